"""`cardc train` and `cardc sample` end to end at a very small size, and their bad inputs."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--set", "D=32", "--set", "H=2", "--set", "D_f=64", "--set", "N=1", "--set", "ctx=32"]


def cardc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cardc", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    r = cardc("train", "cards/gpt2.card", "--preset", "tiny", *SMALL, "--steps", "30",
              "--eval-every", "15", "--batch-size", "4", "--block-size", "16", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "val loss" in r.stdout
    return out


def test_train_writes_metrics_checkpoint_and_plot(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 15, 30]
    for r in records:
        assert {"step", "train_loss", "val_loss", "tokens_per_s"} <= set(r)
    assert records[-1]["val_loss"] < records[0]["val_loss"]
    assert (run_dir / "model.safetensors").stat().st_size > 0
    assert (run_dir / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_checkpoint_records_card_and_preset(run_dir):
    from cardc.runtime.checkpoint import read_checkpoint

    meta, _ = read_checkpoint(run_dir)
    assert meta["card"] == "gpt2.card" and meta["preset"] == "tiny"
    assert meta["hyperparameters"]["D"] == 32
    assert {"gpt2.card", "nn/attention.card"} <= set(meta["cards"])


def test_sample_continues_the_prompt(run_dir, cli):
    r = cardc("sample", str(run_dir), "--prompt", "The ", "--tokens", "20")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The ")
    greedy = [run("sample", str(run_dir), "--prompt", "a", "--tokens", "10",
                  "--temperature", "0").stdout for run in (cardc, cli)]  # two processes
    assert greedy[0] == greedy[1]


def test_sample_with_top_k_or_top_p_sets_the_cards_filters(run_dir, cli):
    """--top-k 1, and a tiny --top-p at any temperature, keep the most probable token alone:
    the card's top_k and top_p steps draw what temperature 0 picks."""
    r = cardc("sample", str(run_dir), "--prompt", "The ", "--tokens", "20", "--top-p", "0.9")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The ")
    common = ["sample", str(run_dir), "--prompt", "a", "--tokens", "30", "--temperature"]
    greedy = cli(*common, "0")
    top_1 = cli(*common, "0.8", "--top-k", "1")
    nucleus = cli(*common, "2", "--top-p", "0.000001")
    assert greedy.returncode == top_1.returncode == nucleus.returncode == 0, top_1.stderr
    assert top_1.stdout == greedy.stdout == nucleus.stdout
    assert cli(*common, "2", "--top-k", "256").stdout == cli(*common, "2").stdout  # k = V


def test_sample_batches_prompts_and_each_reads_as_it_would_alone(run_dir, cli):
    """Prompts of one length run as one batch: at temperature 0 each continues as in a call of
    its own."""
    common = ["sample", str(run_dir), "--tokens", "12", "--seed", "5"]
    one = cardc(*common, "--temperature", "0", "--prompt", "ab", "--prompt", "cd")
    alone = [cli(*common, "--temperature", "0", "--prompt", p).stdout for p in ("ab", "cd")]
    assert one.returncode == 0, one.stderr
    assert one.stdout == f"==> prompt 1 <==\n{alone[0]}\n==> prompt 2 <==\n{alone[1]}"


def _ignoring_prompts(run: Path, out: Path) -> Path:
    """A copy of `run` whose weights are all zero: its next-token distribution is uniform
    whatever the prompt, so only the random draws tell two continuations apart."""
    import shutil

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.copytree(run, out)
    with safe_open(str(run / "model.safetensors"), "pt") as f:
        meta = f.metadata()
        zeros = {k: torch.zeros_like(f.get_tensor(k)) for k in f.keys()}  # noqa: SIM118
    save_file(zeros, str(out / "model.safetensors"), metadata=meta)
    return out


def test_several_prompts_draw_continuations_of_their_own(run_dir, cli, tmp_path):
    """Prompts of different lengths (so different batches) at temperature > 0 continue with
    draws of their own, not the same draws replayed from --seed, which a model that heeds its
    prompt little turns into the same continuation; the same command draws the same again."""
    run = _ignoring_prompts(run_dir, tmp_path / "run")
    args = ["sample", str(run), "--tokens", "40", "--temperature", "1", "--seed", "3",
            "--prompt", "1 2", "--prompt", "3 4 5"]
    first, again = cli(*args), cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == again.stdout
    shown = [part.split() for part in first.stdout.split("==> prompt 2 <==")]
    assert shown[0][-40:] != shown[1][-40:]


