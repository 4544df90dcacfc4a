"""A run folder is always one run.

A training run writes into a staging folder beside its destination and renames it into place
when it has finished, or when it writes its first checkpoint (from then on it is a run that
can be resumed, written in place), so the destination holds either the previous run or this
one, never the metrics of one beside the weights of another. A run killed before that leaves
only its staging folder, which the next run into the same destination removes. Every file of a
run records the same run id, which `check_one_run` compares before a checkpoint is used. A
live run holds a lock on its folder's `.lock`, so no other run replaces or resumes it.

Every folder written this way (a run, and a data folder, a docs site or an exported model,
which are staged alike) records what cardc wrote in it (runtime.manifest), and replaces only a
folder of its kind that holds nothing else: a folder that merely looks like cardc's output is
refused, untouched. A destination that is a link to a folder is written through: the folder
it names is replaced, the link stays.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cardc.atomic import pid_alive
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.manifest import foreign_file, record_all, write_manifest

METRICS = "metrics.jsonl"
TENSORBOARD = "tb"  # the folder of TensorBoard event files, with `cardc train --tensorboard`
LOCK = ".lock"
# What a training run writes as it goes, recorded before it writes any (runtime.manifest); a
# name ending in "/" is a folder of the run's own.
RUN_FILES = frozenset({METRICS, "model.safetensors", "loss.png", f"{TENSORBOARD}/", LOCK,
                       "tokenizer.json",  # a run that reads other than bytes
                       "checkpoints/"})  # a run that saved on the way (runtime.resume)
RUN = "run"  # the kind of folder a training run or an import writes
# Each kind of folder as a message names it, and names what is written to it.
KINDS = {RUN: ("a cardc run", "the run"), "data": ("a prepared data folder", "it"),
         "docs": ("a cardc docs site", "the site"),
         "export": ("a model folder cardc exported", "the model")}
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


def real_folder(dest: str | os.PathLike[str]) -> Path:
    """Where writing `dest` writes: the folder a link names (so the link is kept), else `dest`."""
    dest = Path(dest)
    return Path(os.path.realpath(dest)) if dest.is_symlink() else dest


def check_destination(dest: str | os.PathLike[str], kind: str = RUN) -> None:
    """Refuse a destination a folder of `kind` cannot be written to, before any work is done:
    one that cannot be written, or that holds a file cardc did not write there as a folder of
    this kind (runtime.manifest), named in the message."""
    real = real_folder(dest)
    check_writable_folder(real)
    if real.is_dir():
        if not os.access(real.absolute().parent, os.W_OK | os.X_OK):
            raise RuntimeInputError(f"cannot replace '{dest}': its folder is not writable")
        other = foreign_file(real, kind)
        if other is not None:
            what, it = KINDS[kind]
            raise RuntimeInputError(f"'{dest}' holds files that are not {what} ('{other}'); "
                                    f"write {it} to an empty or new folder")
        check_not_running(real)


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
        write_manifest(path, RUN, RUN_FILES)  # before the run writes anything there

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
    dest = real_folder(dest)
    if resume:
        run = RunFolder(dest, dest, staged=False)
        try:
            yield run
        finally:
            run.close()
        return
    run = RunFolder(dest, _new_staging(dest, RUN), staged=True)
    try:
        yield run
        run.publish()
    except BaseException:
        if run.staged:
            shutil.rmtree(run.path, ignore_errors=True)
        raise
    finally:
        run.close()


def _new_staging(dest: Path, kind: str) -> Path:
    """An empty staging folder beside `dest` (a real folder, not a link), once `dest` may be
    replaced by a folder of `kind` and what killed runs into it left is gone."""
    check_destination(dest, kind)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(dest)
    staging = _side(dest, _STAGING, os.getpid())
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


@contextlib.contextmanager
def staged_run(dest: str | os.PathLike[str], kind: str = RUN) -> Iterator[Path]:
    """A fresh staging folder beside `dest`, moved into place as `dest` on success, with a
    manifest of every file in it, and removed on failure; leftovers of killed runs into `dest`
    are removed first. A `dest` that holds anything but a folder of `kind` cardc wrote is
    refused (check_destination)."""
    dest = real_folder(dest)
    staging = _new_staging(dest, kind)
    try:
        yield staging
        record_all(staging, kind)
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
