"""Fusion passes: cards and builtins whose math is a known intrinsic lower to fused PyTorch.

An intrinsic is recognised by its math, not by its name: `patterns.card` writes each one as a
card, and a card matches when its steps are the pattern's up to a renaming of names (so
`LayerNorm(e | γ, β)` written with other letters still matches). Each fused lowering has a
literal twin — the same card lowered step by step — and tests prove the two agree.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from .. import ir
from .. import syntax as s
from ..checker import CallInfo
from ..diagnostics import Diagnostics
from ..dims import Dim
from ..types import BundleTy, Ty
from .context import Steps
from .values import Family, LowerError, Val, local_name

_IGNORED = {"span", "var_span", "number", "annotation", "note", "where", "end_number"}
_NAMES = {("Name", "id"), ("Sum", "index"), ("For", "var"), ("ForAll", "vars"),
          ("Return", "name")}


@cache
def patterns() -> dict[str, s.Algorithm]:
    from ..parser import parse_file

    diags = Diagnostics()
    card = parse_file(Path(__file__).with_name("patterns.card"), diags)
    return {alg.name: alg for alg in card.algorithms}


def match(pattern: s.Algorithm, card: s.Algorithm) -> dict[str, str] | None:
    """The renaming that turns `pattern` into `card`, or None when their math differs."""
    ren: dict[str, str] = {}
    used: set[str] = set()

    def name(p: str, c: str) -> bool:
        if p in ren:
            return ren[p] == c
        if c in used:
            return False
        ren[p] = c
        used.add(c)
        return True

    def same(p, c) -> bool:
        if type(p) is not type(c):
            return False
        if isinstance(p, tuple):
            return len(p) == len(c) and all(same(a, b) for a, b in zip(p, c, strict=True))
        if not hasattr(p, "__dataclass_fields__"):
            return p == c
        kind = type(p).__name__
        for f in p.__dataclass_fields__:
            if f in _IGNORED:
                continue
            a, b = getattr(p, f), getattr(c, f)
            if (kind, f) in _NAMES:
                pairs = zip(a, b, strict=True) if isinstance(a, tuple) else [(a, b)]
                if isinstance(a, tuple) and len(a) != len(b):
                    return False
                if (a is None) != (b is None) or a is not None and not all(
                        name(x, y) for x, y in pairs):
                    return False
            elif not same(a, b):
                return False
        return True

    if not same(pattern.steps, card.steps):
        return None
    # Inputs are positional; parameters are bound by name, so their header order is free.
    for a, b in ((pattern.args, card.args), (pattern.outputs, card.outputs)):
        if len(a) != len(b) or not all(name(x, y) for x, y in zip(a, b, strict=True)):
            return None
    if len(pattern.params) != len(card.params):
        return None
    for x, y in zip(pattern.params, card.params, strict=True):
        if x not in ren and not name(x, y):  # a bundle, named only in the header
            return None
    return ren


def _call(func: str, *args: ir.Expr, **kwargs: ir.Expr) -> ir.Call:
    return ir.Call(ir.Ref(func), args, tuple(kwargs.items()))


def _method(obj: ir.Expr, name: str, *args: ir.Expr, **kwargs: ir.Expr) -> ir.Call:
    return ir.Call(ir.Attr(obj, name), args, tuple(kwargs.items()))


class Passes:
    """The fused lowerings; with `fuse=False` every hook declines and the literal math stays."""

    def __init__(self, fuse: bool):
        self.fuse = fuse

    def find(self, card: s.Algorithm, *names: str) -> tuple[str, dict[str, str]] | None:
        for name in names:
            ren = match(patterns()[name], card)
            if ren is not None:
                return name, ren
        return None

    # ------------------------------------------------------------------ GELU
    def gelu(self, body: Steps, x: ir.Expr, tanh: bool) -> ir.Expr:
        if self.fuse:
            return _call("F.gelu", x, approximate=ir.Lit('"tanh"')) if tanh else _call("F.gelu", x)
        body.low.program.imports.add("math")
        half_x = ir.Bin("*", ir.Lit("0.5"), x)
        if tanh:  # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
            inner = ir.Bin("+", x, ir.Bin("*", ir.Lit("0.044715"), ir.Bin("**", x, ir.Lit("3"))))
            k = _call("math.sqrt", ir.Bin("/", ir.Lit("2"), ir.Ref("math.pi")))
            return ir.Bin("*", half_x, ir.Bin("+", ir.Lit("1"), _call("torch.tanh",
                                                                       ir.Bin("*", k, inner))))
        erf = _call("torch.erf", ir.Bin("/", x, _call("math.sqrt", ir.Lit("2"))))
        return ir.Bin("*", half_x, ir.Bin("+", ir.Lit("1"), erf))

    # ------------------------------------------------------------------ layer norm
    def call(self, body: Steps, e: s.Call, call: CallInfo) -> ir.Expr | None:
        if not self.fuse:
            return None
        found = self.find(call.callee, "layer_norm_ε", "layer_norm", "rms_norm",
                          "rms_norm_offset", "rope", "rope_pairs")
        if found is None:
            return None
        which, ren = found
        sig = body.low.checker.info(call.callee).sig
        if which in ("rope", "rope_pairs"):
            return self.rope(body, e, call, ren, "rotate_half" if which == "rope" else
                             "rotate_pairs")
        if len(sig.inputs) != 1 or len(sig.inputs[0][1].shape) != 1:
            return None
        x = body.expr(e.args[0]).code
        gamma = body.expr(call.params[ren["γ"]]).code
        width = body.dim(call.bind.get(ren["D"]) or sig.inputs[0][1].shape[0])
        eps: ir.Expr = ir.Lit("0.0")
        if which != "layer_norm":
            given = call.hypers.get(ren["ε"])
            if given is not None:
                eps = body.expr(given.value if isinstance(given, s.Arg) else given).code
            else:
                default = sig.defaults.get(ren["ε"])
                if default is None:
                    return None
                eps = body.expr(default).code
        if which in ("rms_norm", "rms_norm_offset"):
            program = body.low.program
            program.imports.add("math")  # rms_normalize's √
            helper = "offset_rms_norm" if which == "rms_norm_offset" else "rms_normalize"
            return _call(helper, x, ir.Seq((width,)), gamma, eps)
        beta = body.expr(call.params[ren["β"]]).code
        return _call("F.layer_norm", x, ir.Seq((width,)), gamma, beta, eps)

    # ------------------------------------------------------------------ rotary embeddings
    def rope(self, body: Steps, e: s.Call, call: CallInfo, ren: dict[str, str],
             helper: str) -> ir.Expr | None:
        """A card whose steps are RoPE in the rotate-half convention or on interleaved pairs:
        `rotate_half(X, θ_base)` or `rotate_pairs(…)`, helpers of the generated file whose
        angle tables are computed once per positions, width and base
        (every layer, queries and keys share them); decoding with a KV cache starts the
        positions after the cached ones (cardc.lower.decoding)."""
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
        return _call(helper, x.code, body.expr(given).code)

    def partial_rotary(self, body: Steps, e: s.Concat) -> Val | None:
        """`[RoPE(X[:, 1 : r]), X[:, r + 1 : d]]`: RoPE on the first r columns of X, the rest
        passed through, is one rotation of all of X whose tables leave the columns after r
        unturned (`rotate_half(X, θ_base, width=r)`): no slices and no concatenation."""
        if not self.fuse or len(e.items) != 2 or not isinstance(e.items[0], s.Call):
            return None
        rot, rest = e.items
        call = body.info.calls.get(id(rot))
        found = call and self.find(call.callee, "rope", "rope_pairs")
        if not found or len(rot.args) != 1:
            return None
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
        fused = self.call(body, rot, call)
        if not (isinstance(fused, ir.Call) and fused.args):
            return None
        return Val(ir.Call(fused.func, (x.code, *fused.args[1:]),
                           (*fused.kwargs, ("width", body.dim(r)))), body.ty(e), True)

    # ------------------------------------------------------------------ grouped-query attention
    def card_body(self, body: Steps) -> list[ir.Stmt] | None:
        """A whole card whose math is a known intrinsic, lowered in one piece: grouped-query
        attention with RoPE becomes per-role projections, a rotation and fused SDPA."""
        if not self.fuse:
            return None
        for pattern in ("grouped_query_attention", "grouped_query_attention_biased"):
            ren = self.tree_match(body, body.alg, pattern)
            if ren is not None:
                return GroupedQuery(body, ren).lower()
        return None

    def tree_match(self, body: Steps, card: s.Algorithm, pattern: str) -> dict[str, str] | None:
        """`card` matches `pattern`, and every card it calls matches the pattern of that name
        (the patterns name their callees as the library does)."""
        ren = match(patterns()[pattern], card)
        if ren is None:
            return None
        for call in body.low.checker.info(card).calls.values():
            callee = call.callee
            if self.tree_match(body, callee, _SNAKE.get(callee.name, "")) is None:
                return None
        return ren

    # ------------------------------------------------------------------ attention heads
    def head_map(self, body: Steps, st: s.For, step: s.Step) -> bool:
        """`for h ∈ [H] : Y^h ← head(X | W^h_qkv, Mask)` → one projection and fused SDPA."""
        if len(st.body) != 1 or not isinstance(st.body[0].stmt, s.Assign):
            return False
        assign = st.body[0].stmt
        e = assign.value
        call = body.info.calls.get(id(e))
        if call is None or not isinstance(assign.target, s.Name):
            return False
        found = self.find(call.callee, "attention_head", "attention_head_cm",
                          "cross_attention_head")
        if found is None:
            return False
        which, ren = found
        if which == "attention_head_cm":
            return self.head_map_column(body, st, step, assign, call, ren)
        if which == "cross_attention_head":
            return self.head_map_cross(body, st, step, assign, call, ren)
        if len({str(a) for a in e.args}) != 1:  # cross-attention keeps the literal loop
            return False
        roles = self.stacked_roles(body, call, ren, st.var)
        if roles is None:
            return False
        weights, biases = roles
        mask = self.mask(body, call, ren["Mask"])
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

    def head_map_cross(self, body: Steps, st: s.For, step: s.Step, assign: s.Assign,
                       call: CallInfo, ren: dict[str, str]) -> bool:
        """Row-major cross-attention heads: the fused W_qkv (columns q | k | v, heads within
        each) is split once, so X is projected to the queries and Z to keys and values in one
        matmul each, and SDPA attends with no mask."""
        e = assign.value
        roles = self.stacked_roles(body, call, ren, st.var)
        if roles is None or [w.index for w in roles[0]] != [0, 1, 2]:
            return False  # another column order keeps the literal loop
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

    def head_map_column(self, body: Steps, st: s.For, step: s.Step, assign: s.Assign,
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
        mask = self.mask(body, call, ren["Mask"], key_first=True)
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

    def stacked_roles(self, body: Steps, call: CallInfo, ren: dict[str, str], var: str):
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

    def mask(self, body: Steps, call: CallInfo, name: str,
             key_first: bool = False) -> dict[str, ir.Expr] | None:
        """SDPA's masking arguments for a rule over (query t, key t′), or (key, query) in the
        paper's layout; SDPA wants a (query, key) mask, which is how a flipped one is stored."""
        given = call.hypers.get(name)
        if given is None:
            return None
        if isinstance(given, s.Arg) and given.op == "≡":
            return {} if isinstance(given.value, s.Num) and given.value.value == 1 else None
        if not (isinstance(given, s.Arg) and isinstance(given.target, s.Index)):
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
            if pair in ((k, "≤", q), (q, "≥", k)):
                return {"is_causal": ir.Lit("True")}
        return {"attn_mask": body.mask_rule(call, name, given).code}


