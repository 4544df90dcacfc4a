"""`cardc check` loads the library lazily (library.load(lazy=True)): only the cards a checked
card calls get parsed, and what it reports is what the fully parsed library reports."""

from pathlib import Path

import pytest

from cardc.checker import check
from cardc.diagnostics import Diagnostics
from cardc.library import defined_names, library_roots, load
from cardc.parser import parse_file

ROOT = Path(__file__).resolve().parent.parent
CARDS = sorted(p.relative_to(ROOT) for p in (ROOT / "cards").rglob("*.card"))


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def shown(paths: list[str], lazy: bool) -> tuple[str, int]:
    """What `cardc check` prints of the given cards, and how many files it parsed."""
    lib, targets = load(paths, root="cards", lazy=lazy)
    _, diags = check(lib)
    wanted = {str(Path(t)) for t in targets}
    mine = Diagnostics([d for d in diags.items if d.span.file in wanted], diags.sources)
    return mine.render(), len(lib.files)


@pytest.mark.parametrize("card", CARDS, ids=str)
def test_the_index_reads_the_names_the_parser_finds(card):
    names = defined_names(card.read_text(encoding="utf-8"))
    assert names == {a.name for a in parse_file(card, Diagnostics()).algorithms if a.name}


@pytest.mark.parametrize("card", ["cards/gpt2.card", "cards/recipes/lm_training.card",
                                  "tests/golden/faithful/etransformer.card",
                                  "tests/golden/training_errors.card"])
def test_lazy_check_reports_what_the_whole_library_reports(card):
    eager, everything = shown([card], lazy=False)
    lazy, parsed = shown([card], lazy=True)
    assert lazy == eager
    assert parsed < everything


def test_an_unknown_name_is_still_matched_against_every_card(tmp_path):
    text = (ROOT / "cards" / "gpt2.card").read_text(encoding="utf-8")
    card = tmp_path / "typo.card"
    card.write_text(text.replace("LayerNorm(E | γ_f", "LayerNrom(E | γ_f"), encoding="utf-8")
    lazy, _ = shown([str(card)], lazy=True)
    assert "did you mean 'LayerNorm'?" in lazy
    assert lazy == shown([str(card)], lazy=False)[0]


# ------------------------------------------------------------------ the library for any card

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import zipfile  # noqa: E402

import cardc  # noqa: E402
from cardc.diagnostics import CardError  # noqa: E402

# A decoder nobody wrote recipes for, outside any cards/ folder: the library's RMSNorm,
# GroupedQueryAttention and SwiGLU, trained and sampled by the library's generic recipes.
TINY_LM = """\
Algorithm: P ← TinyLM(x | θ)
/* A small decoder written outside the repository. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: P ∈ ℝ^{T×V}, next-token logits.
Hyperparameters: V, D, H, H_kv, D_f, N ∈ ℕ, ε ∈ (0, ∞) = 1e-5
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}, token embeddings, also the unembedding.
    For ℓ ∈ [N]:
        γ^1_ℓ ∈ ℝ^{D} = 1, γ^2_ℓ ∈ ℝ^{D} = 1, the norms.
        θ^attn_ℓ, the attention parameters.
        θ^mlp_ℓ, the MLP parameters.
    γ_f ∈ ℝ^{D} = 1, the final RMSNorm.
Preset tiny: V = 256, D = 32, H = 2, H_kv = 1, D_f = 64, N = 2
1 E ← W_e[x]
2 for ℓ = 1, …, N do
3     E ← E + GroupedQueryAttention(RMSNorm(E | γ^1_ℓ, ε = ε) | θ^attn_ℓ)
4     E ← E + SwiGLU(RMSNorm(E | γ^2_ℓ, ε = ε) | θ^mlp_ℓ)
5 end
6 E ← RMSNorm(E | γ_f, ε = ε)
7 return P = E W_e^⊺
"""


def cardc_in(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cardc", *args], cwd=folder,
                          capture_output=True, text=True, timeout=300)


