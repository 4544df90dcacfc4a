"""Intrinsics recognised by their math: the pattern cards and the matcher the fusion rules use.

An intrinsic is recognised by its math, not by its name: `patterns.card` writes each one as a
card, and a card matches when its steps are the pattern's up to a renaming of names (so
`LayerNorm(e | γ, β)` written with other letters still matches). Each fused lowering has a
literal twin — the same card lowered step by step — and tests prove the two agree. Which
pattern each fusion rule looks for is declared in its table (cardc.lower.pipeline).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path

from .. import ir
from .. import syntax as s
from ..diagnostics import Diagnostics

_IGNORED = {"span", "var_span", "star", "number", "annotation", "note", "where", "end_number"}
_NAMES = {("Name", "id"), ("Sum", "index"), ("For", "var"), ("ForAll", "vars"),
          ("Return", "name")}


@cache
def patterns() -> dict[str, s.Algorithm]:
    from ..parser import parse_file

    diags = Diagnostics()
    card = parse_file(Path(__file__).with_name("patterns.card"), diags)
    return {alg.name: alg for alg in card.algorithms}


def match(pattern: s.Algorithm, card: s.Algorithm) -> dict[str, str] | None:
    """The renaming that turns `pattern` into `card`, or None when their math differs."""
    ren: dict[str, str] = {}
    used: set[str] = set()

    def name(p: str, c: str) -> bool:
        if p in ren:
            return ren[p] == c
        if c in used:
            return False
        ren[p] = c
        used.add(c)
        return True

    def same(p, c) -> bool:
        if type(p) is not type(c):
            return False
        if isinstance(p, tuple):
            return len(p) == len(c) and all(same(a, b) for a, b in zip(p, c, strict=True))
        if not hasattr(p, "__dataclass_fields__"):
            return p == c
        kind = type(p).__name__
        for f in p.__dataclass_fields__:
            if f in _IGNORED:
                continue
            a, b = getattr(p, f), getattr(c, f)
            if (kind, f) in _NAMES:
                pairs = zip(a, b, strict=True) if isinstance(a, tuple) else [(a, b)]
                if isinstance(a, tuple) and len(a) != len(b):
                    return False
                if (a is None) != (b is None) or a is not None and not all(
                        name(x, y) for x, y in pairs):
                    return False
            elif not same(a, b):
                return False
        return True

    if not same(pattern.steps, card.steps):
        return None
    # Inputs are positional; parameters are bound by name, so their header order is free.
    for a, b in ((pattern.args, card.args), (pattern.outputs, card.outputs)):
        if len(a) != len(b) or not all(name(x, y) for x, y in zip(a, b, strict=True)):
            return None
    if len(pattern.params) != len(card.params):
        return None
    for x, y in zip(pattern.params, card.params, strict=True):
        if x not in ren and not name(x, y):  # a bundle, named only in the header
            return None
    return ren



def matching(card: s.Algorithm, names: Iterable[str]) -> tuple[str, dict[str, str]] | None:
    """The first pattern of `names` that `card` matches, with its renaming."""
    for name in names:
        ren = match(patterns()[name], card)
        if ren is not None:
            return name, ren
    return None


def make_call(func: str, *args: ir.Expr, **kwargs: ir.Expr) -> ir.Call:
    return ir.Call(ir.Ref(func), args, tuple(kwargs.items()))


def make_method(obj: ir.Expr, name: str, *args: ir.Expr, **kwargs: ir.Expr) -> ir.Call:
    return ir.Call(ir.Attr(obj, name), args, tuple(kwargs.items()))
