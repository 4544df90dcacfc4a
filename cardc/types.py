"""What the checker knows about a value: tensors with symbolic shapes, bundles, families,
sets of indices and values written as functions of parameters."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction

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
    vocab: Dim | None = None  # token IDs (a token, a sequence): the size of their vocabulary
    pad: str | None = None  # an embedding matrix: the hyperparameter naming its padding row

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

    def same_kind(self, other: BundleTy) -> bool:
        """Bundles of one card (or one structure); an empty bundle is not inferred yet."""
        if self is other or not self.members or not other.members:
            return True
        if self.card and other.card:
            return self.card == other.card
        return list(self.members) == list(other.members)


@dataclass
class FamilyTy:
    """`For h ∈ [H]`: one entry per index value; `name` carries the index as a decoration."""

    var: str
    over: Dim
    entry: Entry

    def __str__(self) -> str:
        return f"a family over [{display(str(self.over))}]"


@dataclass(frozen=True)
class SetTy:
    """A set of indices drawn from [of]: `{t ∈ [ℓ] : …}`."""

    of: Dim

    def __str__(self) -> str:
        return f"a subset of [{display(str(self.of))}]"


@dataclass(frozen=True)
class FuncTy:
    """`P(θ) ← …`: a value written as a function of the named parameters."""

    params: tuple[str, ...]
    result: Entry

    def __str__(self) -> str:
        return f"a function of {', '.join(display(p) for p in self.params)}"


Entry = Ty | BundleTy | FamilyTy | SetTy | FuncTy


def substitute(entry: Entry, bind: dict[str, Dim]) -> Entry:
    """Rewrite a callee's entry in the caller's symbols."""
    return _substitute(entry, bind, {})


def _substitute(entry: Entry, bind: dict[str, Dim], done: dict[Dim, Dim]) -> Entry:
    """substitute(), each distinct dimension rewritten once (`done`): a bundle's shapes repeat
    a few sizes many times over."""
    def dim(d: Dim) -> Dim:
        out = done.get(d)
        if out is None:
            out = done[d] = subst_dim(d, bind)
        return out

    if isinstance(entry, Ty):
        shape = tuple(None if d is None else dim(d) for d in entry.shape)
        value = None if entry.value is None else dim(entry.value)
        vocab = None if entry.vocab is None else dim(entry.vocab)
        return replace(entry, shape=shape, value=value, vocab=vocab)
    if isinstance(entry, BundleTy):
        return BundleTy({k: _substitute(v, bind, done) for k, v in entry.members.items()},
                        entry.card)
    if isinstance(entry, SetTy):
        return SetTy(dim(entry.of))
    if isinstance(entry, FuncTy):
        return FuncTy(entry.params, _substitute(entry.result, bind, done))
    return FamilyTy(entry.var, dim(entry.over), _substitute(entry.entry, bind, done))


def subst_dim(d: Dim, bind: dict[str, Dim]) -> Dim:
    if not any(sym in bind for mono, _ in d.terms for sym, _ in mono):
        return d  # already canonical: rebuilding it would give it back
    total: Dim | None = None
    for mono, coef in d.terms:
        # a product commutes: the symbols left as they are go in at once, the bound ones after
        term = Dim.of({tuple((s, e) for s, e in mono if s not in bind): Fraction(coef)})
        for sym, e in mono:
            base = bind.get(sym)
            if base is None:
                continue
            for _ in range(abs(e)):
                term = term * base if e > 0 else (term / base or term * Dim.sym(f"1/({base})"))
        total = term if total is None else total + term  # 0 + term is term, canonical
    return total if total is not None else Dim.const(0)
