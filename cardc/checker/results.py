"""What checking a card finds out, as the rest of the compiler reads it: a card's signature,
the types of its expressions and the bindings of its calls; and what the stages ask of the
driver that runs them (`Cards`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from .. import syntax as s
from ..diagnostics import Diagnostics
from ..dims import Dim
from ..library import Library
from ..render.text import render_expr
from ..types import BundleTy, Entry, FamilyTy, Ty

SCALAR = Ty()
MAX_CALL_DEPTH = 32  # cards checking cards recurse; the deepest in cards/ is 5 levels


@dataclass
class Signature:
    """A card as its callers see it, in the card's own symbols."""

    alg: s.Algorithm
    inputs: list[tuple[str, Ty]]
    output: Ty | None
    params: list[tuple[str, Entry]]  # in header order; hyperparameters may appear here too
    hypers: dict[str, Ty]  # ℕ hyperparameters carry value = their symbol
    defaults: dict[str, s.Expr]
    definitions: dict[str, Dim]
    tree: BundleTy  # every parameter, for counting and code generation
    layout: str | None  # "row", "column" or None when the card does not say
    elements: dict[str, FamilyTy] = field(default_factory=dict)  # x_n of a dataset x_{1:N}
    models: dict[str, ModelTy] = field(default_factory=dict)  # cards taken as values (M)
    run: dict[str, RunValue] = field(default_factory=dict)  # the seed, number formats
    more: list[Entry | None] = field(default_factory=list)  # the outputs after the first


@dataclass(frozen=True)
class RunValue:
    """A hyperparameter the run takes and the steps do not: the seed of every random draw
    (`formats` empty) or the number format of the input `of` (one of `formats`)."""

    decl: s.Decl
    formats: tuple[str, ...] = ()
    of: str | None = None
    default: int | str | None = None

    @property
    def seed(self) -> bool:
        return not self.formats


@dataclass
class ModelTy:
    """A card-valued hyperparameter `M ∈ {1..V}^{T} → ℝ^{T×V} for T ≤ T_max`: the signature
    the card bound to it must have; `window` names the hyperparameter bounding its input."""

    input: Ty
    output: Ty
    decl: s.Decl
    window: str | None = None

    def __str__(self) -> str:
        t = self.decl.type
        return f"{render_expr(t.input)} → {render_expr(t.output)}" \
            if isinstance(t, s.CardType) else f"{self.input} → {self.output}"


@dataclass
class CardInfo:
    """What checking a card found out: types of expressions, the signature, call bindings."""

    sig: Signature
    types: dict[int, Ty | Entry] = field(default_factory=dict)
    calls: dict[int, CallInfo] = field(default_factory=dict)


@dataclass
class CallInfo:
    callee: s.Algorithm
    bind: dict[str, Dim]
    lift: tuple[Dim, ...]  # leading dimensions the call is mapped over
    params: dict[str, s.Expr]  # callee parameter name → caller expression
    hypers: dict[str, s.Expr]  # callee hyperparameter → caller expression (or a mask rule)
    outputs: tuple[Entry, ...] = ()  # a card of several outputs: each, lifted as the call is


class CheckError(Exception):
    """Internal: abandons one expression after its diagnostic was recorded."""


class Cards(Protocol):
    """The driver as the stages see it: the library, the diagnostics, every card's results."""

    lib: Library
    diags: Diagnostics
    infos: dict[int, CardInfo]
    bindings: dict[tuple[int, str], s.Algorithm]
    active: set[int]

    def info(self, alg: s.Algorithm) -> CardInfo: ...

    def decls(self, alg: s.Algorithm) -> list[s.Decl]: ...
