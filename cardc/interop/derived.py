"""Hyperparameters read from the structure of config.json rather than from a number in it:
`{"count": KEY}` is how many entries the object or list at KEY holds (a classifier's class
count is the number of labels in `id2label`). Import counts them; export writes KEY back with
that many entries: those an import recorded (a classifier's own label names), where it holds
that many, else numbered from 0 and named as transformers names labels it was not told
(`LABEL_0`, …); so config → hyperparameters → config gives the same count, and for an imported
checkpoint the same entries. No torch here."""

from __future__ import annotations

from typing import Any

from ..runtime.errors import RuntimeInputError

COUNT = "count"  # the key of a hyperparameter's spec in a mapping file
MAX_ENTRIES = 1_000_000  # entries export writes: more classes than any model has


def counted(value: Any, key: str, what: str) -> int:
    """The number of entries of config.json's `key`, an object or a list."""
    if not isinstance(value, (dict, list)):
        raise RuntimeInputError(f"config.json has {key} = {value!r} ({what} counts its entries); "
                                "expected an object or a list")
    return len(value)


def entries(n: Any, key: str, what: str, kept: Any = None) -> Any:
    """`key`'s value for `n` entries: `kept` (what an import read) where it holds n, else
    {"0": "LABEL_0", …}."""
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not float(n).is_integer() or \
            not 0 <= n <= MAX_ENTRIES:
        raise RuntimeInputError(f"cannot write {key} for {what} = {n!r}: its entries are a "
                                f"whole number from 0 to {MAX_ENTRIES:,}")
    if holds(kept, n):
        return kept
    return {str(i): f"LABEL_{i}" for i in range(int(n))}


def holds(entries: Any, n: Any) -> bool:
    """Whether `entries` is an object or a list of n entries."""
    return isinstance(entries, (dict, list)) and len(entries) == n
