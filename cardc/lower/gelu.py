"""GELU: its literal math (the erf form, or the tanh approximation), and the fusion rule that
lowers the builtin to `F.gelu` instead (hook: expression)."""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from .. import syntax as s
from .body import _is_tensor
from .context import Steps
from .intrinsics import make_call as _call
from .values import Val

TANH = "GELU_tanh"
BUILTINS = ("GELU", TANH)


def literal(body: Steps, x: ir.Expr, tanh: bool) -> ir.Expr:
    """0.5·x·(1 + erf(x/√2)), or 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
    body.low.program.imports.add("math")
    half_x = ir.Bin("*", ir.Lit("0.5"), x)
    if tanh:
        inner = ir.Bin("+", x, ir.Bin("*", ir.Lit("0.044715"), ir.Bin("**", x, ir.Lit("3"))))
        k = _call("math.sqrt", ir.Bin("/", ir.Lit("2"), ir.Ref("math.pi")))
        return ir.Bin("*", half_x, ir.Bin("+", ir.Lit("1"), _call("torch.tanh",
                                                                   ir.Bin("*", k, inner))))
    erf = _call("torch.erf", ir.Bin("/", x, _call("math.sqrt", ir.Lit("2"))))
    return ir.Bin("*", half_x, ir.Bin("+", ir.Lit("1"), erf))


def find(patterns: tuple[str, ...], body: Steps, e: s.Expr) -> s.Call | None:
    """A call of the builtin GELU (not of a card, nor a value P(θ) of a procedure)."""
    if not (isinstance(e, s.Call) and e.func in BUILTINS and len(e.args) == 1) or \
            id(e) in body.info.calls:
        return None
    if body.procedure and isinstance(body.scope.values.get(e.func), Val):
        return None
    return e


def lower(body: Steps, e: s.Expr, call: s.Call) -> Val:
    x = body.expr(call.args[0])
    if not _is_tensor(x) and not body.sum_axis:  # GELU(μ) of a hyperparameter μ
        x = body.on_number(call.func, x)
    code = _call("F.gelu", x.code, approximate=ir.Lit('"tanh"')) if call.func == TANH else \
        _call("F.gelu", x.code)
    return replace(x, code=code, ty=body.ty(e))
