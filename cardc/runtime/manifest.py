"""Which files of an output folder cardc wrote: the manifest each folder it writes whole holds.

A run, a prepared data folder, a docs site and an exported model each hold MANIFEST, a JSON
object that names the folder's kind and every file cardc wrote there. A name that ends in "/"
names a folder all of whose files cardc writes as it goes (a run's checkpoints/ and tb/). A
folder is replaced only where its manifest, of the same kind, records every file in it: a
file it does not record is someone else's, and nothing of that folder is touched.

The manifest is read like any untrusted file: one that is too large, is not the JSON object
written here, or names another kind records nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cardc.atomic import write_text_atomic

MANIFEST = ".cardc-manifest"
FORMAT = "cardc-manifest"
MAX_BYTES = 1 << 24  # a manifest is read before anything is replaced: bounded


@dataclass(frozen=True)
class Record:
    """What a manifest says: the folder's kind and the paths cardc wrote in it."""

    kind: str
    paths: frozenset[str]

    def owns(self, path: str) -> bool:
        """Whether cardc wrote `path` (relative, '/'-separated): recorded itself, or below a
        recorded folder."""
        parts = path.split("/")
        return path in self.paths or any("/".join(parts[:i]) + "/" in self.paths
                                         for i in range(1, len(parts)))


def write_manifest(folder: Path, kind: str, paths: Iterable[str]) -> None:
    """Record `paths` (relative to `folder`) as what cardc wrote in `folder`, a folder of `kind`."""
    record = {"format": FORMAT, "kind": kind, "files": sorted(set(paths) - {MANIFEST})}
    write_text_atomic(folder / MANIFEST, json.dumps(record, indent=1) + "\n")


def record_all(folder: Path, kind: str) -> None:
    """Record every file now in `folder` (a folder cardc has just written whole)."""
    write_manifest(folder, kind, files_below(folder))


def files_below(folder: Path) -> list[str]:
    """Every entry below `folder` that is not a folder (a link is not followed), as a relative
    '/'-separated path, sorted; the manifest itself left out."""
    found = []
    for top, dirs, files in os.walk(folder):
        rel = Path(top).relative_to(folder)
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]
        dirs[:] = [d for d in dirs if d not in links]
        found += [(rel / name).as_posix() for name in files + links]
    return sorted(p for p in found if p != MANIFEST)


def read_manifest(folder: Path) -> Record | None:
    """The manifest of `folder`, or None where it has none that can be read as one."""
    path = folder / MANIFEST
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_BYTES:
            return None
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or value.get("format") != FORMAT:
        return None
    kind, files = value.get("kind"), value.get("files")
    if not isinstance(kind, str) or not isinstance(files, list) or \
            not all(isinstance(f, str) for f in files):
        return None
    return Record(kind, frozenset(files))


def foreign_file(folder: Path, kind: str) -> str | None:
    """The first file in `folder` that its manifest does not record as written by cardc in a
    folder of `kind` (any file, where it has no such manifest); None where there is none."""
    record = read_manifest(folder)
    files = files_below(folder)
    if record is None and os.path.lexists(folder / MANIFEST):
        files = sorted([*files, MANIFEST])  # not one cardc wrote: someone's file of that name
    if record is not None and record.kind != kind:
        record = None
    return next((p for p in files if record is None or not record.owns(p)), None)
