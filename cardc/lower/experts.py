"""Lowering of sets of indices and of sums over them (a mixture of experts's routing).

`I ← argtop_k(r | k)` is a mask over r's last axis, True at its k largest entries (helper
`top_mask`). `Σ_{j ∈ I} f(j)` is f on the whole axis, summed where the mask holds. A sum whose
body calls a card with the member of a family of parameters its index names,
`Σ_{e ∈ I} c_e · Expert(x | θ^e)`, is a mixture of experts: literally (`route_dense`) every
expert on every token, weighted by c_e where e ∈ I and by 0 elsewhere, which is the card's
math; fused (hook: expression, `route`) a sparse dispatch, each expert run once on the tokens
that chose it, gathered, its outputs weighted and added back in place. That is a Python loop
over the E experts (E gathers, expert calls and scatters a layer), never over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from .. import syntax as s
from ..builtins import ARGTOP
from ..checker import instance
from ..spelling import display
from ..types import SetTy, Ty
from .body import _call, _like
from .context import Steps
from .values import Val

SPARSE, DENSE = "route", "route_dense"  # the helpers of cardc/runtime/experts.py


@dataclass(frozen=True)
class Mixture:
    """`Σ_{e ∈ I} c_e · Expert(x | θ^e)`: the coefficient (None: 1), the call, the experts'
    module list."""

    coef: s.Expr | None
    call: s.Call
    experts: ir.Expr


def argtop(body: Steps, e: s.Call) -> Val:
    """argtop_k(r | k): the mask of r's k largest entries, on r's last axis."""
    x, k = body.expr(e.args[0]), body.expr(e.params[0])
    return _like(x, _call("top_mask", x.code, k.code), Ty(x.ty.shape, "𝔹"))


def indicator(body: Steps, e: s.Call) -> Val:
    """indicator(I) of a set argtop_k chose: its mask as numbers in the card's format."""
    mask = body.expr(e.args[0])
    if mask.ty.elem != "𝔹":
        body.fail(e, "code generation marks the members of a set that argtop_k(r | k) chose",
                  hint="write I ← argtop_k(r | k), then indicator(I)")
    return body.to_real(mask)


def set_sum(body: Steps, e: s.Sum) -> Val:
    """Σ_{j ∈ I} f(j) of a number f(j) per member: f over the whole axis, summed where j ∈ I;
    a mixture of experts literally, every expert on every token."""
    chosen = members(body, e)
    mix = mixture(body, e)
    if mix is not None:
        return routed(body, e, chosen, mix, DENSE)
    if body.ty(e).shape:
        body.fail(e, f"code generation sums numbers over a set, or experts "
                     f"Σ_{{{display(e.index)} ∈ I}} c · Expert(x | θ^{display(e.index)})")
    values = on_axis(body, e, e.body, chosen)
    picked = _call("torch.where", chosen.code, values.code, ir.Lit("0"))
    return Val(ir.Call(ir.Attr(picked, "sum"), (ir.Lit("-1"),)), Ty(),
               chosen.lifted or values.lifted)


def members(body: Steps, e: s.Sum) -> Val:
    """The set a sum runs over, as its mask; only sets argtop_k made have one."""
    chosen = body.expr(e.over) if made_by_argtop(body, e.over) else None
    if chosen is None or chosen.ty.elem != "𝔹" or len(chosen.ty.shape) != 1:
        body.fail(e.over, "code generation sums over [n], or over a set argtop_k makes",
                  hint="write I ← argtop_k(r | k) first, then Σ_{e ∈ I} …")
    return chosen


def made_by_argtop(body: Steps, over: s.Expr) -> bool:
    """Whether a set is argtop_k(…), or a name the card's steps assign only argtop_k(…)."""
    def argtop_call(e: s.Expr) -> bool:
        return isinstance(e, s.Call) and e.func == ARGTOP and id(e) not in body.info.calls

    if not isinstance(over, s.Name):
        return argtop_call(over)
    values = [n.value for n in s.nodes(body.alg.steps) if isinstance(n, s.Assign) and
              isinstance(n.target, s.Name) and n.target.id == over.id]
    return bool(values) and all(map(argtop_call, values))


