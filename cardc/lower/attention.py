"""The softmax attention core, recognised by its local structure among a card's steps.

    S ← Q K^⊺ · scale                  (`/√d`, `· c`, `/ c`: any scale)
    ∀t, t′, if c(t, t′) then S[t, t′] ← −∞      (none or more: causal, windowed, explicit masks)
    … softmax(S) V …                   (S read nowhere else; `softmax(S) V` written once, or
                                         more than once alike: one attention)

is one `F.scaled_dot_product_attention(Q, K, V, …)`: `is_causal=True` when the only c is
`t′ > t`, else a boolean `attn_mask` of the positions no c hides (`t′ > t`, then
`t′ ≤ t − w`, is a sliding window), and `scale=` unless the scale is SDPA's own 1/√(width of
Q). Whatever comes before (projections, slices of a fused projection, rotary, norms on queries
and keys) and after is the card's own math, lowered step by step. The step that reads S may
come after others (another attention's, whose product stands beside this one's) that redefine
nothing the core reads. A core SDPA cannot express (a soft cap `c · tanh(S/c)` between the
steps) keeps its literal steps, which are already batched. In a causal language model
(`Lowerer.decoder`) the keys and values that reach the core are extended by the KV cache's
first (cardc.lower.decoding passes the cache down; a copy where other steps read them over the
new positions only, as queries or a residual), and mask rules other than plain causality place
the queries after the cached positions; values that are the keys' first columns
(`softmax(S) K[:, 1 : n]`, a latent attention's latent beside its rotary key) are read from
the extended keys, so that the cache holds the keys alone; a capped core then keeps its exact math over the
extended keys. Row-major cards only; with `fuse=False` nothing is recognised, which is the
literal twin the tests compare against.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import ir
from .. import syntax as s
from ..types import Ty
from .analysis import CONTEXT, EXTENDS, RECOMPUTES
from .context import Steps
from .values import LowerError, Val, local_name


@dataclass
class Core:
    """Steps of one attention core: the score step, an optional mask step, and the product
    `softmax(S) V` inside the step that reads it (written once, or more than once alike: one
    attention, computed once)."""

    score: s.Step
    transforms: tuple[s.Step, ...]  # S ← f(S), elementwise with numbers (a soft cap)
    edits: tuple[s.Step, ...]  # masks and biases, in the card's order
    products: tuple[s.BinOp, ...]  # equal, each `softmax(S) V`
    reader: s.Step
    q: s.Expr
    k: s.Expr
    v: s.Expr
    scale: tuple[str, s.Expr] | None  # ("/", c) or ("·", c); None: no scale written

    @property
    def product(self) -> s.BinOp:
        return self.products[0]

    @property
    def masks(self) -> tuple[s.Step, ...]:
        """`∀t, t′, if c then S[t, t′] ← −∞`."""
        return tuple(e for e in self.edits if _hides(e.stmt))

    @property
    def biases(self) -> tuple[s.Step, ...]:
        """`∀t, t′ : S[t, t′] ← S[t, t′] + b`: an additive bias of the scores, where a
        condition holds if one is written."""
        return tuple(e for e in self.edits if not _hides(e.stmt))

    @property
    def waiting(self) -> tuple[s.Step, ...]:
        """The steps lowered with the reader: the score, then the masks and biases."""
        return (self.score, *self.transforms, *self.edits)


def find_cores(alg: s.Algorithm, scalars: frozenset[str]) -> list[Core]:
    """Every attention core among the top-level steps of `alg`; `scalars` are the names a
    transform of the scores may read besides them (hyperparameters)."""
    steps = list(alg.steps)
    return [core for i in range(len(steps)) if (core := _core_at(steps, i, scalars)) is not None]


def _core_at(steps: list[s.Step], i: int, scalars: set[str]) -> Core | None:
    st = steps[i].stmt
    if not (isinstance(st, s.Assign) and isinstance(st.target, s.Name)):
        return None
    name = st.target.id
    scores = _scores(st.value)
    if scores is None:
        return None
    q, k, scale = scores
    j = i + 1
    while j < len(steps) and _transforms(steps[j].stmt, name, scalars):
        j += 1
    transforms, m = tuple(steps[i + 1:j]), j
    while j < len(steps) and (_masks(steps[j].stmt, name) or
                              bias_of(steps[j].stmt, name) is not None):
        j += 1
    edits = tuple(steps[m:j])
    read = _names(q) | _names(k) | _names(scale[1] if scale else ()) | \
        {n for e in edits for n in _names(e.stmt.body)}
    reader = _reader(steps[j:], name, read)
    if reader is None:
        return None
    products = tuple(n for n in s.nodes(reader.stmt) if _is_product(n, name))
    if not products or _reads(reader.stmt, name) != len(products) or \
            any(p != products[0] for p in products):
        return None
    if any(_reads(later.stmt, name) for later in steps[steps.index(reader) + 1:]):
        return None  # S is read again: keep it
    if _assigns(reader.stmt, {n for n in _names(q) | _names(k)} - {name}):
        return None
    return Core(steps[i], transforms, edits, products, reader, q, k, products[0].right, scale)


def _reader(steps: list[s.Step], name: str, qk: set[str]) -> s.Step | None:
    """The first of `steps` that reads the scores `name`; the steps before it (another
    attention's, beside this one) define neither the scores nor what they were made of, and
    none defines the values of a product in the reader: the core, lowered at its reader,
    reads what the card's scores read."""
    for j, st in enumerate(steps):
        if _reads(st.stmt, name):
            values = {n for p in s.nodes(st.stmt) if _is_product(p, name) for n in _names(p.right)}
            made = {d for before in steps[:j] for d in _defines(before.stmt)}
            return None if made & (qk | values | {name}) else st
    return None


def _defines(st) -> set[str]:
    """The names a step assigns, whole or in part, anywhere within it."""
    out = set()
    for n in s.nodes(st):
        if isinstance(n, s.Assign):
            target = n.target.base if isinstance(n.target, s.Index) else n.target
            if isinstance(target, s.Name):
                out.add(target.id)
    return out


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


def _transforms(st: s.Stmt, name: str, scalars: set[str]) -> bool:
    """`S ← c · tanh(S/c)`: S again, from S and numbers only."""
    return isinstance(st, s.Assign) and isinstance(st.target, s.Name) and \
        st.target.id == name and name in _names(st.value) and \
        _names(st.value) <= {name, *scalars}


def _masks(st: s.Stmt, name: str) -> bool:
    """`∀t, t′, if c then S[t, t′] ← −∞`."""
    if not (isinstance(st, s.ForAll) and len(st.vars) == 2 and isinstance(st.body, s.If)):
        return False
    then = st.body.then
    return isinstance(then, s.Assign) and isinstance(then.target, s.Index) and \
        isinstance(then.target.base, s.Name) and then.target.base.id == name and \
        [getattr(i, "id", None) for i in then.target.items] == list(st.vars) and \
        _minus_infinity(then.value)


def _hides(st: s.Stmt) -> bool:
    """Whether an edit of the scores is a mask (−∞ where its condition holds)."""
    return isinstance(st.body, s.If) and isinstance(st.body.then, s.Assign) and \
        _minus_infinity(st.body.then.value)


def condition_of(st: s.Stmt) -> s.Expr | None:
    """c of a bias added only where it holds, `∀t, t′, if c then S[t, t′] ← S[t, t′] + b`."""
    return st.body.cond if isinstance(st.body, s.If) else None


def bias_of(st: s.Stmt, name: str) -> tuple[bool, s.Expr] | None:
    """b of `∀t, t′ : S[t, t′] ← S[t, t′] + b` (or `b + S[t, t′]`), b not reading S: the bias
    added to the scores, with False; (True, c) for `S[t, t′] − c`, whose bias is −c. Under
    `if c then` (c not reading S) the update is the same bias where c holds, 0 elsewhere
    (condition_of)."""
    if not (isinstance(st, s.ForAll) and len(st.vars) == 2):
        return None
    update = st.body
    if isinstance(update, s.If):
        if name in _names(update.cond):
            return None
        update = update.then
    if not isinstance(update, s.Assign):
        return None
    target, value = update.target, update.value
    if not (isinstance(target, s.Index) and isinstance(target.base, s.Name) and
            target.base.id == name and [getattr(i, "id", None) for i in target.items] ==
            list(st.vars) and isinstance(value, s.BinOp) and value.op in ("+", "−")):
        return None
    if value.left == target and name not in _names(value.right):
        return value.op == "−", value.right
    if value.op == "+" and value.right == target and name not in _names(value.left):
        return False, value.left
    return None


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


# ------------------------------------------------------------------ the fusion rule (hook: step)
WAITING = "waiting"  # a step of a core, lowered with its reader


def find(patterns: tuple[str, ...], body: Steps, step: s.Step
         ) -> tuple[Core, ...] | str | None:
    """The cores whose reader `step` is (two attentions side by side have the same reader), or
    WAITING for a step of a core (a card's own steps, row-major cards only)."""
    if body.column:
        return None
    cores = body.low.walk(body.alg, find_cores, frozenset(body.info.sig.hypers))
    readers = tuple(core for core in cores if core.reader is step)
    if readers:
        return readers
    return WAITING if any(step is w for core in cores for w in core.waiting) else None


def lower(body: Steps, step: s.Step, found: tuple[Core, ...] | str) -> bool:
    """Nothing for a step of a core; before its reader, each of its cores (`prepare`): True
    when `step` needs no lowering of its own."""
    if found == WAITING:
        return True
    for core in found:
        prepare(body, core)
    return False


# ------------------------------------------------------------------ lowering
CACHE = ir.Ref("cache")
NO_CACHE = ir.Bin("is", CACHE, ir.Lit("None"))


def prepare(body: Steps, core: Core) -> None:
    """Before the step that reads `softmax(S) V`: the core's own steps, as one SDPA call that
    the reader's product becomes (`body.given`), or as the card's steps. In a causal language
    model the keys and values that reach the product are first extended by the KV cache's."""
    q, k, v = body.expr(core.q), body.expr(core.k), body.expr(core.v)
    causal = any(_causal(m.stmt.body.cond, *m.stmt.vars) for m in core.masks)
    masking = body.low.masking
    context = not masking.reads_decoded(body.alg, core.k, core.v)  # an encoder's keys
    cached = body.low.decoder and causal and not context and _follows(body, core)
    scale = _scale(body, core, q) if all(_batched(x) for x in (q, k, v)) else False
    own = _own(body.alg, core, core.k) and _own(body.alg, core, core.v)
    literal = scale is False or core.transforms and not (cached and own) or \
        core.biases and (core.transforms or not _positional(core))
    cached = cached and not literal  # else keys over the new positions only: no cache
    masking.attention(causal, body.alg, _mask_hypers(body, core),
                      CONTEXT if context else EXTENDS if cached else RECOMPUTES)
    body.recorded.add(id(core.score))
    if literal or core.transforms:
        masking.softmaxes += len(core.products)  # their own softmax, not SDPA's
    if literal:
        return _literal(body, core)  # SDPA cannot take it, and no cache asks for more
    if not isinstance(q.code, ir.Ref) and (cached or core.biases or core.masks):
        q = _named(body, core, q)  # read again by the mask: computed once
    if cached:
        k, v = _extend_keys(body, core, k) if _values_lead_keys(core) else \
            _extend(body, core, k, v, _window(core))
    if core.transforms:  # a soft cap: the exact math, with the cache's positions
        _capped(body, core, q, k)
        return None
    kwargs: list[tuple[str, ir.Expr]] = []
    if core.biases:
        kwargs.append(("attn_mask", _biased(body, core, q, k, cached)))
    elif cached and len(core.masks) == 1:  # only causal: SDPA's own mask, the cache's after it
        kwargs += [("attn_mask", ir.Cond(NO_CACHE, ir.Lit("None"),
                                         ir.Call(ir.Attr(CACHE, "mask"), (q.code, k.code)))),
                   ("is_causal", NO_CACHE)]
    elif core.masks:
        kwargs += _mask(body, core, q, k, offset=cached)
        if cached:
            kwargs[-1] = ("attn_mask", _one_sees_all(core, q, kwargs[-1][1]))
    if scale is not None:
        kwargs.append(("scale", scale))
    sdpa = "F.scaled_dot_product_attention"
    if body.lead == "…":  # a function: its heads may sit on any axes, its K and V be shared
        sdpa = "grouped_sdpa"
    cols = _leading_columns(k.code, v.code)
    call = ir.Call(ir.Ref(sdpa), (q.code, k.code, v.code if cols is None else k.code),
                   tuple(kwargs))
    if cols is not None:  # SDPA's fused kernels take values as wide as the keys only
        call = ir.Sub(call, (ir.Ref("..."), cols))
    if len(core.products) > 1:  # written more than once: computed once
        name = body.fresh("attended")
        body.emit(ir.Assign((name,), call, body.note(core.score, None)))
        call = ir.Ref(name)
    ty = body.ty(core.product)
    for product in core.products:
        body.given[id(product)] = Val(call, Ty(ty.shape, ty.elem), True)
    return None


def record_literal(body: Steps, step: s.Step) -> None:
    """Where `step` reads an attention core that no rule lowered (the literal pipeline, a
    column-major card), the core as it masks (cardc.lower.analysis): its rules are read as
    the row-major (query, key) layout's, its hyperparameter masks where its callers give
    them. It keeps its softmax and reads no cache."""
    for core in body.low.walk(body.alg, find_cores, frozenset(body.info.sig.hypers)):
        if core.reader is step and id(core.score) not in body.recorded:
            causal = not body.column and \
                any(_causal(m.stmt.body.cond, *m.stmt.vars) for m in core.masks)
            body.low.masking.attention(causal, body.alg, _mask_hypers(body, core))
            body.low.masking.softmaxes += len(core.products)
            body.recorded.add(id(core.score))


def _positional(core: Core) -> bool:
    """Whether every bias reads the positions it is added at (SDPA's mask is a tensor)."""
    return all(set(b.stmt.vars) & _bias_names(b.stmt, core) for b in core.biases)


def _follows(body: Steps, core: Core) -> bool:
    """Whether the biases read nothing but the positions, numbers (a slope, one per head) and
    values of the positions read at t, t′ that every caller gives (T5's buckets;
    cardc.lower.analysis.positioned), and tables of no position axis read at those (a head's
    bias per bucket): computed again at the positions a cache decodes, or given for them; any
    other tensor read at t, t′ is not."""
    positions = set(body.ty(core.score.stmt.value).shape)
    for b in core.biases:
        pairs = {n.base.id for n in _at_pair(b.stmt, body)}
        for name in sorted(_bias_names(b.stmt, core) - set(b.stmt.vars) - pairs):
            val = body.expr(s.Name(name, span=b.span))
            if val.rows or positions & set(val.ty.shape) or val.ty.shape and not pairs:
                return False  # a tensor over positions; a table read at other than pairs
    return True


def _at_pair(st: s.Stmt, body: Steps) -> list[s.Index]:
    """The reads `β[t, t′]`, at the step's own pair of positions in order, of an input every
    caller gives as a value of the decoded rows' positions; not where β is read otherwise."""
    found = [n for n in s.nodes(st) if isinstance(n, s.Index) and isinstance(n.base, s.Name) and
             body.low.masking.positioned.given(body.alg, n.base.id)]
    at = [n for n in found if [getattr(i, "id", None) for i in n.items] == list(st.vars)]
    bases = {n.base.id for n in at}
    elsewhere = sum(1 for n in s.nodes(st) if isinstance(n, s.Name) and n.id in bases)
    return at if elsewhere == len(at) else []


def _target(core: Core) -> str:
    return core.score.stmt.target.id


def _bias_names(st: s.Stmt, core: Core) -> set[str]:
    """The names a bias step reads: its bias and its condition."""
    cond = condition_of(st)
    return _names(bias_of(st, _target(core))[1]) | (_names(cond) if cond is not None else set())


def _biased(body: Steps, core: Core, q: Val, k: Val, offset: bool) -> ir.Expr:
    """SDPA's float `attn_mask`: the biases at every (query, key) pair, in the queries' number
    format, −∞ where a mask hides the key. With `offset`, query t sits after the cached
    positions (cardc.lower.attention._visible), so the bias follows the decoded positions."""
    shape = body.ty(core.score.stmt.value).shape
    total: ir.Expr | None = None
    outer, ranged = body.point, body.ranged
    try:
        for step in core.biases:
            t, u = step.stmt.vars
            if offset:
                body.point = {}
                body.ranged = {**ranged, **_positions(body, t, u, q, k, shape)}
            else:
                body.point = {t: (0, 2, shape[0]), u: (1, 2, shape[1])}
            negated, e = bias_of(step.stmt, _target(core))
            padded = _padded(body, e, {t, u})
            if offset:  # given for the new rows against every key: read as it comes
                padded += _given_at_pair(body, step.stmt, shape)
            try:
                code = body.expr(e).code
            finally:
                for n in padded:
                    body.given.pop(n, None)
            code = ir.Un("-", code) if negated else code
            cond = condition_of(step.stmt)
            if cond is not None:  # the bias where c holds, 0 elsewhere
                code = ir.Call(ir.Ref("torch.where"), (body.expr(cond).code, code, ir.Lit("0.0")))
            total = code if total is None else ir.Bin("+", total, code)
    finally:
        body.point, body.ranged = outer, ranged
    bias = body.fresh("bias")
    dtype = ir.Attr(q.code, "dtype")
    body.emit(ir.Assign((bias,), ir.Call(ir.Attr(total, "to"), (dtype,)),
                        body.note(core.biases[0], None, "added to the scores")))
    if not core.masks:
        return _full_rank(ir.Ref(bias), q, k)
    made = _remembered(body, core, q, k, _visible(body, core, q, k, offset))
    shared = isinstance(made, ir.Call) and made.func == ir.Ref("shared_mask")
    if shared:  # 0 where visible, −∞ where hidden: added to the bias
        made = replace(made, kwargs=(("dtype", dtype),))
    mask = _one_sees_all(core, q, made)
    if isinstance(mask, (ir.Call, ir.Cond)):  # None where every key at hand is visible
        name = body.fresh("hidden" if shared else "visible")
        body.emit(ir.Assign((name,), mask, body.note(core.masks[0], None)))
        mask = ir.Ref(name)
    body.low.program.imports.add("math")
    out = ir.Bin("+", ir.Ref(bias), mask) if shared else ir.Call(
        ir.Attr(ir.Ref(bias), "masked_fill"), (_not(mask), ir.Un("-", ir.Ref("math.inf"))))
    if isinstance(mask, ir.Ref):
        out = ir.Cond(ir.Bin("is", mask, ir.Lit("None")), ir.Ref(bias), out)
    body.emit(ir.Assign((bias,), out, body.note(core.masks[0], None, "−∞ where hidden")))
    return _full_rank(ir.Ref(bias), q, k)


def _given_at_pair(body: Steps, st: s.Stmt, shape) -> list[int]:
    """The reads `β[t, t′]` of a value of positions the caller gives (_at_pair), lowered as
    entries at every (query, key) pair, the axes of β: the ids of the nodes so given."""
    t, u = st.vars
    outer, ranged = body.point, body.ranged
    out = []
    for n in _at_pair(st, body):
        body.point, body.ranged = {t: (0, 2, shape[0]), u: (1, 2, shape[1])}, {}
        try:
            body.given[id(n)] = body.expr(n)
        finally:
            body.point, body.ranged = outer, ranged
        out.append(id(n))
    return out


def _full_rank(mask: ir.Expr, q: Val, k: Val) -> ir.Expr:
    """The mask with an axis for each of the queries' (a view): SDPA's fused CPU kernel takes
    a mask of the queries' rank only, and falls back to its slow exact math for another."""
    target = ir.Bin("+", ir.Sub(ir.Attr(q.code, "shape"), (ir.SliceX(None, ir.Lit("-1")),)),
                    ir.Sub(ir.Attr(k.code, "shape"), (ir.SliceX(ir.Lit("-2"), ir.Lit("-1")),)))
    return ir.Call(ir.Ref("torch.broadcast_to"), (mask, target))


def _padded(body: Steps, e: s.Expr, positions: set[str]) -> list[int]:
    """A number of `e` that varies over the leading axes (a slope per head) given two axes
    of one, to broadcast against the (query, key) pairs as one number held in a tensor: the
    ids of the names so given."""
    out = []
    for n in s.nodes(e):
        if isinstance(n, s.Name) and n.id not in positions:
            val = body.expr(n)
            if val.lifted and not val.ty.shape and not val.rows:
                body.given[id(n)] = Val(ir.Sub(val.code, (ir.Ref("..."), ir.Ref("None"),
                                                          ir.Ref("None"))), val.ty, tensor=True)
                out.append(id(n))
    return out


def _mask_hypers(body: Steps, core: Core) -> frozenset[str]:
    """The tensor hyperparameters the core's masks read (`¬Mask[t, t′]`)."""
    hypers = body.info.sig.hypers
    return frozenset(n.id for m in core.masks for n in s.nodes(m.stmt.body.cond)
                     if isinstance(n, s.Name) and n.id in hypers and hypers[n.id].shape)


def _capped(body: Steps, core: Core, q: Val, k: Val) -> None:
    """A core with transforms of its scores (a soft cap), as its steps: the scores' scale,
    and the first transform's division of them by a number, applied to the queries (a
    T × d matrix, not T × T), and the masks added to the scores as a bias made once per
    sizes (its backward passes the gradient through, where masked_fill's writes it)."""
    start = len(body.out)
    for st in (core.score, *core.transforms):
        body.step(st)
    name = core.score.stmt.target.id
    body.out[start:] = _folded(body.out[start:], local_name(name))
    scores = body.expr(s.Name(name, span=core.score.span))
    body.low.program.imports.add("math")
    made = _remembered(body, core, q, k, _visible(body, core, q, k, True))
    bias = isinstance(made, ir.Call) and made.func == ir.Ref("shared_mask")
    if bias:
        made = replace(made, kwargs=(("dtype", ir.Attr(scores.code, "dtype")),))
    mask = _one_sees_all(core, q, made)
    if isinstance(mask, (ir.Call, ir.Cond)):  # None where every key at hand is visible
        name = body.fresh("hidden" if bias else "visible")
        body.emit(ir.Assign((name,), mask, body.note(core.masks[0], None)))
        mask = ir.Ref(name)
    masked = ir.Bin("+", scores.code, mask) if bias else ir.Call(
        ir.Attr(scores.code, "masked_fill"), (_not(mask), ir.Un("-", ir.Ref("math.inf"))))
    if isinstance(mask, ir.Ref):
        masked = ir.Cond(ir.Bin("is", mask, ir.Lit("None")), scores.code, masked)
    body.emit(ir.Assign((scores.code.id,), masked,
                        body.note(core.masks[0], None, "the hidden positions")))


def _folded(steps: list[ir.Stmt], name: str) -> list[ir.Stmt]:
    """`S = A @ B / a` (or `· a`, or no scale), then `S = f(S / b)` reading S once: `S = (A
    / (a * b)) @ B`, then `S = f(S)`: b is a number, as everything a transform reads besides
    S is."""
    score, *rest = steps
    if not (isinstance(score, ir.Assign) and score.targets == (name,)):
        return steps
    product, scale = score.value, None
    if isinstance(product, ir.Bin) and product.op in ("/", "*"):
        product, scale = product.left, (product.op, product.right)
    if not (isinstance(product, ir.Bin) and product.op == "@"):
        return steps
    first = rest[0] if rest else None
    divisor = _divisor(first.value, name) if isinstance(first, ir.Assign) and \
        first.targets == (name,) else None
    if divisor is not None:
        scale = ("/", divisor) if scale is None else \
            ("/", ir.Bin("*", scale[1], divisor)) if scale[0] == "/" else \
            ("*", ir.Bin("/", scale[1], divisor))
        ref = ir.Ref(name)
        rest[0] = replace(first, value=ir.rewrite(first.value, lambda e: ref if isinstance(
            e, ir.Bin) and e.op == "/" and e.left == ref else None))
    if scale is None:
        return steps
    queries = ir.Bin(scale[0], product.left, scale[1])
    return [replace(score, value=replace(product, left=queries)), *rest]


def _divisor(e: ir.Expr, name: str) -> ir.Expr | None:
    """b where `S / b` is the one place e reads S."""
    ref = ir.Ref(name)
    reads, found = [], []

    def visit(n):
        if n == ref:
            reads.append(n)
        elif isinstance(n, ir.Bin) and n.op == "/" and n.left == ref:
            reads.append(n)
            found.append(n.right)
            return n
        return None

    ir.rewrite(e, visit)
    return found[0] if len(reads) == 1 and found and name not in ir.ref_ids([found[0]]) \
        else None


def _batched(x: Val) -> bool:
    return x.lifted and not x.rows and not x.flipped and len(x.ty.shape) == 2


def _literal(body: Steps, core: Core) -> None:
    for st in core.waiting:
        body.step(st)


def _extend(body: Steps, core: Core, k: Val, v: Val, window: s.Expr | None
            ) -> tuple[Val, Val]:
    """`K, V = cache.extend(None, K, V)` with a cache: the positions decoded before come
    first. K and V are named first if the card computes them in place. Under a window of w
    positions the cache keeps the last w − 1 only (`keep=w - 1`), all a new position reads
    before itself, so one decoded token sees every key at hand: the mask rules read positions
    relative to the keys at hand, which a window's rule allows."""
    names, given = [], []
    for expr, val in ((core.k, k), (core.v, v)):
        own = isinstance(val.code, ir.Ref) and _own(body.alg, core, expr)
        name = val.code.id if own else body.fresh("K" if expr is core.k else "V")
        if not isinstance(val.code, ir.Ref):
            body.emit(ir.Assign((name,), val.code, body.note(core.score, None)))
        names.append(name)
        given.append(ir.Ref(name) if own or not isinstance(val.code, ir.Ref) else val.code)
    keep = () if window is None else (("keep", ir.Bin("-", body.expr(window).code, ir.Lit("1"))),)
    extend = ir.Assign(tuple(names), ir.Call(ir.Attr(CACHE, "extend"), (
        ir.Lit("None"), *given), keep), ir.Note(
        text="the cached positions come first", line=body.note(core.score).line))
    copies = [(n, g) for n, g in zip(names, given, strict=True) if g != ir.Ref(n)]
    plain = ()  # without a cache, the copies are the values themselves
    if copies:
        values = tuple(g for _, g in copies)
        plain = (ir.Assign(tuple(n for n, _ in copies),
                           values[0] if len(values) == 1 else ir.Seq(values)),)
    body.emit(ir.If(ir.Bin("is not", CACHE, ir.Lit("None")), (extend,), plain))
    body.uses_cache = True
    for expr, name in zip((core.k, core.v), names, strict=True):
        if isinstance(expr, s.Name) and _own(body.alg, core, expr):
            body.scope.values[expr.id] = replace(body.expr(expr), code=ir.Ref(name))
    return replace(k, code=ir.Ref(names[0])), replace(v, code=ir.Ref(names[1]))


def _named(body: Steps, core: Core, q: Val) -> Val:
    """The queries, computed by an expression (`RoPE(Q)` inside the score line), under a
    name of their own: the masks, the bias and the cache's mask read them besides SDPA, and
    each reading would compute them again."""
    name = body.fresh("Q")
    body.emit(ir.Assign((name,), q.code, body.note(core.score, None)))
    return replace(q, code=ir.Ref(name))


def _values_lead_keys(core: Core) -> bool:
    """Whether the values are the first columns of the keys, `softmax(S) K[:, 1 : n]` of the
    name K the scores read (a latent attention's latent beside its rotary key): the cache then
    keeps the keys alone, and the values are read from them."""
    k, v = core.k, core.v
    if not (isinstance(k, s.Name) and isinstance(v, s.Index) and isinstance(v.base, s.Name)
            and v.base.id == k.id and len(v.items) == 2):
        return False
    rows, cols = v.items
    return isinstance(rows, s.Slice) and rows.lo is None and rows.hi is None and \
        isinstance(cols, s.Slice) and (cols.lo is None or (isinstance(cols.lo, s.Num)
                                                            and cols.lo.text == "1"))


def _leading_columns(k: ir.Expr, v: ir.Expr) -> ir.SliceX | None:
    """The slice `:n` where the values are the keys' first columns, `K[..., :, :n]`: then
    softmax(S) V is (softmax(S) K)[..., :n], which SDPA computes in its fused kernel for
    values as wide as the keys (for narrower ones it falls back to its composite, on one CPU
    thread 4× slower at a decoded token and at a 16-token causal forward alike)."""
    if not isinstance(v, ir.Sub) or v.obj != k or not v.items:
        return None
    *rest, cols = v.items
    whole = ir.SliceX(None, None)
    if not (isinstance(cols, ir.SliceX) and cols.lo is None and cols.step is None and
            cols.hi is not None and all(i == whole for i in rest[1:]) and
            rest[:1] in ([], [ir.Ref("...")], [ir.Lit("...")], [whole])):
        return None
    return cols


def _extend_keys(body: Steps, core: Core, k: Val) -> tuple[Val, Val]:
    """`K_, _ = cache.extend(None, K, K[..., :0])` with a cache (values of no width: the cache
    holds the keys alone), then the values, the first columns of the extended keys."""
    name = body.fresh("K")
    none = ir.Sub(k.code, (ir.Lit("..."), ir.SliceX(None, ir.Lit("0"))))
    extend = ir.Assign((name, "_"), ir.Call(ir.Attr(CACHE, "extend"), (
        ir.Lit("None"), k.code, none)), ir.Note(
        text="the cached positions come first; the values are the keys' first columns",
        line=body.note(core.score).line))
    body.emit(ir.If(ir.Bin("is not", CACHE, ir.Lit("None")), (extend,),
                    (ir.Assign((name,), k.code),)))
    body.uses_cache = True
    key = core.k.id  # type: ignore[attr-defined]
    held = body.scope.values[key]
    body.scope.values[key] = replace(held, code=ir.Ref(name))
    try:
        v = body.expr(core.v)
    finally:
        body.scope.values[key] = held
    return replace(k, code=ir.Ref(name)), v


def _own(alg: s.Algorithm, core: Core, expr: s.Expr) -> bool:
    """Whether `expr`, the core's keys or values, is a name that nothing but the core reads:
    the cache may then extend it in place; otherwise (queries, a residual or another step
    read it over the new positions) the cache extends a copy under a name of its own."""
    if not isinstance(expr, s.Name):
        return False
    core_reads = {id(core.k), *(id(p.right) for p in core.products)}
    written = {id(n.target.base if isinstance(n.target, s.Index) else n.target)
               for n in s.nodes(alg.steps) if isinstance(n, s.Assign)}
    return all(id(n) in core_reads or id(n) in written for n in s.nodes(alg.steps)
               if isinstance(n, s.Name) and n.id == expr.id)


def _one_sees_all(core: Core, q: Val, mask: ir.Expr) -> ir.Expr:
    """Under a sliding window, one token decoded through the cache sees every key at hand
    (the cache keeps the w − 1 before it): no mask then."""
    if _window(core) is None:
        return mask
    one = ir.Bin("and", ir.Bin("is not", CACHE, ir.Lit("None")),
                 ir.Call(ir.Attr(CACHE, "sees_all"), (q.code,)))
    return ir.Cond(one, ir.Lit("None"), mask)


def _window(core: Core) -> s.Expr | None:
    """w of a rule hiding `t′ ≤ t − w` beside the causal one: a sliding window. Every rule
    is then a difference of positions, the same wherever the keys at hand start."""
    rules = [m.stmt for m in core.masks]
    found = None
    for rule in rules:
        t, u = rule.vars
        cond = rule.body.cond
        if _causal(cond, t, u):
            continue
        if not (isinstance(cond, s.BinOp) and cond.op == "≤" and getattr(cond.left, "id", None)
                == u and isinstance(cond.right, s.BinOp) and cond.right.op == "−" and
                getattr(cond.right.left, "id", None) == t and
                not {t, u} & _names(cond.right.right)):
            return None  # another rule: positions from the first key, all of them kept
        found = cond.right.right
    return found


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


def _mask(body: Steps, core: Core, q: Val, k: Val, offset: bool) -> list[tuple[str, ir.Expr]]:
    """`is_causal=True` for one mask `t′ > t` (or `¬(t′ ≤ t)`); else the visible positions."""
    rules = [m.stmt for m in core.masks]
    if not offset and len(rules) == 1 and _causal(rules[0].body.cond, *rules[0].vars):
        return [("is_causal", ir.Lit("True"))]
    return [("attn_mask", _remembered(body, core, q, k, _visible(body, core, q, k, offset)))]


def _visible(body: Steps, core: Core, q: Val, k: Val, offset: bool) -> ir.Expr:
    """The positions no mask step hides, (T_q, T_k). With `offset`, query t sits at
    T_k − T_q + t: after the cached positions, which the keys include."""
    shape = body.ty(core.score.stmt.value).shape
    visible: ir.Expr | None = None
    outer, ranged = body.point, body.ranged
    try:
        for rule in (m.stmt for m in core.masks):
            t, u = rule.vars
            if offset:
                body.point = {}
                body.ranged = {**ranged, **_positions(body, t, u, q, k, shape)}
            else:
                body.point = {t: (0, 2, shape[0]), u: (1, 2, shape[1])}
            cond = rule.body.cond
            if isinstance(cond, s.Unary) and cond.op == "¬":
                seen = body.expr(cond.operand).code
            else:
                seen = _not(body.expr(cond).code)
            visible = seen if visible is None else ir.Bin("&", visible, seen)
    finally:
        body.point, body.ranged = outer, ranged
    return visible


def _remembered(body: Steps, core: Core, q: Val, k: Val, visible: ir.Expr) -> ir.Expr:
    """A mask made once per sizes, device and the numbers its rules read (a window's w),
    shared by every layer and decoding step: `shared_mask(site, lambda: …, …)`, None where it
    hides nothing. A rule that reads a tensor (an explicit mask) is computed where it stands."""
    if not (isinstance(q.code, ir.Ref) and isinstance(k.code, ir.Ref)):
        return visible
    numbers = []
    for rule in (m.stmt for m in core.masks):
        for name in sorted(_names(rule.body.cond) - set(rule.vars)):
            val = body.expr(s.Name(name, span=rule.span))
            if val.lifted or val.rows or val.ty.shape:
                return visible
            numbers.append(val.code)
    first = first_query(q.code, k.code)
    if _holds(visible, first):  # the queries' positions: a static cache's own (a tensor)
        numbers.append(first)
    body.low.mask_sites += 1
    site = ir.Lit(str(body.low.mask_sites))
    rule = ir.Lambda(visible, body.fresh("visible"))  # a local function where a line is too short
    return ir.Call(ir.Ref("shared_mask"), (
        site, rule, _count(q), _count(k), ir.Attr(q.code, "device"), *numbers))


def _count(x: Val) -> ir.Expr:
    """`X.shape[-2]`: the positions of queries or keys X."""
    return ir.Sub(ir.Attr(x.code, "shape"), (ir.Lit("-2"),))


def _holds(e: ir.Expr, part: ir.Expr) -> bool:
    """Whether `part` stands in `e`."""
    found = False

    def visit(n):
        nonlocal found
        found = found or n == part

    ir.rewrite(e, visit)
    return found


def first_query(q: ir.Expr, k: ir.Expr) -> ir.Call:
    """`first_query(cache, Q, K)`: the position of the first query among the keys at hand,
    after those decoded before (a static cache's own position: its keys are every position
    it holds); without a cache, the keys' count less the queries'."""
    return ir.Call(ir.Ref("first_query"), (CACHE, q, k))


def _not(e: ir.Expr) -> ir.Expr:
    return e.operand if isinstance(e, ir.Un) and e.op == "~" else ir.Un("~", e)


def _positions(body: Steps, t: str, u: str, q: Val, k: Val, shape) -> dict[str, Val]:
    """The positions of the queries (a column) and the keys (a row), counted from 1 as the
    card's t and t′ are: a rule that is not a function of t − t′ alone (a chunk's,
    ⌊(t − 1)/C⌋) reads them as the card does."""
    rows, cols = _count(q), _count(k)
    device = (("device", ir.Attr(q.code, "device")),)
    one = ir.Lit("1")
    queries = ir.Bin("+", ir.Call(ir.Ref("torch.arange"), (one, ir.Bin("+", rows, one)), device),
                     first_query(q.code, k.code))
    keys = ir.Call(ir.Ref("torch.arange"), (one, ir.Bin("+", cols, one)), device)
    return {
        t: Val(ir.Sub(queries, (ir.SliceX(None, None), ir.Ref("None"))), Ty((shape[0], None), "ℕ"),
               tensor=True),  # what is computed of them is a tensor too: ⌊(t − 1)/C⌋ is torch's
        u: Val(ir.Sub(keys, (ir.Ref("None"), ir.SliceX(None, None))), Ty((None, shape[1]), "ℕ"),
               tensor=True),
    }


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

