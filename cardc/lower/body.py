"""Lowering of one card's steps and expressions into IR statements.

Dispatch is by node kind (`expr_BinOp`, `stmt_For`, …). Every method returns IR built from
the checked card: shapes come from the checker's types, never re-derived here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .. import ir
from .. import syntax as s
from ..builtins import SPECIAL_TOKENS as TOKENS_AFTER
from ..builtins import TORCH
from ..checker import CONSTANTS, DROPOUT, FILTERS, PAIRWISE, CallInfo, CardInfo, expr_dim, instance
from ..dims import Dim
from ..namecheck import card_identifiers
from ..spelling import display
from ..types import BundleTy, FamilyTy, Ty, subst_dim
from .attention import find_cores, prepare
from .context import Lowerer
from .gradients import current, gradient_step, listed, norm, take_over
from .heads import vectorise
from .values import (
    Family,
    Gradient,
    LowerError,
    ModuleSlot,
    Scope,
    Val,
    attr_name,
    dim_expr,
    local_name,
    num_lit,
    shape_text,
)

ELEMENTWISE = TORCH  # builtin → the torch function it lowers to
SPECIAL_TOKENS = {name: after + 1 for name, after in TOKENS_AFTER.items()}  # 0-based: N_V − k
COMPARE = {"≤": "<=", "<": "<", "≥": ">=", ">": ">", "=": "==", "≠": "!=", "∧": "&"}


def _call(func: str, *args: ir.Expr, **kwargs: ir.Expr) -> ir.Call:
    return ir.Call(ir.Ref(func), args, tuple(kwargs.items()))


def _method(obj: ir.Expr, name: str, *args: ir.Expr, **kwargs: ir.Expr) -> ir.Call:
    return ir.Call(ir.Attr(obj, name), args, tuple(kwargs.items()))


def _log_of(code: ir.Expr) -> ir.Expr | None:
    """log of softmax(z), or of entries picked from it: log_softmax(z), picked alike (one
    kernel, and no log of an underflowed 0)."""
    if isinstance(code, ir.Call) and code.func == ir.Ref("torch.softmax"):
        return ir.Call(ir.Ref("torch.log_softmax"), code.args, code.kwargs)
    if isinstance(code, ir.Sub):
        inner = _log_of(code.obj)
        return None if inner is None else ir.Sub(inner, code.items)
    if isinstance(code, ir.Call) and isinstance(code.func, ir.Attr) and code.func.name == "gather":
        inner = _log_of(code.func.obj)
        return None if inner is None else ir.Call(ir.Attr(inner, "gather"), code.args, code.kwargs)
    return None


def _int(n: int) -> ir.Lit:
    return ir.Lit(str(n))


def _mT(code: ir.Expr) -> ir.Expr:
    return ir.Attr(code, "mT")


def _varies(x: Val) -> bool:
    """Whether a value is more than one number: batched, mapped over positions, or shaped."""
    return x.lifted or bool(x.rows) or bool(x.ty.shape)


def _like(x: Val, code: ir.Expr, ty: Ty | None = None) -> Val:
    """`code` computed elementwise from `x`: same layout, batch and position axes."""
    return replace(x, code=code, ty=ty if ty is not None else x.ty)


def bound_sizes(alg: s.Algorithm, info: CardInfo) -> dict[str, Dim]:
    """Sizes that steps name: `ℓ ← length(x)` binds ℓ to the length of x."""
    out: dict[str, Dim] = {}

    def visit(steps) -> None:
        for step in steps:
            st = step.stmt
            if isinstance(st, s.Assign) and isinstance(st.target, s.Name):
                ty = info.types.get(id(st.value))
                if isinstance(ty, Ty) and ty.value is not None:
                    out[st.target.id] = ty.value
            visit(getattr(st, "body", ()) if isinstance(getattr(st, "body", ()), tuple) else ())

    visit(alg.steps)
    return out


def _linear_bias(a: Val, b: Val) -> bool:
    return isinstance(a.code, ir.Call) and a.code.func == ir.Ref("F.linear") and \
        len(a.code.args) == 2 and a.flipped and b.flipped and not b.lifted and not b.rows and \
        len(b.ty.shape) == 2 and b.ty.shape[1] is None


def _names_in(node) -> list[str]:
    return [n.id for n in s.nodes(node) if isinstance(n, s.Name)]


def _dec(code: ir.Expr) -> ir.Expr:
    """A 1-based index made 0-based, its integer constants folded: `ℓ + (i + 1) − 1 − 1` is
    `ℓ + i − 1`."""
    return _shift(code, -1)


def _whole(code: ir.Expr) -> ir.Expr:
    """A slice bound in whole numbers: `d/2` of a card is a size, so Python's `d // 2` (a
    float bound such as `d / 2` cannot index)."""
    if not isinstance(code, ir.Bin) or code.op not in "+-*/":
        return code
    op = "//" if code.op == "/" else code.op
    return ir.Bin(op, _whole(code.left), _whole(code.right))


def _shift(code: ir.Expr, offset: int) -> ir.Expr:
    """`code + offset` with the integer constants of its sums folded into one."""
    terms: list[tuple[int, ir.Expr]] = []
    constant, literals = offset, 0

    def collect(e: ir.Expr, sign: int) -> None:
        nonlocal constant, literals
        if isinstance(e, ir.Bin) and e.op in "+-":
            collect(e.left, sign)
            collect(e.right, sign if e.op == "+" else -sign)
        elif isinstance(e, ir.Lit) and e.text.lstrip("-").isdigit():
            constant += sign * int(e.text)
            literals += 1
        else:
            terms.append((sign, e))

    collect(code, 1)
    if offset == 0 and literals < 2:
        return code  # nothing to fold
    if not terms:  # a constant index: `3 − 1` is 2
        return _int(constant)
    if terms[0][0] < 0:
        return ir.Bin("-", code, _int(-offset)) if offset < 0 else \
            ir.Bin("+", code, _int(offset)) if offset else code
    out = terms[0][1]
    for sign, e in terms[1:]:
        out = ir.Bin("+" if sign > 0 else "-", out, e)
    if constant:
        out = ir.Bin("+" if constant > 0 else "-", out, _int(abs(constant)))
    return out


def _is_all(item) -> bool:
    return isinstance(item, s.Slice) and item.lo is None and item.hi is None


def _is_ones_row(e: s.Expr) -> bool:
    """`1^⊺`, the row of ones that broadcasts a column vector: `b 1^⊺`."""
    return isinstance(e, s.Transpose) and isinstance(e.operand, s.Num) and e.operand.text == "1"


class Body:
    """Lowers the steps of `alg` in `scope`; `dim` maps a dimension symbol to Python."""

    def __init__(self, lowering: Lowerer, alg: s.Algorithm, info: CardInfo, scope: Scope,
                 dim: Callable[[str], ir.Expr], lead: str):
        self.low = lowering
        self.alg = alg
        self.info = info
        self.scope = scope
        self.dim_of = dim
        self.lead = lead  # how batch axes read in shape comments: "B" or "…"
        self.merged: frozenset[str] = frozenset()  # inputs whose columns are every head's (heads)
        self.file = lowering.lib.file_of(alg)
        self.out: list[ir.Stmt] = []
        self.sum_axis: tuple[str, Dim] | None = None  # Σ_i: the index and its range
        self.point: dict[str, tuple[int, int, Dim]] = {}  # ∀ / mask rules: var → (axis, rank, size)
        self.loop_index: dict[str, ir.Expr] = {}  # loop variables as 0-based Python ints
        self.device: ir.Expr | None = None
        self.returned: Val | None = None
        self.max_seq_len: ir.Expr | None = None
        self.runtime_used: set[str] = set()
        self.defined = {d: name for name, d in info.sig.definitions.items()}  # D/H → d
        self.column = info.sig.layout == "column"  # matrices that are not parameters flip
        self.bound = bound_sizes(alg, info)  # ℓ ← length(x): ℓ is |x|
        for name, d in self.bound.items():
            self.defined.setdefault(d, name)
        self.positions: tuple[str, Dim] | None = None  # inside a map over positions: t, ℓ
        self.ranged: dict[str, Val] = {}  # Σ_{t=a}^{b}, {t ∈ [ℓ] : …}: t as every value at once
        self.procedure = False  # a training or inference card: loops run, models are arguments
        self.datasets: dict[str, tuple[str, str, Ty]] = {}  # x_n → (list, index n, type)
        self.prologue: list[ir.Stmt] = []  # set up once, before the steps (an optimizer)
        self.domain: Val | None = None  # the values of t in `T̃ ← {t ∈ [ℓ] : …}`
        self.family_vars: set[str] = set()  # Σ_u over a family's members: u
        self.sets: dict[str, Val] = {}  # T̃ ← {t ∈ [ℓ] : …}: the values t ranges over
        self.decoded: set[str] = set()  # P ← M(x | θ̂) decoded with a KV cache: P's last row
        self.buffers: list[ir.Buffer] = []  # constants the module computes once (RoPE's ω)
        self.given: dict[int, Val] = {}  # values of expressions lowered beforehand
        self.uses_cache = False  # an attention core reads the KV cache (cardc.lower.attention)
        self.drawn: str | None = None  # the token a sample step of these steps draws (y)
        self.hooks: set[str] = set()  # the caller's functions the steps call: "stop"
        self.at_step: s.Step | None = None  # the step being lowered
        self.training: ir.Expr | None = None  # in a module: whether it trains (dropout acts)

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
        """A body for a loop's steps: same card, scope and device; its own statements."""
        body = Body(self.low, self.alg, self.info, self.scope, self.dim_of, self.lead)
        body.device, body.runtime_used, body.loop_index = self.device, self.runtime_used, \
            dict(self.loop_index)
        body.max_seq_len = self.max_seq_len
        body.procedure, body.datasets, body.sets = self.procedure, self.datasets, self.sets
        body.prologue, body.ranged, body.decoded = self.prologue, self.ranged, self.decoded
        body.hooks, body.training = self.hooks, self.training
        return body

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

    # ------------------------------------------------------------------ steps
    def run(self) -> list[ir.Stmt]:
        cores = find_cores(self.alg, set(self.info.sig.hypers)) \
            if self.low.fuse and not self.column else []
        waiting = {id(st) for core in cores for st in core.waiting}
        for step in self.alg.steps:
            if id(step) in waiting:
                continue  # lowered with the step that reads softmax(S) V
            core = next((c for c in cores if c.reader is step), None)
            if core is not None:
                prepare(self, core)
            self.step(step)
        return self.out

    def step(self, step: s.Step) -> None:
        self.at_step = step
        for text in step.comments:
            self.emit(ir.Comment(text))
        kind = type(step.stmt).__name__
        method = getattr(self, "stmt_" + kind, None)
        if method is None:
            self.fail(step, f"code generation does not handle '{kind.lower()}' steps yet")
        method(step.stmt, step)

    def stmt_Assign(self, st: s.Assign, step: s.Step) -> None:
        if self.procedure and isinstance(st.target, s.Call):  # P(θ) ← …: P, a function of θ
            st = replace(st, target=s.Name(st.target.func, span=st.target.span))
        if self.procedure and gradient_step(self, st, step):  # g ← ∇loss(θ), g ← g · s
            return
        if self.procedure and isinstance(st.target, s.Name) and \
                self.is_model(self.scope.values.get(st.target.id)):
            if self.update(st, step):
                return
            self.fail(st, "code generation updates parameters as 'θ ← θ − η · ∇loss(θ)' or "
                          "'θ ← AdamW(θ, ∇loss(θ) | η, β_1, β_2, λ)'",
                      hint="a gradient named before, 'g ← ∇loss(θ)', takes the place of "
                           "∇loss(θ): 'θ ← AdamW(θ, g | η)'")
        if isinstance(st.value, s.SetBuilder) and isinstance(st.target, s.Name):
            self.sets[st.target.id] = self.arange_of(st.value.var, st.value.domain, step)
            self.domain = self.sets[st.target.id]
        if isinstance(st.target, s.Index) and self.assign_part(st.target, st.value, step):
            return
        if not isinstance(st.target, s.Name):
            self.fail(st.target, "code generation handles assignments to a name only here",
                      hint="assign the whole value, e.g. 'X ← …'")
        if self.decode(st, step):
            return
        val = self.expr(st.value)
        family = self.family_of(st.target.id)
        if family is not None:
            family.flipped = val.flipped
            self.emit(ir.Assign((), _method(ir.Ref(family.local), "append", val.code),
                                self.note(step, val, display(st.target.id))))
            return
        name = local_name(st.target.id)
        if val.code != ir.Ref(name):  # `ℓ ← length(x)` where ℓ is already read off x
            self.emit(ir.Assign((name,), val.code, self.note(step, val)))
        self.scope.values[st.target.id] = _like(val, ir.Ref(name))

    def assign_part(self, target: s.Index, value: s.Expr, step: s.Step) -> bool:
        """`Y[:, a : b] ← v` (or a strided part, `Y[:, 1, 3, …, d − 1] ← v`) where Y already
        holds a value: Y with that part replaced, computed as a new tensor (`slice_scatter`),
        so gradients reach both v and the entries of Y that are kept."""
        old = self.scope.values.get(target.base.id) if isinstance(target.base, s.Name) else None
        if not isinstance(old, Val) or old.rows or self.family_of(target.base.id) is not None:
            return False
        parts = [(k, i) for k, i in enumerate(target.items) if not _is_all(i)]
        if len(parts) != 1 or not isinstance(parts[0][1], s.Slice | s.Progression):
            self.fail(target, "code generation replaces one range of one axis at a time",
                      hint="write 'Y[:, a : b] ← …' with ':' for every other axis")
        k, item = parts[0]
        part = self.slice(item, old, k) if isinstance(item, s.Slice) else \
            self.progression(item, old, k)
        val = self.expr(value)
        src = _mT(val.code) if val.flipped != old.flipped and len(val.ty.shape) == 2 else val.code
        index = (ir.Ref("..."),) + tuple(
            part if j == old.axis(k) else ir.SliceX(None, None) for j in range(old.axis(k), 0))
        if val.lifted != old.lifted or len(val.ty.shape) != len(old.ty.shape):  # broadcast
            src = ir.Bin("+", _call("torch.zeros_like", ir.Sub(old.code, index)), src)
        kwargs = {"dim": _int(old.axis(k))}
        for key, bound in (("start", part.lo), ("end", part.hi), ("step", part.step)):
            if bound is not None:
                kwargs[key] = bound
        name = local_name(target.base.id)
        code = _method(old.code, "slice_scatter", src, **kwargs)
        self.emit(ir.Assign((name,), code, self.note(step, old)))
        self.scope.values[target.base.id] = _like(old, ir.Ref(name))
        return True

    def decode(self, st: s.Assign, step: s.Step) -> bool:
        """`P ← M(…, x[a : b] | θ̂)` in a loop, where only P's last row is read: M decodes with
        a KV cache, fed only the tokens of x it has not seen (all of them when the window
        moved), and P holds the rows of those tokens."""
        call = self.info.calls.get(id(st.value)) if self.procedure and self.loop_index else None
        model = self.module_for(st.value, call) if call is not None else None
        rows = self.ty(st.value).shape[0] if self.ty(st.value).rank == 2 else None
        if model is None or rows is None or not self.reads_last_row(st.target.id, rows) or \
                not self.low.decodes(call.callee):
            return False
        cache = self.fresh("cache")
        self.prologue.append(ir.Assign((cache,), _method(model, "new_cache"), ir.Note(
            text=f"{call.callee.label} decodes with a KV cache", line=self.line(step))))
        args = [a.code for a in self.call_args(st.value, call)]
        args[-1] = _method(ir.Ref(cache), "new", args[-1])
        val = Val(ir.Call(model, tuple(args), (("cache", ir.Ref(cache)),)), self.ty(st.value),
                  True)
        name = local_name(st.target.id)
        self.emit(ir.Assign((name,), val.code, self.note(step, None, "rows of the new tokens only")))
        self.scope.values[st.target.id] = _like(val, ir.Ref(name))
        self.decoded.add(st.target.id)
        return True

    def reads_last_row(self, name: str, rows: Dim) -> bool:
        """Every read of `name` in the card is `name[rows, …]`, and it is assigned once."""
        uses, reads = _name_reads(self.alg).get(name, (0, []))
        if uses != len(reads) + 1:  # the assignment's target, and the reads' bases
            return False
        for r in reads:
            if isinstance(r.items[0], s.Slice) or any(not _is_all(i) for i in r.items[1:]):
                return False
            try:
                if self.size(r.items[0]) != rows:
                    return False
            except LowerError:
                return False
        return bool(reads)

    def last_row(self, e: s.Index) -> Val:
        """`P[ℓ + i − s, :]` of a decoded P: its last row, the newest token's."""
        base = self.expr(e.base)
        rest = tuple(ir.SliceX(None, None) for _ in e.items[1:])
        return Val(ir.Sub(base.code, (ir.Ref("..."), _int(-1), *rest)), self.ty(e), True)

    @staticmethod
    def is_model(val) -> bool:
        return isinstance(val, Val) and isinstance(val.ty, BundleTy)

    def stmt_Return(self, st: s.Return, step: s.Step) -> None:
        val = self.expr(st.value)
        self.returned = val
        self.emit(ir.Return(val.code, self.note(step, val)))

    def stmt_For(self, st: s.For, step: s.Step) -> None:
        stack = self.module_stack(st)
        if stack is not None:
            return self.layer_loop(st, step, stack)
        if self.procedure:
            return self.procedure_loop(st, step)
        if st.style == "map" or isinstance(st.over, s.Concat):
            if self.indexes_by(st.body, st.var):
                return self.position_map(st, step)
            if self.low.fuse and (self.low.passes.head_map(self, st, step) or
                                  vectorise(self, st, step)):
                return None
            return self.map_loop(st, step)
        return self.fail(st, "code generation does not handle this loop yet")

    # ------------------------------------------------------------------ procedures
    def procedure_loop(self, st: s.For, step: s.Step) -> None:
        """A loop of a training or inference card. Over a dataset's index it visits each
        example (a batch of one); a loop whose variable indexes positions (`x̃_n[t] ← …`) is
        computed for every position at once; any other loop runs as written."""
        elems = [e for e, (_, var, _) in self.datasets.items() if var == st.var]
        if self.indexes_by(st.body, st.var) and not elems:
            return self.ranged_steps(st, step)
        var = self.loop_var(st.var)
        body = self.child()
        body.loop_index[st.var] = ir.Ref(var)
        for elem in elems:
            local = local_name(elem)
            examples, _, ty = self.datasets[elem]
            item = ir.Sub(ir.Ref(examples), (ir.Ref(var),))
            body.emit(ir.Assign((local,), ir.Sub(item, (ir.Ref("None"),)),
                                ir.Note(None, self.line(step), "a batch of one example")))
            self.scope.values[elem] = Val(ir.Ref(local), ty, True)
        count = _call("len", ir.Ref(self.datasets[elems[0]][0])) if elems else \
            self.loop_count(st)
        for sub in st.body:
            body.step(sub)
        body.stop_check()
        self.emit(ir.Loop(var, _call("range", count), tuple(body.out), self.note(step)))

    def ranged_steps(self, st: s.For, step: s.Step) -> None:
        """`for t = 1, …, ℓ do x̃_n[t] ← f(t) end`: each step for every t at once."""
        t = self.arange_of(st.var, st.over)
        outer, self.ranged = self.ranged, {**self.ranged, st.var: t}
        try:
            for sub in st.body:
                stmt = sub.stmt
                if not (isinstance(stmt, s.Assign) and isinstance(stmt.target, s.Index)
                        and isinstance(stmt.target.base, s.Name) and len(stmt.target.items) == 1
                        and getattr(stmt.target.items[0], "id", None) == st.var):
                    self.fail(sub, f"a loop over positions assigns 'x[{display(st.var)}]' only")
                val = self.expr(stmt.value)
                name = stmt.target.base.id
                local = local_name(name)
                self.emit(ir.Assign((local,), val.code, self.note(sub, val)))
                self.scope.values[name] = replace(val, code=ir.Ref(local), rows=(),
                                                  ty=Ty((t.rows[0],), val.ty.elem, vocab=val.ty.vocab))
        finally:
            self.ranged = outer

    def arange_of(self, var: str, over, where=None) -> Val:
        """The values a variable ranges over, as a tensor: 1, …, n or a, …, b."""
        if isinstance(over, s.Range):
            lo, hi = over.first[0], over.last
        elif isinstance(over, s.Concat) and len(over.items) == 1:
            lo, hi = s.Num("1"), over.items[0]
        else:
            return self.fail(over, "expected a range such as [ℓ] or 1, 2, …, ℓ")
        first, last = self.expr(lo).code, self.expr(hi).code
        end = last.left if isinstance(last, ir.Bin) and last.op == "-" and \
            last.right == ir.Lit("1") else ir.Bin("+", last, _int(1))
        code = _call("torch.arange", first, end, device=self.device_expr())
        local = self.loop_var(var)
        self.emit(ir.Assign((local,), code,
                            ir.Note(None, self.line(where or over), f"every {display(var)}")))
        size = Dim.sym(hi.id) if isinstance(hi, s.Name) and isinstance(lo, s.Num) and \
            lo.text == "1" else Dim.sym(var)
        return Val(ir.Ref(local), Ty(elem="ℕ"), rows=(size,))

    def update(self, st: s.Assign, step: s.Step) -> bool:
        """`θ ← θ − η · ∇loss(θ)` is torch.optim.SGD; `θ ← AdamW(θ, ∇loss(θ) | η, β_1, β_2, λ)`
        is torch.optim.AdamW. Either is made once, before the loops, and steps here; a rate
        the loop computes (a schedule, η_i) is set before each step. A gradient named before,
        `θ ← AdamW(θ, g | …)`, is already in θ's .grad: the update only steps."""
        model = self.scope.values[st.target.id].code
        found = self.optimizer(st.value, st.target.id, model)
        if found is None:
            return False
        make, rate, grad = found  # the loss's name, or a gradient named before
        fixed = rate is None or all(n in self.info.sig.hypers or n in CONSTANTS
                                    for n in _names_in(rate))
        lr = self.expr(rate).code if rate is not None else None
        if lr is not None and fixed:
            make = ir.Call(make.func, make.args, (("lr", lr), *make.kwargs))
        if not any("optimizer" in getattr(x, "targets", ()) for x in self.prologue):
            self.prologue.append(ir.Assign(("optimizer",), make, self.note(step)))
        if lr is not None and not fixed:
            groups = ir.Attr(ir.Ref("optimizer"), "param_groups")
            self.emit(ir.Loop("group", groups, (ir.Assign(('group["lr"]',), lr),),
                              ir.Note(None, self.line(step), "this step's learning rate")))
        if isinstance(grad, Gradient):
            self.emit(ir.Assign((), _method(ir.Ref("optimizer"), "step"), self.note(step)))
            told = (grad.told, lr if lr is not None else ir.Lit("None"))
        else:
            take_over(self, "", st.target.id, step)  # zero_grad empties any named gradient
            loss = self.expr(s.Name(grad, span=st.value.span))
            self.emit(ir.Assign((), _method(ir.Ref("optimizer"), "zero_grad"), self.note(step)))
            total = _method(loss.code, "sum")
            self.emit(ir.Assign((), _method(total, "backward")))
            self.emit(ir.Assign((), _method(ir.Ref("optimizer"), "step")))
            told = (_method(total, "detach"), lr if lr is not None else ir.Lit("None"))
        self.emit(ir.If(ir.Bin("is not", ir.Ref("report"), ir.Ref("None")),
                        (ir.Assign((), _call("report", *told)),)))
        return True

    def optimizer(self, v: s.Expr, theta: str, model: ir.Expr
                  ) -> tuple[ir.Call, s.Expr | None, str | Gradient] | None:
        """The optimizer's constructor (without its rate), the rate and the loss's name (or
        the named gradient of θ it steps with)."""
        def gradient(g) -> str | Gradient | None:  # ∇loss(θ) → "loss"; g ← ∇loss(θ) → g's
            named = self.scope.values.get(g.id) if isinstance(g, s.Name) else None
            if isinstance(named, Gradient) and named.theta == theta:
                return current(self, g.id, g)
            ok = isinstance(g, s.Unary) and g.op == "∇" and isinstance(g.operand, s.Call)
            return g.operand.func if ok else None

        if isinstance(v, s.BinOp) and v.op == "−" and getattr(v.left, "id", None) == theta \
                and isinstance(v.right, s.BinOp) and v.right.op in ("·", " ") \
                and gradient(v.right.right):
            params = _method(model, "parameters")
            return _call("torch.optim.SGD", params), v.right.left, gradient(v.right.right)
        if isinstance(v, s.Call) and v.func == "AdamW" and len(v.args) == 2 \
                and getattr(v.args[0], "id", None) == theta and gradient(v.args[1]):
            given = [p.value if isinstance(p, s.Arg) else p for p in v.params]
            values = [self.expr(p).code for p in given[1:]]
            kwargs: dict[str, ir.Expr] = {}
            if len(values) >= 2:
                kwargs["betas"] = ir.Seq((values[0], values[1]))
            if len(values) >= 3:
                kwargs["weight_decay"] = values[2]
            kwargs["fused"] = ir.Lit("True")  # one kernel for every tensor's update
            make = _call("torch.optim.AdamW", self.decay_groups(model), **kwargs)
            return make, given[0] if given else None, gradient(v.args[1])
        return None

    def decay_groups(self, model: ir.Expr) -> ir.Expr:
        """AdamW's weight decay λ shrinks the weight matrices only: decaying gains and biases
        pulls them toward 0, not toward their identity values."""
        if not isinstance(model, ir.Ref):
            return _method(model, "parameters")
        params = f"{model.id}.parameters()"
        if any("decayed" in getattr(x, "targets", ()) for x in self.prologue):
            return ir.Lit('[{"params": decayed}, {"params": undecayed, "weight_decay": 0.0}]')
        for name, test, why in (("decayed", ">= 2", "weight matrices: AdamW's λ shrinks these"),
                                ("undecayed", "< 2", "gains and biases: not decayed")):
            self.prologue.append(ir.Assign((name,), ir.Lit(f"[p for p in {params} if p.ndim {test}]"),
                                           ir.Note(None, None, why)))
        return ir.Lit('[{"params": decayed}, {"params": undecayed, "weight_decay": 0.0}]')

    def stmt_Sample(self, st: s.Sample, step: s.Step) -> None:
        """`sample a token y from q ∝ p^{1/τ}`: q = softmax(log p / τ); τ → 0 is the arg-max."""
        logits, base, tau = self.logits(st.weights)
        y, q = local_name(st.var), self.fresh(local_name(st.dist))
        draw = (ir.Assign((q,), _call("torch.softmax", logits, dim=_int(-1)), self.note(step)),
                ir.Assign((y,), ir.Sub(_call("torch.multinomial", ir.Ref(q), _int(1)),
                                       (ir.Ref("..."), _int(0)))))
        if tau is None:
            self.out.extend(draw)
        else:  # top_k and top_p keep the most probable token: the limit is theirs too
            greedy = ir.Assign((y,), _method(base.code, "argmax", _int(-1)))
            self.emit(ir.If(ir.Bin("==", tau.code, _int(0)), (greedy,), draw,
                            ir.Note(None, None, "the limit τ → 0: the most probable token")))
        self.scope.values[st.var] = Val(ir.Ref(y), Ty(elem="ℕ"), True)
        self.drawn = y

    def logits(self, w: s.Expr) -> tuple[ir.Expr, Val, Val | None]:
        """The logits of weights w (log w, up to a constant): log p / τ of `p^{1/τ}`, z/τ of
        `exp(z/τ)`, those of w filtered of `top_k(w | k)` and `top_p(w | p)`; with the value
        whose arg-max is w's, and the temperature τ (None where w has none)."""
        if self.is_filter(w):
            inner, base, tau = self.logits(w.args[0])
            return self.filtered(inner, w), base, tau
        if isinstance(w, s.Power) and isinstance(w.exponent, s.BinOp) and w.exponent.op == "/" \
                and isinstance(w.exponent.left, s.Num) and w.exponent.left.value == 1:
            p, tau = self.expr(w.base), self.expr(w.exponent.right)
            return ir.Bin("/", _call("torch.log", p.code), tau.code), p, tau
        if isinstance(w, s.Call) and w.func == "exp" and len(w.args) == 1 and \
                id(w) not in self.info.calls:
            arg = w.args[0]
            if isinstance(arg, s.BinOp) and arg.op == "/":  # q ∝ exp(z/τ)
                z, tau = self.expr(arg.left), self.expr(arg.right)
                return ir.Bin("/", z.code, tau.code), z, tau
            z = self.expr(arg)
            return z.code, z, None
        p = self.expr(w)
        return _call("torch.log", p.code), p, None

    def is_filter(self, e: s.Expr) -> bool:
        return isinstance(e, s.Call) and e.func in FILTERS and id(e) not in self.info.calls

    def filtered(self, logits: ir.Expr, f: s.Call) -> ir.Expr:
        """`logits` with −∞ where top_k or top_p drops an entry: cardc.runtime.logits's
        filter_logits, copied into the module; top_p after top_k joins its call, which applies
        them in that order."""
        self.low.program.filters = True
        bound = self.expr(f.params[0]).code
        if f.func == "top_p" and isinstance(logits, ir.Call) and \
                logits.func == ir.Ref("filter_logits") and [k for k, _ in logits.kwargs] == ["top_k"]:
            return replace(logits, kwargs=(*logits.kwargs, ("top_p", bound)))
        return _call("filter_logits", logits, **{f.func: bound})

    def stop_check(self) -> None:
        """After a loop's steps that draw a token: `stop(y)`, the caller's, may end the loop
        (cardc sample stops at a stop text)."""
        if self.drawn is None or not self.procedure:
            return
        self.hooks.add("stop")
        asked = ir.Bin("and", ir.Bin("is not", ir.Ref("stop"), ir.Ref("None")),
                       _call("stop", ir.Ref(self.drawn)))
        self.emit(ir.If(asked, (ir.Break(),)))

    def stmt_While(self, st: s.While, step: s.Step) -> None:
        if not self.procedure:
            self.fail(step, "code generation does not handle 'while' steps in a model yet",
                      hint="a forward pass runs a fixed number of steps")
        cond = self.expr(st.cond)
        body = self.child()
        for sub in st.body:
            body.step(sub)
        body.stop_check()
        test = _method(_call("torch.as_tensor", cond.code), "any")  # any row not done yet
        self.emit(ir.While(test, tuple(body.out), self.note(step)))

    def expr_Choice(self, e: s.Choice) -> Val:
        """`a or b randomly with probability p or 1 − p`: a where a uniform draw falls below p."""
        if len(e.options) != 2:
            self.fail(e, "code generation draws between two options only")
        a, b = (self.expr(o) for o in e.options)
        p = self.expr(e.probs[0])
        shaped = b if (b.lifted or b.rows) else a
        u = _call("torch.rand_like", shaped.code, dtype=ir.Ref("torch.float"))
        code = _call("torch.where", ir.Bin("<", u, p.code), a.code, b.code)
        return replace(shaped, code=code, ty=self.ty(e) if self.ty(e).shape == shaped.ty.shape
                       else shaped.ty)

    def expr_SetBuilder(self, e: s.SetBuilder) -> Val:
        """`{t ∈ [ℓ] : c}`: a mask over the domain, true where c holds."""
        t, self.domain = self.domain or self.arange_of(e.var, e.domain, e), None
        outer, self.ranged = self.ranged, {**self.ranged, e.var: t}
        try:
            cond = self.expr(e.cond)
        finally:
            self.ranged = outer
        return replace(cond, ty=Ty((t.rows[0],), "𝔹"), rows=())

    def module_stack(self, st: s.For) -> tuple[str, ModuleSlot] | None:
        for name, slot in self.scope.modules.items():
            if slot.var is not None and self.uses_family(st.body, name, slot.var, st.var):
                return name, slot
        return None

    @staticmethod
    def uses_family(body, pattern: str, var: str, loop_var: str) -> bool:
        return any(isinstance(n, s.Name) and instance(pattern, var, n.id) == loop_var
                   for n in s.nodes(body))

    def layer_loop(self, st: s.For, step: s.Step, stack: tuple[str, ModuleSlot]) -> None:
        """A stack of layers: `for block in self.block`, or by index when the layers' own
        tensors (γ^1_l) are stacked beside their modules."""
        pattern, slot = stack
        body = self.child()
        used = [name for name, sl in self.scope.modules.items()
                if sl.var is not None and self.uses_family(st.body, name, sl.var, st.var)]
        by_index = len(used) > 1 or any(
            self.uses_family(st.body, name, fam.var, st.var)
            for name, fam in self.scope.stacked.items() if fam.axis == "lead")
        if by_index:
            local = self.loop_var(st.var)
            body.loop_index[st.var] = ir.Ref(local)
            for name in used:
                attr = ir.Ref(f"self.{self.scope.modules[name].attr}")
                self.scope.loop_modules[name] = ir.Sub(attr, (ir.Ref(local),))
            over = _call("range", self.loop_count(st))
        else:
            local = self.fresh(slot.attr)
            self.scope.loop_modules[pattern] = ir.Ref(local)
            over = ir.Ref(f"self.{slot.attr}")
        for sub in st.body:
            body.step(sub)
        for name in used:
            self.scope.loop_modules.pop(name, None)
        self.max_seq_len = self.max_seq_len or body.max_seq_len
        self.emit(ir.Loop(local, over, tuple(body.out), self.note(step)))

    def loop_count(self, st: s.For) -> ir.Expr:
        if isinstance(st.over, s.Range):
            return self.dim(self.size(st.over.last))
        if isinstance(st.over, s.Concat) and len(st.over.items) == 1:
            return self.dim(self.size(st.over.items[0]))
        return self.fail(st.over, "expected a range such as [L] or 1, 2, …, L")

    @staticmethod
    def indexes_by(body, var: str) -> bool:
        """Whether `var` indexes a value somewhere in `body` (X[:, t]): a map over positions."""
        return any(isinstance(n, s.Index) and any(getattr(i, "id", None) == var for i in n.items)
                   for n in s.nodes(body))

    def position_map(self, st: s.For, step: s.Step) -> None:
        """`for t ∈ [ℓ] : X̃[:, t] ← f(X[:, t])` or `e_t ← …`: every column at once.

        Columns of a flipped matrix are its rows, so `X[:, t]` is all of X with the position
        axis in front of the card's own. Steps may read column t of anything, never another
        column, which is what makes the iterations independent."""
        size = self.size(st.over.items[0]) \
            if isinstance(st.over, s.Concat) and len(st.over.items) == 1 else None
        if size is None:
            self.fail(st.over, "expected a range such as [ℓ]")
        outer, self.positions = self.positions, (st.var, size)
        try:
            for sub in st.body:
                self.position_step(sub, st.var, size)
        finally:
            self.positions = outer

    def position_step(self, step: s.Step, var: str, size: Dim) -> None:
        st = step.stmt
        if not isinstance(st, s.Assign):
            self.fail(step, "a map over positions holds assignments only")
        val = self.expr(st.value)
        if size is None and val.rows:  # a map over a family: its members are the rows
            size = val.rows[0]
        if val.rows != (size,):
            self.fail(st.value, f"this value does not depend on '{display(var)}'")
        target = st.target
        kind = self.mapped_target(target, var)
        if kind is not None:  # X̃[:, t], X̃[t, :] or x[t] ← v: X̃ (x) holds every t's value
            name = target.base.id
            if kind == "column":  # the matrix of all columns, stored flipped
                whole = replace(val, ty=Ty((*val.ty.shape, size), val.ty.elem), rows=(),
                                flipped=True)
            else:  # the positions axis is already in front of the card's own: rows
                whole = replace(val, ty=Ty((size, *val.ty.shape), val.ty.elem), rows=())
            local = local_name(name)
            self.emit(ir.Assign((local,), val.code, self.note(step, whole)))
            self.scope.values[name] = _like(whole, ir.Ref(local))
        elif isinstance(target, s.Name) and instance(target.id, var, target.id) is not None:
            local = self.fresh(attr_name(target.id, var))
            self.emit(ir.Assign((local,), val.code, self.note(step, val)))
            self.scope.values[target.id] = Family(var, local, val.ty, _like(val, ir.Ref(local)),
                                                  positions=True)
        else:
            v = display(var)
            self.fail(target, f"a map over '{v}' assigns 'X[:, {v}]', 'X[{v}, :]', 'x[{v}]' "
                              f"or a value named for '{v}'")

    @staticmethod
    def mapped_target(target: s.Expr, var: str) -> str | None:
        """Which part of a value a map over `var` assigns: "column" (X̃[:, t]), "row"
        (X̃[t, :]) or "entry" (x[t]); None for anything else."""
        if not (isinstance(target, s.Index) and isinstance(target.base, s.Name)):
            return None
        items = [getattr(i, "id", None) == var or (_is_all(i) and "all") for i in target.items]
        return {(True,): "entry", ("all", True): "column", (True, "all"): "row"}.get(tuple(items))

    def map_loop(self, st: s.For, step: s.Step) -> None:
        """`for h ∈ [H] : Y^h ← f(…)`, literally: a Python loop that collects a list."""
        if not isinstance(st.over, s.Concat) or len(st.over.items) != 1:
            self.fail(st.over, "expected a range such as [H]")
        count = self.dim(self.size(st.over.items[0]))
        var = self.loop_var(st.var)
        for sub in st.body:
            target = sub.stmt.target if isinstance(sub.stmt, s.Assign) else None
            if isinstance(target, s.Name) and st.var in target.id:
                fam = Family(st.var, self.fresh(f"{attr_name(target.id, st.var)}_{var}"),
                             self.ty(sub.stmt.value))
                self.scope.values[target.id] = fam
                self.emit(ir.Assign((fam.local,), ir.Seq((), "list"), self.note(step)))
        body = self.child()
        body.loop_index[st.var] = ir.Ref(var)
        for sub in st.body:
            body.step(sub)
        self.emit(ir.Loop(var, _call("range", count), tuple(body.out), self.note(step)))

    def member(self, name: str) -> tuple[Family | None, str | None]:
        """The family `name` belongs to, and its index there: k_u → (k_t's family, u)."""
        for pattern, fam in self.scope.values.items():
            if isinstance(fam, Family):
                index = fam.var if pattern == name else instance(pattern, fam.var, name)
                if index is not None:
                    return fam, index
        return None, None

    def family_of(self, name: str) -> Family | None:
        return self.member(name)[0]

    def stmt_ForAll(self, st: s.ForAll, step: s.Step) -> None:
        """`∀t, t′, if c then S[t, t′] ← v`: a masked fill of S where c holds. `∀t: k_t ← f(e_t)`
        (one variable, a family on each side) is a map over the family's members."""
        body = st.body
        if len(st.vars) == 1 and isinstance(body, s.Assign):
            outer, self.positions = self.positions, (st.vars[0], None)
            try:
                return self.position_step(s.Step(body, span=step.span), st.vars[0], None)
            finally:
                self.positions = outer
        if not (isinstance(body, s.If) and isinstance(body.then, s.Assign)
                and isinstance(body.then.target, s.Index)
                and isinstance(body.then.target.base, s.Name)
                and [getattr(i, "id", None) for i in body.then.target.items] == list(st.vars)):
            self.fail(st, "code generation handles '∀…, if c then A[…] ← v' with A indexed "
                          "by exactly the quantified variables")
        target = body.then.target.base.id
        current = self.expr(body.then.target.base)
        rank = len(st.vars)
        shape = current.ty.shape[-rank:]
        self.point = {v: (self.physical(current, k), rank, shape[k]) for k, v in enumerate(st.vars)}
        try:
            cond = self.expr(body.cond)
            value = self.expr(body.then.value)
        finally:
            self.point = {}
        if value.lifted or value.ty.shape:
            code = _call("torch.where", cond.code, value.code, current.code)
        else:
            code = _method(current.code, "masked_fill", cond.code, value.code)
        name = local_name(target)
        self.emit(ir.Assign((name,), code, self.note(step, current)))
        self.scope.values[target] = _like(current, ir.Ref(name))

    @staticmethod
    def physical(val: Val, k: int) -> int:
        """Where card axis `k` of a matrix sits among its physical card axes (0-based)."""
        return len(val.ty.shape) + val.axis(k)

    # ------------------------------------------------------------------ expressions
    def expr(self, e: s.Expr) -> Val:
        if id(e) in self.given:  # computed already, for every head at once (cardc.lower.heads)
            return self.given[id(e)]
        method = getattr(self, "expr_" + type(e).__name__, None)
        if method is None:
            self.fail(e, "code generation does not handle this expression yet")
        return method(e)

    def expr_Num(self, e: s.Num) -> Val:
        if e.text == "∞":
            self.low.program.imports.add("math")
        return Val(num_lit(e.text, e.span), Ty())

    def expr_Name(self, e: s.Name) -> Val:
        name = e.id
        if name in self.point:
            return self.arange(name)
        if name in self.ranged:
            return self.ranged[name]
        if self.positions and name == self.positions[0]:
            size = self.positions[1]
            code = _call("torch.arange", _int(1), ir.Bin("+", self.dim(size), _int(1)),
                         device=self.device_expr())
            return Val(code, Ty(elem="ℕ"), rows=(size,))
        if self.sum_axis and name == self.sum_axis[0]:
            self.fail(e, "a sum index can only index the last axis here")
        if name in self.loop_index:
            return Val(ir.Bin("+", self.loop_index[name], _int(1)), Ty(elem="ℕ"))
        found = self.scope.values.get(name)
        if isinstance(found, Val):
            return found
        if isinstance(found, Gradient):
            return listed(self, name, e)
        fam, index = self.member(name)  # k_t under ∀t, or k_u under Σ_u
        current = index in self.family_vars or bool(self.positions and index == self.positions[0])
        if fam is not None and fam.positions and current:
            return fam.stacked
        if isinstance(found, Family):
            self.fail(e, f"'{display(name)}' is a family of values; concatenate it first")
        if name in self.scope.tensors:
            return Val(self.scope.tensors[name], self.ty(e))
        stacked = self.stacked(name)
        if stacked is not None:
            return stacked
        if name in CONSTANTS and name not in self.info.sig.hypers:
            self.low.program.imports.add("math")
            return Val(ir.Ref(CONSTANTS[name]), Ty())
        if name in SPECIAL_TOKENS and name not in self.info.sig.hypers:
            # the paper's §4: N_V − 2, N_V − 1, N_V of [N_V]; 0-based IDs are one less
            vocab = self.ty(e).vocab or Dim.sym("N_V")
            code = ir.Bin("-", self.dim(vocab), _int(SPECIAL_TOKENS[name]))
            return Val(code, Ty(elem="ℕ", vocab=vocab))
        hyper = self.info.sig.hypers.get(name)
        if hyper is not None and hyper.value is not None:
            return Val(self.dim(hyper.value), Ty(elem="ℕ"))
        if hyper is not None and not hyper.shape:
            return Val(self.dim_of(name), hyper)
        return self.fail(e, f"cannot generate code for '{display(name)}' here")

    def stacked(self, name: str) -> Val | None:
        for pattern, st in self.scope.stacked.items():
            idx = instance(pattern, st.var, name)
            if idx is None or (idx == st.var and st.var not in self.loop_index):
                continue  # the family itself, outside a loop over it
            h = self.loop_index.get(idx) if idx in self.loop_index else _int(int(idx) - 1)
            store = ir.Ref(st.storage)
            if st.axis == "lead":  # a layer's own tensor: one slice of (L, …)
                return Val(ir.Sub(store, (h,)), Ty(st.shape))
            if st.axis == "first":  # heads stacked on the output axis: (H·d_out, d_in)
                dims = (self.dim(st.over), self.dim(st.shape[0]))
                view = _method(store, "unflatten", _int(0), ir.Seq(dims))
                return Val(ir.Sub(view, (h,)), Ty(st.shape))
            dims = (_int(st.count), self.dim(st.over), self.dim(st.shape[-1]))
            view = _method(store, "unflatten", _int(-1), ir.Seq(dims))
            code = ir.Sub(view, (ir.Ref("..."), _int(st.index), h, ir.SliceX(None, None)))
            return Val(code, Ty(st.shape))
        return None

    def arange(self, var: str) -> Val:
        axis, rank, size = self.point[var]
        code = _call("torch.arange", self.dim(size), device=self.device_expr())
        if rank > 1:
            items = tuple(ir.SliceX(None, None) if k == axis else ir.Ref("None")
                          for k in range(rank))
            code = ir.Sub(code, items)
        return Val(code, Ty(tuple(size if k == axis else None for k in range(rank)), "ℕ"))

    def device_expr(self) -> ir.Expr:
        if self.device is None:
            self.fail(self.alg, "no input tensor to take the device from")
        return self.device

    def expr_BinOp(self, e: s.BinOp) -> Val:
        if e.op == " " and _is_ones_row(e.right):
            return self.ones_row(e)
        if e.op == " " and isinstance(e.left, s.Name) and e.left.id in ELEMENTWISE and \
                e.left.id not in self.scope.values:  # `log P[…]`: a function applied by juxtaposition
            x = self.expr(e.right)
            log = _log_of(x.code) if e.left.id == "log" else None
            return _like(x, log or _call(ELEMENTWISE[e.left.id], x.code), self.ty(e))
        a, b = self.expr(e.left), self.expr(e.right)
        ty = self.ty(e)
        if e.op in (" ", "·"):
            op = "*" if not a.ty.shape or not b.ty.shape or self.sum_axis else "@"
            if op == "@" and self.column:
                return self.matmul(e, a, b, ty)
        elif e.op in COMPARE:
            op = COMPARE[e.op]
        else:
            op = {"+": "+", "−": "-", "⊙": "*", "/": "/"}.get(e.op)
            if op is None:
                self.fail(e, f"code generation does not handle '{e.op}' yet")
        if op == "+" and _linear_bias(a, b):  # F.linear(X, W) + b 1^⊺ → F.linear(X, W, b)
            return replace(a, code=ir.Call(a.code.func, (*a.code.args, b.code)), ty=ty)
        if op != "@":
            a, b = self.align(a, b), self.align(b, a)
            a, b = self.same_layout(a, b), self.same_layout(b, a)
            rank = max(len(a.ty.shape), len(b.ty.shape))
            if self.sum_axis or self.point:
                ty = Ty((a.ty if len(a.ty.shape) == rank else b.ty).shape, ty.elem)
        code = ir.Bin(op, a.code, b.code)
        if op in "+-" and not (a.lifted or b.lifted or a.ty.shape or b.ty.shape):
            code = _shift(code, 0)  # numbers: `(i + 1) − 1` is `i`
        return Val(code, ty, a.lifted or b.lifted, a.flipped or b.flipped, a.rows or b.rows,
                   a.tensor or b.tensor)

    def ones_row(self, e: s.BinOp) -> Val:
        """`b 1^⊺`: the column b repeated across columns, which broadcasting does for free
        when the matrix is stored flipped."""
        b = self.expr(e.left)
        if len(b.ty.shape) != 1:
            self.fail(e, "'1^⊺' broadcasts a vector into columns")
        ty = Ty((b.ty.shape[0], None), b.ty.elem)
        if self.column:
            return Val(b.code, ty, b.lifted, True, b.rows)
        return Val(ir.Sub(b.code, (ir.Ref("..."), ir.SliceX(None, None), ir.Ref("None"))),
                   ty, b.lifted, False, b.rows)

    def same_layout(self, a: Val, other: Val) -> Val:
        """An elementwise operand stored the other way round than its partner is turned."""
        if len(a.ty.shape) != 2 or len(other.ty.shape) != 2 or a.flipped == other.flipped:
            return a
        if None in a.ty.shape or a.lifted and not other.lifted:
            return a  # the partner turns instead
        return replace(a, code=_mT(a.code), flipped=other.flipped)

    def matmul(self, e: s.BinOp, a: Val, b: Val, ty: Ty) -> Val:
        """A · B in a column-major card. The product is stored flipped when B is, as
        (A B)^⊺ = B^⊺ A^⊺; a parameter on the left becomes `F.linear`, nn.Linear's product."""
        lifted, rows = a.lifted or b.lifted, a.rows or b.rows
        plain = not a.lifted and not a.rows and not a.flipped  # a parameter in card layout
        if len(a.ty.shape) == 1 and len(b.ty.shape) == 1:  # q^⊺ k: a dot product
            left = a.code if a.rows or not b.rows else \
                ir.Sub(a.code, (ir.Ref("..."), ir.Ref("None"), ir.SliceX(None, None)))
            return Val(_method(ir.Bin("*", left, b.code), "sum", _int(-1)), ty, lifted, False, rows)
        if len(a.ty.shape) == 2 and len(b.ty.shape) == 1:  # W e: a vector again
            if plain:
                return Val(_call("F.linear", b.code, a.code), ty, lifted, False, rows)
            left = a.code if a.flipped else _mT(a.code)
            return Val(ir.Bin("@", b.code, left), ty, lifted, False, rows)
        if len(a.ty.shape) != 2 or len(b.ty.shape) != 2:
            self.fail(e, "code generation multiplies matrices and matrix–vector pairs only")
        if not b.flipped:
            left = _mT(a.code) if a.flipped else a.code
            return Val(ir.Bin("@", left, b.code), ty, lifted, False, rows)
        if plain:
            return Val(_call("F.linear", b.code, a.code), ty, lifted, True, rows)
        right = a.code if a.flipped else _mT(a.code)
        return Val(ir.Bin("@", b.code, right), ty, lifted, True, rows)

    def align(self, a: Val, other: Val) -> Val:
        """A batched value, or one mapped over positions, of lower card rank gains trailing
        axes to broadcast against `other`: the batch and position axes stay in front."""
        pad = len(other.ty.shape) - len(a.ty.shape)
        if a.rows and pad > 0:  # (t − 1) ω over positions t: the positions axis stays in front
            code = ir.Sub(a.code, (ir.Ref("..."), *[ir.Ref("None")] * pad))
            return replace(a, code=code, ty=Ty(a.ty.shape + (None,) * pad, a.ty.elem))
        if not a.lifted or pad <= 0:
            return a
        code = ir.Sub(a.code, (ir.Ref("..."), *[ir.Ref("None")] * pad))
        return Val(code, Ty((None,) * pad + a.ty.shape, a.ty.elem), True)

    def expr_Unary(self, e: s.Unary) -> Val:
        x = self.expr(e.operand)
        if e.op == "−":
            return _like(x, ir.Un("-", x.code))
        if e.op == "¬":
            return _like(x, ir.Un("~", x.code))
        if e.op == "√":
            if x.lifted or x.rows or x.ty.shape or x.tensor or self.sum_axis:
                return _like(x, _call("torch.sqrt", x.code))
            self.low.program.imports.add("math")
            return Val(_call("math.sqrt", x.code), x.ty)
        return self.fail(e, f"code generation does not handle '{e.op}' yet")

    def expr_Power(self, e: s.Power) -> Val:
        """x^p: the shape comes from whichever side varies; θ^{−2(i − 1)/d} in a map over i
        is a vector through its exponent alone."""
        x, p = self.expr(e.base), self.expr(e.exponent)
        shaped = p if _varies(p) and not _varies(x) else x
        return replace(shaped, code=ir.Bin("**", x.code, p.code), lifted=x.lifted or p.lifted,
                       rows=x.rows or p.rows, tensor=x.tensor or p.tensor)

    def expr_Transpose(self, e: s.Transpose) -> Val:
        x = self.expr(e.operand)
        if len(x.ty.shape) == 1 and self.column:  # q^⊺ k: a vector stays; the product dots
            return x
        if len(x.ty.shape) != 2:
            self.fail(e, "code generation transposes matrices only")
        ty = Ty(x.ty.shape[::-1], x.ty.elem)
        if self.column:  # the storage stays; only how its axes read changes
            return replace(x, ty=ty, flipped=not x.flipped)
        if x.lifted:
            return Val(_method(x.code, "transpose", _int(-2), _int(-1)), ty, True)
        return Val(ir.Attr(x.code, "T"), ty)

    def expr_Index(self, e: s.Index) -> Val:
        if isinstance(e.base, s.Name) and e.base.id in self.decoded:
            return self.last_row(e)
        if self.sum_axis and len(e.items) == 1 and getattr(e.items[0], "id", None) == \
                self.sum_axis[0]:
            base = self.expr(e.base)  # e[i] under Σ_i: the whole last axis, summed later
            return Val(base.code, Ty((self.sum_axis[1],)), base.lifted)
        if self.point and all(getattr(i, "id", None) in self.point for i in e.items):
            return self.point_index(e)
        if self.positions and len(e.items) in (1, 2) and \
                getattr(e.items[-1], "id", None) == self.positions[0]:
            return self.position_index(e)
        if self.positions and any(self.positions[0] in _names_in(i) and
                                  not isinstance(i, (s.Name, s.Index)) for i in e.items):
            var = display(self.positions[0])  # X[:, t − 1] would tie iterations together
            self.fail(e, f"a map over '{var}' may read column '{var}' only, as 'X[:, {var}]'",
                      hint="code generation vectorises a map whose iterations are independent")
        base = self.expr(e.base)
        if len(e.items) == 2 and len(base.ty.shape) == 2 and _is_all(e.items[0]) and \
                not isinstance(e.items[1], s.Slice | s.Progression):
            idx = self.expr(e.items[1])
            if idx.lifted or idx.rows:  # W_e[:, x[t]]: the columns the tokens pick
                if base.lifted:
                    self.fail(e, "code generation picks columns of parameters only")
                cols = base.code if base.flipped else _mT(base.code)
                # token IDs are 0-based in tensors; a position (W_p[:, ℓ]) is 1-based
                pick = idx.code if idx.ty.vocab is not None or idx.rows else _dec(idx.code)
                pad = self.ty(e.base).pad
                code = ir.Sub(cols, (pick,)) if pad is None else self.embedding(pick, cols, pad)
                return Val(code, self.ty(e), idx.lifted, False, idx.rows)
        if self.procedure:
            return self.procedure_index(e, base)
        items: list[ir.Expr | ir.SliceX] = [ir.Ref("...")] if base.lifted else []
        lifted = base.lifted
        for k, item in enumerate(e.items):
            if isinstance(item, s.Slice):
                items.append(self.slice(item, base, k))
                continue
            if isinstance(item, s.Progression):
                items.append(self.progression(item, base, k))
                continue
            idx = self.expr(item)
            pad = self.ty(e.base).pad
            if idx.ty.shape and pad is not None and len(e.items) == 1 and not base.lifted:
                return Val(self.embedding(idx.code, base.code, pad), self.ty(e), idx.lifted)
            if idx.ty.shape:  # token IDs pick rows: W_e[x]
                items.append(idx.code)
                lifted = lifted or idx.lifted
            else:
                items.append(_dec(idx.code))
        if base.lifted and not base.flipped:  # E[1] of a T×D matrix is its first row: E[..., 0, :]
            items += [ir.SliceX(None, None)] * (len(base.ty.shape) - len(e.items))
        return Val(ir.Sub(base.code, tuple(items)), self.ty(e), lifted)

    def embedding(self, tokens: ir.Expr, table: ir.Expr, pad: str) -> ir.Expr:
        """Rows of `table` picked by tokens, the padding row's receiving no gradient: card
        token v_pad is row v_pad − 1, and v_pad = 0 names none."""
        row = self.dim(Dim.sym(pad))
        index = ir.Cond(ir.Bin(">", row, _int(0)), ir.Bin("-", row, _int(1)), ir.Ref("None"))
        return _call("F.embedding", tokens, table, padding_idx=index)

    def procedure_index(self, e: s.Index, base: Val) -> Val:
        """Indexing in a training or inference card, where indices may be tensors: positions
        for every t at once (x_n[t + 1]), or tokens (P(θ)[x_n[t + 1], t]). Positions are
        1-based in the card; token IDs are 0-based in tensors, as every tokenizer makes them."""
        ty = self.ty(e)
        vals = [item if isinstance(item, s.Slice) else self.expr(item) for item in e.items]
        stored = vals[::-1] if base.flipped else vals  # physical order of the card's axes

        def index(v) -> ir.Expr | ir.SliceX:
            if isinstance(v, s.Slice):
                return self.slice(v, base, 0)
            return v.code if v.ty.vocab is not None else _dec(v.code)

        tensors = [v for v in stored if isinstance(v, Val) and (v.rows or v.lifted)]
        rows = next((v.rows for v in tensors if v.rows), ())
        if not tensors:
            code = ir.Sub(base.code, (ir.Ref("..."), *map(index, stored)) if base.lifted
                          else tuple(map(index, stored)))
            return Val(code, ty, base.lifted, False, base.rows)
        last = stored[-1]
        if isinstance(last, Val) and last.lifted:  # tokens pick along the last axis: a gather
            lead = [ir.Ref("...")] + [index(v) for v in stored[:-1]] + [ir.SliceX(None, None)]
            picked = ir.Sub(base.code, tuple(lead)) if len(stored) > 1 else base.code
            tok = ir.Sub(last.code, (ir.Ref("..."), ir.Ref("None")))
            code = ir.Sub(_method(picked, "gather", _int(-1), tok), (ir.Ref("..."), _int(0)))
            return Val(code, ty, True, False, rows)
        code = ir.Sub(base.code, (ir.Ref("..."), *map(index, stored)))
        return Val(code, ty, base.lifted or any(v.lifted for v in tensors), False, rows)

    def position_index(self, e: s.Index) -> Val:
        """`X[:, t]`, `x[t]` or `W_p[:, t]` in a map over positions t ∈ [ℓ]: every position."""
        var, size = self.positions
        base = self.expr(e.base)
        ty = self.ty(e)
        if len(e.items) == 2 and not _is_all(e.items[0]):
            self.fail(e, f"a map over '{display(var)}' reads whole columns 'X[:, {display(var)}]'")
        if base.lifted and base.rows:
            self.fail(e, "positions of a value already mapped over positions")
        if base.lifted:  # columns of a flipped matrix are its rows; a sequence's items, itself
            if len(e.items) == 2 and not base.flipped:
                self.fail(e, "code generation reads columns of flipped matrices only")
            return Val(base.code, ty, True, False, (size,))
        # a parameter: its first ℓ columns, as rows (W_p[:, t] for t ≤ ℓ)
        self.max_seq_len = self.max_seq_len or self.dim(base.ty.shape[-1])
        stored = base.code if len(e.items) == 1 or base.flipped else _mT(base.code)
        return Val(ir.Sub(stored, (ir.SliceX(None, self.dim(size)),)), ty, False, False, (size,))

    def slice(self, item: s.Slice, base: Val, axis: int) -> ir.SliceX:
        """1-based inclusive [lo : hi] → 0-based half-open [lo − 1 : hi]."""
        lo = None
        if item.lo is not None and not (isinstance(item.lo, s.Num) and item.lo.text == "1"):
            lo_val = self.expr(item.lo)
            lo = _dec(_whole(lo_val.code))
        hi = None if item.hi is None else _whole(self.expr(item.hi).code)
        skip = self.runtime_offset(item)
        if skip is not None and not base.lifted and base.ty.shape:
            # W_p[1 : T] bounds T by the rows; W_p[3 : T + 2] (positions from row 3) by 2 fewer
            self.max_seq_len = self.dim(base.ty.shape[axis] - Dim.const(skip))
        return ir.SliceX(lo, hi)

    def progression(self, item: s.Progression, base: Val, axis: int) -> ir.SliceX:
        """1-based inclusive `a, b, …, c` → 0-based `a − 1 : c : b − a`; the end is left out
        where c is the axis's last entry of the progression (`X[..., 0::2]`)."""
        defs = self.info.sig.definitions
        first, second, last = (expr_dim(x, defs) for x in (item.first, item.second, item.last))
        if first is None or second is None or last is None:
            self.fail(item, "code generation needs a progression of sizes the card declares")
        step = (second - first).constant()
        if step is None or step < 1 or step.denominator != 1:
            self.fail(item.second, "code generation needs a progression with a whole step")
        lo = None
        if first != Dim.const(1):
            lo = _dec(_whole(self.expr(item.first).code))
        size = base.ty.shape[axis]
        rest = None if size is None else (size - last).constant()
        hi = None if rest is not None and 0 <= rest < step else _whole(self.expr(item.last).code)
        return ir.SliceX(lo, hi, _int(int(step)))

    def expr_Progression(self, e: s.Progression) -> Val:
        self.fail(e, "code generation reads a progression 'a, b, …, c' as an index of a "
                     "value of the card only")

    def runtime_offset(self, item: s.Slice) -> int | None:
        """k for a slice [k + 1 : T + k] of a length T read at call time, else None."""
        hi, k = item.hi, 0
        if isinstance(hi, s.BinOp) and hi.op == "+" and isinstance(hi.right, s.Num) and \
                float(hi.right.value).is_integer():
            hi, k = hi.left, int(hi.right.value)
        if not (isinstance(hi, s.Name) and hi.id in self.runtime_used):
            return None
        lo = item.lo
        if (lo is None and k == 0) or isinstance(lo, s.Num) and lo.value == k + 1:
            return k
        return None

    def point_index(self, e: s.Index) -> Val:
        """`Mask[t, t′]` under ∀t, t′: the whole tensor, transposed if the order differs."""
        base = self.expr(e.base)
        order = [self.point[i.id][0] for i in e.items]
        stored = [self.physical(base, k) for k in range(len(e.items))]
        if order == stored:
            return base
        if len(order) == 2:
            return Val(_method(base.code, "transpose", _int(-2), _int(-1)), base.ty, base.lifted)
        return self.fail(e, "code generation handles two quantified variables at most")

    def expr_Iverson(self, e: s.Iverson) -> Val:
        return self.expr(e.cond)

    def expr_Norm(self, e: s.Norm) -> Val:
        return norm(self, e)

    def expr_Sum(self, e: s.Sum) -> Val:
        """Σ_{i=1}^{n} f(x[i]): f on the whole last axis of x, then a sum over it."""
        if self.procedure:
            return self.ranged_sum(e)
        if e.over is None and self.sums_family(e):
            return self.family_sum(e)
        if e.over is not None or not (isinstance(e.lo, s.Num) and e.lo.text == "1"):
            self.fail(e, "code generation handles sums Σ_{i=1}^{n} only")
        size = self.low.dim_value(self.alg, e.hi)
        outer, self.sum_axis = self.sum_axis, (e.index, size)
        try:
            body = self.expr(e.body)
        finally:
            self.sum_axis = outer
        if len(body.ty.shape) != 1:
            self.fail(e, f"the sum over '{display(e.index)}' must index the last axis")
        return Val(_method(body.code, "sum", _int(-1)), Ty(), body.lifted)

    def sums_family(self, e: s.Sum) -> bool:
        """Σ_u f(k_u) or Σ_{t=1}^{T} α_t v_t: the index names members of a family."""
        members = [self.member(n) for n in _names_in(e.body)]
        return any(fam is not None and fam.positions and index == e.index
                   for fam, index in members)

    def family_sum(self, e: s.Sum) -> Val:
        """A sum over a family's members: its rows axis, summed."""
        self.family_vars.add(e.index)
        try:
            body = self.expr(e.body)
        finally:
            self.family_vars.discard(e.index)
        axis = -1 - len(body.ty.shape)
        keep = {"keepdim": ir.Lit("True")} if not body.ty.shape else {}  # Σ_u: one per example
        code = _method(body.code, "sum", _int(axis), **keep)
        return Val(code, body.ty, body.lifted, False, ())

    def ranged_sum(self, e: s.Sum) -> Val:
        """Σ_{t=a}^{b} f(t) or Σ_{t∈T̃} f(t): f for every t at once, then summed."""
        elems = [x for x, (_, var, _) in self.datasets.items() if var == e.index]
        if elems and e.over is None:
            return self.minibatch_sum(e, elems)
        if e.over is not None:
            if not (isinstance(e.over, s.Name) and e.over.id in self.sets):
                self.fail(e.over, "code generation sums over a set built with {t ∈ … : …}")
            t, mask = self.sets[e.over.id], self.expr(e.over)
        else:
            t, mask = self.arange_of(e.index, s.Range((e.lo,), e.hi), e), None
        outer, self.ranged = self.ranged, {**self.ranged, e.index: t}
        try:
            body = self.expr(e.body)
        finally:
            self.ranged = outer
        code = body.code
        if mask is not None:
            code = _call("torch.where", mask.code, code, ir.Lit("0.0"))
        return Val(_method(code, "sum", _int(-1)), Ty(), body.lifted)

    def minibatch_sum(self, e: s.Sum, elems: list[str]) -> Val:
        """Σ_{n=a}^{b} f(x_n) over a dataset's examples: f of the minibatch x_a, …, x_b at
        once (every example one row of a batch), then summed over the rows."""
        lo, hi = self.expr(e.lo).code, self.expr(e.hi).code
        outer = {elem: self.scope.values.get(elem) for elem in elems}
        for elem in elems:
            examples, _, ty = self.datasets[elem]
            local = self.fresh(local_name(elem))
            rows = ir.Sub(ir.Ref(examples), (ir.SliceX(_dec(lo), hi),))
            self.emit(ir.Assign((local,), _call("torch.stack", rows),
                                ir.Note(None, self.line(e), "a minibatch: one example per row")))
            self.scope.values[elem] = Val(ir.Ref(local), ty, True)
        try:
            body = self.expr(e.body)
        finally:
            for elem, val in outer.items():
                if val is None:
                    self.scope.values.pop(elem, None)
                else:
                    self.scope.values[elem] = val
        if not body.lifted or body.ty.shape:
            self.fail(e, "a sum over a dataset's examples sums one number per example")
        return Val(_method(body.code, "sum"), Ty())

    def expr_Concat(self, e: s.Concat) -> Val:
        items = [x for x in e.items if not isinstance(x, s.Ellipsis_)]
        if self.procedure and e.sep == "," and self.ty(e).elem == "ℕ":
            return self.sequence(e, items)
        fused = self.low.passes.partial_rotary(self, e)
        if fused is not None:
            return fused
        fam = self.family_of(items[0].id) if isinstance(items[0], s.Name) else None
        ty = self.ty(e)
        if fam is not None and any(isinstance(x, s.Ellipsis_) for x in e.items):
            if fam.merged:  # returned as it is: the caller joins every group's heads at once
                return replace(fam.stacked, ty=Ty(fam.ty.shape, ty.elem))
            if fam.positions:  # [e_1, …, e_ℓ]: the columns, already stored as rows
                return replace(fam.stacked, ty=ty, rows=(), flipped=True)
            if fam.stacked is not None:  # (…, H, T, d) → (…, T, H·d)
                moved = _method(fam.stacked.code, "transpose", _int(-3), _int(-2))
                return Val(_method(moved, "flatten", _int(-2)), ty, True, self.column)
            return self.join(ir.Ref(fam.local), fam.ty, e.sep, ty, flipped=fam.flipped)
        vals = [self.expr(x) for x in items]
        code = ir.Seq(tuple(v.code for v in vals), "list")
        return self.join(code, vals[0].ty, e.sep, ty, any(v.lifted for v in vals),
                         vals[0].flipped)

    def sequence(self, e: s.Concat, items: list[s.Expr]) -> Val:
        """`[x, y]`, `[bos_token]`: tokens and sequences joined into one sequence."""
        parts = []
        for item in items:
            v = self.expr(item)
            if v.ty.shape:
                parts.append(v.code)
            elif v.lifted:
                parts.append(ir.Sub(v.code, (ir.Ref("..."), ir.Ref("None"))))
            else:  # a constant token, once per row of the batch
                batch = ir.Sub(ir.Attr(self.batch_source(), "shape"), (ir.SliceX(None, _int(-1)),))
                parts.append(_call("torch.full", ir.Seq((ir.Un("*", batch), _int(1))), v.code,
                                   device=self.device_expr()))
        code = parts[0] if len(parts) == 1 else _call("torch.cat", ir.Seq(tuple(parts), "list"),
                                                       dim=_int(-1))
        return Val(code, self.ty(e), True)

    def batch_source(self) -> ir.Expr:
        return ir.Ref(local_name(self.info.sig.inputs[0][0]))

    def join(self, items: ir.Expr, item: Ty, sep: str, ty: Ty, lifted: bool = True,
             flipped: bool = False) -> Val:
        if len(item.shape) == 1:  # vectors become columns (",") or rows (";")
            if self.column:  # a matrix of columns is stored flipped: columns are rows
                axis, flip = (-1, False) if sep == ";" else (-2, True)
                return Val(_call("torch.stack", items, dim=_int(axis)), ty, lifted, flip)
            axis = -2 if sep == ";" else -1
            return Val(_call("torch.stack", items, dim=_int(axis)), ty, lifted)
        axis = -len(item.shape) if sep == ";" else -1
        if flipped:  # card axis 0 of a flipped matrix is the last physical one
            axis = -1 if sep == ";" else -2
        return Val(_call("torch.cat", items, dim=_int(axis)), ty, lifted, flipped)

    # ------------------------------------------------------------------ calls
    def expr_Call(self, e: s.Call) -> Val:
        if self.procedure and isinstance(self.scope.values.get(e.func), Val):
            return self.scope.values[e.func]  # P(θ): the value P, computed from θ
        info = self.info.calls.get(id(e))
        if info is None:
            return self.builtin(e)
        return self.call_card(e, info)

    def builtin(self, e: s.Call) -> Val:
        if e.func in PAIRWISE and len(e.args) == 2:
            return self.pairwise(e)
        if e.func in ("cos", "sin") and len(e.args) == 1:
            x = self.expr(e.args[0])
            if not x.lifted and not x.ty.shape and not x.tensor:  # a number (a schedule's)
                self.low.program.imports.add("math")
                return Val(_call(f"math.{e.func}", x.code), Ty())
            return _like(x, _call(f"torch.{e.func}", x.code), self.ty(e))
        if e.func == DROPOUT:
            return self.dropout(e)
        if e.func in FILTERS:  # a distribution: the softmax of the filtered logits
            logits, base, _ = self.logits(e)
            return _like(base, _call("torch.softmax", logits, dim=_int(-1)), self.ty(e))
        if len(e.args) != 1:
            self.fail(e, f"'{e.func}' takes one argument")
        x = self.expr(e.args[0])
        ty = self.ty(e)
        if e.func in ("GELU", "GELU_tanh"):
            return _like(x, self.low.passes.gelu(self, x.code, e.func == "GELU_tanh"), ty)
        if e.func in ELEMENTWISE:
            return _like(x, _call(ELEMENTWISE[e.func], x.code), ty)
        if e.func == "softmax":  # over the first index in the paper's layout (its eq. 2)
            axis = x.axis(0) if self.column and x.ty.shape else -1
            return _like(x, _call("torch.softmax", x.code, dim=_int(axis)), ty)
        if e.func in ("mean", "var"):
            return Val(_method(x.code, e.func, _int(-1), **(
                {"unbiased": ir.Lit("False")} if e.func == "var" else {})), ty, x.lifted)
        if e.func in ("max", "min"):
            return Val(_method(x.code, "a" + e.func, _int(-1)), ty, x.lifted)
        if e.func == "length":
            size = self.ty(e).value
            if size is not None and not x.rows and not self.procedure:  # lengths change in loops
                try:
                    return Val(self.dim(size), Ty(elem="ℕ"))
                except LowerError:
                    pass
            return Val(ir.Sub(ir.Attr(x.code, "shape"), (_int(-1),)), Ty(elem="ℕ"))
        return self.fail(e, f"code generation does not know '{e.func}' yet")

    def dropout(self, e: s.Call) -> Val:
        """dropout(X | p): F.dropout while the module trains; nothing in evaluation."""
        if self.training is None:
            self.fail(e, "dropout acts in a card that owns parameters (a module, which knows "
                         "whether it is training)",
                      hint="apply it in the card that holds the parameters, or in its caller")
        x, p = self.expr(e.args[0]), self.expr(e.params[0])
        return _like(x, _call("F.dropout", x.code, p.code, self.training), self.ty(e))

    def pairwise(self, e: s.Call) -> Val:
        """min(a, b), max(a, b): Python's for numbers, torch's element-wise for tensors."""
        a, b = (self.expr(x) for x in e.args)
        if a.lifted or b.lifted:
            func = "torch.minimum" if e.func == "min" else "torch.maximum"
            return Val(_call(func, a.code, b.code), Ty(), True)
        if a.tensor or b.tensor:  # a number held on a device stays there: no wait for it
            if a.tensor and b.tensor:
                func = "torch.minimum" if e.func == "min" else "torch.maximum"
                return Val(_call(func, a.code, b.code), Ty(), tensor=True)
            x, bound = (a, b) if a.tensor else (b, a)
            limit = {"max" if e.func == "min" else "min": bound.code}
            return Val(_call("torch.clamp", x.code, **limit), Ty(), tensor=True)
        return Val(_call(e.func, a.code, b.code), Ty())

    def call_card(self, e: s.Call, call: CallInfo) -> Val:
        ty = self.ty(e)
        flipped = len(ty.shape) == 2 and \
            self.low.checker.info(call.callee).sig.layout == "column"
        rows = (self.positions[1],) if self.positions else ()
        if self.low.fuse:
            fused = self.low.passes.call(self, e, call)
            if fused is not None:
                return Val(fused, ty, True, flipped, rows)
        args = self.call_args(e, call)
        module = self.module_for(e, call)
        if module is not None:
            masks = [self.hyper_value(call, n, g) for n, g in call.hypers.items()
                     if n in self.module_inputs(call.callee)]
            return Val(ir.Call(module, tuple(a.code for a in args) + tuple(masks)), ty, True,
                       flipped, rows)
        fn = self.low.function(call.callee)
        kwargs = self.call_params(e, call)
        return Val(ir.Call(ir.Ref(fn), tuple(a.code for a in args), tuple(kwargs)), ty, True,
                   flipped, rows)

    def module_inputs(self, callee: s.Algorithm) -> list[str]:
        """Tensor hyperparameters (a Mask) a module takes with its inputs at call time."""
        return self.low.tensor_hypers(callee)

    def call_args(self, e: s.Call, call: CallInfo) -> list[Val]:
        sig = self.low.checker.info(call.callee).sig
        args = [self.expr(a) for a in e.args]
        return args + [args[0]] * (len(sig.inputs) - len(args))  # Z = X: self-attention

    def module_for(self, e: s.Call, call: CallInfo) -> ir.Expr | None:
        for given in call.params.values():
            if not isinstance(given, s.Name):
                continue
            if self.is_model(self.scope.values.get(given.id)):  # a model handed to a procedure
                return self.scope.values[given.id].code
            if given.id in self.scope.modules and self.scope.modules[given.id].var is None:
                return ir.Ref(f"self.{self.scope.modules[given.id].attr}")
            for pattern, ref in self.scope.loop_modules.items():
                slot = self.scope.modules[pattern]
                if instance(pattern, slot.var, given.id) is not None:
                    return ref
        return None

    def call_params(self, e: s.Call, call: CallInfo) -> list[tuple[str, ir.Expr]]:
        """Keyword arguments of a card lowered to a function: tensors, masks, scalars."""
        callee = self.low.checker.info(call.callee).sig
        out: list[tuple[str, ir.Expr]] = []
        for name, entry in callee.params:
            if name in callee.hypers:
                continue
            given = call.params.get(name)
            if given is None:
                self.fail(e, f"'{call.callee.name}' needs '{display(name)}'")
            if isinstance(entry, BundleTy):
                mine = self.bundle_members(given)
                for (member, _), value in zip(self.low.flat_tensors(entry), mine, strict=True):
                    out.append((local_name(member), value))
            else:
                out.append((local_name(name), self.expr(given).code))
        for name, given in call.hypers.items():
            out.append((local_name(name), self.hyper_value(call, name, given)))
        return out

    def bundle_members(self, given: s.Expr) -> list[ir.Expr]:
        entry = self.info.types.get(id(given))
        if isinstance(entry, FamilyTy):
            entry = entry.entry
        if not isinstance(entry, BundleTy) or not isinstance(given, s.Name):
            return self.fail(given, "expected a parameter bundle")
        out = []
        for member, _ in self.low.flat_tensors(entry):
            out.append(self.expr(s.Name(member, span=given.span)).code)
        return out

    def hyper_value(self, call: CallInfo, name: str, given: s.Expr) -> ir.Expr:
        if isinstance(given, s.Arg) and isinstance(given.target, s.Index):
            return self.mask_rule(call, name, given).code
        value = given.value if isinstance(given, s.Arg) else given
        if isinstance(given, s.Arg) and given.op == "≡":
            return self.constant_mask(call, name, value).code
        return self.expr(value).code

    def mask_rule(self, call: CallInfo, name: str, rule: s.Arg) -> Val:
        """`Mask[t, t′] = [[t′ ≤ t]]`: the boolean tensor the rule describes."""
        shape = self.callee_shape(call, name)
        vars_ = [i.id for i in rule.target.items if isinstance(i, s.Name)]
        if len(vars_) != len(shape):
            self.fail(rule, f"'{display(name)}' has {len(shape)} axes")
        rank = len(shape)
        flip = self.column and rank == 2  # stored flipped, like every matrix of the card
        outer, self.point = self.point, {
            v: (rank - 1 - k if flip else k, rank, shape[k]) for k, v in enumerate(vars_)}
        try:
            return replace(self.expr(rule.value), flipped=flip)
        finally:
            self.point = outer

    def constant_mask(self, call: CallInfo, name: str, value: s.Expr) -> Val:
        dims = self.callee_shape(call, name)
        shape = tuple(self.dim(d) for d in dims)
        flip = self.column and len(shape) == 2
        fill = "True" if isinstance(value, s.Num) and value.value else "False"
        code = _call("torch.full", ir.Seq(shape[::-1] if flip else shape), ir.Lit(fill),
                     device=self.device_expr())
        return Val(code, Ty(dims, "𝔹"), False, flip)

    def callee_shape(self, call: CallInfo, name: str) -> tuple[Dim, ...]:
        from ..types import substitute

        hyper = self.low.checker.info(call.callee).sig.hypers[name]
        return substitute(hyper, call.bind).shape


_READS: dict[int, tuple[s.Algorithm, dict[str, tuple[int, list[s.Index]]]]] = {}


def _name_reads(alg: s.Algorithm) -> dict[str, tuple[int, list[s.Index]]]:
    """For each name of a card: how often it is written, and its reads `name[…]`; walked once
    per card, not once per step (a long card would take quadratic time)."""
    kept = _READS.get(id(alg))
    if kept is not None and kept[0] is alg:
        return kept[1]
    uses: dict[str, int] = {}
    reads: dict[str, list[s.Index]] = {}
    for n in s.nodes(alg):
        if isinstance(n, s.Name):
            uses[n.id] = uses.get(n.id, 0) + 1
        elif isinstance(n, s.Index) and isinstance(n.base, s.Name):
            reads.setdefault(n.base.id, []).append(n)
    out = {name: (count, reads.get(name, [])) for name, count in uses.items()}
    if len(_READS) > 256:
        _READS.clear()
    _READS[id(alg)] = (alg, out)
    return out
