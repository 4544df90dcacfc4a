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
from ..builtins import CONSTANTS
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


class _Renaming:
    """A renaming of a pattern's names into a card's, grown while their trees are compared."""

    def __init__(self) -> None:
        self.ren: dict[str, str] = {}
        self.used: set[str] = set()

    def name(self, p: str, c: str) -> bool:
        if p in self.ren:
            return self.ren[p] == c
        if c in self.used:
            return False
        self.ren[p] = c
        self.used.add(c)
        return True

    def same(self, p, c) -> bool:
        if type(p) is not type(c):
            return False
        if isinstance(p, tuple):
            return len(p) == len(c) and all(self.same(a, b) for a, b in zip(p, c, strict=True))
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
                        self.name(x, y) for x, y in pairs):
                    return False
            elif not self.same(a, b):
                return False
        return True

    def names(self, a: tuple[str, ...], b: tuple[str, ...]) -> bool:
        return len(a) == len(b) and all(self.name(x, y) for x, y in zip(a, b, strict=True))


def match(pattern: s.Algorithm, card: s.Algorithm) -> dict[str, str] | None:
    """The renaming that turns `pattern` into `card`, or None when their math differs."""
    r = _Renaming()
    if not r.same(pattern.steps, card.steps):
        return None
    # Inputs are positional; parameters are bound by name, so their header order is free.
    if not (r.names(pattern.args, card.args) and r.names(pattern.outputs, card.outputs)):
        return None
    if len(pattern.params) != len(card.params):
        return None
    for x, y in zip(pattern.params, card.params, strict=True):
        if x not in r.ren and not r.name(x, y):  # a bundle, named only in the header
            return None
    return r.ren


def match_computed(pattern: s.Algorithm, card: s.Algorithm) -> dict[str, str] | None:
    """The renaming that turns `pattern` into `card`'s last steps, where the pattern's inputs
    after its first are values the card computes in the steps before those (RoPE's
    frequencies ω, however the card computes them), or None. The caller judges those
    leading steps (`leading`, `computed_from`)."""
    n = len(pattern.steps)
    if len(card.steps) <= n or len(card.args) != 1:
        return None
    r = _Renaming()
    if not r.same(pattern.steps, card.steps[-n:]):
        return None
    if not (r.names(pattern.args[:1], card.args) and r.names(pattern.outputs, card.outputs)):
        return None
    made = assigned(leading(pattern, card))
    if not all(r.ren.get(x) in made for x in pattern.args[1:]):
        return None
    return r.ren


def leading(pattern: s.Algorithm, card: s.Algorithm) -> tuple[s.Step, ...]:
    """The card's steps before those `match_computed` matched to the pattern's."""
    return card.steps[:-len(pattern.steps)]


def assigned(steps: tuple[s.Step, ...]) -> set[str]:
    """The names the steps assign (`ω[i] ← …` assigns ω), loops' bodies included."""
    out: set[str] = set()
    for node in s.nodes(steps):
        if isinstance(node, s.Assign):
            target = node.target.base if isinstance(node.target, s.Index) else node.target
            if isinstance(target, s.Name):
                out.add(target.id)
    return out


def computed_from(steps: tuple[s.Step, ...], allowed: set[str]) -> bool:
    """Whether the steps compute from the names `allowed` alone (hyperparameters), numbers
    and constants: assignments, maps and conditions only, every name they read one of
    those, one they assign, or a loop's variable."""
    bound = assigned(steps) | set(allowed) | set(CONSTANTS)
    for node in s.nodes(steps):
        if isinstance(node, s.Step):
            if not isinstance(node.stmt, s.Assign | s.For | s.ForAll | s.If):
                return False
        elif isinstance(node, s.For):
            if node.style != "map":
                return False
            bound.add(node.var)
        elif isinstance(node, s.ForAll):
            bound.update(node.vars)
        elif isinstance(node, s.Sum):
            bound.add(node.index)
    return all(node.id in bound for node in s.nodes(steps) if isinstance(node, s.Name))


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