def test_sample_stops_before_the_stop_text(run_dir, capsys, monkeypatch):
    """--stop TEXT: the continuation ends before the first stop text, and decoding ends with
    the token that completes it (the card's loop is told each token it draws)."""
    import cardc.build
    from cardc.cli import main

    real, told = cardc.build.procedure_function, []

    def telling(checker, alg, model=None):
        fn = real(checker, alg, model)

        def run(x, theta, stop=lambda y: False, **hypers):
            return fn(x, theta, stop=lambda y: told.append(int(y[0])) or stop(y), **hypers)
        return run

    monkeypatch.setattr(cardc.build, "procedure_function", telling)
    common = ["sample", str(run_dir), "--prompt", "ab", "--tokens", "40", "--temperature", "1"]
    assert main(common) == 0
    drawn, told[:] = list(told), []
    continuation = capsys.readouterr().out.removesuffix("\n")[2:]
    assert len(drawn) == 40 and continuation == bytes(drawn).decode(errors="replace")
    stop = next(c for c in continuation[3:] if c.isascii() and c.isprintable())
    assert main([*common, "--stop", stop, "--stop", "never said"]) == 0
    assert capsys.readouterr().out == "ab" + continuation[:continuation.index(stop)] + "\n"
    assert len(told) == next(n for n in range(41) if stop.encode() in bytes(drawn[:n]))


def test_sample_refuses_top_k_for_a_card_without_the_step(run_dir, tmp_path, cli):
    card = (ROOT / "cards/recipes/lm_sampling.card").read_text(encoding="utf-8")
    plain = tmp_path / "plain.card"
    lines = [line for line in card.splitlines(keepends=True)
             if not line.startswith(("Hyperparameters: k ∈", "Hyperparameters: p ∈"))]
    plain.write_text("".join(lines).replace("top_p(top_k(exp(z/τ) | k) | p)", "exp(z/τ)"),
                     encoding="utf-8")
    r = cardc("sample", str(run_dir), "--card", str(plain), "--top-k", "5")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr == ("cardc: error: --top-k sets k in a step top_k(w | k) of the sampling "
                        "card, and LMSampling has none; sample with a card that has one, as "
                        "cardc's recipes/lm_sampling.card\n")
    r = cli("sample", str(run_dir), "--card", str(plain), "--tokens", "3")
    assert r.returncode == 0, r.stderr
    r = cli("sample", str(run_dir), "--set", "k=0")
    assert r.returncode == 2 and r.stderr == ("cardc: error: k = 0: top_k keeps at least one "
                                              "token\n")


def test_eval_prints_the_held_out_loss_and_its_perplexity(run_dir, cli):
    """With no --data, eval measures the windows of the run's held-out split that training
    measured: its loss is the last recorded val_loss."""
    r = cardc("eval", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1 and "held-out split of the built-in corpus" in r.stdout
    found = re.search(r"loss (\d+\.\d+), perplexity (\d+\.\d+)", r.stdout)
    loss, perplexity = float(found[1]), float(found[2])
    assert abs(perplexity - math.exp(loss)) <= 1e-4 * perplexity
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert abs(loss - records[-1]["val_loss"]) < 1e-4
    r = cli("eval", str(run_dir), "--data", "README.md", "--batches", "2")
    assert r.returncode == 0, r.stderr
    assert "on 'README.md' (2 batches of 16 windows of 15 tokens)" in r.stdout


def test_eval_refuses_a_model_that_reads_ahead(paper_run, cli):
    r, run = paper_run("etraining")
    assert r.returncode == 0, r.stderr
    r = cli("eval", str(run))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("cardc: error: ETransformer is not a causal language model")


def test_train_tensorboard(tmp_path):
    """--tensorboard writes event files under the run's tb/; without the tensorboard package
    it is one line naming the package, before anything is written."""
    import importlib.util

    r = cardc("train", "cards/gpt2.card", "--preset", "tiny", *SMALL, "--steps", "2",
              "--batch-size", "2", "--block-size", "8", "--tensorboard", "--out",
              str(tmp_path / "run"))
    if importlib.util.find_spec("tensorboard") is None:
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr == ("cardc: error: --tensorboard needs the tensorboard package: pip "
                            "install tensorboard (or pip install 'cardc[tensorboard]')\n")
        assert not (tmp_path / "run").exists()
    else:
        assert r.returncode == 0, r.stderr
        assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))


