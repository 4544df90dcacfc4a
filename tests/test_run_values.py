"""A training card's seed (`s ∈ ℕ = 1337, seed of every random draw`) and its weights' number
format (`φ ∈ {float32, bfloat16} = float32, number format of θ`): declared, checked, rendered and
set like any hyperparameter, and each against its torch equivalent: the seed is
torch.manual_seed's before the model is built, the format is `model.to(dtype)` before the
card's optimizer takes θ."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cardc.build import build_model, checked, procedure_function, recipe_for
from cardc.cli import main
from cardc.lower.values import card_names
from cardc.parser import parse
from cardc.render.latex import render_latex
from cardc.render.text import render_card
from cardc.runtime.tokenizer import ByteTokenizer
from cardc.runtime.train import TrainConfig, data_splits, make_data, train

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "cards" / "recipes" / "lm_training.card"
TEXT = RECIPE.read_text(encoding="utf-8")
SEED = "s ∈ ℕ = 1337, seed of every random draw"
FORMAT = "φ ∈ {float32, bfloat16} = float32, number format of θ"
SMALL = ["--set", "D=16", "--set", "H=2", "--set", "N=1", "--set", "D_f=32", "--block-size", "17"]


@pytest.fixture(autouse=True)
def _root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_the_recipe_declares_its_seed_and_format():
    assert SEED in TEXT and FORMAT in TEXT
    lib, checker, _ = checked([str(RECIPE)], "cards")
    sig = checker.info(lib.find("LMTraining")).sig
    seed, fmt = sig.run["s"], sig.run["φ"]
    assert seed.seed and seed.default == 1337 and seed.of is None
    assert not fmt.seed and fmt.formats == ("float32", "bfloat16") and fmt.of == "θ"
    assert fmt.default == "float32"
    names = card_names(sig)  # the generated function does not take them: the run does
    assert "s" not in names and "φ" not in names and "η" in names
    assert "s" not in sig.hypers and "φ" not in sig.hypers


def test_they_round_trip_and_render():
    card = parse(TEXT, str(RECIPE))
    assert render_card(card) == TEXT
    assert parse(render_card(card), str(RECIPE)) == card
    tex = render_latex(card)
    assert r"$s \in \mathbb{N} = 1337$, seed of every random draw" in tex
    assert (r"${\phi} \in \{\mathtt{float32}, \mathtt{bfloat16}\} = \mathtt{float32}$, "
            r"number format of ${\theta}$") in tex


BAD = [
    (SEED, "s ∈ (0, ∞) = 1337, seed of every random draw", "a seed is a whole number"),
    (SEED, f"{SEED}\n    r ∈ ℕ, seed of every random draw",
     "a card has one seed: 's' is already seed of every random draw"),
    (SEED, "s ∈ ℕ = 0.5, seed of every random draw",
     "the seed 's' is a whole number from 0 to 2^63 − 1"),
    (SEED, f"s ∈ ℕ = {2**63}, seed of every random draw",
     "the seed 's' is a whole number from 0 to 2^63 − 1"),
    (SEED, "s, r ∈ ℕ, seed of every random draw", "declare a seed or a number format on its own"),
    ("{float32, bfloat16}", "{float32, float8}", "'float8' is not a number format"),
    ("= float32, number", "= float16, number", "'φ' is one of {float32, bfloat16}"),
    ("number format of θ", "number format of ψ",
     "'ψ' is not an input of parameters: a number format formats parameters"),
    ("number format of θ", "number format of x",
     "'x' is not an input of parameters: a number format formats parameters"),
    (", number format of θ", "", "'φ' names a number format: say of what"),
    ("φ ∈ {float32, bfloat16}", "φ ∈ ℕ", "a number format is one of a set of formats"),
    ("Input: θ, initial parameters of M.",
     "Input: θ, initial parameters of M.\nInput: r ∈ ℕ, seed of every random draw",
     "a seed or a number format is a hyperparameter, not an input"),
    ("λ = 0.1, c = 1\nPreset gpt2", "λ = 0.1, c = 1, φ = float16\nPreset gpt2",
     "'φ' is one of {float32, bfloat16}, not float16"),
    ("λ = 0.1, c = 1\nPreset gpt2", "λ = 0.1, c = 1, s = 1e3\nPreset gpt2",
     "the seed 's' is a whole number ≥ 0, not 1e3"),
]


@pytest.mark.parametrize(("old", "new", "message"), BAD, ids=[m for _, _, m in BAD])
def test_a_bad_seed_or_format_is_one_located_error(tmp_path, capsys, old, new, message):
    assert old in TEXT
    card = tmp_path / "recipe.card"
    card.write_text(TEXT.replace(old, new, 1), encoding="utf-8")
    assert main(["check", str(card)]) == 1
    err = capsys.readouterr().err
    assert f"{card}:" in err and f"error: {message}" in err


def test_only_a_training_card_takes_them(tmp_path, capsys):
    card = tmp_path / "scale.card"
    card.write_text("Algorithm: Y ← Scale(X | γ)\n"
                    "/* A vector scaled entry by entry. */\n"
                    "Input: X ∈ ℝ^{D}\nOutput: Y ∈ ℝ^{D}\n"
                    "Hyperparameters: D ∈ ℕ\n"
                    "Hyperparameters: s ∈ ℕ = 1, seed of every random draw\n"
                    "Parameters: γ ∈ ℝ^{D} = 1\n"
                    "1 return Y = X ⊙ γ\n", encoding="utf-8")
    assert main(["check", str(card)]) == 1
    assert (f"{card}:6:18: error: 's' is the run's, and this card does not train: it takes no "
            "dataset") in capsys.readouterr().err


def test_no_step_reads_them(tmp_path, capsys):
    """They are the run's: a step that reads one is an error, not a number."""
    card = tmp_path / "recipe.card"
    card.write_text(TEXT.replace("6     θ ← AdamW(θ, g | η_i,", "6     θ ← AdamW(θ, g · s | η_i,"),
                    encoding="utf-8")
    assert main(["check", str(card)]) == 1
    assert f"{card}:25:24: error: 's' is the run's seed, which no step reads" \
        in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (["--seed", "3", "--set", "s=4"], "--seed 3 and --set s=4 both set the seed: give one"),
    (["--set", "φ=float16"], "--set φ=float16: 'φ' is one of {float32, bfloat16}, not float16"),
    (["--set", "phi=bf16"], "--set phi=bf16: 'φ' is one of {float32, bfloat16}, not bf16"),
    (["--set", "s=-1"], "--set s=-1: the seed 's' is a whole number ≥ 0, not -1"),
    (["--set", f"s={2**63}"], f"--set s={2**63}: the seed 's' = {2**63} is beyond 2^63 − 1"),
])
def test_a_bad_value_on_the_command_line_is_refused(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    assert main(["train", "cards/gpt2.card", "--preset", "tiny", "--steps", "1",
                 "--out", str(out), *flags]) == 2
    assert f"cardc: error: {message}" in capsys.readouterr().err
    assert not out.exists()


def _initial_weights(tmp_path: Path, *flags: str) -> dict[str, torch.Tensor]:
    out = tmp_path / ("-".join(flags) or "default")
    assert main(["train", "cards/gpt2.card", "--preset", "tiny", "--steps", "0", *SMALL,
                 "--out", str(out), *flags]) == 0
    return load_file(out / "model.safetensors")


def test_the_seed_is_torch_manual_seed_before_the_model_is_built(tmp_path, capsys):
    by_card = _initial_weights(tmp_path, "--set", "s=7")
    by_flag = _initial_weights(tmp_path, "--seed", "7")
    default = _initial_weights(tmp_path)
    torch.manual_seed(7)
    model = build_model("cards/gpt2.card", "tiny", {"D": 16, "H": 2, "N": 1, "D_f": 32})
    for name, tensor in model.state_dict().items():
        assert torch.equal(by_card[name], tensor) and torch.equal(by_flag[name], tensor)
    assert not torch.equal(default["W_e"], by_card["W_e"])
    torch.manual_seed(1337)  # the card's default
    assert torch.equal(default["W_e"], build_model(
        "cards/gpt2.card", "tiny", {"D": 16, "H": 2, "N": 1, "D_f": 32}).W_e)


def test_bfloat16_weights_train_as_a_bfloat16_model_does(tmp_path):
    """φ = bfloat16: the run's updates are those of the card's function on the model cast to
    bfloat16 by torch, bit for bit; its weights and AdamW's moments are bfloat16."""
    lib, checker, _ = checked(["cards/gpt2.card"], "cards")
    recipe = procedure_function(checker, recipe_for(lib, checker, lib.find("GPT2"), True))
    hypers = {"N_steps": 3, "B": 2, "l": 9, "eta": 1e-3, "eta_min": 1e-4, "N_warmup": 1,
              "beta_1": 0.9, "beta_2": 0.95, "lambda_": 0.1, "c": 1.0}
    cfg = TrainConfig(out_dir=str(tmp_path / "run"), eval_every=3, eval_iters=1,
                      device="cpu", weights="bfloat16", save_every=2)
    torch.manual_seed(0)
    model = build_model("cards/gpt2.card", "tiny", {"D": 16, "H": 2, "N": 1, "D_f": 32})
    reference = copy.deepcopy(model).to(torch.bfloat16)
    train(model, recipe, hypers, cfg, model.card_meta, progress=False)

    _, train_split, _ = data_splits(cfg, ByteTokenizer())
    data = make_data(reference, 1, 6, 9, train_split, cfg.seed, torch.device("cpu"))
    recipe(*data, reference, **hypers)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert p.dtype == torch.bfloat16 and torch.equal(p, q), name
    saved = load_file(tmp_path / "run" / "model.safetensors")
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    state = load_file(tmp_path / "run" / "checkpoints" / "step-0000002" / "state.safetensors")
    moments = {t.dtype for k, t in state.items() if k.endswith((".exp_avg", ".exp_avg_sq"))}
    assert moments == {torch.bfloat16}
