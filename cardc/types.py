"""What the checker knows about a value: tensors with symbolic shapes, bundles, families."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from . import syntax as s
from .dims import Dim
from .spelling import display


@dataclass(frozen=True)
class Ty:
    """A tensor (a scalar when the shape is empty). `None` in a shape is a free dimension (1^⊺)."""

    shape: tuple[Dim | None, ...] = ()
    elem: str = "ℝ"  # "ℝ" reals, "ℕ" integers (indices, token IDs), "𝔹" {0,1}
    value: Dim | None = None  # a known integer value: hyperparameters, lengths, loop indices
    init: s.Expr | None = None  # parameters: the declared initial value or distribution
    init_dist: s.Expr | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        if not self.shape:
            return {"ℝ": "ℝ", "ℕ": "ℕ", "𝔹": "{0,1}"}[self.elem]
        base = {"ℝ": "ℝ", "ℕ": "ℕ", "𝔹": "{0,1}"}[self.elem]
        return f"{base}^{{{'×'.join(_dim_text(d) for d in self.shape)}}}"


def _dim_text(d: Dim | None) -> str:
    return "*" if d is None else display(str(d))


@dataclass
class BundleTy:
    """Named parameters passed around as one; `card` is set when adopted from a callee."""

    members: dict[str, Entry] = field(default_factory=dict)
    card: str | None = None

    def __str__(self) -> str:
        return f"parameters of {self.card}" if self.card else "a parameter bundle"


@dataclass
class FamilyTy:
    """`For h ∈ [H]`: one entry per index value; `name` carries the index as a decoration."""

    var: str
    over: Dim
    entry: Entry

    def __str__(self) -> str:
        return f"a family over [{display(str(self.over))}]"


Entry = Ty | BundleTy | FamilyTy


def substitute(entry: Entry, bind: dict[str, Dim]) -> Entry:
    """Rewrite a callee's entry in the caller's symbols."""
    if isinstance(entry, Ty):
        shape = tuple(None if d is None else subst_dim(d, bind) for d in entry.shape)
        value = None if entry.value is None else subst_dim(entry.value, bind)
        return replace(entry, shape=shape, value=value)
    if isinstance(entry, BundleTy):
        return BundleTy({k: substitute(v, bind) for k, v in entry.members.items()}, entry.card)
    return FamilyTy(entry.var, subst_dim(entry.over, bind), substitute(entry.entry, bind))


def subst_dim(d: Dim, bind: dict[str, Dim]) -> Dim:
    total = Dim.const(0)
    for mono, coef in d.terms:
        term = Dim.const(coef)
        for sym, e in mono:
            base = bind.get(sym, Dim.sym(sym))
            for _ in range(abs(e)):
                term = term * base if e > 0 else (term / base or term * Dim.sym(f"1/({base})"))
        total = total + term
    return total
