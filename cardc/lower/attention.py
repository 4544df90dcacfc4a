"""The softmax attention core, recognised by its local structure among a card's steps.

    S ← Q K^⊺ · scale                  (`/√d`, `· c`, `/ c`: any scale)
    ∀t, t′, if c(t, t′) then S[t, t′] ← −∞      (none or more: causal, windowed, explicit masks)
    … softmax(S) V …                   (S read nowhere else)

is one `F.scaled_dot_product_attention(Q, K, V, …)`: `is_causal=True` when the only c is
`t′ > t`, else a boolean `attn_mask` of the positions no c hides (`t′ > t`, then
`t′ ≤ t − w`, is a sliding window), and `scale=` unless the scale is SDPA's
own 1/√(width of Q). Whatever comes before (projections, slices of a fused projection, rotary,
norms on queries and keys) and after is the card's own math, lowered step by step. A core SDPA
cannot express (a soft cap `c · tanh(S/c)` between the steps) keeps its literal steps, which are
already batched. Row-major cards only; with `fuse=False` nothing is recognised, which is the
literal twin the tests compare against.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from .. import syntax as s
from ..types import Ty
from .context import Steps
from .values import LowerError, Val


@dataclass
class Core:
    """Steps of one attention core: the score step, an optional mask step, and the product
    `softmax(S) V` inside the step that reads it."""

    score: s.Step
    masks: tuple[s.Step, ...]
    product: s.BinOp
    reader: s.Step
    q: s.Expr
    k: s.Expr
    v: s.Expr
    scale: tuple[str, s.Expr] | None  # ("/", c) or ("·", c); None: no scale written

    @property
    def waiting(self) -> tuple[s.Step, ...]:
        """The steps lowered with the reader: the score, then the masks."""
        return (self.score, *self.masks)


def find_cores(alg: s.Algorithm) -> list[Core]:
    """Every attention core among the top-level steps of `alg`."""
    steps = list(alg.steps)
    return [core for i in range(len(steps)) if (core := _core_at(steps, i)) is not None]


def _core_at(steps: list[s.Step], i: int) -> Core | None:
    st = steps[i].stmt
    if not (isinstance(st, s.Assign) and isinstance(st.target, s.Name)):
        return None
    name = st.target.id
    scores = _scores(st.value)
    if scores is None:
        return None
    q, k, scale = scores
    j = i + 1
    while j < len(steps) and _masks(steps[j].stmt, name):
        j += 1
    masks = tuple(steps[i + 1:j])
    if j >= len(steps):
        return None
    reader = steps[j]
    products = [n for n in s.nodes(reader.stmt) if _is_product(n, name)]
    if len(products) != 1 or _reads(reader.stmt, name) != 1:
        return None
    if any(_reads(later.stmt, name) for later in steps[j + 1:]):
        return None  # S is read again: keep it
    if _assigns(reader.stmt, {n for n in _names(q) | _names(k)} - {name}):
        return None
    return Core(steps[i], masks, products[0], reader, q, k, products[0].right, scale)


def _scores(e: s.Expr) -> tuple[s.Expr, s.Expr, tuple[str, s.Expr] | None] | None:
    """`Q K^⊺`, `Q K^⊺/c`, `Q K^⊺ · c` or `c · Q K^⊺`: the queries, keys and scale."""
    scale = None
    if isinstance(e, s.BinOp) and e.op == "/":
        e, scale = e.left, ("/", e.right)
    elif isinstance(e, s.BinOp) and e.op in ("·", " ") and _qk(e.left) and not _qk(e.right):
        e, scale = e.left, ("·", e.right)
    elif isinstance(e, s.BinOp) and e.op in ("·", " ") and _qk(e.right) and not _qk(e.left):
        e, scale = e.right, ("·", e.left)
    if not _qk(e):
        return None
    return e.left, e.right.operand, scale


def _qk(e: s.Expr) -> bool:
    return isinstance(e, s.BinOp) and e.op in (" ", "·") and isinstance(e.right, s.Transpose) \
        and not isinstance(e.left, s.Transpose)


def _masks(st: s.Stmt, name: str) -> bool:
    """`∀t, t′, if c then S[t, t′] ← −∞`."""
    if not (isinstance(st, s.ForAll) and len(st.vars) == 2 and isinstance(st.body, s.If)):
        return False
    then = st.body.then
    return isinstance(then, s.Assign) and isinstance(then.target, s.Index) and \
        isinstance(then.target.base, s.Name) and then.target.base.id == name and \
        [getattr(i, "id", None) for i in then.target.items] == list(st.vars) and \
        _minus_infinity(then.value)


def _minus_infinity(e: s.Expr) -> bool:
    return isinstance(e, s.Unary) and e.op == "−" and isinstance(e.operand, s.Num) and \
        e.operand.text == "∞"


def _is_product(e, name: str) -> bool:
    """`softmax(S) V`."""
    return isinstance(e, s.BinOp) and e.op in (" ", "·") and isinstance(e.left, s.Call) and \
        e.left.func == "softmax" and len(e.left.args) == 1 and \
        isinstance(e.left.args[0], s.Name) and e.left.args[0].id == name and \
        name not in _names(e.right)


def _reads(st, name: str) -> int:
    return sum(1 for n in s.nodes(st) if isinstance(n, s.Name) and n.id == name)


def _assigns(st, names: set[str]) -> bool:
    return isinstance(st, s.Assign) and isinstance(st.target, s.Name) and st.target.id in names


def _names(e) -> set[str]:
    return {n.id for n in s.nodes(e) if isinstance(n, s.Name)}


# ------------------------------------------------------------------ lowering
def lower_core(body: Steps, core: Core) -> Val | None:
    """The core as one SDPA call, for the step that reads `softmax(S) V`; None when its values
    are not batched row-major matrices (the literal steps stay)."""
    q, k, v = body.expr(core.q), body.expr(core.k), body.expr(core.v)
    if any(not x.lifted or x.rows or x.flipped or len(x.ty.shape) != 2 for x in (q, k, v)):
        return None
    kwargs: list[tuple[str, ir.Expr]] = []
    if core.masks:
        kwargs += _mask(body, core)
    scale = _scale(body, core, q)
    if scale is False:
        return None
    if scale is not None:
        kwargs.append(("scale", scale))
    call = ir.Call(ir.Ref("F.scaled_dot_product_attention"), (q.code, k.code, v.code),
                   tuple(kwargs))
    ty = body.ty(core.product)
    return Val(call, Ty(ty.shape, ty.elem), True)


def _scale(body: Steps, core: Core, q: Val) -> ir.Expr | None | bool:
    """None for SDPA's default 1/√(width of Q); else the factor the card writes (False: one
    that is not a number, which SDPA cannot take)."""
    if core.scale is None:
        return ir.Lit("1.0")
    op, c = core.scale
    if op == "/" and isinstance(c, s.Unary) and c.op == "√":
        try:
            if body.low.dim_value(body.alg, c.operand) == q.ty.shape[-1]:
                return None
        except LowerError:  # not a dimension: a scale like any other
            pass
    value = body.expr(c)
    if value.lifted or value.rows or value.ty.shape:
        return False
    return ir.Bin("/", ir.Lit("1.0"), value.code) if op == "/" else value.code


def _mask(body: Steps, core: Core) -> list[tuple[str, ir.Expr]]:
    """`is_causal=True` for one mask `t′ > t` (or `¬(t′ ≤ t)`); else the visible positions,
    where no mask's condition holds."""
    rules = [m.stmt for m in core.masks]
    if len(rules) == 1 and _causal(rules[0].body.cond, *rules[0].vars):
        return [("is_causal", ir.Lit("True"))]
    shape = body.ty(core.score.stmt.value).shape
    visible: ir.Expr | None = None
    outer = body.point
    try:
        for rule in rules:
            t, u = rule.vars
            body.point = {t: (0, 2, shape[0]), u: (1, 2, shape[1])}
            cond = rule.body.cond
            if isinstance(cond, s.Unary) and cond.op == "¬":
                seen = body.expr(cond.operand).code
            else:
                seen = ir.Un("~", body.expr(cond).code)
            visible = seen if visible is None else ir.Bin("&", visible, seen)
    finally:
        body.point = outer
    return [("attn_mask", visible)]


def _causal(cond: s.Expr, t: str, u: str) -> bool:
    """`t′ > t`, `t < t′`, `¬(t′ ≤ t)` or `¬(t ≥ t′)`: t′ after t is hidden."""
    if isinstance(cond, s.Iverson):
        cond = cond.cond
    if isinstance(cond, s.Unary) and cond.op == "¬":
        inner = cond.operand.cond if isinstance(cond.operand, s.Iverson) else cond.operand
        return _pair(inner) in ((u, "≤", t), (t, "≥", u))
    return _pair(cond) in ((u, ">", t), (t, "<", u))


def _pair(e: s.Expr) -> tuple[str, str, str] | None:
    if isinstance(e, s.BinOp) and isinstance(e.left, s.Name) and isinstance(e.right, s.Name):
        return e.left.id, e.op, e.right.id
    return None

