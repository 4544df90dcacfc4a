"""`cardc.train` and `cardc.sample` from Python: what `cardc train` and `cardc sample` do, with
the same numbers for the same seed, and the project's errors for bad arguments."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cardc
from cardc.app.inputs import UsageError
from cardc.diagnostics import CardError
from cardc.presets import OverrideError

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"D": 32, "H": 2, "D_f": 64, "N": 1, "ctx": 32}
FLAGS = ["--steps", "4", "--eval-every", "2", "--batch-size", "2", "--block-size", "16"]


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _losses(records: list[dict]) -> list[tuple]:
    return [(r["step"], r["train_loss"], r["val_loss"]) for r in records]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, cardc.app.training.TrainedRun]:
    out = tmp_path_factory.mktemp("py") / "run"
    run = cardc.train(ROOT / "cards/gpt2.card", preset="tiny", overrides=SIZES, steps=4, eval_every=2,
                      batch_size=2, block_size=16, out=str(out), device="cpu")
    return out, run


def test_train_from_python_is_the_command_line_run(trained, tmp_path, cli):
    out, run = trained
    assert run.out == out and (out / "model.safetensors").is_file()
    assert _losses(run.records) == _losses(_records(out))
    sets = [a for k, v in SIZES.items() for a in ("--set", f"{k}={v}")]
    r = cli("train", "cards/gpt2.card", "--preset", "tiny", *sets, *FLAGS,
            "--device", "cpu", "--out", str(tmp_path / "cli"))
    assert r.returncode == 0, r.stderr
    assert _losses(_records(tmp_path / "cli")) == _losses(run.records)  # the same seed


def test_sample_from_python_prints_what_the_command_line_prints(trained, cli):
    out, _ = trained
    shown = cardc.sample(out, prompt=["The ", "ab"], tokens=8, temperature=0, device="cpu")
    assert len(shown) == 2 and shown[0].startswith("The ") and shown[1].startswith("ab")
    r = cli("sample", str(out), "--prompt", "The ", "--prompt", "ab", "--tokens", "8",
            "--temperature", "0", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"==> prompt 1 <==\n{shown[0]}\n\n==> prompt 2 <==\n{shown[1]}\n"
    one = cardc.sample(out, prompt="ab", tokens=8, temperature=0, device="cpu")
    assert one == [shown[1]]  # a prompt of a length of its own continues as it would alone


def test_a_model_is_lowered_once_per_run(trained, tmp_path, monkeypatch):
    """Its sampler and its training card read the analysis recorded when it was lowered
    (`model.analysis`) instead of lowering its card a second time."""
    from cardc.lower import cards

    lowered, model = [], cards.Lowering.model
    monkeypatch.setattr(cards.Lowering, "model",
                        lambda self, alg: lowered.append(alg.name) or model(self, alg))
    cardc.sample(trained[0], prompt="ab", tokens=2, temperature=0, device="cpu")
    assert lowered == ["GPT2"]  # rebuilt from the checkpoint, and no more
    lowered.clear()
    cardc.train(ROOT / "cards/gpt2.card", preset="tiny", overrides=SIZES, steps=1,
                batch_size=2, block_size=16, out=str(tmp_path / "run"), device="cpu")
    assert lowered == ["GPT2"]


def test_sample_says_so_where_the_model_decodes_without_a_cache(trained, tmp_path, cli,
                                                              capsys):
    """`cardc sample` notes on stderr that a model recomputes every position: the model rebuilt
    from the checkpoint's cards, whose lowering proved no KV cache, says so, not the analysis
    the checkpoint's metadata claims (a file anyone may edit). A model that decodes with one
    gets no note."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    out, _ = trained
    args = ("--prompt", "1 2 3", "--tokens", "4", "--temperature", "0", "--device", "cpu")
    cached = cli("sample", str(out), *args)
    assert cached.returncode == 0 and "KV cache" not in cached.stderr, cached.stderr
    run = tmp_path / "claims"
    shutil.copytree(out, run)
    with safe_open(str(run / "model.safetensors"), framework="pt") as f:
        metadata, state = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    meta = json.loads(metadata["cardc"])
    assert meta["analysis"] == {"decodes": True, "causal": True, "likelihood": True}
    meta["analysis"]["decodes"] = False
    save_file(state, str(run / "model.safetensors"), {**metadata, "cardc": json.dumps(meta)})
    claimed = cli("sample", str(run), *args)
    assert claimed.returncode == 0 and "KV cache" not in claimed.stderr, claimed.stderr
    assert claimed.stdout == cached.stdout
    from cardc.app.sampling import _note_recomputing

    latent = cardc.model(str(ROOT / "tests/cards/decoding/latent_attention.card"),
                         V=16, D=16, H=2, D_c=8, d_r=4, N=1)  # its lowering proves no cache
    assert not latent.analysis.decodes and not hasattr(latent, "new_cache")
    _note_recomputing(latent, {"name": "LatentDecoder"})
    assert capsys.readouterr().err == "note: LatentDecoder decodes without a KV cache: each " \
        "token recomputes every position of its context\n"


def test_bad_arguments_raise_the_projects_errors(tmp_path):
    with pytest.raises(UsageError, match="no such card file: missing.card"):
        cardc.train("missing.card", out=str(tmp_path / "run"))
    with pytest.raises(UsageError, match="--steps must be >= 0"):
        cardc.train(ROOT / "cards/gpt2.card", steps=-1, out=str(tmp_path / "run"))
    with pytest.raises(OverrideError, match="--set H=0: H = 0 divides the size D/H"):
        cardc.train(ROOT / "cards/gpt2.card", preset="tiny", overrides={"H": 0},
                    out=str(tmp_path / "run"))
    bad = tmp_path / "bad.card"
    bad.write_text("Algorithm 1: y ← Bad(x)\nInput: x ∈ ℝ^{d}\nOutput: y ∈ ℝ^{d}\n"
                   "1 return y = z\n", encoding="utf-8")
    with pytest.raises(CardError, match="unknown name 'z'"):  # a card that does not check
        cardc.train(bad, out=str(tmp_path / "run"))
    with pytest.raises(UsageError, match="tokens: must be >= 1"):
        cardc.sample(tmp_path, tokens=0)
    assert not (tmp_path / "run").exists()


def test_import_cardc_stays_cheap():
    code = ("import sys, cardc\n"
            "assert 'torch' not in sys.modules\n"
            "assert callable(cardc.train) and callable(cardc.sample)\n"
            "assert 'torch' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
