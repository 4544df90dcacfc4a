"""The expression checker: the type of every expression of a card's steps (products, sums,
indexing, concatenation, sets, random choices), recorded in the card's results; calls are the
call checker's."""

from __future__ import annotations

from .. import syntax as s
from ..builtins import BUILTINS
from ..dims import ONE, Dim
from ..render.text import render_expr
from ..spelling import display
from ..types import BundleTy, Entry, FuncTy, SetTy, Ty, substitute
from .calls import CallChecker
from .indexed import instance
from .messages import _WORDS, _product_hint, _text
from .results import CheckError
from .scope import BodyState, Part
from .shapes import (
    _d,
    _is_var,
    _members,
    _same_vocab,
    broadcast_shape,
    broadcastable,
    dims_equal,
    same_shape,
)


class ExprChecker(Part):
    """Types the expressions of one card's steps."""

    def __init__(self, state: BodyState):
        super().__init__(state)
        self.calls = CallChecker(state, self)

    def set_size(self, e: s.Expr) -> Dim:
        """The n of a set of indices: [n], or a subset of [n] built as {t ∈ [n] : …}."""
        if isinstance(e, s.Concat) and len(e.items) == 1:
            return self.state.dim_of(e.items[0])
        ty = self.expr(e)
        if isinstance(ty, SetTy):
            return ty.of
        self.error(e.span, f"expected a set such as [ℓ] or {{t ∈ [ℓ] : …}}, not {ty}")
        raise CheckError

    def expr(self, e: s.Expr) -> Ty:
        ty = s.dispatch(self, "expr", e)
        self.info.types[id(e)] = ty
        return ty

    def tensor(self, e: s.Expr) -> Ty:
        return self.as_tensor(e, self.expr(e))

    def as_tensor(self, e: s.Expr, ty: Entry) -> Ty:
        if not isinstance(ty, Ty):
            hint = None
            if isinstance(ty, FuncTy):
                hint = f"write {display(_text(e))}({', '.join(map(display, ty.params))})"
            self.error(e.span, f"'{_text(e)}' is {ty}, not a tensor", hint)
            raise CheckError
        return substitute(ty, self.state.solved) if self.state.solved else ty

    def operand(self, e: s.Expr) -> Ty | BundleTy:
        """A tensor, or a parameter bundle: θ − η · ∇loss(θ) is arithmetic on bundles."""
        ty = self.expr(e)
        return ty if isinstance(ty, BundleTy) else self.as_tensor(e, ty)

    def solve(self, a: tuple, b: tuple) -> bool:
        """Bind inference variables (?d_out) so that two shapes agree; False if they cannot."""
        if len(a) != len(b):
            return False
        for x, y in zip(a, b, strict=False):
            for u, v in ((x, y), (y, x)):
                if u is not None and v is not None and u != v and _is_var(u):
                    self.state.solved[next(iter(u.symbols))] = v
                    break
        return True

    def expr_Name(self, e: s.Name) -> Ty:
        entry = self.state.lookup(e.id, e.span)
        return entry

    def expr_Num(self, e: s.Num) -> Ty:
        if e.text.isdigit():
            return Ty(elem="ℕ", value=Dim.const(int(e.text)))
        return Ty()

    def expr_BinOp(self, e: s.BinOp) -> Ty:
        if e.op in ("≤", "<", "≥", ">", "≠", "=", "≡"):  # entry by entry: x ≥ j of a vector x
            a, b = self.tensor(e.left), self.tensor(e.right)
            shape = broadcast_shape(a.shape, b.shape)
            if shape is None:
                self.error(e.span, f"cannot compare {a} with {b}",
                           hint="shapes must match, or one must be a scalar or a trailing part "
                                "of the other")
                raise CheckError
            return Ty(shape, "𝔹")
        if e.op == "∧":  # both sides are conditions
            for side in (e.left, e.right):
                ty = self.tensor(side)
                if ty.elem != "𝔹" or ty.shape:
                    self.error(side.span, f"'∧' joins conditions; this is {ty}")
                    raise CheckError
            return Ty(elem="𝔹")
        if e.op == " " and isinstance(e.left, s.Name) and e.left.id in BUILTINS \
                and self.state.try_lookup(e.left.id) is None:
            return self.calls.apply_builtin(e.left.id, [self.tensor(e.right)], e)
        if e.op == " " and isinstance(e.left, s.Unary) and e.left.op == "−" \
                and isinstance(e.left.operand, s.Name) and e.left.operand.id in BUILTINS \
                and self.state.try_lookup(e.left.operand.id) is None:  # −log p reads as −(log p)
            return self.calls.apply_builtin(e.left.operand.id, [self.tensor(e.right)], e)
        a, b = self.operand(e.left), self.operand(e.right)
        if isinstance(a, BundleTy) or isinstance(b, BundleTy):
            return self.bundle_arithmetic(e, a, b)
        if e.op in ("+", "−", "⊙"):
            return self.broadcast(a, b, e)
        if e.op == "·" and e.star is not None and a.rank >= 2 and b.rank >= 2:
            self.c.diags.warning(e.star, f"'*' between two matrices is the matrix product "
                                 f"({a} times {b})",
                                 hint="for the element-wise product write ⊙ (ASCII: (.))")
        if e.op == "mod":  # ℓ mod p: whole numbers, the remainder in {0, …, p − 1}
            return self.remainder(a, b, e)
        if e.op == "/":
            if b.shape and not broadcastable(b, a):
                self.error(e.span, f"cannot divide {a} by {b}")
                raise CheckError
            return Ty(a.shape, "ℝ")
        return self.product(a, b, e)

    def remainder(self, a: Ty, b: Ty, e: s.BinOp) -> Ty:
        for side, ty in ((e.left, a), (e.right, b)):
            if ty.elem not in ("ℕ", "ℤ") or ty.vocab is not None:
                self.error(side.span, f"'mod' takes whole numbers; this is {ty}")
                raise CheckError
        if b.shape:
            self.error(e.right.span, f"'mod' divides by a whole number; this is {b}")
            raise CheckError
        return Ty(a.shape, "ℕ")

    def bundle_arithmetic(self, e: s.BinOp, a: Ty | BundleTy, b: Ty | BundleTy) -> BundleTy:
        """Bundles of one card add and subtract; a scalar scales one (θ − η · ∇loss(θ)); 0 is
        every bundle's zero, so that a gradient accumulates from `g ← 0` (g ← g + ∇loss(θ))."""
        if e.op == "+" and any(isinstance(x, Ty) and not x.shape and x.value == Dim.const(0)
                               for x in (a, b)):
            return b if isinstance(b, BundleTy) else a
        if e.op in ("+", "−", "⊙") and isinstance(a, BundleTy) and isinstance(b, BundleTy):
            if a.same_kind(b):
                return a if a.members else b
            self.error(e.span, f"cannot {_WORDS[e.op]} {a} and {b}",
                       hint="parameters of different cards do not match")
            raise CheckError
        scaled, scale = (b, a) if isinstance(b, BundleTy) else (a, b)
        if e.op in ("·", " ", "/") and isinstance(scale, Ty) and not scale.shape \
                and (e.op != "/" or scale is b):
            return scaled
        self.error(e.span, f"cannot {_WORDS.get(e.op, 'combine')} {a} and {b}",
                   hint="bundles add to bundles of the same card and scale by scalars")
        raise CheckError

    def broadcast(self, a: Ty, b: Ty, e: s.BinOp) -> Ty:
        shape = broadcast_shape(a.shape, b.shape)
        if shape is None and self.solve(a.shape, b.shape):
            a, b = substitute(a, self.state.solved), substitute(b, self.state.solved)
            shape = broadcast_shape(a.shape, b.shape)
        if shape is None:
            self.error(e.span, f"cannot {_WORDS[e.op]} {a} and {b}",
                       hint="shapes must match, or one must be a scalar or a trailing part of the other")
            raise CheckError
        elem = "ℝ" if "ℝ" in (a.elem, b.elem) else a.elem
        value = None
        if a.value is not None and b.value is not None and not shape:
            value = a.value + b.value if e.op == "+" else a.value - b.value if e.op == "−" else None
        return Ty(shape, elem, value)

    def product(self, a: Ty, b: Ty, e: s.BinOp) -> Ty:
        """Juxtaposition and `·`: scaling, matrix–matrix, matrix–vector, outer products."""
        for side, ty, other in ((e.left, a, b), (e.right, b, a)):
            if isinstance(side, s.Name) and side.id in self.state.number_states and \
                    not ty.shape and other.rank >= 2:  # a loop state still a number
                self.state.scaled.setdefault(side.id, e)
        if not a.shape or not b.shape:
            value = a.value * b.value if a.value is not None and b.value is not None else None
            return Ty(a.shape or b.shape, "ℝ" if "ℝ" in (a.elem, b.elem) else a.elem, value)
        if a.rank == 1 and b.rank == 2 and b.shape[0] == ONE:  # b 1^⊺: an outer product
            return Ty((a.shape[0], b.shape[1]))
        inner_a = a.shape[-1]
        inner_b = b.shape[0] if b.rank <= 2 else b.shape[-2]
        if not dims_equal(inner_a, inner_b):
            transpose = _product_hint(e, a, b)  # else: say where each shape came from
            self.error(e.span, f"cannot multiply {a} by {b}: inner dimensions "
                               f"{_d(inner_a)} and {_d(inner_b)} differ",
                       hint=transpose or self.redeclare_hint(e, a, b),
                       notes=() if transpose else self.origin_notes(e, a, b))
            raise CheckError
        if a.rank == 2 and a.shape[0] == ONE and b.rank == 1:  # q^⊺ k: a row times a column
            return Ty()
        shape = a.shape[:-1] + (b.shape[1:] if b.rank <= 2 else b.shape[:-2] + b.shape[-1:])
        return Ty(shape)

    def redeclare_hint(self, e: s.BinOp, a: Ty, b: Ty) -> str | None:
        """A parameter matrix times a computed value: the declaration may be what is wrong."""
        params = _members(self.sig.tree)
        left, right = e.left, e.right
        if isinstance(left, s.Name) and left.id in params and not _is_param(right, params) \
                and a.rank == 2 and b.rank >= 1:
            want = Ty((a.shape[0], b.shape[0]), a.elem)
        elif isinstance(right, s.Name) and right.id in params and not _is_param(left, params) \
                and b.rank == 2 and a.rank >= 1:
            want = Ty((a.shape[-1], b.shape[1]), b.elem)
            left = right
        else:
            return None
        return f"did you mean to declare {display(left.id)} ∈ {want}?"

    def origin_notes(self, e: s.BinOp, *tys: Ty) -> tuple[tuple[s.Span, str], ...]:
        """Where each named operand got its shape: its declaration, or the step that assigned it."""
        notes = []
        for operand, ty in zip((e.left, e.right), tys, strict=True):
            if not isinstance(operand, s.Name):
                continue
            name = display(operand.id)
            if operand.id in self.state.assigned:
                notes.append((self.state.assigned[operand.id], f"'{name}' is {ty} from this step"))
            elif operand.id in self.state.declared:
                notes.append((self.state.declared[operand.id], f"'{name}' is declared {ty} here"))
        return tuple(notes)

    def expr_Unary(self, e: s.Unary) -> Entry:
        if e.op == "∇":
            return self.gradient(e)
        ty = self.tensor(e.operand)
        if e.op == "¬":
            return Ty(ty.shape, "𝔹")
        value = -ty.value if e.op == "−" and ty.value is not None else None
        return Ty(ty.shape, "ℝ" if e.op == "√" else ty.elem, value)

    def gradient(self, e: s.Unary) -> Entry:
        """∇loss(θ): the gradient of a scalar function of θ with respect to θ, shaped like θ."""
        f = e.operand
        if not isinstance(f, s.Call) or len(f.args) != 1 or f.params:
            self.error(e.span, "∇ takes the gradient of a function of one variable",
                       hint="define the function first, as 'loss(θ) = …', then write ∇loss(θ)")
            raise CheckError
        value = self.tensor(f)
        if value.shape:
            self.error(e.span, f"∇ needs a scalar to differentiate; {display(render_expr(f))} is {value}")
            raise CheckError
        wrt = f.args[0]
        if isinstance(wrt, s.Name):  # a loss of the old θ: its graph is gone
            stale = self.state.staleness.read(f.func, wrt.id, f.span, render_expr(e))
            if stale is not None:
                self.refuse_stale(stale)
        return self.expr(wrt)

    def expr_Power(self, e: s.Power) -> Ty:
        ty = self.tensor(e.base)
        exponent = self.tensor(e.exponent)
        if exponent.shape:
            self.error(e.exponent.span, f"an exponent must be a scalar, not {exponent}")
        return Ty(ty.shape)

    def expr_Transpose(self, e: s.Transpose) -> Ty:
        ty = self.tensor(e.operand)
        if isinstance(e.operand, s.Num) and e.operand.text == "1":
            return Ty((ONE, None))  # 1^⊺: a row of ones as long as its partner needs
        if ty.rank == 1:
            return Ty((ONE, ty.shape[0]), ty.elem)
        if ty.rank != 2:
            self.error(e.span, f"cannot transpose {ty}: only matrices and vectors")
            raise CheckError
        return Ty((ty.shape[1], ty.shape[0]), ty.elem)

    def expr_Index(self, e: s.Index) -> Ty:
        return self.index(self.tensor(e.base), e)

    def index(self, base: Ty, e: s.Index) -> Ty:
        if len(e.items) > base.rank:
            self.error(e.span, f"{len(e.items)} indices into {base}, which has {base.rank} axes")
            raise CheckError
        shape: list[Dim | None] = []
        for axis, item in enumerate(e.items):
            size = base.shape[axis]
            if isinstance(item, s.Progression):
                shape.append(self.progression_size(item))
                continue
            if isinstance(item, s.Slice):
                if item.lo is None and item.hi is None:
                    shape.append(size)
                    continue
                lo = self.state.dim_of(item.lo) if item.lo is not None else ONE
                hi = self.state.dim_of(item.hi) if item.hi is not None else size
                shape.append(hi - lo + ONE)
                continue
            ity = self.tensor(item)
            if ity.elem not in ("ℕ", "𝔹") and not isinstance(item, s.Name):
                self.error(item.span, f"an index must be a whole number, not {ity}")
            if not dims_equal(ity.vocab, size) and not _is_var(size) and not _is_var(ity.vocab):
                self.error(item.span, f"a token of a vocabulary of {_d(ity.vocab)} indexes an axis "
                                      f"of {_d(size)}", hint="tokens index the vocabulary axis")
            shape += list(ity.shape)  # a vector of token IDs gathers rows
        return Ty(tuple(shape) + base.shape[len(e.items):], base.elem, vocab=base.vocab)

    def progression_size(self, p: s.Progression) -> Dim:
        """How many entries `a, b, …, c` picks: (c − a)/(b − a) + 1, its step b − a a whole
        number from 1 up."""
        first, second, last = self.state.dim_of(p.first), self.state.dim_of(p.second), self.state.dim_of(p.last)
        step = (second - first).constant()
        if step is None or step < 1 or step.denominator != 1:
            self.error(p.second.span, f"the step of a progression must be a whole number from "
                                      f"1 up, not {_d(second - first)}",
                       hint="the odd columns of X are 'X[:, 1, 3, …, d − 1]', a step of 2")
            raise CheckError
        return (last - first) * Dim.const(1 / step) + ONE

    def expr_Progression(self, e: s.Progression) -> Ty:
        self.error(e.span, "a progression 'a, b, …, c' picks entries of an index only",
                   hint="write it inside the brackets of an index: 'X[:, 1, 3, …, d − 1]'")
        raise CheckError

    def expr_Concat(self, e: s.Concat) -> Ty:
        items = [x for x in e.items if not isinstance(x, s.Ellipsis_)]
        tys = [self.tensor(x) for x in items]
        first = tys[0]
        if e.sep == "," and any(ty.vocab is not None and ty.rank <= 1 for ty in tys):
            return self.tokens(e, items, tys)
        if first.rank >= 2 and len(items) > 1 and len(items) == len(e.items):
            return self.join_parts(e, items, tys)
        for x, ty in zip(items[1:], tys[1:], strict=False):
            if not same_shape(first, ty):
                self.error(x.span, f"cannot concatenate {ty} with {first}")
                raise CheckError
        count = self.concat_count(e, items)
        if len(e.items) == 1 and not first.shape:
            return Ty((first.value or Dim.sym("?"),), "ℕ")  # [N]: the set 1..N
        if not first.shape:
            self.error(e.span, "cannot concatenate scalars",
                       hint="[a, b] joins vectors or matrices, [x, y] tokens")
            raise CheckError
        if first.rank == 1:
            return Ty((count, first.shape[0]) if e.sep == ";" else (first.shape[0], count))
        if e.sep == ";":
            return Ty((count * first.shape[0],) + first.shape[1:])
        return Ty(first.shape[:-1] + (count * first.shape[-1],))

    def join_parts(self, e: s.Concat, items: list[s.Expr], tys: list[Ty]) -> Ty:
        """[A, B] side by side (the last axes add up), [A; B] one above the other (the first
        axes do): parts written out one by one may differ in width, ℝ^{T×a} and ℝ^{T×b}
        making ℝ^{T×(a + b)}; every other axis must agree."""
        first = tys[0]
        axis = 0 if e.sep == ";" else first.rank - 1
        hint = ("parts side by side may differ in width only" if e.sep == ","
                else "parts one above the other may differ in height only")
        total: Dim | None = Dim.const(0)
        for x, ty in zip(items, tys, strict=True):
            if ty.rank != first.rank or not all(
                    i == axis or dims_equal(a, b)
                    for i, (a, b) in enumerate(zip(ty.shape, first.shape, strict=True))):
                self.error(x.span, f"cannot concatenate {ty} with {first}", hint=hint)
                raise CheckError
            size = ty.shape[axis]
            total = None if size is None or total is None else total + size
        shape = list(first.shape)
        shape[axis] = total
        return Ty(tuple(shape), first.elem)

    def tokens(self, e: s.Concat, items: list[s.Expr], tys: list[Ty]) -> Ty:
        """[x, y], [bos_token]: tokens and sequences joined into one sequence."""
        if any(isinstance(x, s.Ellipsis_) for x in e.items):
            self.error(e.span, "cannot tell how many tokens '…' stands for")
            raise CheckError
        vocab = next(ty.vocab for ty in tys if ty.vocab is not None)
        length = Dim.const(0)
        for x, ty in zip(items, tys, strict=True):
            if ty.rank > 1 or ty.vocab is None or not _same_vocab(ty, Ty(vocab=vocab)):
                self.error(x.span, f"cannot join {ty} into a sequence of tokens of a vocabulary "
                                   f"of {_d(vocab)}", hint="join tokens and sequences of tokens")
                raise CheckError
            length = length + (ty.shape[0] if ty.shape and ty.shape[0] is not None else ONE)
        return Ty((length,), "ℕ", vocab=vocab)

    def concat_count(self, e: s.Concat, items: list[s.Expr]) -> Dim:
        if not any(isinstance(x, s.Ellipsis_) for x in e.items):
            return Dim.const(len(items))
        first, last = items[0], items[-1]
        lo, hi = self.family_index(first), self.family_index(last)
        if lo is None or hi is None:
            self.error(e.span, "cannot tell how many items '…' stands for",
                       hint="write the first and last items of a family, as [e_1, e_2, …, e_ℓ]")
            raise CheckError
        return hi - lo + ONE

    def family_index(self, e: s.Expr) -> Dim | None:
        if not isinstance(e, s.Name):
            return None
        for pattern, (var, _, _) in self.state.families.items():
            idx = instance(pattern, var, e.id)
            if idx is not None:
                return self.state.dim_of(s.Name(idx)) if not idx.isdigit() else Dim.const(int(idx))
        return None

    def expr_Iverson(self, e: s.Iverson) -> Ty:
        cond = self.expr(e.cond)  # [[x ≥ j]] of a vector x is a vector of 0s and 1s
        return Ty(cond.shape if isinstance(cond, Ty) else (), "𝔹")

    def expr_Norm(self, e: s.Norm) -> Ty:
        """‖x‖: the L2 norm of a tensor's entries, or of a bundle's (a gradient's global norm)."""
        value = self.operand(e.operand)
        if isinstance(value, Ty) and value.elem == "𝔹":
            self.error(e.span, f"‖·‖ measures numbers, not {value}")
            raise CheckError
        return Ty()

    def expr_Sum(self, e: s.Sum) -> Ty:
        # Σ_{t∈T̃} is over a set of indices; the index also binds members of families, as
        # x_n of a dataset under Σ_{n=a}^{b} (a minibatch)
        size = self.set_size(e.over) if e.over is not None else Dim.sym(e.index)
        outer = self.state.loop_vars.get(e.index)
        self.state.loop_vars[e.index] = size
        self.state.scopes.append({e.index: Ty(elem="ℕ", value=Dim.sym(e.index))})
        try:
            body = self.tensor(e.body)
        finally:
            self.state.scopes.pop()
            self.state.loop_vars.pop(e.index)
            if outer is not None:
                self.state.loop_vars[e.index] = outer
        return Ty(body.shape)

    def expr_Choice(self, e: s.Choice) -> Ty:
        """a or b randomly with probability p or q: options alike, one scalar per option."""
        options = [self.tensor(x) for x in e.options]
        for x, ty in zip(e.options[1:], options[1:], strict=True):
            if not same_shape(ty, options[0]) or ty.elem != options[0].elem \
                    or not _same_vocab(ty, options[0]):
                self.error(x.span, f"the options of a random choice differ: {options[0]} and {ty}")
                raise CheckError
        if len(e.probs) != len(e.options):
            self.error(e.span, f"{len(e.options)} options but {len(e.probs)} probabilities",
                       hint="give one probability per option")
        for p in e.probs:
            ty = self.tensor(p)
            if ty.shape:
                self.error(p.span, f"a probability must be a scalar, not {ty}")
        first = options[0]
        return Ty(first.shape, first.elem, vocab=first.vocab)

    def expr_SetBuilder(self, e: s.SetBuilder) -> SetTy:
        """{t ∈ [ℓ] : c}: the indices of [ℓ] where c holds."""
        size = self.set_size(e.domain)
        outer = self.state.loop_vars.get(e.var)
        self.state.loop_vars[e.var] = size
        self.state.scopes.append({e.var: Ty(elem="ℕ", value=Dim.sym(e.var))})
        try:
            cond = self.tensor(e.cond)
        finally:
            self.state.scopes.pop()
            self.state.loop_vars.pop(e.var)
            if outer is not None:
                self.state.loop_vars[e.var] = outer
        if cond.shape:
            self.error(e.cond.span, f"a set's condition must be a single truth value, not {cond}")
        return SetTy(size)

    def expr_Call(self, e: s.Call) -> Entry:
        return self.calls.call(e)


def _is_param(e: s.Expr, params: dict[str, Entry]) -> bool:
    return isinstance(e, s.Name) and e.id in params
