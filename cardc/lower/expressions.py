"""Lowering of a card's expressions: names (values, parameters, loop variables, constants),
arithmetic and products (layout-aware: a column-major card's matrices are stored flipped),
transposes, sums and concatenations."""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from .. import syntax as s
from ..checker import CONSTANTS, instance
from ..dims import Dim
from ..spelling import display
from ..types import SetTy, Ty
from .body import (
    COMPARE,
    ELEMENTWISE,
    SPECIAL_TOKENS,
    _call,
    _int,
    _is_all,
    _is_ones_row,
    _is_tensor,
    _like,
    _linear_bias,
    _log_of,
    _method,
    _mT,
    _names_in,
    _shift,
    _varies,
)
from .experts import set_sum
from .gradients import listed, norm
from .values import (
    Family,
    Gradient,
    Val,
    counted,
    is_token,
    num_lit,
)


class Expressions:
    """Names, arithmetic, products, sums and concatenations (part of `cardc.lower.steps.Body`)."""

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
            v = display(name)
            self.fail(e, f"the sum's index '{v}' is read as a number here: code generation "
                         f"reads it only as the index of a value, as 'e[{v}]'")
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
        if fam is not None and fam.count is not None and index in self.family_vars:
            return self.members(fam, e)
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
        example = self.example(name)
        if example is not None:
            return example
        return self.fail(e, f"cannot generate code for '{display(name)}' here")

    def special(self, e: s.Expr) -> bool:
        """A special token (`eos_token`), compared as its 0-based ID: with a token the card
        holds as such, or one it drew (`y ≠ eos_token`), whose type does not say so."""
        return isinstance(e, s.Name) and e.id in SPECIAL_TOKENS and \
            e.id not in self.info.sig.hypers

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

    def members(self, fam: Family, e: s.Name) -> Val:
        """Every member of a map's family y^e under Σ_e, the members as rows: (…, E, card axes)."""
        if fam.flipped or fam.merged:
            self.fail(e, f"code generation sums '{display(e.id)}' over its members only where "
                         "each is stored as the card writes it")
        rows = (fam.count,)
        if fam.stacked is not None:  # every head at once: (…, H, T, w)
            return replace(fam.stacked, ty=fam.ty, rows=rows)
        code = _call("torch.stack", ir.Ref(fam.local), dim=_int(-1 - len(fam.ty.shape)))
        return Val(code, fam.ty, True, False, rows)

    def arange(self, var: str) -> Val:
        axis, rank, size = self.point[var]  # t of ∀t counts from 1, as every card index
        code = _call("torch.arange", _int(1), ir.Bin("+", self.dim(size), _int(1)),
                     device=self.device_expr())
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
            if not _is_tensor(x) and not self.sum_axis:
                x = self.on_number(e.left.id, x)
                if not x.tensor:
                    return x
            log = _log_of(x.code) if e.left.id == "log" else None
            return _like(x, log or _call(ELEMENTWISE[e.left.id], x.code), self.ty(e))
        a, b = self.expr(e.left), self.expr(e.right)
        ty = self.ty(e)
        if e.op in ARITHMETIC:
            a, b = counted(a), counted(b)
        elif e.op in COMPARE and is_token(a) != is_token(b):  # a token beside a number
            a, b = (x if self.special(side) else counted(x)
                    for x, side in ((a, e.left), (b, e.right)))
        if e.op in ARITHMETIC:  # [[·]] counts as 0 or 1: a sum of two is 2, a difference −1
            a, b = _numbers(a, b, e.op), _numbers(b, a, e.op)
            a, b = self.as_real(a, b, e.right), self.as_real(b, a, e.left)
            if e.op in ("+", "−", " ", "·", "⊙") and _is_tensor(a) and _is_tensor(b) and \
                    {a.ty.elem, b.ty.elem} <= INTEGERS and ty.elem == "ℝ":
                ty = Ty(ty.shape, a.ty.elem)  # `p 1^⊺ − 1 p^⊺` of positions p: still integers
        if e.op == "/":
            a, b = self.real(a, b), self.real(b, a)
        if e.op in (" ", "·"):
            op = "*" if not a.ty.shape or not b.ty.shape or self.sum_axis or \
                self.point and not self.ty(e).shape else "@"  # entries under ∀t, t′: a number
            if op == "@":  # a product of matrices takes one number format: no promotion
                a, b = self.real_beside(a, b), self.real_beside(b, a)
            a, b = self.meet(a, b), self.meet(b, a)
            if op == "@" and self.column:
                return self.matmul(e, a, b, ty)
        elif e.op in COMPARE:
            op = COMPARE[e.op]
        else:
            op = {"+": "+", "−": "-", "⊙": "*", "/": "/", "mod": "%"}.get(e.op)
            if op is None:
                self.fail(e, f"code generation does not handle '{e.op}' yet")
            a, b = self.meet(a, b), self.meet(b, a)
        if op == "+" and _linear_bias(a, b):  # F.linear(X, W) + b 1^⊺ → F.linear(X, W, b)
            return replace(a, code=ir.Call(a.code.func, (*a.code.args, b.code)), ty=ty)
        if op == "@":  # a row-major product reads both sides in the card's own layout
            a, b = _unflipped(a), _unflipped(b)
        else:
            a, b = self.align(a, b), self.align(b, a)
            a, b = self.same_layout(a, b), self.same_layout(b, a)
            rank = max(len(a.ty.shape), len(b.ty.shape))
            if self.sum_axis or self.point:
                ty = Ty((a.ty if len(a.ty.shape) == rank else b.ty).shape, ty.elem)
        code = _product(a, b) if op == "@" else ir.Bin(op, a.code, b.code)
        if op in "+-" and not (a.lifted or b.lifted or a.ty.shape or b.ty.shape):
            code = _shift(code, 0)  # numbers: `(i + 1) − 1` is `i`
        return Val(code, ty, a.lifted or b.lifted, a.flipped or b.flipped, a.rows or b.rows,
                   a.tensor or b.tensor, a.exact or b.exact)

    def meet(self, val: Val, other: Val) -> Val:
        """Reals of integers alone (held in real_type: float32 in a bfloat16 model) meeting the
        model's own real values, in the model's number format: torch would promote the model's
        values to float32, and a product of matrices does not mix formats at all."""
        if not val.exact or other.exact or other.ty.elem != "ℝ" or not _is_tensor(other) or \
                self.dtype is None:
            return val
        return replace(val, code=_method(val.code, "to", self.dtype), exact=False)

    def as_real(self, val: Val, other: Val, other_node: s.Expr) -> Val:
        """An integer tensor (`t − t′` over positions) meeting a real number (`log(α) · G`)
        in the card's real dtype: torch would make it its default dtype, float32 in a float64
        model."""
        if val.ty.elem not in INTEGERS or not _is_tensor(val) or self.dtype is None or \
                _is_tensor(other) or other.ty.elem != "ℝ" or _whole_number(other_node):
            return val
        return replace(val, code=_method(val.code, "to", self.dtype), ty=Ty(val.ty.shape))

    def real(self, val: Val, other: Val) -> Val:
        """An integer tensor divided by a number is a real: held in the number format of
        the card's first input (modelkit's real_type: float64 in a float64 model, else
        float32), where torch would divide into its default format, float32."""
        if val.ty.elem != "ℕ" or not _is_tensor(val) or \
                other.ty.elem != "ℕ" and _is_tensor(other):  # a real tensor sets the format
            return val
        return self.to_real(val)

    def to_real(self, val: Val) -> Val:
        """An integer tensor as reals in the card's number format (modelkit's real_type)."""
        if self.dtype is not None:  # the card's first real input's
            real = _call("real_type", self.dtype)
        else:
            device = self.device_expr()
            assert isinstance(device, ir.Attr)  # `X.device` of an input X
            real = _call("real_type", ir.Attr(device.obj, "dtype"))
        return replace(val, code=_method(val.code, "to", real), ty=replace(val.ty, elem="ℝ"),
                       exact=True)

    def real_beside(self, val: Val, other: Val) -> Val:
        """An integer tensor multiplied by a real matrix (`m X` of position distances m) in
        the card's real number format: torch's matrix product does not mix formats."""
        if val.ty.elem not in INTEGERS or other.ty.elem != "ℝ" or not _is_tensor(other):
            return val
        return self.to_real(val)

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
        if other.rows and not a.rows and a.lifted:
            a = self.beside_rows(a)  # x ≥ j over j: x for every j, the j axis before x's own;
            # x[1] of each example beside x[t]: one entry, the same at every position
            pad = len(other.ty.shape) - len(a.ty.shape)
        if not a.lifted or pad <= 0:
            return a
        code = ir.Sub(a.code, (ir.Ref("..."), *[ir.Ref("None")] * pad))
        return Val(code, Ty((None,) * pad + a.ty.shape, a.ty.elem), True)

    @staticmethod
    def beside_rows(a: Val) -> Val:
        """A value that does not vary over a map's positions, given a positions axis of one
        in front of its card axes (after its batch axes), to broadcast against one that does."""
        code = ir.Sub(a.code, (ir.Ref("..."), ir.Ref("None"),
                               *[ir.SliceX(None, None)] * len(a.ty.shape)))
        return replace(a, code=code, lifted=True)

    def expr_Unary(self, e: s.Unary) -> Val:
        x = self.expr(e.operand)
        if e.op in ("−", "√"):
            x = counted(x)
        if e.op == "−":
            return _like(x, ir.Un("-", _numbers(x, x, "−").code))
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
        x, p = self.real_power(x, p, e.exponent)
        shaped = p if _varies(p) and not _varies(x) else x
        return replace(shaped, code=ir.Bin("**", x.code, p.code), lifted=x.lifted or p.lifted,
                       rows=x.rows or p.rows, tensor=x.tensor or p.tensor)

    def real_power(self, x: Val, p: Val, exponent: s.Expr) -> tuple[Val, Val]:
        """x^p in reals where either side is an integer tensor: torch's power of integer
        tensors stays integer (2 ** −h floors to 0, t ** −1 fails); a whole number at least 0
        keeps an integer base integer (t²)."""
        if p.ty.elem in INTEGERS and _is_tensor(p):
            return x, self.to_real(p)
        if x.ty.elem in INTEGERS and _is_tensor(x) and not (
                isinstance(exponent, s.Num) and exponent.text.isdigit()):
            return self.to_real(x), p
        return x, p

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
        if self.lead == "…":  # a function's tensor may hold every head in front (lower.heads)
            return Val(ir.Attr(x.code, "mT"), ty)
        return Val(ir.Attr(x.code, "T"), ty)

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
        if isinstance(self.info.types.get(id(e.over)), SetTy):  # Σ_{e ∈ I}, I ← argtop_k(…)
            return set_sum(self, e)
        if e.over is not None or not (isinstance(e.lo, s.Num) and e.lo.text == "1"):
            self.fail(e, "code generation handles sums Σ_{i=1}^{n} only")
        size = self.low.dim_value(self.alg, e.hi)
        if _axis_read(e) is not None:
            return self.axis_read_sum(e, size)
        outer, self.sum_axis = self.sum_axis, (e.index, size)
        try:
            body = self.expr(e.body)
        finally:
            self.sum_axis = outer
        kept = self.ty(e).shape  # Σ_j C[:, j]: the columns summed, the rows kept
        if len(body.ty.shape) != len(kept) + 1:
            self.fail(e, f"the sum over '{display(e.index)}' must index the last axis")
        return Val(_method(body.code, "sum", _int(-1)), Ty(kept), body.lifted)

    def axis_read_sum(self, e: s.Sum, size: Dim) -> Val:
        """Σ_{t=1}^{n} C[t, :]: C's rows summed, its first n where it has more, the axis t
        reads summed whichever it is."""
        k = _axis_read(e)
        base = self.expr(e.body.base)
        rank = len(base.ty.shape)
        if base.rows or base.flipped or not isinstance(base.ty, Ty) or rank != len(e.body.items):
            self.fail(e.body, f"code generation sums '{display(e.index)}' over an axis of a "
                              "plain matrix or tensor only")
        axis = k - rank  # counted from the end: batch axes may stand in front
        code = base.code
        if base.ty.shape[k] != size:  # the first n entries of the axis
            code = ir.Sub(code, (ir.Ref("..."), ir.SliceX(None, self.dim(size)),
                                 *[ir.SliceX(None, None)] * (-axis - 1)))
        return Val(_method(code, "sum", _int(axis)), Ty(self.ty(e).shape), base.lifted)

    def sums_family(self, e: s.Sum) -> bool:
        """Σ_u f(k_u), Σ_{t=1}^{T} α_t v_t or Σ_{e=1}^{E} g[e] · y^e: the index names members
        of a family (over positions, or made by a map)."""
        members = [self.member(n) for n in _names_in(e.body)]
        return any(fam is not None and (fam.positions or fam.count is not None) and
                   index == e.index for fam, index in members)

    def family_sum(self, e: s.Sum) -> Val:
        """A sum over a family's members: its rows axis, summed."""
        self.family_vars[e.index] = self.family_count(e)
        try:
            body = self.expr(e.body)
        finally:
            self.family_vars.pop(e.index, None)
        axis = -1 - len(body.ty.shape)  # Σ_u of numbers: one per example, which `align`
        code = _method(body.code, "sum", _int(axis))  # stands beside the rows of a map
        return Val(code, body.ty, body.lifted, False, ())

    def family_count(self, e: s.Sum) -> Dim | None:
        """How many members of a map's family Σ_{e=1}^{E} sums: all of them, or it is refused."""
        counts = {fam.count for fam, index in map(self.member, _names_in(e.body))
                  if fam is not None and fam.count is not None and index == e.index}
        if not counts:
            return None
        hi = self.low.dim_value(self.alg, e.hi) if e.hi is not None else None
        first = isinstance(e.lo, s.Num) and e.lo.text == "1"
        if e.over is not None or not first or counts != {hi}:
            self.fail(e, f"code generation sums a family over all its members, "
                         f"Σ_{{{display(e.index)}=1}}^{{n}} for its n members")
        return hi

    def expr_Concat(self, e: s.Concat) -> Val:
        items = [x for x in e.items if not isinstance(x, s.Ellipsis_)]
        if self.procedure and e.sep == "," and self.ty(e).elem == "ℕ":
            return self.sequence(e, items)
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
        # a function's values may hold every head, or one for all (lower.heads): they
        # broadcast; so do a parameter's rows beside a value with batch axes ([c; E])
        lifted = [v.lifted for v in vals]
        broadcast = len(vals) > 1 and any(lifted) and (self.lead == "…" or not all(lifted))
        return self.join(code, vals[0].ty, e.sep, ty, any(v.lifted for v in vals),
                         vals[0].flipped, broadcast)

    def join(self, items: ir.Expr, item: Ty, sep: str, ty: Ty, lifted: bool = True,
             flipped: bool = False, broadcast: bool = False) -> Val:
        if len(item.shape) == 1:  # vectors become columns (",") or rows (";")
            if self.column:  # a matrix of columns is stored flipped: columns are rows
                axis, flip = (-1, False) if sep == ";" else (-2, True)
                return Val(_call("torch.stack", items, dim=_int(axis)), ty, lifted, flip)
            axis = -2 if sep == ";" else -1
            return Val(_call("torch.stack", items, dim=_int(axis)), ty, lifted)
        axis = -len(item.shape) if sep == ";" else -1
        if flipped:  # card axis 0 of a flipped matrix is the last physical one
            axis = -1 if sep == ";" else -2
        cat = "cat_broadcast" if broadcast else "torch.cat"
        return Val(_call(cat, items, dim=_int(axis)), ty, lifted, flipped)


