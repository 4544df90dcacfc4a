"""patches(X | p): an image cut into p×p blocks, one flattened block a row. The literal
lowering gathers every entry through the index the notation defines (modelkit's
gather_patches); the fusion rule (hook: expression) splits and permutes a view of the image
instead (cut_patches), which a following matrix product takes as it is."""

from __future__ import annotations

from dataclasses import replace

from .. import syntax as s
from ..builtins import PATCHES
from .body import _call, _int, _mT
from .context import Steps
from .values import Val


def lowered(body: Steps, e: s.Call, helper: str) -> Val:
    """The call as `helper(X, p)`: X in the card's own axis order (a flipped matrix turned
    back), one channel added to a matrix; the result in the card's order too."""
    x = body.expr(e.args[0])
    code = _mT(x.code) if x.flipped else x.code
    if len(x.ty.shape) == 2:
        code = _call("torch.unsqueeze", code, _int(-3))
    p = body.expr(e.params[0])
    return replace(x, code=_call(helper, code, p.code), ty=body.ty(e), flipped=False)


def literal(body: Steps, e: s.Call) -> Val:
    return lowered(body, e, "gather_patches")


def find(patterns: tuple[str, ...], body: Steps, e: s.Expr) -> s.Call | None:
    """A call of the builtin patches (not of a card of that name)."""
    if isinstance(e, s.Call) and e.func == PATCHES and id(e) not in body.info.calls and \
            len(e.args) == 1 and len(e.params) == 1:
        return e
    return None


def lower(body: Steps, e: s.Expr, call: s.Call) -> Val:
    return lowered(body, call, "cut_patches")
