"""Lowering of one card's steps and expressions into IR statements: `Body`.

A Body is its state (cardc.lower.state: what a loop's steps share of it, declared per field)
and its parts, one module each: statements and loops, procedures (training and inference
cards), expressions, indexing, calls. Every part dispatches the one way this module does: by
the node's class name (`stmt_For`, `expr_BinOp`), and a kind no part handles is a located
error that names it. At each hook (card, step, loop, call, expression) the Body asks the
fusion rules of cardc.lower.pipeline first, with one call. Every method returns IR built from
the checked card: shapes come from the checker's types, never re-derived here.
"""

from __future__ import annotations

from typing import Any, NoReturn

from .. import ir
from .. import syntax as s
from ..checker import CallInfo
from ..dims import Dim
from ..namecheck import card_identifiers
from ..spelling import display
from ..types import Ty, subst_dim
from .attention import record_literal
from .calls import Calls
from .expressions import Expressions
from .indexing import Indexing
from .pipeline import first
from .procedures import Procedures
from .recurrence import Recurrences
from .state import BodyState
from .statements import Statements
from .values import LowerError, Val, dim_expr, local_name, shape_text


class Body(Statements, Recurrences, Procedures, Expressions, Indexing, Calls, BodyState):
    """Lowers the steps of `alg` in `scope`; `dim_of` maps a dimension symbol to Python."""

    # ------------------------------------------------------------------ helpers
    def fail(self, node, message: str, hint: str | None = None):
        raise LowerError(node.span, message, hint)

    def line(self, node) -> str:
        return f"{self.file.path.rsplit('/', 1)[-1]}:{node.span.line}"

    def note(self, node, val: Val | None = None, text: str | None = None) -> ir.Note:
        shape = shape_text(val, self.lead, self.defined) if val is not None else None
        return ir.Note(shape or None, self.line(node), text)

    def ty(self, e: s.Expr) -> Ty:
        ty = self.info.types.get(id(e))
        return ty if isinstance(ty, Ty) else Ty()

    def dim(self, d: Dim) -> ir.Expr:
        if d in self.defined:
            return self.dim_of(self.defined[d])
        return dim_expr(d, self.dim_of)

    def size(self, e: s.Expr) -> Dim:
        """The dimension an expression such as ℓ or L_enc stands for."""
        return subst_dim(self.low.dim_value(self.alg, e), self.bound)

    def dim_text(self, d: Dim) -> str:
        return display(self.defined.get(d, str(d))).replace("?", "")

    def emit(self, st: ir.Stmt) -> None:
        self.out.append(st)

    def child(self) -> Body:
        """A body for a loop's steps: each field as cardc.lower.state declares it."""
        return Body(**self.handed_down())

    def fresh(self, name: str, avoid: frozenset[str] = frozenset()) -> str:
        taken = {n for st in self.out if isinstance(st, ir.Assign) for n in st.targets}
        taken |= {local_name(n) for n in self.scope.values} | avoid
        while name in taken:
            name += "_"
        return name

    def loop_var(self, var: str) -> str:
        """A loop variable's Python name: none that a name of the card takes (ℓ ← length(x)
        and `for l = …` both spell `l`), so the loop never overwrites a card's value."""
        return self.fresh(local_name(var), self.low.walk(self.alg, card_identifiers))

    # ------------------------------------------------------------------ fusion hooks
    # One call per hook: the recognisers of cardc.lower.pipeline, asked in order.
    def fuse_card(self) -> list[ir.Stmt] | None:
        """The whole card in one piece, or None: its steps one by one."""
        return first(self.low.pipeline.card, self)

    def fuse_step(self, step: s.Step) -> bool:
        """Whether `step` needs no lowering of its own (it was lowered with another)."""
        return bool(first(self.low.pipeline.step, self, step))

    def fuse_loop(self, st: s.For, step: s.Step) -> bool:
        return bool(first(self.low.pipeline.loop, self, st, step))

    def fuse_recurrence(self, st: s.For, step: s.Step) -> bool:
        return bool(first(self.low.pipeline.recurrence, self, st, step))

    def fuse_call(self, e: s.Call, call: CallInfo) -> ir.Expr | None:
        return first(self.low.pipeline.call, self, e, call)

    def fuse_expr(self, e: s.Expr) -> Val | None:
        return first(self.low.pipeline.expression, self, e)

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, prefix: str, node: Any, what: str, *args: Any) -> Any:
        """`self.<prefix>_<node's class>(node, *args)`; a kind no part handles is an error
        at `args[0]` (the step) or the node, naming the kind: a refusal of the card, located."""

        def missing(node: Any) -> NoReturn:
            kind = type(node).__name__.lower()
            self.fail(args[0] if args else node,
                      f"code generation does not handle '{kind}' {what} yet")

        return s.dispatch(self, prefix, node, *args, missing=missing)

    def run(self) -> list[ir.Stmt]:
        for step in self.alg.steps:
            if not self.fuse_step(step):
                record_literal(self, step)  # an attention core no rule lowered: its masks
                self.step(step)
        return self.out

    def step(self, step: s.Step) -> None:
        self.at_step = step
        for text in step.comments:
            self.emit(ir.Comment(text))
        self.dispatch("stmt", step.stmt, "steps", step)

    def expr(self, e: s.Expr) -> Val:
        if id(e) in self.given:  # computed already, for every head at once (cardc.lower.heads)
            return self.given[id(e)]
        fused = self.fuse_expr(e)
        if fused is not None:
            return fused
        return self.dispatch("expr", e, "expressions")