_SNAKE = {"AttentionGroup": "attention_group", "CausalHead": "causal_head", "RoPE": "rope"}


class GroupedQuery:
    """The fused lowering of `grouped_query_attention` (and its `_biased` twin): heads on their
    own axis, RoPE applied to queries and keys at once, key/value heads repeated for the G query
    heads of a group."""

    def __init__(self, body: Steps, ren: dict[str, str]):
        self.body, self.ren = body, ren
        self.step = body.alg.steps[0]
        self.x = ir.Ref(local_name(body.info.sig.inputs[0][0]))

    def hyper(self, name: str) -> ir.Expr:
        return self.body.dim_of(self.ren[name])

    def emit(self, name: str, code: ir.Expr, step: s.Step, shape: str | None = None) -> ir.Ref:
        self.body.emit(ir.Assign((name,), code, self.body.note(step, None, shape)))
        return ir.Ref(name)

    def heads(self, role: str, count: str, step: s.Step) -> ir.Ref:
        """X W_role (+ b_role) with its columns split into heads: (…, T, heads·d) → (…, heads,
        T, d)."""
        tensors = self.body.scope.tensors
        proj: ir.Expr = ir.Bin("@", self.x, tensors[self.ren[role]])
        bias = self.ren.get(role.replace("W_", "b_"))  # only the biased pattern names one
        if bias is not None:
            proj = ir.Bin("+", proj, tensors[bias])
        split = ir.Seq((ir.Lit("-1"), self.hyper("d")))  # as many heads as fit
        code = _method(_method(proj, "unflatten", ir.Lit("-1"), split),
                       "transpose", ir.Lit("-3"), ir.Lit("-2"))
        name = local_name(self.ren[role.replace("W_", "").upper()])
        return self.emit(name, code, step, f"(B, {count}, T, d)")

    def rotary(self, step: s.Step) -> tuple[ir.Ref, ir.Ref]:
        """cos and sin of the angles (t − 1) ω_i, ω_i = θ_base^{−2(i − 1)/d}, over both halves;
        the first half's angles negated, so that sin carries rotate-half's sign. The signed
        frequencies are a buffer: computed once, not per call and layer."""
        d = self.hyper("d")
        freq = ir.Bin("**", self.hyper("θ_base"), ir.Un("-", ir.Bin(
            "/", _call("torch.arange", ir.Lit("0"), d, ir.Lit("2")), d)))
        signs = _call("torch.tensor", ir.Seq((ir.Seq((ir.Lit("-1.0"),), "list"),
                                              ir.Seq((ir.Lit("1.0"),), "list")), "list"))
        signed = _method(ir.Bin("*", signs, freq), "flatten")
        self.body.buffers.append(ir.Buffer("omega", signed, self.body.note(
            self.body.alg.steps[3], None, "(d,): −ω, then ω")))
        device = ir.Attr(self.x, "device")
        t = _call("torch.arange", ir.Sub(ir.Attr(self.x, "shape"), (ir.Lit("-2"),)),
                  device=device, dtype=ir.Lit("torch.float32"))
        angles = ir.Bin("*", ir.Sub(t, (ir.SliceX(None, None), ir.Lit("None"))),
                        _method(ir.Ref("self.omega"), "float"))
        phi = self.emit("phi", angles, step, "(T, d): the angles, the first half negated")
        return (self.emit("cos", _method(phi, "cos"), step, "(T, d)"),
                self.emit("sin", _method(phi, "sin"), step, "(T, d)"))

    def rotate(self, x: ir.Ref, cos: ir.Ref, sin: ir.Ref, step: s.Step) -> None:
        """x cos + rotate_half(x) sin with rotate_half(x) = [−x_2, x_1]: the halves swapped by
        a roll, the sign in sin."""
        half = ir.Bin("//", self.hyper("d"), ir.Lit("2"))
        rolled = _method(x, "roll", half, ir.Lit("-1"))
        self.emit(x.id, _call("torch.addcmul", ir.Bin("*", x, cos), rolled, sin), step)

    def lower(self) -> list[ir.Stmt]:
        steps = self.body.alg.steps
        q = self.heads("W_q", "H", steps[0])
        k = self.heads("W_k", "H_kv", steps[1])
        v = self.heads("W_v", "H_kv", steps[2])
        cos, sin = self.rotary(steps[3])
        self.rotate(q, cos, sin, steps[3])
        self.rotate(k, cos, sin, steps[3])
        # each key/value head serves the G query heads of its group, unrepeated
        sdpa = _call("F.scaled_dot_product_attention", q, k, v, is_causal=ir.Lit("True"),
                     enable_gqa=ir.Lit("True"))
        y = local_name(self.ren["Y"])
        heads = self.emit(f"{y}_g", sdpa, steps[3], "(B, H, T, d)")
        joined = _method(_method(heads, "transpose", ir.Lit("-3"), ir.Lit("-2")), "flatten",
                         ir.Lit("-2"))
        self.emit(y, joined, steps[4], "(B, T, D)")
        w_o = self.body.scope.tensors[self.ren["W_o"]]
        self.body.emit(ir.Return(ir.Bin("@", ir.Ref(y), w_o),
                                 self.body.note(steps[5], None, "(B, T, D)")))
        return self.body.out


def _const(n: int) -> Dim:
    return Dim.const(n)


def _columns(e: s.Expr) -> tuple[str, s.Expr | None, s.Expr | None] | None:
    """`X[:, lo : hi]`: the name X and the bounds of its column slice."""
    if not (isinstance(e, s.Index) and isinstance(e.base, s.Name) and len(e.items) == 2):
        return None
    rows, cols = e.items
    if not (isinstance(rows, s.Slice) and rows.lo is None and rows.hi is None and
            isinstance(cols, s.Slice)):
        return None
    return e.base.id, cols.lo, cols.hi
