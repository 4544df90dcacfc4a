"""Every verb validates its flags and paths: one `cardc: error: …` line and a non-zero exit (2 for
a malformed command line, 1 for input that cannot be used), never a traceback or a hang."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cardc.cli import main

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534  # the unprivileged user's id
SMALL = ["--set", "D=32", "--set", "H=2", "--set", "D_f=64", "--set", "N=1", "--set", "ctx=32"]


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """`cardc ARGV` in process: exit status, stdout, stderr (argparse's exits included)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@contextlib.contextmanager
def read_only_folder() -> Iterator[Path]:
    """A folder (in /tmp) no one but root may write in, and a process that asks as a user does.
    cardc asks access(2), which answers for the real user, and root (CI runs as root) may
    write anywhere: there the real user is nobody while the folder is in use (the effective
    one stays root), so the answer is the one any user gets."""
    folder = Path(tempfile.mkdtemp(prefix="cardc-read-only-"))
    folder.chmod(0o555)
    root = os.getuid() == 0
    try:
        if root:
            os.setresuid(NOBODY, 0, 0)
        yield folder
    finally:
        if root:
            os.setresuid(0, 0, 0)
        folder.chmod(0o755)
        shutil.rmtree(folder)


def last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished run of a very small GPT-2, made by the command line."""
    out = tmp_path_factory.mktemp("run") / "small"
    r = subprocess.run([sys.executable, "-m", "cardc", "train", "cards/gpt2.card", "--preset",
                        "tiny", *SMALL, "--steps", "4", "--batch-size", "2", "--block-size",
                        "17", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return out


# ------------------------------------------------------------------ the command line itself


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out == "cardc 0.1.0\n"


@pytest.mark.parametrize("verb, shown", [
    ("train", ["--seed SEED seed of every random draw: the recipe's seed hyperparameter when "
               "it has one (default: the recipe's, else 1337)",
               "(default: 2000)", "(default: auto)", "(default: the preset's)"]),
    ("sample", ["tokens to add (default: 200)", "(default: 0.8)", "(default: 1337)",
                "(default: a newline)"]),
    ("build", ["output folder (default: generated)"]),
    ("check", ["before the library cardc ships; repeat for more (default: ./cards)"]),
])
def test_help_shows_the_defaults(capsys, verb, shown):
    code, out, _ = run(capsys, verb, "--help")
    assert code == 0
    words = " ".join(out.split())  # as wrapped to any terminal's width
    for text in shown:
        assert text in words


def test_an_unexpected_failure_is_one_line(capsys, monkeypatch):
    import cardc.cli as cli

    def boom(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "cmd_check", boom)
    code, _, err = run(capsys, "check", "cards/gpt2.card")
    assert code == 1
    assert err == ("cardc: internal error: RuntimeError: boom (please report this, with the "
                   "command that caused it)\n")


# ------------------------------------------------------------------ cards that are not files


@pytest.mark.parametrize("verb", ["check", "fmt", "render", "info", "train"])
def test_a_fifo_as_a_card_is_refused_without_blocking(tmp_path, verb):
    fifo = tmp_path / "pipe.card"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "cardc", verb, str(fifo)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.startswith(f"{fifo}: error: cannot read card: not a regular file")


def test_a_device_as_a_card_is_refused(capsys):
    code, _, err = run(capsys, "check", "/dev/zero")
    assert code == 1 and err.startswith("/dev/zero: error: cannot read card: not a regular file")


# ------------------------------------------------------------------ output folders


def test_train_out_naming_a_file(capsys, tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    code, out, err = run(capsys, "train", "cards/gpt2.card", "--preset", "tiny", "--out", str(file))
    assert code == 1 and out == ""
    assert err == f"cardc: error: '{file}' exists and is not a folder\n"
    assert file.read_text() == "mine"


def test_train_out_below_a_file(capsys, tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    code, _, err = run(capsys, "train", "cards/gpt2.card", "--preset", "tiny",
                       "--out", str(file / "run"))
    assert code == 1
    assert err == f"cardc: error: cannot create '{file / 'run'}': '{file}' is not a folder\n"


def test_train_out_holding_other_files(capsys, tmp_path):
    (tmp_path / "thesis.tex").write_text("mine")
    code, _, err = run(capsys, "train", "cards/gpt2.card", "--preset", "tiny", "--out", str(tmp_path))
    assert code == 1
    assert err == (f"cardc: error: '{tmp_path}' holds files that are not a cardc run "
                   "('thesis.tex'); write the run to an empty or new folder\n")
    assert [p.name for p in tmp_path.iterdir()] == ["thesis.tex"]


def test_train_out_in_a_read_only_folder(capsys):
    with read_only_folder() as folder:
        code, _, err = run(capsys, "train", "cards/gpt2.card", "--preset", "tiny",
                           "--out", str(folder / "run"))
    assert code == 1
    assert err == f"cardc: error: cannot write in '{folder}': permission denied\n"


def test_build_out_below_a_file(capsys, tmp_path):
    file = tmp_path / "generated"
    file.write_text("")
    code, _, err = run(capsys, "build", "cards/gpt2.card", "--out", str(file / "sub"))
    assert code == 1
    assert err == f"cardc: error: cannot create '{file / 'sub'}': '{file}' is not a folder\n"


def test_build_into_a_read_only_folder(capsys):
    with read_only_folder() as folder:
        code, _, err = run(capsys, "build", "cards/gpt2.card", "--out", str(folder))
    assert code == 1
    assert err == f"cardc: error: cannot write in '{folder}': permission denied\n"


def _unwritable(monkeypatch):
    """Make every atomic write fail as in a read-only folder (root ignores permissions)."""
    import cardc.atomic as atomic

    def refuse(*args, dir=None, **kwargs):
        raise PermissionError(13, "Permission denied", dir)

    monkeypatch.setattr(atomic.tempfile, "mkstemp", refuse)


def test_fmt_of_a_card_it_cannot_rewrite(capsys, tmp_path, monkeypatch):
    card = tmp_path / "ln.card"
    text = (ROOT / "cards" / "nn" / "layer_norm.card").read_text(encoding="utf-8")
    card.write_text(text.replace("←", "<-"), encoding="utf-8")
    _unwritable(monkeypatch)
    code, out, err = run(capsys, "fmt", str(card))
    assert code == 1 and out == ""
    assert err == f"cardc: error: cannot write '{card}': Permission denied\n"


def test_build_of_a_module_it_cannot_write(capsys, tmp_path, monkeypatch):
    _unwritable(monkeypatch)
    code, _, err = run(capsys, "build", "cards/nn/mlp.card", "cards/gpt2.card",
                       "--out", str(tmp_path))
    assert code == 1
    assert err == f"cardc: error: cannot write '{tmp_path / 'gpt2.py'}': Permission denied\n"


# ------------------------------------------------------------------ sample's flags


@pytest.mark.parametrize("value, message", [
    ("nan", "must be a finite number >= 0, got nan"),
    ("inf", "must be a finite number >= 0, got inf"),
    ("-1", "must be a finite number >= 0, got -1"),
    ("warm", "expected a number, got 'warm'"),
])
def test_sample_temperature(capsys, value, message):
    code, _, err = run(capsys, "sample", "runs/none", "--temperature", value)
    assert code == 2 and last_line(err) == f"cardc: error: argument --temperature: {message}"


@pytest.mark.parametrize("value, message", [
    ("1e9", "expected a whole number, got '1e9'"),
    ("1000000000", "must be between 1 and 100,000, got 1000000000"),
    ("0", "must be between 1 and 100,000, got 0"),
    ("-5", "must be between 1 and 100,000, got -5"),
])
def test_sample_tokens(capsys, value, message):
    code, _, err = run(capsys, "sample", "runs/none", "--tokens", value)
    assert code == 2 and last_line(err) == f"cardc: error: argument --tokens: {message}"


@pytest.mark.parametrize("value", ["nan", "1e999", "0"])
def test_train_lr_not_a_positive_finite_number(capsys, value):
    code, _, err = run(capsys, "train", "cards/gpt2.card", "--lr", value)
    assert code == 2
    assert last_line(err) == f"cardc: error: argument --lr: must be a finite number > 0, got {value}"


def test_sample_prompt_ids_outside_the_vocabulary(capsys, trained):
    code, out, err = run(capsys, "sample", str(trained), "--prompt", "300 1 2", "--tokens", "3")
    assert code == 2 and out == ""
    assert err == ("cardc: error: the prompt's token ID 300 lies outside the model's vocabulary "
                   "(IDs 0 to 255)\n")


def test_sample_prompt_ids_inside_the_vocabulary(capsys, trained):
    code, out, _ = run(capsys, "sample", str(trained), "--prompt", "255 1 2", "--tokens", "3")
    assert code == 0 and len(out.split()) == 3


# ------------------------------------------------------------------ import's config.json


def _hf_folder(folder: Path, **config) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir()
    base = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], vocab_size=300,
                n_positions=64, n_embd=48, n_head=4, n_layer=2, layer_norm_epsilon=1e-5,
                activation_function="gelu_new", tie_word_embeddings=True)
    (folder / "config.json").write_text(json.dumps({**base, **config}))
    save_file({"transformer.wte.weight": torch.zeros(300, 48)}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a model is built: sizes must be refused before any allocation."""
    import cardc.build

    def refuse(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(cardc.build, "build_model", refuse)


@pytest.mark.parametrize("config, message", [
    (dict(n_head=0), "config.json has n_head = 0; the card's H must be a positive whole number: "
                     "the card divides by it"),
    (dict(n_embd=-128), "config.json has n_embd = -128; the card's D must be a whole number"),
    (dict(n_layer=2.5), "config.json has n_layer = 2.5; the card's N must be a whole number"),
    (dict(n_layer=10**6), "config.json's sizes (vocab_size = 300, n_embd = 48, n_head = 4, "
                          "n_layer = 1,000,000, n_positions = 64, n_inner = 192) make "
                          "28,272,017,568 parameters, but the checkpoint holds 14,400 values; "
                          "the config does not describe these weights"),
])
def test_import_refuses_sizes_before_building(capsys, tmp_path, no_model, config, message):
    source = _hf_folder(tmp_path / "hf", **config)
    code, _, err = run(capsys, "import", "cards/gpt2.card", "--from", str(source),
                       "--out", str(tmp_path / "out"))
    assert code == 1 and err == f"cardc: error: {message}\n"
    assert not (tmp_path / "out").exists()


def test_import_refuses_a_config_that_does_not_divide(capsys, tmp_path, no_model):
    source = _hf_folder(tmp_path / "hf", n_head=5)
    code, _, err = run(capsys, "import", "cards/gpt2.card", "--from", str(source),
                       "--out", str(tmp_path / "out"))
    assert code == 1 and err.startswith("cardc: error: config.json") and "d" in err
    assert len(err.splitlines()) == 1


# ------------------------------------------------------------------ training data and size


@pytest.mark.parametrize("data", ["/dev/zero", "tests"])
def test_train_data_that_is_not_a_file(capsys, tmp_path, data):
    code, out, err = run(capsys, "train", "cards/gpt2.card", "--preset", "tiny", "--data", data,
                         "--out", str(tmp_path / "run"))
    assert code == 1 and out == ""
    assert err == f"cardc: error: corpus file '{data}' is not a regular file\n"


def test_train_refuses_a_dataset_no_memory_holds(capsys, tmp_path):
    code, _, err = run(capsys, "train", "cards/gpt2.card", "--preset", "tiny",
                       "--steps", "1000000000", "--out", str(tmp_path / "run"))
    assert code == 1
    assert err == ("cardc: error: 16,000,000,000 examples of 129 tokens are 2,064,000,000,000 "
                   "tokens, more than the 268,435,456 a run holds; ask for fewer updates or "
                   "smaller minibatches\n")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ the sampling window


def test_the_checkpoint_records_the_positions_its_run_trained(trained):
    from cardc.runtime.checkpoint import read_checkpoint

    meta = read_checkpoint(trained)[0]
    assert meta["block_size"] == 17 and meta["context"] == 16  # ℓ − 1 predictions scored
    assert meta["hyperparameters"]["ctx"] == 32


def test_the_sampling_card_reads_only_trained_positions(capsys, trained, monkeypatch):
    """The model's positions are 32 but its run trained 16: the sampling card's window T_max,
    which its card type bounds M's input by, is 16."""
    import cardc.build

    seen = {}
    real = cardc.build.procedure_function

    def spy(checker, alg, model=None):
        fn = real(checker, alg, model)

        def wrapped(x, theta, **hypers):
            seen.update(hypers)
            lengths = []
            forward = theta.forward

            def counting(x, *args, cache=None, **kwargs):
                # the window the card passed: what the cache holds, the new tokens included
                lengths.append(x.shape[-1] if cache is None else cache.tokens.shape[-1])
                return forward(x, *args, cache=cache, **kwargs)

            theta.forward = counting
            try:
                return fn(x, theta, **hypers)
            finally:
                del theta.forward
                seen["lengths"] = lengths
        return wrapped

    monkeypatch.setattr(cardc.build, "procedure_function", spy)
    code, out, _ = run(capsys, "sample", str(trained), "--prompt", "The ", "--tokens", "40")
    assert code == 0 and out.startswith("The ")
    assert seen["T_max"] == 16 and max(seen["lengths"]) == 16


def test_the_built_in_sampler_keeps_its_window():
    import torch

    from cardc.runtime.sample import generate

    class Counting(torch.nn.Module):
        max_seq_len = 32

        def __init__(self):
            super().__init__()
            self.lengths = []

        def forward(self, x, targets=None):
            self.lengths.append(x.shape[-1])
            return torch.zeros(*x.shape, 5)

    model = Counting()
    generate(model, torch.zeros(1, 3, dtype=torch.long), 30, temperature=0, window=16)
    assert max(model.lengths) == 16 and model.lengths[:2] == [3, 4]
    model.lengths.clear()
    generate(model, torch.zeros(1, 3, dtype=torch.long), 40, temperature=0)
    assert max(model.lengths) == 32


@pytest.mark.parametrize("flags, message", [
    (["--stop", ""], "--stop needs a text to stop at, not an empty one"),
    (["--prompt", "1 2", "--stop", " "], "a prompt of token IDs stops at token IDs"),
    (["--prompt", "1 2", "--stop", "a"], "a prompt of token IDs stops at token IDs: give each "
                                         "--stop as integers separated by spaces"),
    (["--set", "p=1.5"], "p = 1.5: the mass of top_p lies in (0, 1]"),
    (["--set", "k=2.5"], "'k' ∈ ℕ is 2.5, not a whole number ≥ 0"),
    (["--top-k", "0"], "argument --top-k: must be >= 1, got 0"),
])
def test_bad_sampling_flags_are_one_line(capsys, trained, flags, message):
    """What --stop, --top-k and --top-p (or --set of the card's k and p) cannot mean is one
    line, exit 2 (1 for a value the card's declaration refuses); a filter flag is never
    dropped in silence (tests/test_train_cli.py)."""
    code, _, err = run(capsys, "sample", str(trained), "--tokens", "2", *flags)
    assert code in (1, 2) and message in last_line(err), err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, card", [
    (["info", "cards/gpt2.card"], "GPT2"),
    (["train", "cards/gpt2.card", "--steps", "1"], "LMTraining"),  # the recipe's presets
    (["train", "cards/paper/dtraining.card"], "DTraining"),
])
def test_a_misspelt_preset_is_the_flags_error(capsys, argv, card):
    """`--preset tinyy` is reported against the flag, with the preset meant, not as an error
    at the card's first line (the card is not at fault)."""
    code, out, err = run(capsys, *argv, "--preset", "tinyy")
    assert code == 1 and out == ""
    assert err.startswith(f"cardc: error: --preset tinyy: '{card}' has no preset 'tinyy'; "
                          "did you mean 'tiny'? (presets: ")
    assert err.count("\n") == 1 and ".card:1:1" not in err


def test_a_misspelt_preset_of_an_import_is_the_flags_error(capsys, tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1,
                                     n_head=2, bos_token_id=None, eos_token_id=None)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "hf")
    capsys.readouterr()  # what transformers said while saving
    code, out, err = run(capsys, "import", "cards/gpt2.card", "--from", str(tmp_path / "hf"),
                         "--out", str(tmp_path / "run"), "--preset", "tinyy")
    assert code == 1 and out == "" and not (tmp_path / "run").exists()
    assert err.startswith("cardc: error: --preset tinyy: 'GPT2' has no preset 'tinyy'; "
                          "did you mean 'tiny'? (presets: "), err
