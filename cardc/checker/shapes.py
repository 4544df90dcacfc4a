"""Shapes and dimensions: equality up to unknown sizes, broadcasting, dimensions written in a
card (`D/H`), and whether a card fits a card type."""

from __future__ import annotations

from .. import syntax as s
from ..diagnostics import Diagnostics
from ..dims import ONE, Dim
from ..spelling import display
from ..types import BundleTy, Entry, FamilyTy, Ty, subst_dim
from .results import CheckError, ModelTy, Signature


def _is_var(d: Dim) -> bool:
    syms = d.symbols
    return len(syms) == 1 and next(iter(syms)).startswith("?") and d == Dim.sym(next(iter(syms)))


def dims_equal(a: Dim | None, b: Dim | None) -> bool:
    return a is None or b is None or a == b


def same_shape(a: Ty, b: Ty) -> bool:
    return a.rank == b.rank and all(dims_equal(x, y) for x, y in zip(a.shape, b.shape, strict=False))


def broadcast_shape(a: tuple, b: tuple) -> tuple | None:
    """Trailing axes align (row-major bias vectors); a free axis (1^⊺) takes its partner's size."""
    if len(a) < len(b):
        a, b = b, a
    out = list(a[: len(a) - len(b)])
    for x, y in zip(a[len(a) - len(b):], b, strict=False):
        if not dims_equal(x, y):
            if x == ONE:
                out.append(y)
                continue
            if y == ONE:
                out.append(x)
                continue
            return None
        out.append(x if x is not None else y)
    return tuple(out)


def broadcastable(small: Ty, big: Ty) -> bool:
    return broadcast_shape(small.shape, big.shape) is not None


def _is_sequence(entry: Entry | None) -> bool:
    return isinstance(entry, Ty) and entry.rank == 1 and entry.vocab is not None


def _same_vocab(a: Ty, b: Ty) -> bool:
    return a.vocab is None or b.vocab is None or a.vocab == b.vocab or _is_var(a.vocab) \
        or _is_var(b.vocab)


def _same_entry(a: Entry | None, b: Entry | None) -> bool:
    if isinstance(a, BundleTy) and isinstance(b, BundleTy):
        return a.same_kind(b)
    if isinstance(a, Ty) and isinstance(b, Ty):
        return same_shape(a, b)
    return a == b


def _members(b: BundleTy) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    for name, entry in b.members.items():
        out[name] = entry
        if isinstance(entry, BundleTy):
            out.update(_members(entry))
        if isinstance(entry, FamilyTy) and isinstance(entry.entry, BundleTy):
            out.update({k: FamilyTy(entry.var, entry.over, v) for k, v in _members(entry.entry).items()})
    return out


def _flat_names(b: BundleTy) -> list[str]:
    out = []
    for name, entry in b.members.items():
        out.append(name)
        inner = entry.entry if isinstance(entry, FamilyTy) else entry
        if isinstance(inner, BundleTy):
            out += _flat_names(inner)
    return out


def _adopt(bundle: BundleTy, other: BundleTy) -> None:
    """A bundle known only by name (θ, prose-declared) takes the structure it is used with."""
    if not bundle.members and other.members:
        bundle.members.update(other.members)
        bundle.card = other.card


def fits_model(want: ModelTy, sig: Signature) -> bool:
    """A card whose one input and one output fit a card type, with one reading of its symbols
    (a card of several outputs fits none)."""
    given = [ty for _, ty in sig.inputs]
    bind: dict[str, Dim] = {}
    return len(given) == 1 and isinstance(given[0], Ty) and isinstance(sig.output, Ty) \
        and not sig.more \
        and _fits(want.input, given[0], bind) and _fits(want.output, sig.output, bind)


def _fits(want: Ty, given: Ty, bind: dict[str, Dim]) -> bool:
    """A card's declared input or output matches a card type's: the same rank and kind, its
    sizes consistent with one reading of the type's symbols."""
    if want.rank != given.rank or want.elem != given.elem or \
            (want.vocab is None) != (given.vocab is None):
        return False
    for w, g in zip((*want.shape, want.vocab), (*given.shape, given.vocab), strict=True):
        if w is None or g is None:
            continue
        sym = next(iter(w.symbols), None) if len(w.symbols) == 1 else None
        if sym is None or Dim.sym(sym) != w:
            if not dims_equal(subst_dim(w, bind), g):
                return False
        elif sym in bind and not dims_equal(bind[sym], g):
            return False
        else:
            bind[sym] = g
    return True


def _is_integral_expr(e: s.Expr) -> bool:
    if isinstance(e, s.Num):
        return e.text.isdigit()
    if isinstance(e, s.Name):
        return True
    if isinstance(e, s.BinOp):
        return e.op in "+−/· " and _is_integral_expr(e.left) and _is_integral_expr(e.right)
    if isinstance(e, s.Power):
        return _is_integral_expr(e.base) and _is_integral_expr(e.exponent)
    return False


def _dim(expr: s.Expr, definitions: dict[str, Dim], diags: Diagnostics | None,
         values: dict[str, Dim] | None = None) -> Dim | None:
    def go(e: s.Expr) -> Dim:
        if isinstance(e, s.Num) and e.text.isdigit():
            return Dim.const(int(e.text))
        if isinstance(e, s.Name):
            if values and e.id in values:
                return values[e.id]
            return definitions.get(e.id, Dim.sym(e.id))
        if isinstance(e, s.BinOp) and e.op in ("+", "−", "·", " ", "/"):
            a, b = go(e.left), go(e.right)
            if e.op == "+":
                return a + b
            if e.op == "−":
                return a - b
            if e.op == "/":
                q = a / b
                if q is None:
                    raise CheckError
                return q
            return a * b
        if isinstance(e, s.Power) and isinstance(e.exponent, s.Num) and \
                e.exponent.text.isdigit():  # C p²: a product of sizes written as a power
            base, out = go(e.base), Dim.const(1)
            for _ in range(int(e.exponent.text)):
                out = out * base
            return out
        if isinstance(e, s.Call) and e.func == "length" and len(e.args) == 1:
            arg = e.args[0]
            return Dim.sym(f"|{arg.id}|") if isinstance(arg, s.Name) else Dim.sym("|?|")
        raise CheckError

    try:
        return go(expr)
    except CheckError:
        if diags is not None:
            diags.error(expr.span, "expected a dimension: a whole number or a product or sum of hyperparameters")
        return None


def expr_dim(expr: s.Expr, definitions: dict[str, Dim]) -> Dim | None:
    """A dimension written in a card (`D/H`, `ℓ + 1`), or None when it is not one."""
    return _dim(expr, definitions, None)


def _d(d: Dim | None) -> str:
    return "*" if d is None else display(str(d))
