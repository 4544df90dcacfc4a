"""Fusion rule for maps over attention heads: `for h ∈ [H] : Y^h ← head(X | W^h_qkv, Mask)`
whose callee's math is one attention head becomes one projection (heads stacked), a split
into heads and fused SDPA (hook: loop). Row-major self- and cross-attention heads and the
paper's column-major heads each have their pattern."""

from __future__ import annotations

from .. import ir
from .. import syntax as s
from ..checker import CallInfo
from ..dims import Dim
from ..types import BundleTy, Ty
from .analysis import CAUSAL_SDPA, CONTEXT, RECOMPUTES, hides_later
from .context import Steps
from .intrinsics import make_call as _call
from .intrinsics import make_method as _method
from .intrinsics import matching
from .values import Family, Val, local_name

Found = tuple[s.Assign, CallInfo, str, dict[str, str]]


def find(patterns: tuple[str, ...], body: Steps, st: s.For, step: s.Step) -> Found | None:
    """A map of one assignment whose value calls a card that is an attention head."""
    if len(st.body) != 1 or not isinstance(st.body[0].stmt, s.Assign):
        return None
    assign = st.body[0].stmt
    call = body.info.calls.get(id(assign.value))
    if call is None or not isinstance(assign.target, s.Name):
        return None
    found = matching(call.callee, patterns)
    if found is None:
        return None
    return assign, call, *found


def lower(body: Steps, st: s.For, step: s.Step, found: Found) -> bool:
    """The heads' projections, split, and SDPA; False keeps the literal loop."""
    assign, call, which, ren = found
    e = assign.value
    if which == "attention_head_cm":
        return _column(body, st, step, assign, call, ren)
    if which == "cross_attention_head":
        return _cross(body, st, step, assign, call, ren)
    if len({str(a) for a in e.args}) != 1:  # cross-attention keeps the literal loop
        return False
    roles = stacked_roles(body, call, ren, st.var)
    if roles is None:
        return False
    weights, biases = roles
    mask = sdpa_mask(body, call, ren["Mask"], keys=e.args[0])
    if mask is None:
        return False
    x = body.expr(e.args[0])
    ty = body.ty(e)
    wq = weights[0]
    fused = body.fresh("qkv")
    proj = ir.Bin("@", x.code, ir.Ref(wq.storage))
    if biases is not None:
        proj = ir.Bin("+", proj, ir.Ref(biases[0].storage))
    width = wq.shape[-1]
    t = body.dim_text(x.ty.shape[0])
    total = body.dim_text(wq.shape[-1] * wq.over * _const(3))
    body.emit(ir.Assign((fused,), proj, body.note(step, None, f"(B, {t}, {total})")))
    names = [body.fresh(local_name(ren[r])) for r in ("Q", "K", "V")]
    dims = ir.Seq((ir.Lit("3"), body.dim(wq.over), body.dim(width)))
    heads = _method(_method(_method(ir.Ref(fused), "unflatten", ir.Lit("-1"), dims),
                            "movedim", ir.Lit("-3"), ir.Lit("0")),
                    "transpose", ir.Lit("-3"), ir.Lit("-2"))
    order = [w.index for w in weights]
    head_shape = f"(B, {body.dim_text(wq.over)}, {t}, {body.dim_text(width)})"
    if order == [0, 1, 2]:
        body.emit(ir.Assign(tuple(names), _method(heads, "unbind", ir.Lit("0")),
                            body.note(step, None, f"{head_shape} each")))
    else:
        parts = body.fresh("parts")
        body.emit(ir.Assign((parts,), heads))
        for n, k in zip(names, order, strict=True):
            body.emit(ir.Assign((n,), ir.Sub(ir.Ref(parts), (ir.Lit(str(k)),))))
    fam = Family(st.var, body.fresh(f"{local_name(assign.target.id.split('^')[0])}_"
                                    f"{local_name(st.var)}"), ty)
    sdpa = _call("F.scaled_dot_product_attention", *(ir.Ref(n) for n in names), **mask)
    body.emit(ir.Assign((fam.local,), sdpa, body.note(step, None, head_shape)))
    fam.stacked = Val(ir.Ref(fam.local), Ty(ty.shape), True)
    body.scope.values[assign.target.id] = fam
    return True