def _product(a: Val, b: Val) -> ir.Expr:
    """A row-major `a @ b` where a vector with batch axes is not taken for a matrix's rows: a
    matrix times one (…, E) is `(A @ g[..., None])[..., 0]`, one (…, D) times a batched
    matrix `(x[..., None, :] @ M)[..., 0, :]`."""
    if len(a.ty.shape) == 2 and len(b.ty.shape) == 1 and b.lifted and not (a.rows or b.rows):
        column = ir.Sub(b.code, (ir.Ref("..."), ir.SliceX(None, None), ir.Ref("None")))
        return ir.Sub(ir.Bin("@", a.code, column), (ir.Ref("..."), _int(0)))
    if len(a.ty.shape) == 1 and len(b.ty.shape) == 2 and a.lifted and b.lifted and \
            not (a.rows or b.rows):
        row = ir.Sub(a.code, (ir.Ref("..."), ir.Ref("None"), ir.SliceX(None, None)))
        return ir.Sub(ir.Bin("@", row, b.code), (ir.Ref("..."), _int(0), ir.SliceX(None, None)))
    return ir.Bin("@", a.code, b.code)


def _whole_number(e: s.Expr) -> bool:
    """A literal whole number, `2` or `−1`: an integer tensor stays integer with it."""
    if isinstance(e, s.Unary) and e.op == "−":
        e = e.operand
    return isinstance(e, s.Num) and e.text.isdigit()


