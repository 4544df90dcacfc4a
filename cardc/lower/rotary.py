"""Fusion rules for rotary embeddings: a card whose math is RoPE, rotate-half or on
interleaved pairs, lowers to the generated file's `rotate_half(X, θ_base)` or `rotate_pairs(…)`
(hook: call); RoPE on the first r columns concatenated with the rest is one rotation with
`width=r` (hook: expression).

RoPE is recognised by its structure: row t turned by the angles (t − 1) ω for frequencies ω
that the card computes from its hyperparameters alone, however it computes them (a base
written as a number, Llama 3's rescaling). Those steps become a function of the file,
`<Card>_frequencies(d, …hyperparameters, device, dtype)`, and the rotation
`rotate_half(X, (<Card>_frequencies, …their values))`: the angle tables are made from its
value once per positions, width and hyperparameters, as for the library's base."""

from __future__ import annotations

from .. import ir
from .. import syntax as s
from ..checker import CallInfo
from ..dims import Dim
from ..spelling import display
from .context import Steps
from .intrinsics import computed_from, leading, match_computed, matching, patterns
from .intrinsics import make_call as _call
from .values import LowerError, Scope, Val, dim_expr, local_name

Found = tuple[str, dict[str, str]]
HELPERS = {"rope": "rotate_half", "rope_pairs": "rotate_pairs",  # pattern → helper
           "rope_by": "rotate_half", "rope_pairs_by": "rotate_pairs"}
COMPUTED = ("rope_by", "rope_pairs_by")  # the patterns whose frequencies the card computes


def find_call(names: tuple[str, ...], body: Steps, e: s.Call, call: CallInfo) -> Found | None:
    """The RoPE pattern the callee's math is, with its renaming: the library's card itself,
    else any card that computes its frequencies from its hyperparameters alone."""
    found = matching(call.callee, [n for n in names if n not in COMPUTED])
    if found is not None:
        return found
    for name in names:
        if name in COMPUTED:
            ren = match_computed(patterns()[name], call.callee)
            if ren is not None and _frequencies_alone(body, call.callee, name, ren):
                return name, ren
    return None


def _frequencies_alone(body: Steps, callee: s.Algorithm, which: str, ren: dict[str, str]) -> bool:
    """Whether the callee's steps before the rotation compute ω, a vector of d/2 entries, from
    its hyperparameters alone (not X, not the positions), and it owns no tensors."""
    sig = body.low.checker.info(callee).sig
    if len(sig.inputs) != 1 or len(sig.inputs[0][1].shape) != 2 or sig.layout == "column":
        return False
    if any(name not in sig.hypers for name, _ in sig.params):
        return False
    rows, width = sig.inputs[0][1].shape
    if rows != Dim.sym(ren["T"]) or width != Dim.sym(ren["d"]):
        return False
    info = body.low.checker.info(callee)
    tail = callee.steps[len(leading(patterns()[which], callee)):]
    if any(isinstance(n, s.Name) and n.id == ren["ω"] and
           len(getattr(info.types.get(id(n)), "shape", ())) != 1 for n in s.nodes(tail)):
        return False  # one frequency for every plane: a number would broadcast
    allowed = {h for h in sig.hypers if not sig.hypers[h].shape} | {ren["d"]}
    return computed_from(leading(patterns()[which], callee), allowed - {ren["T"]})


def lower_call(body: Steps, e: s.Call, call: CallInfo, found: Found) -> ir.Expr | None:
    """`rotate_half(X, θ_base)` or `rotate_pairs(…)`, helpers of the generated file whose
    angle tables are computed once per positions, width and base (every layer, queries and
    keys share them); with frequencies the card computes, `(<Card>_frequencies, …)` in
    place of the base. Decoding with a KV cache starts the positions after the cached ones
    (cardc.lower.decoding)."""
    which, ren = found
    sig = body.low.checker.info(call.callee).sig
    if len(sig.inputs) != 1 or len(sig.inputs[0][1].shape) != 2 or sig.layout == "column":
        return None
    x = body.expr(e.args[0])
    if x.flipped or x.rows:
        return None
    if which in COMPUTED:
        theta = _frequency_call(body, call, which, ren)
    else:
        given = _given(body, call, ren["θ_base"])
        theta = None if given is None else body.expr(given).code
    if theta is None:
        return None
    return _call(HELPERS[which], x.code, theta)