def on_axis(body: Steps, e: s.Sum, value: s.Expr, chosen: Val) -> Val:
    """`value` at every member of the set's whole axis at once (r[j]: all of r)."""
    outer, body.sum_axis = body.sum_axis, (e.index, chosen.ty.shape[0])
    try:
        out = body.expr(value)
    finally:
        body.sum_axis = outer
    if len(out.ty.shape) == 1:
        return out
    if out.ty.shape or any(isinstance(n, s.Name) and n.id == e.index for n in s.nodes(value)):
        body.fail(value, f"code generation sums one number per member of a set, "
                         f"read as r[{display(e.index)}]")
    # the same for every member: one per token, on the members' axis
    code = ir.Sub(out.code, (ir.Ref("..."), ir.Ref("None"))) if out.lifted else out.code
    return Val(code, Ty(chosen.ty.shape), out.lifted)


def mixture(body: Steps, e: s.Sum) -> Mixture | None:
    """The sum's body as a coefficient times a call of a card given θ^e, the member of a
    family of parameter bundles that the sum's index names (or that call alone)."""
    node = e.body
    factors = [(None, node)]
    if isinstance(node, s.BinOp) and node.op in ("·", " "):
        factors = [(node.left, node.right), (node.right, node.left)]
    for coef, call in factors:
        if not isinstance(call, s.Call) or id(call) not in body.info.calls:
            continue
        experts = expert_modules(body, call, e.index)
        if experts is not None:
            return Mixture(coef, call, experts)
    return None


def expert_modules(body: Steps, call: s.Call, index: str) -> ir.Expr | None:
    """The module list of the family a call's parameters name by `index` (θ^e → self.theta)."""
    for given in body.info.calls[id(call)].params.values():
        if not isinstance(given, s.Name):
            continue
        for pattern, slot in body.scope.modules.items():
            if slot.var is not None and instance(pattern, slot.var, given.id) == index:
                return ir.Ref(f"self.{slot.attr}")
    return None


def routed(body: Steps, e: s.Sum, chosen: Val, mix: Mixture, helper: str) -> Val:
    """`helper`(x, I, c, experts): the experts' weighted sum, by the helper's strategy."""
    if len(mix.call.args) != 1 or body.low.tensor_hypers(body.info.calls[id(mix.call)].callee):
        body.fail(mix.call, "code generation routes a token to experts that each take it "
                            "alone: Expert(x | θ^e)")
    x = body.expr(mix.call.args[0])
    if any(isinstance(n, s.Name) and n.id == e.index for n in s.nodes(mix.call.args[0])):
        body.fail(mix.call.args[0], f"every expert takes the same input; this one depends on "
                                    f"'{display(e.index)}'")
    weight = on_axis(body, e, mix.coef, chosen).code if mix.coef is not None else ir.Lit("1")
    code = _call(helper, x.code, chosen.code, weight, mix.experts)
    return Val(code, body.ty(e), True)


def find(patterns: tuple[str, ...], body: Steps, e: s.Expr) -> tuple[Val, Mixture] | None:
    """A mixture of experts over a set argtop_k made (hook: expression)."""
    if not isinstance(e, s.Sum) or e.over is None or body.procedure or \
            not isinstance(body.info.types.get(id(e.over)), SetTy):
        return None
    mix = mixture(body, e)
    return None if mix is None else (members(body, e), mix)


def lower(body: Steps, e: s.Sum, found: tuple[Val, Mixture]) -> Val:
    """The mixture as a sparse dispatch: each expert on the tokens that chose it."""
    chosen, mix = found
    return routed(body, e, chosen, mix, SPARSE)