def test_a_wheel_ships_the_library(tmp_path):
    """`pip install .` installs the building blocks and the generic recipes with the code."""
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("cardc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("nn", "recipes"):
        for card in (ROOT / "cards" / folder).glob("*.card"):
            assert f"cardc/cards/{folder}/{card.name}" in names
    assert "cardc/cards/nn/swiglu.card" in names and "cardc/cards/gpt2.card" not in names
    for source in (ROOT / "cardc").rglob("*.py"):  # every package is listed in pyproject.toml
        assert source.relative_to(ROOT).as_posix() in names


def test_a_card_outside_the_repository_checks_trains_and_samples(tmp_path):
    """No --library, no cards/ folder: the shipped library resolves RMSNorm and SwiGLU, and its
    generic recipes train and sample a family nobody wrote recipes for."""
    from cardc.runtime.checkpoint import read_checkpoint

    (tmp_path / "tinylm.card").write_text(TINY_LM, encoding="utf-8")
    r = cardc_in(tmp_path, "check", "tinylm.card")
    assert r.returncode == 0 and r.stdout == "ok: 1 card in 1 file\n", r.stderr
    r = cardc_in(tmp_path, "train", "tinylm.card", "--preset", "tiny", "--steps", "3",
                 "--batch-size", "2", "--block-size", "17", "--eval-every", "3", "--out", "run")
    assert r.returncode == 0, r.stderr
    assert "training TinyLM (tiny, " in r.stdout and " with LMTraining (" in r.stdout
    meta, _ = read_checkpoint(tmp_path / "run")
    assert meta["sampler"] == {"card": "library/recipes/lm_sampling.card", "name": "LMSampling"}
    assert {"tinylm.card", "library/nn/swiglu.card", "library/nn/rms_norm.card"} \
        <= set(meta["cards"])
    r = cardc_in(tmp_path, "sample", "run", "--prompt", "ab", "--tokens", "5",
                 "--temperature", "0")
    assert r.returncode == 0 and r.stdout.startswith("ab"), r.stderr
    assert len(r.stdout.removesuffix("\n").encode("utf-8", "surrogateescape")) >= 2


def test_lookup_order_own_folder_then_library_then_shipped(tmp_path):
    """A card beside the caller beats a --library card of the same name, which beats the
    shipped one."""
    mine, extra = tmp_path / "mine", tmp_path / "extra"
    mine.mkdir(), extra.mkdir()
    (mine / "tinylm.card").write_text(TINY_LM, encoding="utf-8")
    norm = (ROOT / "cards" / "nn" / "rms_norm.card").read_text(encoding="utf-8")
    (extra / "rms_norm.card").write_text(norm.replace("ε inside the root", "from --library"),
                                         encoding="utf-8")
    lib, _ = load([str(mine / "tinylm.card")],
                  root=library_roots([mine / "tinylm.card"], [str(extra)]))
    caller = next(f for f in lib.files if f.path.endswith("tinylm.card"))
    assert lib.find("RMSNorm", caller).span.file == str(extra / "rms_norm.card")
    assert "cards/nn/swiglu.card" in Path(lib.find("SwiGLU", caller).span.file).as_posix()
    (mine / "rms_norm.card").write_text(norm, encoding="utf-8")
    lib, _ = load([str(mine / "tinylm.card")],
                  root=library_roots([mine / "tinylm.card"], [str(extra)]))
    caller = next(f for f in lib.files if f.path.endswith("tinylm.card"))
    assert lib.find("RMSNorm", caller).span.file == str(mine / "rms_norm.card")


def test_a_missing_card_names_the_folders_searched_and_no_builtin(tmp_path):
    """Without the shipped library SwiGLU exists nowhere: the hint says where cards were looked
    for, and does not offer the builtin SiLU for a card's name."""
    (tmp_path / "tinylm.card").write_text(TINY_LM, encoding="utf-8")
    lib, _ = load([str(tmp_path / "tinylm.card")], root=None, shipped=False)
    _, diags = check(lib)
    (swiglu,) = [d for d in diags.errors if "SwiGLU" in d.message]
    assert swiglu.message == "unknown card or function 'SwiGLU'"
    assert "SiLU" not in (swiglu.hint or "")
    assert swiglu.hint.startswith(f"Cards are looked for in {tmp_path}/ (and the folders")
    (tmp_path / "typo.card").write_text(TINY_LM.replace("SwiGLU(", "SwiGLu(")
                                        .replace("TinyLM", "TypoLM"), encoding="utf-8")
    r = cardc_in(tmp_path, "check", "typo.card", "--library", str(tmp_path))
    assert r.returncode == 1 and "hint: did you mean 'SwiGLU'? Cards are looked for in ./, " \
        in r.stderr, r.stderr


def test_cardc_model_and_every_verb_take_a_library(tmp_path):
    """A card calling a card that only a --library folder holds: found through library=[…]
    (and --library), not without it."""
    lib_dir, cards = tmp_path / "blocks", tmp_path / "models"
    lib_dir.mkdir(), cards.mkdir()
    norm = (ROOT / "cards" / "nn" / "rms_norm.card").read_text(encoding="utf-8")
    (lib_dir / "norm.card").write_text(norm.replace("RMSNorm", "MyNorm"), encoding="utf-8")
    (cards / "tinylm.card").write_text(TINY_LM.replace("RMSNorm(", "MyNorm("), encoding="utf-8")
    card = str(cards / "tinylm.card")
    with pytest.raises(CardError):
        cardc.model(card, "tiny")
    model = cardc.model(card, "tiny", library=[str(lib_dir)])
    assert sum(p.numel() for p in model.parameters()) > 0
    assert cardc_in(tmp_path, "check", card).returncode == 1
    for verb in (["check", card], ["info", card, "--preset", "tiny"]):
        r = cardc_in(tmp_path, *verb, "--library", str(lib_dir))
        assert r.returncode == 0, r.stderr
    r = cardc_in(tmp_path, "check", card, "--library", str(tmp_path / "nowhere"))
    assert r.returncode == 2
    assert r.stderr == f"cardc: error: --library {tmp_path / 'nowhere'}: no such folder\n"
    assert json.dumps(cardc.model.__doc__)  # documented


@pytest.mark.parametrize("verb", [
    ["check", "cards/gpt2.card"], ["info", "cards/gpt2.card"], ["build", "cards/gpt2.card"],
    ["diff", "cards/gpt2.card", "cards/llama.card"],
    ["train", "cards/gpt2.card", "--steps", "1"],
    ["import", "cards/gpt2.card", "--from", "nowhere", "--out", "nowhere-run"],
], ids=lambda v: v[0])
def test_every_verb_reads_the_library_flag(verb, tmp_path):
    """--library is a flag of every verb that reads cards, and a folder that is not there is
    one clear line, before anything is read or written."""
    r = cardc_in(ROOT, *verb, "--library", str(tmp_path / "none"), "--library", "cards")
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"cardc: error: --library {tmp_path / 'none'}: no such folder\n"