def _cross(body: Steps, st: s.For, step: s.Step, assign: s.Assign,
           call: CallInfo, ren: dict[str, str]) -> bool:
    """Row-major cross-attention heads: the fused W_qkv (columns q | k | v, heads within
    each) is split once, so X is projected to the queries and Z to keys and values in one
    matmul each, and SDPA attends with no mask."""
    e = assign.value
    roles = stacked_roles(body, call, ren, st.var)
    if roles is None or [w.index for w in roles[0]] != [0, 1, 2]:
        return False  # another column order keeps the literal loop
    context = not body.low.masking.reads_decoded(body.alg, e.args[1])
    body.low.masking.attention(False, cache=CONTEXT if context else RECOMPUTES)  # none hidden
    wq, bq = roles[0][0], roles[1][0]
    x, z = body.expr(e.args[0]), body.expr(e.args[1])
    t, tz = body.dim_text(x.ty.shape[0]), body.dim_text(z.ty.shape[0])
    h, d = body.dim_text(wq.over), body.dim_text(wq.shape[-1])
    split = body.dim(wq.shape[-1] * wq.over)  # the query columns: H heads of width d
    width = body.dim_text(wq.shape[-1] * wq.over)

    def part(storage: str, query: bool) -> ir.Expr:
        cut = ir.SliceX(None, split) if query else ir.SliceX(split, None)
        lead = () if storage == bq.storage else (ir.SliceX(None, None),)
        return ir.Sub(ir.Ref(storage), (*lead, cut))

    def heads(proj: ir.Expr, count: int) -> ir.Expr:
        dims = (body.dim(wq.over), body.dim(wq.shape[-1]))
        if count > 1:
            dims = (ir.Lit(str(count)), *dims)
        out = _method(proj, "unflatten", ir.Lit("-1"), ir.Seq(dims))
        if count > 1:
            out = _method(out, "movedim", ir.Lit("-3"), ir.Lit("0"))
        return _method(out, "transpose", ir.Lit("-3"), ir.Lit("-2"))

    q = body.fresh(local_name(ren["Q"]))
    proj = ir.Bin("+", ir.Bin("@", x.code, part(wq.storage, True)), part(bq.storage, True))
    body.emit(ir.Assign((q,), heads(proj, 1), body.note(step, None, f"(B, {h}, {t}, {d})")))
    kv = body.fresh("kv")
    proj = ir.Bin("+", ir.Bin("@", z.code, part(wq.storage, False)), part(bq.storage, False))
    body.emit(ir.Assign((kv,), proj, body.note(step, None, f"(B, {tz}, 2 {width})")))
    k, v = body.fresh(local_name(ren["K"])), body.fresh(local_name(ren["V"]))
    body.emit(ir.Assign((k, v), _method(heads(ir.Ref(kv), 2), "unbind", ir.Lit("0")),
                        body.note(step, None, f"(B, {h}, {tz}, {d}) each")))
    ty = body.ty(e)
    fam = Family(st.var, body.fresh(f"{local_name(assign.target.id.split('^')[0])}_"
                                    f"{local_name(st.var)}"), ty)
    sdpa = _call("F.scaled_dot_product_attention", ir.Ref(q), ir.Ref(k), ir.Ref(v))
    body.emit(ir.Assign((fam.local,), sdpa, body.note(step, None, f"(B, {h}, {t}, {d})")))
    fam.stacked = Val(ir.Ref(fam.local), Ty(ty.shape), True)
    body.scope.values[assign.target.id] = fam
    return True

def _column(body: Steps, st: s.For, step: s.Step, assign: s.Assign,
            call: CallInfo, ren: dict[str, str]) -> bool:
    """The paper's heads: per-role projections (nn.Linear layout, heads stacked on the
    output axis), then fused SDPA; Z ≠ X makes it cross-attention."""
    e = assign.value
    given = call.params.get(ren["W_qkv"])
    entry = body.info.types.get(id(given))
    bundle = dict(body.low.checker.info(call.callee).sig.params).get(ren["W_qkv"])
    if not isinstance(entry, BundleTy) or not isinstance(bundle, BundleTy):
        return False
    theirs = [n for n, _ in body.low.flat_tensors(bundle)]
    mine = [n for n, _ in body.low.flat_tensors(entry)]
    slots = {}
    for role in ("W_q", "W_k", "W_v", "b_q", "b_k", "b_v"):
        if ren[role] not in theirs or len(theirs) != len(mine):
            return False
        slot = body.scope.stacked.get(mine[theirs.index(ren[role])])
        if slot is None or slot.axis != "first" or slot.var != st.var:
            return False
        slots[role] = slot
    mask = sdpa_mask(body, call, ren["Mask"], key_first=True, keys=e.args[-1])
    if mask is None:
        return False
    x = body.expr(e.args[0])
    z = body.expr(e.args[1]) if len(e.args) > 1 else x
    heads = body.dim(slots["W_q"].over)
    lx, lz = body.dim_text(x.ty.shape[1]), body.dim_text(z.ty.shape[1])
    h = body.dim_text(slots["W_q"].over)
    names = []
    for role, src, length in (("q", x, lx), ("k", z, lz), ("v", z, lz)):
        w, b = slots[f"W_{role}"], slots[f"b_{role}"]
        proj = _call("F.linear", src.code, ir.Ref(w.storage), ir.Ref(b.storage))
        split = _method(_method(proj, "unflatten", ir.Lit("-1"),
                                ir.Seq((heads, body.dim(w.shape[0])))),
                        "transpose", ir.Lit("-3"), ir.Lit("-2"))
        name = body.fresh(local_name(ren[role.upper()]))
        shape = f"(B, {h}, {length}, {body.dim_text(w.shape[0])})"
        body.emit(ir.Assign((name,), split, body.note(step, None, shape)))
        names.append(name)
    ty = body.ty(e)
    fam = Family(st.var, body.fresh(f"{local_name(assign.target.id.split('^')[0])}_"
                                    f"{local_name(st.var)}"), ty)
    sdpa = _call("F.scaled_dot_product_attention", *(ir.Ref(n) for n in names), **mask)
    shape = f"(B, {h}, {lx}, {body.dim_text(slots['W_v'].shape[0])})"
    body.emit(ir.Assign((fam.local,), sdpa, body.note(step, None, shape)))
    fam.stacked = Val(ir.Ref(fam.local), Ty(ty.shape), True)
    body.scope.values[assign.target.id] = fam
    return True