def _given(body: Steps, call: CallInfo, name: str) -> s.Expr | None:
    """What the call gives the callee's hyperparameter `name`, else its default."""
    given = call.hypers.get(name)
    if given is None:
        return body.low.checker.info(call.callee).sig.defaults.get(name)
    return given.value if isinstance(given, s.Arg) else given


def _frequency_call(body: Steps, call: CallInfo, which: str, ren: dict[str, str]) -> ir.Expr | None:
    """`(<Card>_frequencies, …values of the hyperparameters it reads)`: what rotate_half
    makes the frequencies from (cardc.runtime.modelkit's rope_table)."""
    made = _frequency_function(body, call.callee, which, ren)
    if made is None:
        return None
    name, hypers = made
    values: list[ir.Expr] = []
    for h in hypers:
        given = _given(body, call, h)
        try:
            if given is not None:
                values.append(body.expr(given).code)
            elif h in call.bind:  # a size the call's arguments give
                values.append(body.dim(call.bind[h]))
            else:
                return None
        except LowerError:
            return None
    return ir.Seq((ir.Ref(name), *values))


def _frequency_function(body: Steps, callee: s.Algorithm, which: str,
                        ren: dict[str, str]) -> tuple[str, list[str]] | None:
    """The function of the file that computes the callee's frequencies, made once per card:
    its name and the hyperparameters it takes after the width d (then device and dtype)."""
    low = body.low
    name = f"{local_name(callee.label)}_frequencies"
    info = low.checker.info(callee)
    sig = info.sig
    steps = leading(patterns()[which], callee)
    read = [h for h in sig.hypers if h != ren["d"] and h not in sig.definitions and
            any(isinstance(n, s.Name) and n.id == h for n in s.nodes(steps))]
    if any(f.name == name for f in low.program.functions):
        return name, read
    width = ren["d"]
    scope = Scope()
    for h in read:
        scope.values[h] = Val(ir.Ref(local_name(h)), sig.hypers[h], False)

    def dim_of(sym: str) -> ir.Expr:
        sym = sym.lstrip("?")
        if sym == width or sym in read:
            return ir.Ref(local_name(sym))
        if sym in sig.definitions:
            return dim_expr(sig.definitions[sym], dim_of)
        raise LowerError(callee.span, f"cannot tell the size '{display(sym)}' of the frequencies")

    fb = type(body)(low, callee, info, scope, dim_of, "…")
    fb.device, fb.dtype = ir.Ref("device"), ir.Ref("dtype")
    try:
        for step in steps:
            fb.step(step)
    except LowerError:
        return None
    omega = scope.values.get(ren["ω"])
    if not isinstance(omega, Val):
        return None
    fb.emit(ir.Return(omega.code))
    args = [ir.Arg(local_name(width)), *(ir.Arg(local_name(h)) for h in read),
            ir.Arg("device"), ir.Arg("dtype")]
    doc = (f"The frequencies ω of {callee.label}'s rotation, from its width "
           f"{display(width)} and hyperparameters: its steps before the angles, computed once "
           "per angle table (cardc.runtime.modelkit's rope_table).")
    low.program.functions.append(ir.Function(name, doc, low.origin(callee), args, fb.out))
    return name, read


Partial = tuple[s.Call, CallInfo, Found]


def find_partial(names: tuple[str, ...], body: Steps, e: s.Expr) -> Partial | None:
    """`[RoPE(X[:, 1 : r]), X[:, r + 1 : d]]`: a concatenation whose first part is a call of a
    card whose math is RoPE."""
    if not isinstance(e, s.Concat) or len(e.items) != 2 or not isinstance(e.items[0], s.Call):
        return None
    if body.procedure and e.sep == "," and body.ty(e).elem == "ℕ":
        return None  # a sequence of tokens (Body.sequence)
    rot = e.items[0]
    call = body.info.calls.get(id(rot))
    found = call and find_call(names, body, rot, call)
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
