"""A run folder is always one run: `cardc train` killed at any point leaves the previous complete
run (or no run, which `cardc sample` says), never one run's metrics beside another's weights,
and the next run removes what the killed one left."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from cardc.atomic import write_text_atomic
from cardc.cli import main
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.manifest import MANIFEST, write_manifest
from cardc.runtime.runs import check_one_run, publish, staged_run

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--set", "D=32", "--set", "H=2", "--set", "D_f=64", "--set", "N=1", "--set", "ctx=32"]
TRAIN = [sys.executable, "-m", "cardc", "train", "cards/gpt2.card", "--preset", "tiny", *SMALL,
         "--batch-size", "2", "--block-size", "17", "--eval-every", "1"]
DEAD_PID = 4_194_305  # above Linux's largest process id: never a running process


def finish(dest: Path, steps: int = 2) -> None:
    """A whole run into `dest`, made in this process: the runs these tests kill are processes
    of their own (kill_when), the ones they finish need not pay for a new interpreter."""
    out, err = io.StringIO(), io.StringIO()
    handler, rng = signal.getsignal(signal.SIGTERM), torch.get_rng_state()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([*TRAIN[TRAIN.index("train"):], "--steps", str(steps), "--out", str(dest)])
    finally:  # what `cardc train` sets for its own process
        signal.signal(signal.SIGTERM, handler)
        torch.set_rng_state(rng)
    assert code == 0, err.getvalue()


def kill_when(dest: Path, ready: Callable[[], bool], sig: int = signal.SIGKILL) -> None:
    """Start a long run into `dest` and kill it with `sig` once `ready()` holds."""
    proc = subprocess.Popen([*TRAIN, "--steps", "2000", "--out", str(dest)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not ready() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        proc.send_signal(sig)
        proc.wait(timeout=120)


def staging(dest: Path) -> list[Path]:
    return sorted(dest.parent.glob(f".{dest.name}.incomplete-*"))


def staged(name: str, records: int = 1) -> Callable[[Path], Callable[[], bool]]:
    """Ready once the run's staging folder holds `name` (metrics.jsonl: `records` lines)."""
    def ready(dest: Path) -> Callable[[], bool]:
        def check() -> bool:
            for folder in staging(dest):
                try:
                    text = (folder / name).read_text() if name else ""
                except OSError:
                    continue
                if not name or text.count("\n") >= records:
                    return True
            return False
        return check
    return ready


def files(folder: Path) -> dict[str, bytes]:
    """A folder's files and their bytes, but for the manifest of what cardc wrote there."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != MANIFEST} \
        if folder.exists() else {}


def sample(capsys, folder: Path) -> tuple[int, str, str]:
    code = main(["sample", str(folder), "--tokens", "4", "--prompt", "ab"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished run, which tests copy before they change it."""
    dest = tmp_path_factory.mktemp("finished") / "run"
    finish(dest)
    return dest