def stacked_roles(body: Steps, call: CallInfo, ren: dict[str, str], var: str):
    """The stacked storage of W_q, W_k, W_v (and b_q, b_k, b_v), in one tensor each."""
    given = call.params.get(ren["W_qkv"])
    entry = body.info.types.get(id(given))
    callee_sig = body.low.checker.info(call.callee).sig
    bundle = dict(callee_sig.params).get(ren["W_qkv"])
    if not isinstance(entry, BundleTy) or not isinstance(bundle, BundleTy):
        return None
    theirs = [n for n, _ in body.low.flat_tensors(bundle)]
    mine = [n for n, _ in body.low.flat_tensors(entry)]
    if len(theirs) != len(mine):
        return None

    def slots(roles):
        out = []
        for r in roles:
            member = mine[theirs.index(ren[r])]
            st = body.scope.stacked.get(member)
            if st is None or st.var != var or st.count != len(roles):
                return None
            out.append(st)
        if len({x.storage for x in out}) != 1:
            return None
        return out

    weights = slots(("W_q", "W_k", "W_v"))
    biases = slots(("b_q", "b_k", "b_v"))
    if weights is None or biases is None:
        return None
    if [w.index for w in weights] != [b.index for b in biases]:
        return None
    return weights, biases

def sdpa_mask(body: Steps, call: CallInfo, name: str, key_first: bool = False,
              keys: s.Expr | None = None) -> dict[str, ir.Expr] | None:
    """SDPA's masking arguments for a rule over (query t, key t′), or (key, query) in the
    paper's layout; SDPA wants a (query, key) mask, which is how a flipped one is stored.
    `keys`: the argument the heads' keys and values come from. Only a causal rule over keys
    that depend on the tokens decoded is extended by the cache (cardc.lower.decoding); keys
    that depend on none need no cache; any other attention recomputes."""
    given = call.hypers.get(name)
    if given is None:
        return None
    masking = body.low.masking
    context = keys is not None and not masking.reads_decoded(body.alg, keys)
    other = CONTEXT if context else RECOMPUTES
    if isinstance(given, s.Arg) and given.op == "≡":
        if isinstance(given.value, s.Num) and given.value.value == 1:
            masking.attention(False, cache=other)  # every key seen
            return {}
        return None
    if not (isinstance(given, s.Arg) and isinstance(given.target, s.Index)):
        masking.attention(False, body.alg, passed_on(body, given), cache=other)
        val = body.expr(given)
        if key_first and not val.flipped:
            return {"attn_mask": ir.Attr(val.code, "mT")}
        return {"attn_mask": val.code}
    q, k = (getattr(i, "id", None) for i in given.target.items)
    if key_first:
        q, k = k, q
    cond = given.value.cond if isinstance(given.value, s.Iverson) else given.value
    if isinstance(cond, s.BinOp) and isinstance(cond.left, s.Name) and \
            isinstance(cond.right, s.Name):
        pair = (cond.left.id, cond.op, cond.right.id)
        if pair in ((k, "≤", q), (q, "≥", k)):  # extended by the cache, where it decodes
            masking.attention(True, cache=RECOMPUTES if context else CAUSAL_SDPA)
            return {"is_causal": ir.Lit("True")}
    masking.attention(hides_later(given, key_first), cache=other)
    return {"attn_mask": body.mask_rule(call, name, given).code}


def passed_on(body: Steps, given: s.Expr) -> frozenset[str]:
    """A tensor hyperparameter of the card, given on as it is (its callers' rule decides)."""
    hyper = body.info.sig.hypers.get(given.id) if isinstance(given, s.Name) else None
    return frozenset((given.id,)) if hyper is not None and hyper.shape else frozenset()


def _const(n: int) -> Dim:
    return Dim.const(n)