def test_sample_rebuilds_without_the_card_files(run_dir, tmp_path):
    """The checkpoint carries its cards: sampling works from anywhere."""
    r = subprocess.run([sys.executable, "-m", "cardc", "sample", str(run_dir), "--tokens", "5"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args, code, message", [
    (["sample", "no/such/run"], 1, "checkpoint not found"),
    (["eval", "no/such/run"], 1, "checkpoint not found"),
    (["sample", "no/such/run", "--top-p", "0"], 2, "argument --top-p: must be a number in (0, 1]"),
    (["sample", "no/such/run", "--top-p", "1.5"], 2, "must be a number in (0, 1], got 1.5"),
    (["sample", "no/such/run", "--top-p", "nan"], 2, "must be a number in (0, 1], got nan"),
    (["train", "cards/gpt2.card", "--preset", "huge"], 1, "has no preset 'huge'"),
    (["train", "cards/gpt2.card", "--preset", "tiny", "--device", "tpu"], 2, "invalid choice"),
    (["train", "cards/gpt2.card", "--preset", "tiny", "--steps", "-1"], 2, "steps"),
    (["train", "missing.card"], 2, "no such card file"),
    (["train", "cards/gpt2.card", "--preset", "tiny", "--data", "no/such.txt", "--steps", "1"],
     1, "cannot read corpus file"),
])
def test_bad_input_gets_one_clear_message(args, code, message, cli):
    r = cli(*args)
    assert r.returncode == code, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_corrupt_checkpoint(tmp_path, cli):
    (tmp_path / "model.safetensors").write_bytes(b"not a checkpoint at all")
    r = cli("sample", str(tmp_path))
    assert r.returncode == 1 and "not a valid safetensors file" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_gpu_is_reported_before_anything_is_written(tmp_path, cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = cli("train", "cards/gpt2.card", "--preset", "tiny", "--device", "cuda",
            "--out", str(tmp_path / "run"))
    assert r.returncode == 1 and "CUDA is not available" in r.stderr
    assert not (tmp_path / "run").exists() and r.stdout == ""


def test_same_seed_same_initial_weights(run_dir, tmp_path):
    """A second run of run_dir's seed and sizes (run_dir is the first) starts from its weights:
    their first held-out losses are equal."""
    out = tmp_path / "run"
    r = cardc("train", "cards/gpt2.card", "--preset", "tiny", *SMALL, "--steps", "0",
              "--batch-size", "4", "--block-size", "16", "--out", str(out))
    assert r.returncode == 0, r.stderr
    first = [json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
             for run in (run_dir, out)]
    assert first[0]["val_loss"] == first[1]["val_loss"]


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory) -> Callable[[str], tuple[subprocess.CompletedProcess, Path]]:
    """`cardc train cards/paper/CARD.card`, run once for the module: the tests that sample or
    evaluate a run of a paper card read this one (never change it)."""
    runs: dict[str, tuple[subprocess.CompletedProcess, Path]] = {}

    def run(card: str) -> tuple[subprocess.CompletedProcess, Path]:
        if card not in runs:
            out = tmp_path_factory.mktemp(card)
            runs[card] = cardc("train", f"cards/paper/{card}.card", "--preset", "tiny",
                               "--examples", "300", "--block-size", "32", "--out", str(out)), out
        return runs[card]

    return run


