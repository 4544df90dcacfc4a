"""Fusion rule for normalisations: a card whose math is LayerNorm (with or without ε) or
RMSNorm, with gains or without, gains stored less one (1 + γ, as Gemma writes) or not, with
offsets or without, lowers to `F.layer_norm` or the generated file's `rms_normalize` /
`offset_rms_norm` (hook: call).

A norm is recognised by its structure: the card's steps up to its return are a core pattern
of patterns.card (the normalisation before gains and offsets), and its return is that core
times γ, or times (1 + γ), plus β, each optional, γ and β parameters of the card."""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from .. import syntax as s
from ..checker import CallInfo
from .context import Steps
from .intrinsics import make_call as _call
from .intrinsics import match, matching, patterns

# (pattern, renaming, gain: "", "γ" or "1 + γ", offset: whether + β): the renaming maps γ
# and β to the card's parameters where it has them
Found = tuple[str, dict[str, str], str, bool]
CORES = ("layer_norm_core_ε", "layer_norm_core", "rms_norm_core")
WHOLE = {"layer_norm_ε": ("γ", True), "layer_norm": ("γ", True), "rms_norm": ("γ", False),
         "rms_norm_offset": ("1 + γ", False)}  # the library's spellings: gains, offsets


def find(names: tuple[str, ...], body: Steps, e: s.Call, call: CallInfo) -> Found | None:
    """The norm the callee's math is: a whole pattern, or a core with its gains and offsets."""
    found = matching(call.callee, [n for n in names if n in WHOLE])
    if found is not None:
        return (found[0], found[1], *WHOLE[found[0]])
    return _by_structure(call.callee, [n for n in names if n in CORES])


def _by_structure(card: s.Algorithm, cores: list[str]) -> Found | None:
    """The core pattern the card's steps are once its return's gains and offsets are taken
    off, with the renaming of γ and β to its parameters."""
    if not card.steps or not isinstance(card.steps[-1].stmt, s.Return):
        return None
    last = card.steps[-1]
    value, params = last.stmt.value, set(card.params)
    ren: dict[str, str] = {}
    if isinstance(value, s.BinOp) and value.op == "+" and _param(value.right, params):
        ren["β"], value = value.right.id, value.left
    gain = ""
    if isinstance(value, s.BinOp) and value.op == "⊙":
        g = value.right
        if _param(g, params):
            ren["γ"], gain = g.id, "γ"
        elif isinstance(g, s.BinOp) and g.op == "+" and isinstance(g.left, s.Num) and \
                g.left.text == "1" and _param(g.right, params):
            ren["γ"], gain = g.right.id, "1 + γ"
        else:
            return None
        value = value.left
    if set(ren.values()) != params:
        return None  # a parameter the norm does not use as a gain or an offset
    core = replace(card, params=(), steps=(*card.steps[:-1], replace(
        last, stmt=replace(last.stmt, value=value))))
    for name in cores:
        found = match(patterns()[name], core)
        if found is not None:
            return name, {**found, **ren}, gain, "β" in ren
    return None


def _param(e: s.Expr, params: set[str]) -> bool:
    return isinstance(e, s.Name) and e.id in params


def lower(body: Steps, e: s.Call, call: CallInfo, found: Found) -> ir.Expr | None:
    which, ren, gain, offset = found
    sig = body.low.checker.info(call.callee).sig
    if len(sig.inputs) != 1 or len(sig.inputs[0][1].shape) != 1:
        return None
    x = body.expr(e.args[0]).code
    gamma = body.expr(call.params[ren["γ"]]).code if gain else ir.Ref("None")
    beta = body.expr(call.params[ren["β"]]).code if offset else None
    width = body.dim(call.bind.get(ren["D"]) or sig.inputs[0][1].shape[0])
    eps: ir.Expr = ir.Lit("0.0")
    if which not in ("layer_norm", "layer_norm_core"):
        given = call.hypers.get(ren["ε"])
        if given is not None:
            eps = body.expr(given.value if isinstance(given, s.Arg) else given).code
        else:
            default = sig.defaults.get(ren["ε"])
            if default is None:
                return None
            eps = body.expr(default).code
    if which.startswith("rms_norm"):
        body.low.program.imports.add("math")  # rms_normalize's √
        normed = _call("offset_rms_norm" if gain == "1 + γ" else "rms_normalize",
                       x, ir.Seq((width,)), gamma, eps)
        return normed if beta is None else ir.Bin("+", normed, beta)
    if gain == "1 + γ":
        return None  # no fused op takes gains stored less one: the card's own steps
    return _call("F.layer_norm", x, ir.Seq((width,)), gamma,
                 ir.Ref("None") if beta is None else beta, eps)
