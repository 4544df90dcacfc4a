"""What the parts of the lowering ask of one another, as protocols, so that they import one
another one way: values ← context ← intrinsics ← the fusion rules (attention, sdpa_heads,
heads, norms, rotary, gelu, grouped), decoding, gradients ← pipeline; context ← body (the
vocabulary of a card's steps) ← state ← the body's parts (statements, procedures, expressions,
indexing, calls) ← steps (`Body`); parameters, steps ← cards; analysis (what is recorded with a
model) ← sdpa_heads, calls, cards.

`Lowerer` is what lowering a card's steps asks of the whole lowering (cardc.lower.cards);
`Steps` is what a fusion rule (or the lowering of gradients) asks of the lowering of one card's
steps (cardc.lower.steps).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .. import ir
from .. import syntax as s
from ..checker import CallInfo, CardInfo, Checker
from ..dims import Dim
from ..types import Ty
from .values import Scope, Val


class Lowerer(Protocol):
    checker: Checker
    decoder: bool  # the model is a causal language model: attention reads a KV cache
    pipeline: Any  # cardc.lower.pipeline.Pipeline: the fusion rules by hook, the passes
    masking: Any  # cardc.lower.analysis.Masking: how each attention masks, reads a cache
    mask_sites: int  # attention masks made through shared_mask so far
    program: ir.Program
    lib: Any
    passed_sizes: dict[str, list[str]]  # a function's sizes no argument's shape tells

    def walk(self, alg: s.Algorithm, find: Callable[..., Any], *args: Any) -> Any: ...

    def function(self, alg: s.Algorithm, merged: frozenset[str] = frozenset()) -> str: ...

    def decodes(self, alg: s.Algorithm) -> bool: ...

    def dim_value(self, alg: s.Algorithm, e: s.Expr) -> Dim: ...

    def flat_tensors(self, entry: Any) -> list[tuple[str, Ty]]: ...

    def tensor_hypers(self, alg: s.Algorithm) -> list[str]: ...


class Steps(Protocol):
    low: Lowerer
    alg: s.Algorithm
    info: CardInfo
    scope: Scope
    out: list[ir.Stmt]
    dim_of: Callable[[str], ir.Expr]
    lead: str
    merged: frozenset[str]
    column: bool
    procedure: bool  # a training or inference card
    given: dict[int, Val]
    point: dict[str, tuple[int, int, Dim]]
    ranged: dict[str, Val]
    sum_axis: tuple[str, Dim] | None  # Σ_i: the index and its range
    uses_cache: bool
    recorded: set[int]  # attention cores recorded (cardc.lower.analysis): their score steps' ids
    at_step: s.Step | None  # the step being lowered

    def expr(self, e: s.Expr) -> Val: ...

    def on_number(self, func: str, x: Val) -> Val: ...

    def fail(self, node: Any, message: str, hint: str | None = None) -> Any: ...

    @staticmethod
    def is_model(val: Any) -> bool: ...

    def step(self, step: s.Step) -> None: ...

    def emit(self, st: ir.Stmt) -> None: ...

    def note(self, node: Any, val: Val | None = None, text: str | None = None) -> ir.Note: ...

    def ty(self, e: s.Expr) -> Ty: ...

    def dim(self, d: Dim) -> ir.Expr: ...

    def dim_text(self, d: Dim) -> str: ...

    def size(self, e: s.Expr) -> Dim: ...

    def fresh(self, name: str, avoid: frozenset[str] = frozenset()) -> str: ...

    def mask_rule(self, call: CallInfo, name: str, rule: s.Arg) -> Val: ...

    def hyper_value(self, call: CallInfo, name: str, given: s.Expr) -> ir.Expr: ...

    def module_for(self, e: s.Call, call: CallInfo) -> ir.Expr | None: ...
