"""Names with indices: W^l_mlp1 splits into its base and its decorations, and e_ℓ is the
member ℓ of the family e_t over t."""

from __future__ import annotations

import re
from functools import lru_cache

_DECOR = re.compile(r"([_^])(\{[^{}]*\}|[^_^{}]+)")


def split_name(name: str) -> tuple[str, list[tuple[str, str]]]:
    base, decor = _split_name(name)
    return base, list(decor)


@lru_cache(maxsize=4096)  # a card's names are split over and over, by checker and lowering
def _split_name(name: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    m = re.match(r"[^_^]+", name)
    base = m.group(0) if m else ""
    return base, tuple((k, v.strip("{}")) for k, v in _DECOR.findall(name[len(base):]))


@lru_cache(maxsize=4096)
def instance(pattern: str, var: str, name: str) -> str | None:
    """The index text of `name` as an instance of family `pattern` over `var` (e_t, e_ℓ → ℓ)."""
    pb, pd = _split_name(pattern)
    nb, nd = _split_name(name)
    if pb != nb or len(pd) != len(nd) or not any(v == var for _, v in pd):
        return None
    found = None
    for (pk, pv), (nk, nv) in zip(pd, nd, strict=False):
        if pk != nk:
            return None
        if pv == var:
            if found is not None and found != nv:
                return None
            found = nv
        elif pv != nv:
            return None
    return found
