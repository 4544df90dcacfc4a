"""Atomic file writes, so an interrupted run never leaves a half-written file behind.

A temporary file is named after its target and the process writing it; one whose process is
gone (killed before it could clean up) is removed by the next write of the same target."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a temporary path next to ``path``; move it into place only on success."""
    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    os.makedirs(directory, exist_ok=True)
    prefix = f".{os.path.basename(target)}."
    remove_stale_temporaries(directory, prefix)
    # Same directory as the target so os.replace is a rename, never a cross-device copy.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{prefix}{os.getpid()}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs should be readable like any file
        fsync_path(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_stale_temporaries(directory: str, prefix: str) -> None:
    """Remove `prefix<pid>.*.tmp` files in `directory` whose writing process is gone."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if not (name.startswith(prefix) and name.endswith(".tmp")):
                continue
            pid = name[len(prefix):].split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))


def pid_alive(pid: int) -> bool:
    """Whether a process of this id runs (one we may not signal runs too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file (before its rename, or a crash could leave an empty file under the final
    name) or a folder (after a rename in it, so the rename itself is on disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
