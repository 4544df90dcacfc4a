"""Fusion rule for grouped-query attention: a whole card whose math is grouped-query attention
with RoPE (`grouped_query_attention`, or its `_biased` twin), and whose callees are the
pattern's, lowers in one piece to per-role projections, a rotation and fused SDPA (hook:
card)."""

from __future__ import annotations

from .. import ir
from .. import syntax as s
from .analysis import CAUSAL_SDPA, RECOMPUTES
from .context import Steps
from .intrinsics import make_call as _call
from .intrinsics import make_method as _method
from .intrinsics import match, patterns
from .values import local_name


def find(names: tuple[str, ...], body: Steps) -> dict[str, str] | None:
    """The renaming of the first pattern the card (and every card it calls) matches."""
    for pattern in names:
        ren = tree_match(body, body.alg, pattern)
        if ren is not None:
            return ren
    return None


def lower(body: Steps, ren: dict[str, str]) -> list[ir.Stmt]:
    x = s.Name(body.info.sig.inputs[0][0])
    context = not body.low.masking.reads_decoded(body.alg, x)  # the pattern's mask is causal:
    body.low.masking.attention(True, cache=RECOMPUTES if context else CAUSAL_SDPA)  # cached
    return GroupedQuery(body, ren).lower()


def tree_match(body: Steps, card: s.Algorithm, pattern: str) -> dict[str, str] | None:
    """`card` matches `pattern`, and every card it calls matches the pattern of that name
    (the patterns name their callees as the library does)."""
    ren = match(patterns()[pattern], card)
    if ren is None:
        return None
    for call in body.low.checker.info(card).calls.values():
        callee = call.callee
        if tree_match(body, callee, _SNAKE.get(callee.name, "")) is None:
            return None
    return ren


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

    def rotate(self, x: ir.Ref, step: s.Step) -> None:
        """RoPE on every head of x: the generated file's `rotate_half`, whose angle tables, in
        the model's precision (float64 in a float64 model), are made once per positions and
        base and shared by queries, keys and every layer; decoding with a KV cache starts
        the positions after the cached ones (cardc.lower.decoding)."""
        self.emit(x.id, _call("rotate_half", x, self.hyper("θ_base")), step)

    def lower(self) -> list[ir.Stmt]:
        steps = self.body.alg.steps
        q = self.heads("W_q", "H", steps[0])
        k = self.heads("W_k", "H_kv", steps[1])
        v = self.heads("W_v", "H_kv", steps[2])
        self.rotate(q, steps[3])
        self.rotate(k, steps[3])
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