@pytest.mark.parametrize("card", ["dtraining", "etraining", "edtraining"])
def test_train_runs_the_papers_training_cards(card, paper_run):
    """`cardc train` on a training card runs the card's own loop on the model it calls."""
    r, run = paper_run(card)
    assert r.returncode == 0, r.stderr
    assert f"with {card[:-8].upper()}Training (cards/paper/{card}.card)" in r.stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    vals = [r["val_loss"] for r in records if r["val_loss"] is not None]
    assert len(vals) >= 2 and vals[-1] < vals[0]
    assert records[-1]["step"] % 300 == 0  # one update per example, every epoch
    assert (run / "model.safetensors").stat().st_size > 0


def test_train_a_model_card_runs_the_card_that_trains_it(tmp_path):
    """EDTransformer has no next-token loss: its recipe is the paper's EDTraining, found in the
    library; the harness measures the card's own objective on held-out pairs, first and last."""
    r = cardc("train", "cards/paper/edtransformer.card", "--preset", "tiny", "--examples", "200",
              "--set", "N_epochs=2", "--eval-every", "100", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "with EDTraining (cards/paper/edtraining.card)" in r.stdout
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 100, 200, 300, 400]
    assert [r["val_loss"] is not None for r in records] == [True, False, False, False, True]
    assert records[-1]["val_loss"] < records[0]["val_loss"]
    assert all(r["card_loss"] is not None for r in records[1:])