def _unflipped(val: Val) -> Val:
    """A matrix stored flipped (a map's columns), turned back to the card's layout."""
    if not val.flipped or len(val.ty.shape) != 2:
        return val
    return replace(val, code=_mT(val.code), flipped=False)


ARITHMETIC = ("+", "−", "⊙", "/", " ", "·")
INTEGERS = {"ℕ", "ℤ"}


def _numbers(val: Val, other: Val, op: str) -> Val:
    """A tensor of conditions (`[[x ≥ j]]`) as the numbers 0 and 1 it stands for: torch's
    booleans neither subtract nor negate, and add as `or`. A product of matrices takes the
    number format of its other side (a `bool` matrix does not multiply a `float` one)."""
    if val.ty.elem != "𝔹" or not _is_tensor(val):
        return val
    matrices = op in (" ", "·") and val.ty.shape and other.ty.shape
    if not matrices:
        code = _method(val.code, "long")
    elif other.ty.elem != "𝔹" and _is_tensor(other):
        code = _method(val.code, "to", ir.Attr(other.code, "dtype"))
    else:
        code = _method(val.code, "float")
    return replace(val, code=code, ty=Ty(val.ty.shape, "ℕ"))


def _axis_read(e: s.Sum) -> int | None:
    """The axis k of `Σ_t C[…, t, …]` whose body reads a name at the sum's index on axis k and
    all of every other axis, k not the last (the last is the general sum's); else None."""
    body = e.body
    if not isinstance(body, s.Index) or not isinstance(body.base, s.Name):
        return None
    at = [k for k, item in enumerate(body.items)
          if isinstance(item, s.Name) and item.id == e.index]
    if len(at) != 1 or at[0] == len(body.items) - 1:
        return None
    rest = [item for k, item in enumerate(body.items) if k != at[0]]
    return at[0] if all(_is_all(item) for item in rest) else None