def test_a_killed_run_leaves_the_previous_run_whole(finished, tmp_path, capsys):
    dest = Path(shutil.copytree(finished, tmp_path / "run"))
    before = files(dest)
    assert set(before) == {"metrics.jsonl", "model.safetensors", "loss.png"}
    points = [lambda d: lambda: True,  # while it starts
              staged(""),  # its staging folder made
              staged("metrics.jsonl"),  # the first record written
              staged("metrics.jsonl", records=3)]  # three updates in
    for point in points:
        kill_when(dest, point(dest))
        assert files(dest) == before  # the previous run, untouched
        code, out, _ = sample(capsys, dest)
        assert code == 0 and out.startswith("ab")
    finish(dest)
    after = files(dest)
    assert set(after) == set(before) and after["model.safetensors"] != before["model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no staging folder left beside
    assert sample(capsys, dest)[0] == 0


def test_a_run_killed_before_it_finished_is_no_run(tmp_path, capsys):
    dest = tmp_path / "run"
    kill_when(dest, staged("metrics.jsonl", records=2)(dest))
    assert not dest.exists() and staging(dest)
    code, _, err = sample(capsys, dest)
    assert code == 1
    assert err == (f"cardc: error: '{dest}' holds no finished run: a run into it is under way "
                   "or was stopped before it finished\n")
    finish(dest)
    assert not staging(dest) and sample(capsys, dest)[0] == 0


def test_a_terminated_run_leaves_a_run_to_resume_and_nothing_else(tmp_path):
    """SIGTERM once it has begun to record: a checkpoint, published in the run's place (to be
    resumed, tests/test_resume.py), and no staging folder beside it."""
    dest = tmp_path / "run"
    kill_when(dest, staged("metrics.jsonl")(dest), signal.SIGTERM)
    assert list(tmp_path.iterdir()) == [dest]
    assert (dest / "checkpoints").is_dir() and not (dest / "model.safetensors").exists()


def test_sample_refuses_a_folder_mixing_two_runs(finished, tmp_path, capsys):
    dest = Path(shutil.copytree(finished, tmp_path / "run"))
    lines = (dest / "metrics.jsonl").read_text().splitlines()
    other = [json.dumps({**json.loads(x), "run": "0123456789abcdef"}) for x in lines]
    (dest / "metrics.jsonl").write_text("\n".join(other) + "\n")
    from cardc.runtime.checkpoint import read_checkpoint

    run = read_checkpoint(dest)[0]["run"]
    code, out, err = sample(capsys, dest)
    assert code == 1 and out == ""
    assert err == (f"cardc: error: '{dest}' mixes two runs: its metrics.jsonl is from run "
                   f"0123456789abcdef, its weights from run {run}; train again into it, or "
                   "into a new folder\n")


def test_a_new_run_replaces_every_file_of_the_old(tmp_path):
    """Files of an old run the new one does not write are gone with it (loss.png of a run
    that had one, beside a run that has not yet written its own)."""
    dest = tmp_path / "run"
    dest.mkdir()
    (dest / "metrics.jsonl").write_text('{"run": "old"}\n')
    (dest / "loss.png").write_bytes(b"old")
    write_manifest(dest, "run", ["metrics.jsonl", "loss.png"])  # as the old run recorded them
    with staged_run(dest) as folder:
        (folder / "model.safetensors").write_bytes(b"new")
        assert files(dest)["loss.png"] == b"old"  # the old run stays whole until the end
    assert files(dest) == {"model.safetensors": b"new"}


def test_a_failed_run_leaves_the_old_one(tmp_path):
    dest = tmp_path / "run"
    dest.mkdir()
    (dest / "model.safetensors").write_bytes(b"old")
    write_manifest(dest, "run", ["model.safetensors"])
    with pytest.raises(KeyboardInterrupt), staged_run(dest) as folder:
        (folder / "model.safetensors").write_bytes(b"new")
        raise KeyboardInterrupt
    assert files(dest) == {"model.safetensors": b"old"}
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_killed_between_the_renames_the_folder_is_absent_not_mixed(tmp_path, monkeypatch):
    dest, new = tmp_path / "run", tmp_path / "new"
    for folder, what in ((dest, b"old"), (new, b"new")):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(what)
    real = Path.rename
    calls = []

    def rename(self, target):
        calls.append(self)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as if killed here
        return real(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        publish(new, dest)
    assert not dest.exists()


def test_check_one_run_accepts_a_checkpoint_named_directly(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"run": "a"}\n')
    check_one_run(tmp_path / "model.safetensors", {"run": "b"})  # nothing beside it is read
    with pytest.raises(RuntimeInputError, match="mixes two runs"):
        check_one_run(tmp_path, {"run": "b"})


def test_a_write_removes_temporaries_of_dead_writers_only(tmp_path):
    target = tmp_path / "metrics.jsonl"
    dead = tmp_path / f".metrics.jsonl.{DEAD_PID}.x1y2.tmp"
    live = tmp_path / f".metrics.jsonl.{os.getppid()}.x1y2.tmp"  # a writer still running
    other = tmp_path / f".loss.png.{DEAD_PID}.x1y2.tmp"  # another target's: not this write's
    for p in (dead, live, other):
        p.write_text("partial")
    write_text_atomic(target, "done\n")
    assert target.read_text() == "done\n"
    assert not dead.exists() and live.exists() and other.exists()


def test_staging_left_by_a_dead_run_is_removed_and_a_live_ones_kept(tmp_path):
    dest = tmp_path / "run"
    dead = tmp_path / f".run.incomplete-{DEAD_PID}"
    live = tmp_path / f".run.incomplete-{os.getppid()}"
    for p in (dead, live):
        p.mkdir()
        (p / "metrics.jsonl").write_text("{}\n")
    with staged_run(dest) as folder:
        (folder / "model.safetensors").write_bytes(b"x")
    assert not dead.exists() and live.exists() and files(dest) == {"model.safetensors": b"x"}