def test_sample_with_the_papers_inference_card(paper_run, cli):
    r, run = paper_run("dtraining")
    assert r.returncode == 0, r.stderr
    r = cardc("sample", str(run), "--card", "cards/paper/dinference.card", "--prompt", "ab",
              "--tokens", "12", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert 1 <= len(r.stdout.encode()) <= 12 * 3 + 1  # ℓ_gen = 12 bytes, decoded
    again = cli("sample", str(run), "--card", "cards/paper/dinference.card", "--prompt",
                "ab", "--tokens", "12", "--temperature", "0")
    assert again.stdout == r.stdout  # τ = 0 is the arg-max: deterministic, in another process
    wrong = cli("sample", str(run), "--card", "cards/paper/edinference.card")
    assert wrong.returncode == 2
    assert "EDInference samples from EDTransformer" in wrong.stderr
    assert "Traceback" not in wrong.stderr


@pytest.mark.parametrize("args, code, message", [
    (["train", "cards/paper/dinference.card", "--preset", "tiny"], 2, "is an inference card"),
    (["train", "cards/paper/etraining.card", "--preset", "tiny", "--set", "η=-1"], 1,
     "'η' = -1 lies outside (0, ∞)"),
    (["train", "cards/paper/etraining.card", "--preset", "tiny", "--set", "p_mask=2"], 1,
     "'p_mask' = 2 lies outside (0, 1)"),
    (["train", "cards/paper/etraining.card", "--preset", "tiny", "--examples", "0"], 2,
     "--examples must be >= 1"),
    (["train", "cards/paper/etraining.card", "--preset", "huge"], 1, "no preset 'huge'"),
])
def test_training_cards_reject_bad_input(args, code, message, tmp_path, cli):
    r = cli(*args, "--out", str(tmp_path / "run"))
    assert r.returncode == code, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_sample_sets_an_inference_cards_own_hyperparameters(paper_run, cli):
    r, run = paper_run("edtraining")
    assert r.returncode == 0, r.stderr
    guarded = ["sample", str(run), "--card", "cards/paper/edinference_guarded.card",
               "--prompt", "3 1 4", "--temperature", "0"]
    r = cardc(*guarded, "--set", "ℓ_out=3")
    assert r.returncode == 0, r.stderr
    out = [int(w) for w in r.stdout.split()]
    assert out[0] == 32 - 2 and (len(out) == 3 or out[-1] == 32 - 1)  # bos, then ≤ ℓ_out tokens
    r = cli(*guarded, "--set", "ℓ_out=x")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = cli("sample", str(run), "--prompt", "3 1 4", "--temperature", "0")
    assert r.returncode == 0, r.stderr  # the inference card recorded at training: EDInference
    assert [int(w) for w in r.stdout.split()][0] == 32 - 2


def test_the_generic_sampling_card_decodes_like_the_built_in_sampler(run_dir, cli):
    """cards/recipes/lm_sampling.card, bound to GPT-2, at τ = 0 and the built-in greedy sampler
    (what model.generate runs) agree token for token, past the model's context of 32 tokens."""
    from cardc.build import rebuild_model
    from cardc.runtime.checkpoint import load_state, read_checkpoint
    from cardc.runtime.sample import generate

    common = ["sample", str(run_dir), "--prompt", "ab", "--tokens", "40", "--temperature", "0"]
    card = cardc(*common, "--card", "cards/recipes/lm_sampling.card")
    default = cli(*common)
    assert card.returncode == 0 and default.returncode == 0, card.stderr
    meta, state = read_checkpoint(run_dir)
    model = rebuild_model(meta)
    load_state(model, state)
    idx = torch_tensor([list(b"ab")])
    out = generate(model, idx, 40, temperature=0, window=meta["context"])[0, 2:].tolist()
    assert "ab" + card.stdout == default.stdout == "ab" + bytes(out).decode(errors="replace") + \
        "\n"


def torch_tensor(rows):
    import torch

    return torch.tensor(rows, dtype=torch.long)


def test_the_checkpoint_records_the_sampling_card(run_dir):
    """`cardc sample RUN` runs the inference card recorded at training time, from anywhere."""
    from cardc.runtime.checkpoint import read_checkpoint

    meta, _ = read_checkpoint(run_dir)
    assert meta["sampler"] == {"card": "recipes/lm_sampling.card", "name": "LMSampling"}
    assert meta["cards"]["recipes/lm_sampling.card"] == \
        (ROOT / "cards/recipes/lm_sampling.card").read_text()


def test_train_refuses_a_model_no_training_card_trains(tmp_path, cli):
    r = cli("train", "cards/paper/unembedding.card", "--set", "N_V=10", "--set", "d_e=4",
            "--out", str(tmp_path / "run"))
    assert r.returncode == 1, r.stderr  # the card is at fault, not the command line
    assert r.stderr.startswith("cards/paper/unembedding.card:1:1: error: no training card "
                               "trains Unembedding: none calls it"), r.stderr
    assert "= hint: searched cards/; write a training card that calls Unembedding" in r.stderr
    assert r.stderr.endswith("\n1 error\n")
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, message", [
    (["cards/paper/edtransformer.card", "--steps", "2"],
     "--steps sets N_steps, which EDTraining does not have"),
    (["cards/gpt2.card", "--recipe", "cards/paper/dtraining.card"],
     "cards/paper/dtraining.card holds no training card for GPT2"),
    (["cards/gpt2.card", "--lr", "0"], "argument --lr: must be a finite number > 0, got 0"),
    (["cards/gpt2.card", "--block-size", "1"], "--block-size must be >= 2"),
    (["cards/gpt2.card", "--block-size", "300"], "ℓ = 300 tokens do not fit the model's context"),
])
def test_recipe_flags_are_checked_against_the_training_card(args, message, tmp_path, cli):
    r = cli("train", *args, "--preset", "tiny", "--out", str(tmp_path / "run"))
    assert r.returncode in (1, 2) and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run" / "model.safetensors").exists()


