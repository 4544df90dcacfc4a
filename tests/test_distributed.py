"""Training on two CPU processes under torchrun (DDP, and FSDP, over gloo): the same updates as
one process with the same minibatch, and a stopped two-process run resumes exactly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cardc.runtime.distributed import Shard, World, world_from_env
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.resume import CHECKPOINTS, STATE_NAME

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--set", "D=32", "--set", "H=2", "--set", "D_f=64", "--set", "N=1", "--set", "ctx=32"]
RUN = ["train", "cards/gpt2.card", "--preset", "tiny", *SMALL, "--steps", "30",
       "--eval-every", "10", "--save-every", "10", "--batch-size", "4", "--block-size", "16"]
LOSSES = ("train_loss", "val_loss", "card_loss")


def cardc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cardc", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--standalone", "-m", "cardc", *args]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def stop_after_first_checkpoint(command: list[str], out: Path) -> None:
    """Start a run that checkpoints every 10 updates, SIGTERM it once the first is written,
    and check that it stopped unfinished."""
    import time

    proc = subprocess.Popen(command, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    state = out / CHECKPOINTS / "step-0000010" / STATE_NAME
    deadline = time.monotonic() + 240
    while not state.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert not (out / "model.safetensors").exists()


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one") / "run"
    r = cardc(*RUN, "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def double(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("two") / "run"
    r = subprocess.run(torchrun(*RUN, "--out", str(out)), cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("val loss") == 1  # rank 0 alone speaks
    return out


def test_two_processes_make_the_updates_of_one(single, double):
    """Each process reads half of every minibatch; DDP averages their gradients."""
    one, two = records(single), records(double)
    assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 10, 20, 30]
    for a, b in zip(one, two, strict=True):
        for key in LOSSES:
            assert (a[key] is None) == (b[key] is None)
            if a[key] is not None:
                assert abs(a[key] - b[key]) <= 1e-5, (a["step"], key, a[key], b[key])
    assert {r["world_size"] for r in two} == {2} and {r["world_size"] for r in one} == {1}
    w1, w2 = load_file(single / "model.safetensors"), load_file(double / "model.safetensors")
    # AdamW divides by √v̂: gradients equal to float rounding move weights by up to ~1e-5.
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) <= 1e-4
    from cardc.runtime.checkpoint import read_checkpoint

    assert read_checkpoint(double)[0]["world_size"] == 2


def test_a_stopped_two_process_run_resumes_exactly(double, tmp_path):
    """SIGTERM to torchrun reaches both processes; they stop at one update, rank 0 saves both
    processes' generators, and the resumed run ends as the uninterrupted one."""
    out = tmp_path / "run"
    stop_after_first_checkpoint(torchrun(*RUN, "--out", str(out)), out)
    r = subprocess.run(torchrun(*RUN, "--out", str(out), "--resume", str(out)), cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    keys = ("step", *LOSSES)
    assert [[x[k] for k in keys] for x in records(out)] == \
        [[x[k] for k in keys] for x in records(double)]
    a, b = load_file(out / "model.safetensors"), load_file(double / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resuming_with_another_number_of_processes_is_refused(double, tmp_path, cli):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(double, run)
    (run / "model.safetensors").unlink()  # as if it had stopped after its checkpoint
    r = cli(*RUN, "--resume", str(run))
    assert r.returncode == 1
    assert "world_size = 2, this run has 1" in r.stderr


def test_a_shard_reads_every_nth_example():
    data = list(range(12))
    shards = [Shard(data, World(rank, 3)) for rank in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4]
    # A minibatch of B′ = 2 per process: together, examples 2·3·i … 2·3·(i+1) − 1.
    assert sorted(x for s in shards for x in s[2:4]) == list(range(6, 12))
    assert shards[1][-1] == 10
    with pytest.raises(IndexError):
        shards[0][4]


def test_the_world_comes_from_torchruns_environment():
    assert world_from_env({}) == World()
    launched = world_from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert launched == World(1, 2, 1, launched=True) and launched.distributed
    alone = world_from_env({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    assert alone.launched and not alone.distributed and alone.main
    for bad in ({"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "x", "WORLD_SIZE": "2"}):
        with pytest.raises(RuntimeInputError):
            world_from_env(bad)


def test_fsdp_outside_torchrun_is_refused(tmp_path, cli):
    """One line, before anything is written."""
    r = cli(*RUN, "--fsdp", "--out", str(tmp_path / "a"))
    assert r.returncode == 1 and "run under torchrun" in r.stderr
    assert not (tmp_path / "a").exists()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sharded") / "run"
    r = subprocess.run(torchrun(*RUN, "--fsdp", "--out", str(out)), cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_two_sharded_processes_make_the_updates_of_one(single, sharded):
    """FSDP: each process keeps half of every parameter and reads half of every minibatch;
    the gradients are reduced and scattered to the halves. The same bounds as DDP's."""
    one, two = records(single), records(sharded)
    assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 10, 20, 30]
    for a, b in zip(one, two, strict=True):
        for key in LOSSES:
            if a[key] is not None:
                assert abs(a[key] - b[key]) <= 1e-5, (a["step"], key, a[key], b[key])
    w1, w2 = load_file(single / "model.safetensors"), load_file(sharded / "model.safetensors")
    assert w1.keys() == w2.keys()
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) <= 1e-4


def test_a_stopped_sharded_run_resumes_exactly(sharded, tmp_path):
    """The gathered checkpoint restores into the shards, weights and optimizer state: the
    resumed run ends as the uninterrupted one."""
    out = tmp_path / "run"
    stop_after_first_checkpoint(torchrun(*RUN, "--fsdp", "--out", str(out)), out)
    r = subprocess.run(torchrun(*RUN, "--fsdp", "--out", str(out), "--resume", str(out)),
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    keys = ("step", *LOSSES)
    assert [[x[k] for k in keys] for x in records(out)] == \
        [[x[k] for k in keys] for x in records(sharded)]
    a, b = load_file(out / "model.safetensors"), load_file(sharded / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


SHARDED_AGAINST_PLAIN = """
import copy, sys, tempfile
import torch
import torch.distributed as dist
from cardc.build import build_model, checked, find_card, procedure_function, recipe_for
from cardc.runtime.distributed import shard
from cardc.runtime.train import compiled

lib, checker, _ = checked(["cards/gpt2.card"], "cards")
card = find_card(lib, checker, "cards/gpt2.card", None)
train = procedure_function(checker, recipe_for(lib, checker, card, True))
with tempfile.NamedTemporaryFile() as f:
    dist.init_process_group("gloo", init_method=f"file://{f.name}", rank=0, world_size=1)
    torch.manual_seed(0)
    plain = build_model("cards/gpt2.card", "tiny", {"D": 32, "H": 2, "D_f": 64, "N": 2, "ctx": 32})
    sharded = shard(copy.deepcopy(plain))
    theta = compiled(sharded) if "--compile" in sys.argv else sharded
    data = list(torch.randint(0, 256, (12, 17), generator=torch.Generator().manual_seed(1)))
    hp = dict(N_steps=3, B=4, l=17, eta=1e-3, eta_min=1e-4, N_warmup=1, beta_1=0.9,
              beta_2=0.95, lambda_=0.1, c=1.0)
    for model in (plain, theta):
        train(data, model, **hp)
    whole = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
    print(max((v - whole[k]).abs().max().item() for k, v in plain.state_dict().items()))
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("flags, bound", [((), 0.0), (("--compile",), 5e-5)])
def test_the_training_card_updates_a_sharded_model_as_a_plain_one(flags, bound):
    """The library's training card on a model FSDP shards (one process: every shard) updates
    it as the plain model: exactly, and compiled to the rounding of inductor's kernels. Its
    step `g ← ∇loss(θ)` empties θ's gradients after the forward, when FSDP has the root's
    gathered copies registered in place of its shards: those kept their gradients, and the
    next update added them in (4e-4 off after three updates, compiled too). In a process of
    its own: the process group is global."""
    r = subprocess.run([sys.executable, "-c", SHARDED_AGAINST_PLAIN, *flags], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.split()[-1]) <= bound
