"""The vocabulary the parts of a card's lowering share (cardc.lower.steps and its parts):
how builtins and comparisons are spelled in torch, the special tokens, and small helpers that
build IR (0-based indices with their constants folded, transposes, elementwise results).
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from .. import syntax as s
from ..builtins import MATH, TORCH
from ..builtins import SPECIAL_TOKENS as TOKENS_AFTER
from ..checker import CardInfo
from ..dims import Dim
from ..types import Ty
from .values import Val

ELEMENTWISE = TORCH  # builtin → the torch function it lowers to
ON_NUMBERS = MATH  # builtin → the Python function it is on a number
SPECIAL_TOKENS = {name: after + 1 for name, after in TOKENS_AFTER.items()}  # 0-based: N_V − k
COMPARE = {"≤": "<=", "<": "<", "≥": ">=", ">": ">", "=": "==", "≠": "!=", "∧": "&"}


def _call(func: str, *args: ir.Expr, **kwargs: ir.Expr) -> ir.Call:
    return ir.Call(ir.Ref(func), args, tuple(kwargs.items()))


def _method(obj: ir.Expr, name: str, *args: ir.Expr, **kwargs: ir.Expr) -> ir.Call:
    return ir.Call(ir.Attr(obj, name), args, tuple(kwargs.items()))


LOG_OF = {ir.Ref("torch.softmax"): ir.Ref("torch.log_softmax"),
          ir.Ref("torch.sigmoid"): ir.Ref("F.logsigmoid")}  # f → the fused log ∘ f


def _log_of(code: ir.Expr) -> ir.Expr | None:
    """log of softmax(z) or σ(z), or of entries picked from it: log_softmax(z) or
    logsigmoid(z), picked alike (one kernel, and no log of an underflowed 0: −∞ where the
    value is finite)."""
    if isinstance(code, ir.Call) and code.func in LOG_OF:
        return ir.Call(LOG_OF[code.func], code.args, code.kwargs)
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


def _is_tensor(val: Val) -> bool:
    """Whether a value is held in a tensor, not a Python number (a hyperparameter's)."""
    return bool(val.lifted or val.rows or val.ty.shape or val.tensor)


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
