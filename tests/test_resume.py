"""Checkpoints on the way and exact resume: a run killed (SIGKILL) or stopped (SIGINT, SIGTERM)
midway and resumed ends bit for bit where the uninterrupted run ends."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from cardc.runtime.checkpoint import read_checkpoint
from cardc.runtime.resume import CHECKPOINTS, STATE_NAME, snapshots

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--set", "D=32", "--set", "H=2", "--set", "D_f=64", "--set", "N=1", "--set", "ctx=32"]
# Ten updates between evaluations and checkpoints; a run long enough to be stopped midway.
RUN = ["train", "cards/gpt2.card", "--preset", "tiny", *SMALL, "--steps", "40",
       "--eval-every", "10", "--save-every", "10", "--batch-size", "4", "--block-size", "16"]
CURVE = ("step", "train_loss", "val_loss", "card_loss", "lr")  # what the clock does not change


def cardc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cardc", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cardc", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path.name}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {path} after {timeout}s"
        time.sleep(0.05)


def curve(run: Path) -> list[tuple]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [tuple(json.loads(line)[k] for k in CURVE) for line in lines]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "model.safetensors")


# Checkpoints every 5 updates, the newest 3 kept: where to save changes neither the curve nor
# the weights (the resumed runs, saving every 10, end as this one).
KEEP = ["--save-every", "5", "--keep-checkpoints", "3"]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """The run nothing interrupts."""
    out = tmp_path_factory.mktemp("whole") / "run"
    r = cardc(*RUN, *KEEP, "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def assert_same_run(resumed: Path, whole: Path) -> None:
    assert curve(resumed) == curve(whole)
    a, b = weights(resumed), weights(whole)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_killed_midway_resumes_bit_exactly(whole, tmp_path):
    """SIGKILL after the checkpoint of update 20 (and possibly further updates, whose records
    are dropped): the resumed run's loss curve and final weights are the uninterrupted run's."""
    out = tmp_path / "run"
    proc = start(*RUN, "--out", str(out))
    wait_for(out / CHECKPOINTS / "step-0000020" / STATE_NAME, proc)
    proc.kill()
    proc.communicate()
    assert not (out / "model.safetensors").exists()
    r = cardc(*RUN, "--out", str(out), "--resume", str(out))
    assert r.returncode == 0, r.stderr
    assert "(update 20 of" in r.stdout or "(update 30 of" in r.stdout
    assert_same_run(out, whole)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_run_saves_where_it_stopped_and_resumes(whole, tmp_path, sig, code):
    """Ctrl-C or `kill`: a checkpoint of the update under way, the command that resumes, and
    the exit status of the signal; resuming ends as the uninterrupted run."""
    out = tmp_path / "run"
    proc = start(*RUN, "--out", str(out))
    wait_for(out / CHECKPOINTS / "step-0000010" / STATE_NAME, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert f"stopped by {signal.Signals(sig).name} after update" in err
    assert "resume with: cardc train" in err and f"--resume {out}" in err
    stopped_at = int(err.split("after update ")[1].split(";")[0])
    assert snapshots(out)[-1].name == f"step-{stopped_at:07d}"
    r = cardc(*RUN, "--out", str(out), "--resume", str(out))
    assert r.returncode == 0, r.stderr
    assert_same_run(out, whole)


def test_the_newest_checkpoints_are_kept(whole):
    # The last update is model.safetensors itself, not a checkpoint too.
    assert [p.name for p in snapshots(whole)] == ["step-0000025", "step-0000030", "step-0000035"]
    from cardc.runtime.checkpoint import read_checkpoint

    meta, _ = read_checkpoint(snapshots(whole)[-1])
    assert meta["update"] == 35 and meta["context"] == 15  # samples as a run of its own


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    """A run killed after its checkpoint of update 10."""
    out = tmp_path_factory.mktemp("killed") / "run"
    proc = start(*RUN, "--out", str(out))
    wait_for(out / CHECKPOINTS / "step-0000010" / STATE_NAME, proc)
    proc.kill()
    proc.communicate()
    for later in snapshots(out)[1:]:  # the kill may land after a later one
        shutil.rmtree(later)
    return out


@pytest.fixture
def stopped(killed, tmp_path) -> Path:
    """A copy of the killed run, for a test to change."""
    return Path(shutil.copytree(killed, tmp_path / "run"))


def test_resume_refuses_other_settings_naming_the_first(stopped, cli):
    r = cli(*RUN, "--lr", "0.01", "--out", str(stopped), "--resume", str(stopped))
    assert r.returncode == 1
    assert "it was trained with recipe_values.eta = 0.001, this run has 0.01" in r.stderr
    r = cli(*RUN, "--seed", "7", "--resume", str(stopped))
    assert r.returncode == 1 and "seed = 1337, this run has 7" in r.stderr
    r = cli(*RUN, "--precision", "float32", "--resume", str(stopped))
    assert r.returncode == 1 and 'precision = "bf16", this run has "float32"' in r.stderr


def test_an_unfinished_run_points_to_its_checkpoint(stopped, cli):
    r = cli("sample", str(stopped), "--tokens", "5")
    assert r.returncode == 1
    assert "has not finished; resume it" in r.stderr and "step-0000010" in r.stderr


@pytest.mark.parametrize("damage, message", [
    ("truncate", "is not a valid checkpoint state"),
    ("settings", "optimizer setting betas = 'x'"),
    ("shape", "of shape (3,), for a parameter of shape"),
])
def test_a_damaged_checkpoint_state_is_one_clear_error(stopped, damage, message, cli):
    """The state file is untrusted input: each kind of damage is one line, no traceback."""
    file = snapshots(stopped)[-1] / STATE_NAME
    if damage == "truncate":
        file.write_bytes(file.read_bytes()[:100])
    else:
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as f:
            meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        state = json.loads(meta["cardc_state"])
        if damage == "settings":
            state["param_groups"][0]["betas"] = "x"
        else:
            tensors[next(k for k in tensors if k.endswith("exp_avg"))] = torch.zeros(3)
        save_file(tensors, str(file), metadata={"cardc_state": json.dumps(state)})
    r = cli(*RUN, "--out", str(stopped), "--resume", str(stopped))
    assert r.returncode == 1, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_resume_and_its_flags_refuse_what_cannot_be_resumed(whole, tmp_path, cli):
    r = cli(*RUN, "--resume", str(whole))
    assert r.returncode == 2 and "the run has finished" in r.stderr and "--finetune" in r.stderr
    r = cli(*RUN, "--resume", str(whole), "--finetune", str(whole))
    assert r.returncode == 2 and "give one" in r.stderr
    r = cli(*RUN, "--resume", str(whole), "--out", str(tmp_path / "elsewhere"))
    assert r.returncode == 2 and "in the run's own folder" in r.stderr
    r = cli(*RUN, "--resume", str(tmp_path))
    assert r.returncode == 2 and "saved no checkpoint" in r.stderr


def test_finetune_starts_from_a_checkpoint_folder(whole, tmp_path):
    """One of a run's checkpoints is weights to start a new run from."""
    first = snapshots(whole)[0]
    r = cardc(*RUN, "--steps", "0", "--finetune", str(first), "--out", str(tmp_path / "ft"))
    assert r.returncode == 0, r.stderr
    a, b = weights(tmp_path / "ft"), load_file(first / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_live_run_is_neither_replaced_nor_resumed(tmp_path):
    """Its folder's lock refuses a second run into it while it runs."""
    from cardc.runtime.errors import RuntimeInputError
    from cardc.runtime.runs import check_destination, training_run

    dest = tmp_path / "run"
    with training_run(dest) as folder:
        folder.publish()
        with pytest.raises(RuntimeInputError, match="being written by a run under way"):
            check_destination(dest)
        with pytest.raises(RuntimeInputError, match="being written by a run under way"), \
                training_run(dest, resume=True):
            pass
    check_destination(dest)  # free once it has finished


def test_generated_training_skips_the_updates_a_checkpoint_holds():
    """`start` answers how many updates were made: the loop skips them without reading data
    (a dataset of None entries would fail if read)."""
    from cardc.build import checked, find_card, procedure_function

    card = "cards/paper/dtraining.card"
    lib, checker, _ = checked([str(ROOT / card)], str(ROOT / "cards"))
    fn = procedure_function(checker, find_card(lib, checker, str(ROOT / card), None))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(5, 5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.w[x], dim=-1)  # (B, ℓ, N_V)

    data = [None] * 3 + [torch.tensor([1, 2, 3])] * 2
    told, given = [], []
    fn(data, Model(), N_epochs=1, eta=0.1, report=lambda loss, lr: told.append(loss),
       start=lambda opt: given.append(opt) or 3)
    assert len(told) == 2 and isinstance(given[0], torch.optim.SGD)


def test_two_uninterrupted_runs_are_bit_identical_on_a_busy_machine(whole, tmp_path):
    """The same command and seed, run again while every CPU is busy with other work: the same
    loss curve and the same weights, bit for bit, and the thread count recorded."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(os.cpu_count() or 1)]
    try:
        r = cardc(*RUN, *KEEP, "--out", str(tmp_path / "again"))
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
    assert r.returncode == 0, r.stderr
    assert_same_run(tmp_path / "again", whole)
    threads = read_checkpoint(whole)[0]["threads"]
    assert read_checkpoint(tmp_path / "again")[0]["threads"] == threads >= 1


def test_a_run_computes_with_its_own_thread_count_whatever_the_caller_set(whole, cli, tmp_path):
    """A run in a process whose torch was set to another thread count (as a caller, or a
    machine's load through a library's choice, may set it) computes with the count the run
    fixes, and ends as the run in a fresh process; the caller's count is set back after."""
    from cardc.runtime.train import DEFAULT_THREADS

    other = 1 if DEFAULT_THREADS > 1 else 2
    before = torch.get_num_threads()
    torch.set_num_threads(other)
    try:
        r = cli(*RUN, *KEEP, "--out", str(tmp_path / "run"))
        assert r.returncode == 0, r.stderr
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(before)
    assert_same_run(tmp_path / "run", whole)
