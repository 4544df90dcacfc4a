"""Fusion rules for rotary embeddings: a card whose math is RoPE, rotate-half or on
interleaved pairs, lowers to the generated file's `rotate_half(X, θ_base)` or `rotate_pairs(…)`
(hook: call); RoPE on the first r columns concatenated with the rest is one rotation with
`width=r` (hook: expression)."""

from __future__ import annotations

from .. import ir
from .. import syntax as s
from ..checker import CallInfo
from ..dims import Dim
from .context import Steps
from .intrinsics import make_call as _call
from .intrinsics import matching
from .values import LowerError, Val

Found = tuple[str, dict[str, str]]
HELPERS = {"rope": "rotate_half", "rope_pairs": "rotate_pairs"}  # pattern → helper


def find_call(patterns: tuple[str, ...], body: Steps, e: s.Call, call: CallInfo) -> Found | None:
    """The RoPE pattern the callee's math is, with its renaming."""
    return matching(call.callee, patterns)


def lower_call(body: Steps, e: s.Call, call: CallInfo, found: Found) -> ir.Expr | None:
    """`rotate_half(X, θ_base)` or `rotate_pairs(…)`, helpers of the generated file whose
    angle tables are computed once per positions, width and base (every layer, queries and
    keys share them); decoding with a KV cache starts the positions after the cached ones
    (cardc.lower.decoding)."""
    which, ren = found
    sig = body.low.checker.info(call.callee).sig
    if len(sig.inputs) != 1 or len(sig.inputs[0][1].shape) != 2 or sig.layout == "column":
        return None
    x = body.expr(e.args[0])
    if x.flipped or x.rows:
        return None
    given = call.hypers.get(ren["θ_base"])
    if given is None:
        given = sig.defaults.get(ren["θ_base"])
    elif isinstance(given, s.Arg):
        given = given.value
    if given is None:
        return None
    helper = HELPERS[which]
    return _call(helper, x.code, body.expr(given).code)


Partial = tuple[s.Call, CallInfo, Found]


def find_partial(patterns: tuple[str, ...], body: Steps, e: s.Expr) -> Partial | None:
    """`[RoPE(X[:, 1 : r]), X[:, r + 1 : d]]`: a concatenation whose first part is a call of a
    card whose math is RoPE."""
    if not isinstance(e, s.Concat) or len(e.items) != 2 or not isinstance(e.items[0], s.Call):
        return None
    if body.procedure and e.sep == "," and body.ty(e).elem == "ℕ":
        return None  # a sequence of tokens (Body.sequence)
    rot = e.items[0]
    call = body.info.calls.get(id(rot))
    found = call and matching(call.callee, patterns)
    if not found or len(rot.args) != 1:
        return None
    return rot, call, found


def lower_partial(body: Steps, e: s.Concat, partial: Partial) -> Val | None:
    """RoPE on the first r columns of X, the rest passed through, is one rotation of all of X
    whose tables leave the columns after r unturned (`rotate_half(X, θ_base, width=r)`): no
    slices and no concatenation."""
    rot, call, found = partial
    rest = e.items[1]
    head, tail = _columns(rot.args[0]), _columns(rest)
    if head is None or tail is None or head[0] != tail[0]:
        return None
    x = body.expr(s.Name(head[0], span=rest.span))
    if not x.lifted or x.rows or x.flipped or len(x.ty.shape) != 2:
        return None
    one = Dim.const(1)
    try:
        bounds = [[None if b is None else body.low.dim_value(body.alg, b) for b in part[1:]]
                  for part in (head, tail)]
    except LowerError:
        return None
    (lo, r), (after, end) = bounds
    if lo not in (None, one) or r is None or after != r + one or \
            end not in (None, x.ty.shape[1]):
        return None
    fused = lower_call(body, rot, call, found)
    if not (isinstance(fused, ir.Call) and fused.args):
        return None
    return Val(ir.Call(fused.func, (x.code, *fused.args[1:]),
                       (*fused.kwargs, ("width", body.dim(r)))), body.ty(e), True)


def _columns(e: s.Expr) -> tuple[str, s.Expr | None, s.Expr | None] | None:
    """`X[:, lo : hi]`: the name X and the bounds of its column slice."""
    if not (isinstance(e, s.Index) and isinstance(e.base, s.Name) and len(e.items) == 2):
        return None
    rows, cols = e.items
    if not (isinstance(rows, s.Slice) and rows.lo is None and rows.hi is None and
            isinstance(cols, s.Slice)):
        return None
    return e.base.id, cols.lo, cols.hi
