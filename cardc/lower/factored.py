"""Attention whose queries are a product (a pass): the association of the products chosen by
their sizes when the model runs.

    Q = cat_broadcast([A @ B.mT, R], dim=-1)        (or torch.cat; or A @ B.mT alone; B.T)
    … sdpa(Q, K, V, …)[..., :c] @ U …               (the slice and the product by U optional)

becomes `factored_sdpa(A, B, R, K, V, out=U, cols=c, …)` (cardc/runtime/modelkit.py), which
computes the same attention with B moved onto the keys and U onto the values where that costs
fewer multiplications: a latent attention written in its absorbed form (the queries taken into
the latent through each head's key up-projection, the attended latent projected up after)
then trains in the naive form, whose scores and attended values are as narrow as a head,
and decodes in the absorbed one, whose cache holds the latent alone. Only where Q is read by
nothing but that call (and the cache's mask, which reads its rows only, as A has them) and
nothing A, B or R reads is assigned between Q's definition and the call.
"""

from __future__ import annotations

import dataclasses

from .. import ir

SDPA = frozenset({"grouped_sdpa", "F.scaled_dot_product_attention"})
CATS = frozenset({"cat_broadcast", "torch.cat"})
ELLIPSIS = (ir.Lit("..."), ir.Ref("..."))
MARK = ir.Ref("<the queries' A>")  # where A goes, once the rewrite is known to hold


@dataclasses.dataclass(frozen=True)
class Factors:
    """The queries `A @ B.mT`, beside `R` (None: alone)."""

    A: ir.Expr
    B: ir.Expr
    R: ir.Expr | None


def factor_attention(program: ir.Program) -> None:
    """Every function's and module's attention whose queries are a product, factored."""
    for unit in (*program.functions, *program.modules):
        unit.body = _body(list(unit.body))


def _body(stmts: list[ir.Stmt]) -> list[ir.Stmt]:
    out = [_nested(st) for st in stmts]
    i = 0
    while i < len(out):
        if (rewritten := _factor_at(out, i)) is not None:
            out = rewritten
        i += 1
    return out


def _nested(st: ir.Stmt) -> ir.Stmt:
    if isinstance(st, ir.If):
        return dataclasses.replace(st, body=tuple(_body(list(st.body))),
                                   orelse=tuple(_body(list(st.orelse))))
    if isinstance(st, ir.Loop | ir.While):
        return dataclasses.replace(st, body=tuple(_body(list(st.body))))
    return st


def _factor_at(stmts: list[ir.Stmt], i: int) -> list[ir.Stmt] | None:
    """`stmts` with the queries defined at `i` factored into the one attention that reads
    them, or None where the statement defines no such queries or they are read otherwise."""
    st = stmts[i]
    if not (isinstance(st, ir.Assign) and len(st.targets) == 1):
        return None
    factors = _factors(st.value)
    name = st.targets[0]
    if factors is None:
        return None
    later = stmts[i + 1:]
    users = [j for j, other in enumerate(later) if name in ir.ref_ids([other])]
    if len(users) != 1 or name in ir.assigned(tuple(later)):
        return None
    j = users[0]
    reads = ir.ref_ids([factors.A, factors.B] + ([] if factors.R is None else [factors.R]))
    if reads & ir.assigned(tuple(later[:j])):
        return None  # what the factors read changes before the call
    marked = ir.rewrite(later[j], lambda e: _factored(e, name, factors))
    if name in ir.ref_ids([marked]):
        return None  # Q is read besides the attention's own arguments
    keep: list[ir.Stmt] = []
    a = factors.A
    if not isinstance(a, ir.Ref):  # the mask reads A's rows too: computed once, named
        keep = [ir.Assign((name,), a, ir.Note(line=st.note.line))]
        a = ir.Ref(name)
    user = ir.rewrite(marked, lambda e: a if e == MARK else None)
    return [*stmts[:i], *keep, *later[:j], user, *later[j + 1:]]


def _factors(e: ir.Expr) -> Factors | None:
    if _product(e) is not None:
        return Factors(*_product(e), None)
    if not (isinstance(e, ir.Call) and isinstance(e.func, ir.Ref) and e.func.id in CATS
            and len(e.args) == 1 and isinstance(e.args[0], ir.Seq)
            and len(e.args[0].items) == 2 and dict(e.kwargs).get("dim") == ir.Lit("-1")):
        return None
    lead, rest = e.args[0].items
    product = _product(lead)
    return None if product is None else Factors(*product, rest)


def _product(e: ir.Expr) -> tuple[ir.Expr, ir.Expr] | None:
    """(A, B) of `A @ B.mT` (or `A @ B.T`, a matrix's)."""
    if isinstance(e, ir.Bin) and e.op == "@" and isinstance(e.right, ir.Attr) and \
            e.right.name in ("mT", "T"):
        return e.left, e.right.obj
    return None


def _factored(e: ir.Expr, name: str, f: Factors) -> ir.Expr | None:
    """`e` as a factored attention if it is the attention reading the queries `name`, with
    its slice of the values' first columns and its product by a matrix after it if any."""
    out = None
    if isinstance(e, ir.Bin) and e.op == "@":
        out, e = e.right, e.left
    cols = _leading_columns(e)
    if cols is not None:
        e = e.obj  # type: ignore[union-attr]
    if not (isinstance(e, ir.Call) and isinstance(e.func, ir.Ref) and e.func.id in SDPA
            and len(e.args) == 3 and e.args[0] == ir.Ref(name)
            and "enable_gqa" not in dict(e.kwargs)):  # grouped_sdpa serves fewer key heads
        return None
    q, k, v = e.args
    if cols is not None and v != k:
        return None  # a slice of the keys' columns is what the values' slice is moved onto
    kwargs = tuple((key, _rows_of(val, name)) for key, val in e.kwargs)
    extra = tuple((key, val) for key, val in (("out", out), ("cols", cols)) if val is not None)
    r = ir.Lit("None") if f.R is None else f.R
    return ir.Call(ir.Ref("factored_sdpa"), (MARK, f.B, r, k, v), extra + kwargs)


def _is_sdpa(e: ir.Expr) -> bool:
    return isinstance(e, ir.Call) and isinstance(e.func, ir.Ref) and e.func.id in SDPA


def _leading_columns(e: ir.Expr) -> ir.Expr | None:
    """c of `call[..., :c]`."""
    if not (isinstance(e, ir.Sub) and _is_sdpa(e.obj) and len(e.items) == 2
            and e.items[0] in ELLIPSIS):
        return None
    cols = e.items[1]
    if isinstance(cols, ir.SliceX) and cols.lo is None and cols.step is None and \
            cols.hi is not None:
        return cols.hi
    return None


def _rows_of(e: ir.Expr, name: str) -> ir.Expr:
    """A keyword argument of the attention with the cache's mask reading A's rows where it
    read the queries' (`cache.mask(Q, K)`)."""
    def visit(n):
        if isinstance(n, ir.Call) and isinstance(n.func, ir.Attr) and n.func.name == "mask" \
                and n.args[:1] == (ir.Ref(name),):
            return dataclasses.replace(n, args=(MARK, *n.args[1:]))
        return None

    return ir.rewrite(e, visit)
