"""Fusion rule for normalisations: a card whose math is LayerNorm (with or without ε) or
RMSNorm (with gains stored less one, or not) lowers to `F.layer_norm` or the generated file's
`rms_normalize` / `offset_rms_norm` (hook: call)."""

from __future__ import annotations

from .. import ir
from .. import syntax as s
from ..checker import CallInfo
from .context import Steps
from .intrinsics import make_call as _call
from .intrinsics import matching

Found = tuple[str, dict[str, str]]


def find(patterns: tuple[str, ...], body: Steps, e: s.Call, call: CallInfo) -> Found | None:
    """The norm pattern the callee's math is, with its renaming."""
    return matching(call.callee, patterns)


def lower(body: Steps, e: s.Call, call: CallInfo, found: Found) -> ir.Expr | None:
    which, ren = found
    sig = body.low.checker.info(call.callee).sig
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
