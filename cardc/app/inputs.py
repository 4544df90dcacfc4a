"""What a caller hands the application, checked: card files, library folders and
`NAME=VALUE` hyperparameters. A bad one raises `UsageError`, which the command line reports
as a usage error (exit 2); values are named as their flags spell them, so one message serves
both. Imports no torch, and little else: `cardc check` uses it too."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..library import card_paths, library_roots
from ..names import identifier

DEFAULT_SEED = 1337  # a run's seed when neither its recipe nor --seed gives one

Overrides = Mapping[str, float] | Sequence[str]  # {name: value}, or "NAME=VALUE" as --set


class UsageError(Exception):
    """An argument the caller can fix: a missing card file, flags that contradict, a value out
    of range."""


def require_cards(paths: Sequence[str]) -> list[Path]:
    """The card files `paths` name (folders: the cards below them), every one present."""
    found = card_paths(list(paths))
    missing = [str(p) for p in found if not p.exists()]
    if missing:
        raise UsageError(f"no such card file: {missing[0]}")
    if not found:
        raise UsageError(f"no .card files under {', '.join(paths)}")
    return found


def library_folders(library: Sequence[str] | None, paths: list[str]) -> list[str]:
    """The library folders a verb searches after the cards' own: `library` (--library), in
    order, else the cards/ folder each card lives in; the shipped library comes after either."""
    for folder in library or []:
        if not Path(folder).is_dir():
            raise UsageError(f"--library {folder}: no such folder")
    return library_roots(paths, list(library) if library is not None else None)


def set_pairs(overrides: Overrides) -> list[str]:
    """Overrides as `--set` takes them, `NAME=VALUE`, whichever way they were given."""
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, Mapping):
        return [f"{name}={value}" for name, value in overrides.items()]
    return list(overrides)


def parse_overrides(pairs: Sequence[str]) -> dict[str, float]:
    """`NAME=NUMBER` pairs by name."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            out[name.strip()] = float(value) if sep else float("nan")
        except ValueError:
            raise UsageError(f"expected NAME=NUMBER, got '{pair}'") from None
        if not sep:
            raise UsageError(f"expected NAME=NUMBER, got '{pair}'")
    return out


def set_flags(pairs: Sequence[str]) -> dict[str, str]:
    """Each `--set NAME=VALUE` as typed, by the name it sets: errors name the flag."""
    return {pair.partition("=")[0].strip(): f"--set {pair}" for pair in pairs}


def typed(sig, names: list[str], values: dict[str, float]) -> dict[str, int | float]:
    """Hyperparameter values by Python name, whole numbers for ℕ: a generated function's
    keyword arguments."""
    return {identifier(n): int(values[n]) if sig.hypers[n].elem == "ℕ" else float(values[n])
            for n in names}


def shown_path(path: str) -> str:
    """A path relative to the working directory when it lies below it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel

