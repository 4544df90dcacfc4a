"""Lowering of one card's steps and expressions into IR statements.

Dispatch is by node kind (`expr_BinOp`, `stmt_For`, …). Every method returns IR built from
the checked card: shapes come from the checker's types, never re-derived here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import ir
from .. import syntax as s
from ..checker import CallInfo, CardInfo, instance
from ..dims import Dim
from ..spelling import display
from ..types import BundleTy, FamilyTy, Ty
from .values import (
    Family,
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

if TYPE_CHECKING:
    from .cards import Lowering

ELEMENTWISE = {"ReLU": "torch.relu", "SiLU": "F.silu", "σ": "torch.sigmoid", "exp": "torch.exp",
               "log": "torch.log", "tanh": "torch.tanh"}
COMPARE = {"≤": "<=", "<": "<", "≥": ">=", ">": ">", "=": "==", "≠": "!="}


def _call(func: str, *args: ir.Expr, **kwargs: ir.Expr) -> ir.Call:
    return ir.Call(ir.Ref(func), args, tuple(kwargs.items()))


def _method(obj: ir.Expr, name: str, *args: ir.Expr, **kwargs: ir.Expr) -> ir.Call:
    return ir.Call(ir.Attr(obj, name), args, tuple(kwargs.items()))


def _int(n: int) -> ir.Lit:
    return ir.Lit(str(n))


class Body:
    """Lowers the steps of `alg` in `scope`; `dim` maps a dimension symbol to Python."""

    def __init__(self, lowering: Lowering, alg: s.Algorithm, info: CardInfo, scope: Scope,
                 dim: Callable[[str], ir.Expr], lead: str):
        self.low = lowering
        self.alg = alg
        self.info = info
        self.scope = scope
        self.dim_of = dim
        self.lead = lead  # how batch axes read in shape comments: "B" or "…"
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

    def dim_text(self, d: Dim) -> str:
        return display(self.defined.get(d, str(d))).replace("?", "")

    def emit(self, st: ir.Stmt) -> None:
        self.out.append(st)

    def child(self) -> Body:
        """A body for a loop's steps: same card, scope and device; its own statements."""
        body = Body(self.low, self.alg, self.info, self.scope, self.dim_of, self.lead)
        body.device, body.runtime_used, body.loop_index = self.device, self.runtime_used, \
            dict(self.loop_index)
        return body

    def fresh(self, name: str) -> str:
        taken = {n for st in self.out if isinstance(st, ir.Assign) for n in st.targets}
        taken |= {local_name(n) for n in self.scope.values}
        while name in taken:
            name += "_"
        return name

    # ------------------------------------------------------------------ steps
    def run(self) -> list[ir.Stmt]:
        for step in self.alg.steps:
            self.step(step)
        return self.out

    def step(self, step: s.Step) -> None:
        kind = type(step.stmt).__name__
        method = getattr(self, "stmt_" + kind, None)
        if method is None:
            self.fail(step, f"code generation does not handle '{kind.lower()}' steps yet")
        method(step.stmt, step)

    def stmt_Assign(self, st: s.Assign, step: s.Step) -> None:
        if not isinstance(st.target, s.Name):
            self.fail(st.target, "code generation handles assignments to a name only here",
                      hint="assign the whole value, e.g. 'X ← …'")
        val = self.expr(st.value)
        family = self.family_of(st.target.id)
        if family is not None:
            self.emit(ir.Assign((), _method(ir.Ref(family.local), "append", val.code),
                                self.note(step, val, display(st.target.id))))
            return
        name = local_name(st.target.id)
        self.emit(ir.Assign((name,), val.code, self.note(step, val)))
        self.scope.values[st.target.id] = Val(ir.Ref(name), val.ty, val.lifted)

    def stmt_Return(self, st: s.Return, step: s.Step) -> None:
        val = self.expr(st.value)
        self.returned = val
        self.emit(ir.Return(val.code, self.note(step, val)))

    def stmt_For(self, st: s.For, step: s.Step) -> None:
        stack = self.module_stack(st)
        if stack is not None:
            return self.layer_loop(st, step, stack)
        if st.style == "map" or isinstance(st.over, s.Concat):
            if self.low.fuse and self.low.passes.head_map(self, st, step):
                return None
            return self.map_loop(st, step)
        return self.fail(st, "code generation does not handle this loop yet")

    def module_stack(self, st: s.For) -> tuple[str, ModuleSlot] | None:
        for name, slot in self.scope.modules.items():
            if slot.var is not None and self.uses_family(st.body, name, slot.var, st.var):
                return name, slot
        return None

    def uses_family(self, body, pattern: str, var: str, loop_var: str) -> bool:
        found = False

        def visit(node):
            nonlocal found
            if isinstance(node, s.Name) and instance(pattern, var, node.id) == loop_var:
                found = True
            elif isinstance(node, tuple):
                for x in node:
                    visit(x)
            elif hasattr(node, "__dataclass_fields__"):
                for f in node.__dataclass_fields__:
                    if f != "span":
                        visit(getattr(node, f))

        visit(body)
        return found

    def layer_loop(self, st: s.For, step: s.Step, stack: tuple[str, ModuleSlot]) -> None:
        pattern, slot = stack
        local = self.fresh(slot.attr)
        body = self.child()
        self.scope.loop_modules[pattern] = ir.Ref(local)
        for sub in st.body:
            body.step(sub)
        self.scope.loop_modules.pop(pattern)
        self.emit(ir.Loop(local, ir.Ref(f"self.{slot.attr}"), tuple(body.out), self.note(step)))

    def map_loop(self, st: s.For, step: s.Step) -> None:
        """`for h ∈ [H] : Y^h ← f(…)`, literally: a Python loop that collects a list."""
        if not isinstance(st.over, s.Concat) or len(st.over.items) != 1:
            self.fail(st.over, "expected a range such as [H]")
        count = self.dim(self.low.dim_value(self.alg, st.over.items[0]))
        var = local_name(st.var)
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

    def family_of(self, name: str) -> Family | None:
        for pattern, fam in self.scope.values.items():
            if isinstance(fam, Family) and (pattern == name or
                                            instance(pattern, fam.var, name) is not None):
                return fam
        return None

    def stmt_ForAll(self, st: s.ForAll, step: s.Step) -> None:
        """`∀t, t′, if c then S[t, t′] ← v`: a masked fill of S where c holds."""
        body = st.body
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
        self.point = {v: (k, rank, shape[k]) for k, v in enumerate(st.vars)}
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
        self.scope.values[target] = Val(ir.Ref(name), current.ty, current.lifted)

    # ------------------------------------------------------------------ expressions
    def expr(self, e: s.Expr) -> Val:
        method = getattr(self, "expr_" + type(e).__name__, None)
        if method is None:
            self.fail(e, "code generation does not handle this expression yet")
        return method(e)

    def expr_Num(self, e: s.Num) -> Val:
        if e.text == "∞":
            self.low.program.imports.add("math")
        return Val(num_lit(e.text), Ty())

    def expr_Name(self, e: s.Name) -> Val:
        name = e.id
        if name in self.point:
            return self.arange(name)
        if self.sum_axis and name == self.sum_axis[0]:
            self.fail(e, "a sum index can only index the last axis here")
        if name in self.loop_index:
            return Val(ir.Bin("+", self.loop_index[name], _int(1)), Ty(elem="ℕ"))
        found = self.scope.values.get(name)
        if isinstance(found, Val):
            return found
        if isinstance(found, Family):
            self.fail(e, f"'{display(name)}' is a family of values; concatenate it first")
        if name in self.scope.tensors:
            return Val(self.scope.tensors[name], self.ty(e))
        stacked = self.stacked(name)
        if stacked is not None:
            return stacked
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
        a, b = self.expr(e.left), self.expr(e.right)
        ty = self.ty(e)
        if e.op in (" ", "·"):
            op = "*" if not a.ty.shape or not b.ty.shape or self.sum_axis else "@"
        elif e.op in COMPARE:
            op = COMPARE[e.op]
        else:
            op = {"+": "+", "−": "-", "⊙": "*", "/": "/"}.get(e.op)
            if op is None:
                self.fail(e, f"code generation does not handle '{e.op}' yet")
        if op != "@":
            a, b = self.align(a, b), self.align(b, a)
            rank = max(len(a.ty.shape), len(b.ty.shape))
            if self.sum_axis or self.point:
                ty = Ty((a.ty if len(a.ty.shape) == rank else b.ty).shape, ty.elem)
        return Val(ir.Bin(op, a.code, b.code), ty, a.lifted or b.lifted)

    def align(self, a: Val, other: Val) -> Val:
        """A batched value of lower card rank gains trailing axes to broadcast against `other`."""
        pad = len(other.ty.shape) - len(a.ty.shape)
        if not a.lifted or pad <= 0:
            return a
        code = ir.Sub(a.code, (ir.Ref("..."), *[ir.Ref("None")] * pad))
        return Val(code, Ty((None,) * pad + a.ty.shape, a.ty.elem), True)

    def expr_Unary(self, e: s.Unary) -> Val:
        x = self.expr(e.operand)
        if e.op == "−":
            return Val(ir.Un("-", x.code), x.ty, x.lifted)
        if e.op == "¬":
            return Val(ir.Un("~", x.code), x.ty, x.lifted)
        if e.op == "√":
            if x.lifted or x.ty.shape or self.sum_axis:
                return Val(_call("torch.sqrt", x.code), x.ty, x.lifted)
            self.low.program.imports.add("math")
            return Val(_call("math.sqrt", x.code), x.ty)
        return self.fail(e, f"code generation does not handle '{e.op}' yet")

    def expr_Power(self, e: s.Power) -> Val:
        x, p = self.expr(e.base), self.expr(e.exponent)
        return Val(ir.Bin("**", x.code, p.code), x.ty, x.lifted)

    def expr_Transpose(self, e: s.Transpose) -> Val:
        x = self.expr(e.operand)
        if len(x.ty.shape) != 2:
            self.fail(e, "code generation transposes matrices only")
        ty = Ty(x.ty.shape[::-1], x.ty.elem)
        if x.lifted:
            return Val(_method(x.code, "transpose", _int(-2), _int(-1)), ty, True)
        return Val(ir.Attr(x.code, "T"), ty)

    def expr_Index(self, e: s.Index) -> Val:
        if self.sum_axis and len(e.items) == 1 and getattr(e.items[0], "id", None) == \
                self.sum_axis[0]:
            base = self.expr(e.base)  # e[i] under Σ_i: the whole last axis, summed later
            return Val(base.code, Ty((self.sum_axis[1],)), base.lifted)
        if self.point and all(getattr(i, "id", None) in self.point for i in e.items):
            return self.point_index(e)
        base = self.expr(e.base)
        items: list[ir.Expr | ir.SliceX] = [ir.Ref("...")] if base.lifted else []
        lifted = base.lifted
        for k, item in enumerate(e.items):
            if isinstance(item, s.Slice):
                items.append(self.slice(item, base, k))
                continue
            idx = self.expr(item)
            if idx.ty.shape:  # token IDs pick rows: W_e[x]
                items.append(idx.code)
                lifted = lifted or idx.lifted
            else:
                items.append(ir.Bin("-", idx.code, _int(1)))
        return Val(ir.Sub(base.code, tuple(items)), self.ty(e), lifted)

    def slice(self, item: s.Slice, base: Val, axis: int) -> ir.SliceX:
        """1-based inclusive [lo : hi] → 0-based half-open [lo − 1 : hi]."""
        lo = None
        if item.lo is not None and not (isinstance(item.lo, s.Num) and item.lo.text == "1"):
            lo_val = self.expr(item.lo)
            lo = ir.Bin("-", lo_val.code, _int(1))
        hi = None if item.hi is None else self.expr(item.hi).code
        runtime = isinstance(item.hi, s.Name) and item.hi.id in self.runtime_used
        if lo is None and runtime and not base.lifted and base.ty.shape:
            self.max_seq_len = self.dim(base.ty.shape[axis])  # W_p[1 : T] bounds T
        return ir.SliceX(lo, hi)

    def point_index(self, e: s.Index) -> Val:
        """`Mask[t, t′]` under ∀t, t′: the whole tensor, transposed if the order differs."""
        base = self.expr(e.base)
        order = [self.point[i.id][0] for i in e.items]
        if order == sorted(order):
            return base
        if len(order) == 2:
            return Val(_method(base.code, "transpose", _int(-2), _int(-1)), base.ty, base.lifted)
        return self.fail(e, "code generation handles two quantified variables at most")

    def expr_Iverson(self, e: s.Iverson) -> Val:
        return self.expr(e.cond)

    def expr_Sum(self, e: s.Sum) -> Val:
        """Σ_{i=1}^{n} f(x[i]): f on the whole last axis of x, then a sum over it."""
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

    def expr_Concat(self, e: s.Concat) -> Val:
        items = [x for x in e.items if not isinstance(x, s.Ellipsis_)]
        fam = self.family_of(items[0].id) if isinstance(items[0], s.Name) else None
        ty = self.ty(e)
        if fam is not None and any(isinstance(x, s.Ellipsis_) for x in e.items):
            if fam.stacked is not None:  # (…, H, T, d) → (…, T, H·d)
                moved = _method(fam.stacked.code, "transpose", _int(-3), _int(-2))
                return Val(_method(moved, "flatten", _int(-2)), ty, True)
            return self.join(ir.Ref(fam.local), fam.ty, e.sep, ty)
        vals = [self.expr(x) for x in items]
        code = ir.Seq(tuple(v.code for v in vals), "list")
        return self.join(code, vals[0].ty, e.sep, ty, any(v.lifted for v in vals))

    def join(self, items: ir.Expr, item: Ty, sep: str, ty: Ty, lifted: bool = True) -> Val:
        if len(item.shape) == 1:  # vectors become columns (",") or rows (";")
            axis = -2 if sep == ";" else -1
            return Val(_call("torch.stack", items, dim=_int(axis)), ty, lifted)
        axis = -len(item.shape) if sep == ";" else -1
        return Val(_call("torch.cat", items, dim=_int(axis)), ty, lifted)

    # ------------------------------------------------------------------ calls
    def expr_Call(self, e: s.Call) -> Val:
        info = self.info.calls.get(id(e))
        if info is None:
            return self.builtin(e)
        return self.call_card(e, info)

    def builtin(self, e: s.Call) -> Val:
        if len(e.args) != 1:
            self.fail(e, f"'{e.func}' takes one argument")
        x = self.expr(e.args[0])
        ty = self.ty(e)
        if e.func in ("GELU", "GELU_tanh"):
            return Val(self.low.passes.gelu(self, x.code, e.func == "GELU_tanh"), ty, x.lifted)
        if e.func in ELEMENTWISE:
            return Val(_call(ELEMENTWISE[e.func], x.code), ty, x.lifted)
        if e.func == "softmax":
            axis = 0 if self.info.sig.layout == "column" else -1
            return Val(_call("torch.softmax", x.code, dim=_int(axis)), ty, x.lifted)
        if e.func in ("mean", "var"):
            return Val(_method(x.code, e.func, _int(-1), **(
                {"unbiased": ir.Lit("False")} if e.func == "var" else {})), ty, x.lifted)
        if e.func == "max":
            return Val(_method(x.code, "amax", _int(-1)), ty, x.lifted)
        if e.func == "length":
            return Val(ir.Sub(ir.Attr(x.code, "shape"), (_int(-1),)), Ty(elem="ℕ"))
        return self.fail(e, f"code generation does not know '{e.func}' yet")

    def call_card(self, e: s.Call, call: CallInfo) -> Val:
        ty = self.ty(e)
        if self.low.fuse:
            fused = self.low.passes.call(self, e, call)
            if fused is not None:
                return Val(fused, ty, True)
        args = self.call_args(e, call)
        module = self.module_for(e, call)
        if module is not None:
            return Val(ir.Call(module, tuple(a.code for a in args)), ty, True)
        fn = self.low.function(call.callee)
        kwargs = self.call_params(e, call)
        return Val(ir.Call(ir.Ref(fn), tuple(a.code for a in args), tuple(kwargs)), ty, True)

    def call_args(self, e: s.Call, call: CallInfo) -> list[Val]:
        sig = self.low.checker.info(call.callee).sig
        args = [self.expr(a) for a in e.args]
        return args + [args[0]] * (len(sig.inputs) - len(args))  # Z = X: self-attention

    def module_for(self, e: s.Call, call: CallInfo) -> ir.Expr | None:
        for given in call.params.values():
            if not isinstance(given, s.Name):
                continue
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
        outer, self.point = self.point, {v: (k, len(shape), shape[k]) for k, v in enumerate(vars_)}
        try:
            return self.expr(rule.value)
        finally:
            self.point = outer

    def constant_mask(self, call: CallInfo, name: str, value: s.Expr) -> Val:
        shape = tuple(self.dim(d) for d in self.callee_shape(call, name))
        fill = "True" if isinstance(value, s.Num) and value.value else "False"
        code = _call("torch.full", ir.Seq(shape), ir.Lit(fill), device=self.device_expr())
        return Val(code, Ty(), False)

    def callee_shape(self, call: CallInfo, name: str) -> tuple[Dim, ...]:
        from ..types import substitute

        hyper = self.low.checker.info(call.callee).sig.hypers[name]
        return substitute(hyper, call.bind).shape
