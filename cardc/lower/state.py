"""The state of one card's lowering (`cardc.lower.steps.Body`), declared once.

Each field says what a nested body, the lowering of a loop's steps (`Body.child()`), gets of it:

- SHARED: the same object (or value): what the loop's steps add, the card's steps see;
- COPIED: a copy: what the loop's steps add stays theirs (its loop variables);
- FRESH: the field's default: the loop's steps start without it (their own statements).

Fields that follow from the card (`file`, `defined`, `column`, `bound`) are computed again.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from .. import ir
from .. import syntax as s
from ..checker import CardInfo
from ..dims import Dim
from ..types import Ty
from .body import bound_sizes
from .context import Lowerer
from .values import Scope, Val

SHARED, COPIED, FRESH = "shared", "copied", "fresh"


def _field(child: str, default: Any = MISSING, factory: Any = MISSING) -> Any:
    return field(default=default, default_factory=factory, metadata={"child": child})


def _derived() -> Any:
    return field(init=False, metadata={"child": FRESH})


@dataclass(eq=False, repr=False)
class BodyState:
    """What lowering a card's steps reads and records, and what a loop's steps share of it."""

    low: Lowerer = _field(SHARED)
    alg: s.Algorithm = _field(SHARED)
    info: CardInfo = _field(SHARED)
    scope: Scope = _field(SHARED)
    dim_of: Callable[[str], ir.Expr] = _field(SHARED)  # a dimension symbol in Python
    lead: str = _field(SHARED)  # how batch axes read in shape comments: "B" or "…"
    device: ir.Expr | None = _field(SHARED, None)
    dtype: ir.Expr | None = _field(SHARED, None)  # the card's reals': its first real input's
    runtime_used: set[str] = _field(SHARED, factory=set)  # sizes read off the inputs
    max_seq_len: ir.Expr | None = _field(SHARED, None)
    training: ir.Expr | None = _field(SHARED, None)  # in a module: whether it trains (dropout)
    procedure: bool = _field(SHARED, False)  # a training or inference card: loops run
    datasets: dict[str, tuple[str, str, Ty]] = _field(SHARED, factory=dict)  # x_n → (list, n, type)
    prologue: list[ir.Stmt] = _field(SHARED, factory=list)  # set up once, before the steps
    sets: dict[str, Val] = _field(SHARED, factory=dict)  # T̃ ← {t ∈ [ℓ] : …}: the values of t
    ranged: dict[str, Val] = _field(SHARED, factory=dict)  # Σ_{t=a}^{b}: t as every value
    decoded: set[str] = _field(SHARED, factory=set)  # P ← M(x | θ̂) with a KV cache: P's last row
    hooks: set[str] = _field(SHARED, factory=set)  # the caller's functions the steps call: "stop"
    updates: list[s.Step] = _field(SHARED, factory=list)  # the parameter updates lowered so far
    # each loop over a dataset's examples: its updates per example (None: not a fixed number)
    visits: list[int | None] = _field(SHARED, factory=list)
    loop_index: dict[str, ir.Expr] = _field(COPIED, factory=dict)  # loop variables, 0-based
    merged: frozenset[str] = _field(FRESH, frozenset())  # inputs holding every head's columns
    out: list[ir.Stmt] = _field(FRESH, factory=list)
    sum_axis: tuple[str, Dim] | None = _field(FRESH, None)  # Σ_i: the index and its range
    point: dict[str, tuple[int, int, Dim]] = _field(FRESH, factory=dict)  # ∀: var → (axis, rank, size)
    returned: Val | None = _field(FRESH, None)
    positions: tuple[str, Dim] | None = _field(FRESH, None)  # in a map over positions: t, ℓ
    domain: Val | None = _field(FRESH, None)  # the values of t in `T̃ ← {t ∈ [ℓ] : …}`
    # Σ_u over a family's members: u, and how many there are (None: a family over positions)
    family_vars: dict[str, Dim | None] = _field(FRESH, factory=dict)
    given: dict[int, Val] = _field(FRESH, factory=dict)  # values lowered beforehand (SDPA)
    uses_cache: bool = _field(FRESH, False)  # an attention core reads the KV cache
    recorded: set[int] = _field(FRESH, factory=set)  # attention cores recorded: their score steps' ids
    drawn: str | None = _field(FRESH, None)  # the token a sample step of these steps draws
    at_step: s.Step | None = _field(FRESH, None)  # the step being lowered
    file: Any = _derived()
    defined: dict[Dim, str] = _derived()  # D/H → d: sizes by the names that define them
    column: bool = _derived()  # a column-major card: matrices that are not parameters flip
    bound: dict[str, Dim] = _derived()  # ℓ ← length(x): ℓ is |x|

    def __post_init__(self) -> None:
        self.file = self.low.lib.file_of(self.alg)
        self.defined = {d: name for name, d in self.info.sig.definitions.items()}
        self.column = self.info.sig.layout == "column"
        self.bound = bound_sizes(self.alg, self.info)
        for name, d in self.bound.items():
            self.defined.setdefault(d, name)

    def handed_down(self) -> dict[str, Any]:
        """The fields a nested body is made with, as each field declares."""
        out = {}
        for f in fields(BodyState):
            how = f.metadata["child"]
            if f.init and how != FRESH:
                value = getattr(self, f.name)
                out[f.name] = copy.copy(value) if how == COPIED else value
        return out
