"""A run folder is always one run.

A training run writes into a staging folder beside its destination and renames it into place
when it has finished, or when it writes its first checkpoint (from then on it is a run that
can be resumed, written in place), so the destination holds either the previous run or this
one, never the metrics of one beside the weights of another. A run killed before that leaves
only its staging folder, which the next run into the same destination removes. Every file of a
run records the same run id, which `check_one_run` compares before a checkpoint is used. A
live run holds a lock on its folder's `.lock`, so no other run replaces or resumes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cardc.atomic import pid_alive
from cardc.runtime.errors import RuntimeInputError

METRICS = "metrics.jsonl"
TENSORBOARD = "tb"  # the folder of TensorBoard event files, with `cardc train --tensorboard`
# The files a run writes; a folder holding only these (or nothing) may be replaced by a run.
LOCK = ".lock"
RUN_FILES = frozenset({METRICS, "model.safetensors", "loss.png", TENSORBOARD, LOCK,
                       "tokenizer.json",  # a run that reads other than bytes
                       "checkpoints"})  # a run that saved on the way (runtime.resume)
_STAGING, _OLD = "incomplete", "replaced"


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def _side(dest: Path, kind: str, pid: int) -> Path:
    return dest.parent / f".{dest.name}.{kind}-{pid}"


def _leftovers(dest: Path) -> list[tuple[Path, int]]:
    """Staging and replaced folders beside `dest`, with the process id that made each."""
    found = []
    for kind in (_STAGING, _OLD):
        for path in dest.parent.glob(f".{dest.name}.{kind}-*"):
            pid = path.name.rsplit("-", 1)[1]
            if pid.isdigit():
                found.append((path, int(pid)))
    return found


def remove_stale(dest: Path) -> None:
    """Remove what killed runs into `dest` left beside it (their process is gone)."""
    for path, pid in _leftovers(dest):
        if pid != os.getpid() and not pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)


def interrupted(dest: str | os.PathLike[str]) -> bool:
    """Whether a run into `dest` is under way, or was killed before it finished."""
    dest = Path(dest)
    return dest.parent.is_dir() and any(True for _ in _leftovers(dest))


def check_writable_folder(dest: str | os.PathLike[str]) -> None:
    """Refuse a folder that cannot be created or written, before any work is done."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise RuntimeInputError(f"'{dest}' exists and is not a folder")
    ancestor = next(p for p in [dest, *dest.absolute().parents] if p.exists())
    if not ancestor.is_dir():
        raise RuntimeInputError(f"cannot create '{dest}': '{ancestor}' is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise RuntimeInputError(f"cannot write in '{ancestor}': permission denied")


def check_destination(dest: str | os.PathLike[str]) -> None:
    """Refuse a destination a run cannot be written to, before any work is done."""
    dest = Path(dest)
    check_writable_folder(dest)
    if dest.is_dir():
        if not os.access(dest.absolute().parent, os.W_OK | os.X_OK):
            raise RuntimeInputError(f"cannot replace '{dest}': its folder is not writable")
        others = sorted(p.name for p in dest.iterdir() if p.name not in RUN_FILES)
        if others:
            raise RuntimeInputError(f"'{dest}' holds files that are not a cardc run "
                                    f"('{others[0]}'); write the run to an empty or new folder")
        check_not_running(dest)


def check_not_running(folder: Path) -> None:
    """Refuse a folder a live run is writing (a live run always holds its .lock)."""
    if not (folder / LOCK).is_file():
        return
    fd = _try_lock(folder)
    if fd is None:
        raise RuntimeInputError(f"'{folder}' is being written by a run under way; wait for it "
                                "or stop it first")
    os.close(fd)


def _try_lock(folder: Path) -> int | None:
    """An exclusive lock on `folder`/.lock (held until the descriptor closes, or the process
    ends however it ends), or None while another process holds it."""
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class RunFolder:
    """Where a training run writes: its staging folder until it is published, then its
    destination. It holds the folder's lock (which moves with the folder) while it runs."""

    def __init__(self, dest: Path, path: Path, staged: bool) -> None:
        self.dest, self.path, self.staged = dest, path, staged
        fd = _try_lock(path)
        if fd is None:
            raise RuntimeInputError(f"'{dest}' is being written by a run under way")
        self._lock = fd

    def publish(self) -> None:
        """Put the staged run in the destination's place; it is written there from now on."""
        if self.staged:
            if self.dest.is_dir():
                check_not_running(self.dest)
            publish(self.path, self.dest)
            self.path, self.staged = self.dest, False

    def close(self) -> None:
        """Let go of the folder; its .lock goes too, so a finished run holds only its files."""
        with contextlib.suppress(OSError):
            (self.path / LOCK).unlink()
        os.close(self._lock)


@contextlib.contextmanager
def training_run(dest: str | os.PathLike[str], resume: bool = False) -> Iterator[RunFolder]:
    """The folder a training run writes: staged beside `dest` (as `staged_run`), published when
    the run finishes or asks; or, to resume it, `dest` itself. A run that fails once published
    stays, to be resumed from its checkpoints."""
    dest = Path(dest)
    if resume:
        run = RunFolder(dest, dest, staged=False)
        try:
            yield run
        finally:
            run.close()
        return
    run = RunFolder(dest, _new_staging(dest, check_destination), staged=True)
    try:
        yield run
        run.publish()
    except BaseException:
        if run.staged:
            shutil.rmtree(run.path, ignore_errors=True)
        raise
    finally:
        run.close()


def _new_staging(dest: Path, accept: Callable[[Path], None]) -> Path:
    """An empty staging folder beside `dest`, once `accept` has taken `dest` and what killed
    runs into it left is gone."""
    accept(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(dest)
    staging = _side(dest, _STAGING, os.getpid())
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


@contextlib.contextmanager
def staged_run(dest: str | os.PathLike[str],
               accept: Callable[[Path], None] = check_destination) -> Iterator[Path]:
    """A fresh staging folder beside `dest`, moved into place as `dest` on success and removed
    on failure; leftovers of killed runs into `dest` are removed first. `accept` refuses a
    `dest` that holds something else than what is replaced (a run, by default)."""
    dest = Path(dest)
    staging = _new_staging(dest, accept)
    try:
        yield staging
        publish(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def publish(staging: Path, dest: Path) -> None:
    """Put the finished run in `dest`'s place: the old run moves aside, the new one in, and the
    old one is removed. Killed between the two renames, `dest` is absent, never mixed."""
    old = None
    if dest.is_dir():
        if any(dest.iterdir()):
            old = _side(dest, _OLD, os.getpid())
            shutil.rmtree(old, ignore_errors=True)
            dest.rename(old)
        else:
            dest.rmdir()
    staging.rename(dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def metrics_run(folder: str | os.PathLike[str]) -> tuple[bool, str | None]:
    """Whether `folder` has a metrics.jsonl, and the run id its first record names."""
    path = Path(folder) / METRICS
    if not path.is_file():
        return False, None
    try:
        with path.open(encoding="utf-8") as f:
            first = json.loads(f.readline() or "{}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return True, None
    return True, first.get("run") if isinstance(first, dict) else None


def check_one_run(folder: str | os.PathLike[str], meta: dict[str, Any]) -> None:
    """Refuse a run folder whose metrics and weights come from different runs."""
    if not Path(folder).is_dir():
        return  # a checkpoint file named directly: nothing beside it is read
    present, run = metrics_run(folder)
    if present and run != meta.get("run"):
        raise RuntimeInputError(
            f"'{folder}' mixes two runs: its {METRICS} is from run {run or 'unknown'}, its "
            f"weights from run {meta.get('run') or 'unknown'}; train again into it, or into a "
            "new folder")