def test_the_tiny_llama_trains_and_samples(tmp_path, cli):
    """The Llama card trains with the generic LMTraining (val loss falls) and samples."""
    r = cardc("train", "cards/llama.card", "--preset", "tiny", "--set", "D=32", "--set", "H=4",
              "--set", "H_kv=2", "--set", "D_f=64", "--set", "N=1", "--steps", "12",
              "--eval-every", "12", "--batch-size", "4", "--block-size", "16",
              "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "with LMTraining (cards/recipes/lm_training.card)" in r.stdout
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0")
    assert s.returncode == 0, s.stderr


def test_finetune_starts_from_a_checkpoints_weights(run_dir, tmp_path):
    """No updates after --finetune: the new checkpoint holds the old one's weights, and its first
    evaluation the old one's last held-out loss."""
    from cardc.runtime.checkpoint import read_checkpoint

    r = cardc("train", "cards/gpt2.card", "--preset", "tiny", "--finetune", str(run_dir),
              "--steps", "0", "--batch-size", "4", "--block-size", "16", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert f"the weights of {run_dir}" in r.stdout
    (_, before), (meta, after) = read_checkpoint(run_dir), read_checkpoint(tmp_path)
    assert meta["hyperparameters"]["D"] == 32  # the checkpoint's size, not the preset's 128
    assert before.keys() == after.keys()
    assert all(torch_equal(before[k], after[k]) for k in before)
    old = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    new = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][0]
    assert abs(old["val_loss"] - new["val_loss"]) < 1e-4


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


@pytest.mark.parametrize("card, message", [
    ("cards/llama.card", "holds GPT2, but the training card trains Llama"),
    ("cards/gpt2.card", "checkpoint tensor 'W_p' has shape (32, 32), model expects (16, 32)"),
])
def test_finetune_refuses_a_checkpoint_of_another_model(run_dir, tmp_path, card, message,
                                                        cli):
    extra = ["--set", "ctx=16"] if card == "cards/gpt2.card" else []
    r = cli("train", card, "--preset", "tiny", "--finetune", str(run_dir), *extra,
            "--steps", "1", "--out", str(tmp_path / "out"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert message in r.stderr
    assert not (tmp_path / "out").exists()


def test_pad_vocab_rounds_the_vocabulary_up_to_a_multiple_of_64(tmp_path):
    from cardc.runtime.checkpoint import read_checkpoint

    r = cardc("train", "cards/gpt2.card", "--preset", "tiny", *SMALL, "--set", "V=257",
              "--pad-vocab", "--steps", "1", "--batch-size", "2", "--block-size", "16",
              "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "V = 257 padded to 320, a multiple of 64" in r.stdout
    meta, state = read_checkpoint(tmp_path)
    assert meta["hyperparameters"]["V"] == 320 and state["W_e"].shape == (320, 32)


def test_pad_vocab_refuses_a_fine_tuned_run(run_dir, tmp_path, cli):
    r = cli("train", "cards/gpt2.card", "--preset", "tiny", "--finetune", str(run_dir),
            "--pad-vocab", "--steps", "1", "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "a fine-tuned model keeps its checkpoint" in r.stderr


def test_a_run_that_records_no_sampler_samples_with_the_generic_one_and_says_so(run_dir,
                                                                                 tmp_path, cli):
    """`cardc sample` never falls back silently: a checkpoint without a sampling card (an older
    run's) samples with the library's LMSampling, bound to its model, and says so on stderr."""
    from cardc.build import rebuild_model
    from cardc.runtime.checkpoint import load_state, read_checkpoint, save_checkpoint

    meta, state = read_checkpoint(run_dir)
    model = rebuild_model(meta)
    load_state(model, state)
    del meta["sampler"]
    meta["cards"] = {k: v for k, v in meta["cards"].items() if not k.startswith("recipes/")}
    save_checkpoint(str(tmp_path), model, meta)
    common = ["--prompt", "ab", "--tokens", "20", "--temperature", "0"]
    r = cardc("sample", str(tmp_path), *common)
    assert r.returncode == 0, r.stderr
    assert r.stderr == (f"note: {tmp_path} records no sampling card; sampling GPT2 with the "
                        "library's cards/recipes/lm_sampling.card\n")
    assert r.stdout == cli("sample", str(run_dir), *common).stdout


def test_a_generic_recipe_refuses_a_model_that_reads_ahead(tmp_path, cli):
    """LMTraining trains causal language models: a card of its signature whose scores for a
    position depend on later tokens is refused before training."""
    card = (ROOT / "cards" / "gpt2.card").read_text(encoding="utf-8")
    assert "CausalSelfAttention(" in card
    (tmp_path / "ahead.card").write_text(
        card.replace("GPT2(", "Ahead(").replace("CausalSelfAttention(", "SelfAttention("),
        encoding="utf-8")
    r = cli("train", str(tmp_path / "ahead.card"), "--preset", "tiny", "--steps", "1",
            "--out", str(tmp_path / "run"))
    assert r.returncode == 2, r.stderr
    assert r.stderr == ("cardc: error: LMTraining trains a causal language model, and Ahead "
                        "reads ahead: its scores for a position change with a later token\n")
    assert not (tmp_path / "run").exists()


FIRST_EXAMPLE = """\
1 m ← length(x_1)
2 for i = 1, 2, …, N_epochs do
3     for n = 1, 2, …, N_data do
4         ℓ ← length(x_n)
5         P(θ) ← DTransformer(x_n | θ)
6         loss(θ) = −(1/m) Σ_{t=1}^{ℓ − 1} log P(θ)[x_n[t + 1], t]
7         θ ← θ − η · ∇loss(θ)
8     end
9 end
10 return θ̂ = θ
"""


def test_a_training_card_reads_an_example_by_its_number_before_its_loops(tmp_path):
    """`m ← length(x_1)` before the loops: the first example, a batch of one (check accepted
    it and build refused it). Its length scales the loss; the run trains."""
    card = _paper_copy(tmp_path, FIRST_EXAMPLE)
    assert cardc("check", str(card)).returncode == 0
    r = cardc("train", str(card), "--preset", "tiny", "--examples", "40", "--eval-every", "20",
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in
               (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    vals = [r["val_loss"] for r in records if r["val_loss"] is not None]
    assert len(vals) >= 2 and vals[-1] < vals[0]


def _paper_copy(tmp_path: Path, steps: str) -> Path:
    """cards/paper's DTraining beside its DTransformer in tmp_path, its steps replaced."""
    folder = tmp_path / "paper"
    folder.mkdir()
    for card in ("dtraining", "dtransformer"):
        text = (ROOT / "cards" / "paper" / f"{card}.card").read_text(encoding="utf-8")
        (folder / f"{card}.card").write_text(text, encoding="utf-8")
    card = folder / "dtraining.card"
    text = card.read_text(encoding="utf-8")
    card.write_text(text[:text.index("1 for i = 1, 2, …, N_epochs do")] + steps,
                    encoding="utf-8")
    return card


TWICE = """\
1 for i = 1, 2, …, N_epochs do
2     for n = 1, 2, …, N_data do
3         ℓ ← length(x_n)
4         P(θ) ← DTransformer(x_n | θ)
5         loss(θ) = −Σ_{t=1}^{ℓ − 1} log P(θ)[x_n[t + 1], t]
6         θ ← θ − η · ∇loss(θ)
7         P(θ) ← DTransformer(x_n | θ)
8         loss(θ) = −Σ_{t=1}^{ℓ − 1} log P(θ)[x_n[t + 1], t]
9         θ ← θ − η · ∇loss(θ)
10     end
11 end
12 return θ̂ = θ
"""


def test_a_card_that_updates_twice_per_example_counts_its_updates(tmp_path):
    """Two updates per example: 20 examples make 40 updates, the progress shows 40 of 40
    (was 40 of 20) and the last update is evaluated as the run's end."""
    card = _paper_copy(tmp_path, TWICE)
    r = cardc("train", str(card), "--preset", "tiny", "--examples", "20", "--eval-every", "10",
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    shown = re.findall(r"step (\d+)/(\d+)", r.stdout + r.stderr)
    assert shown and all(total == "40" for _, total in shown), shown
    records = [json.loads(line) for line in
               (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 40 and records[-1]["val_loss"] is not None


def test_sample_takes_no_filter_bound_from_the_models_hyperparameters(tmp_path):
    """Mixtral's k (experts per token) is the model's, not the sampler's top-k: sampling its
    run without --top-k draws from every token, as --top-k V does."""
    out = tmp_path / "moe"
    r = cardc("train", "cards/mixtral.card", "--preset", "tiny", "--set", "D=32", "--set", "d=8",
              "--set", "D_f=32", "--set", "N=1", "--steps", "2", "--batch-size", "2",
              "--block-size", "8", "--out", str(out))
    assert r.returncode == 0, r.stderr
    common = ["sample", str(out), "--prompt", "a", "--tokens", "40", "--temperature", "3",
              "--seed", "1"]
    every = cardc(*common, "--top-k", "256")
    assert every.returncode == 0, every.stderr
    assert cardc(*common).stdout == every.stdout
    assert cardc(*common, "--top-k", "2").stdout != every.stdout  # the old, silent reading
