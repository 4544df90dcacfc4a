"""Maps over heads, vectorised by their structure.

`for h ∈ [H] : Y^h ← F(args | params^h, hypers)` is F applied to every head at once: F is
lowered to a function whose steps act on the trailing (card) axes of its values, so calling it
once with a head axis in front of every argument's card axes computes all H heads. Each
argument says how it reaches the heads:

- one that does not name h is the same for every head: shared, and given a head axis of size 1
  (`X.unsqueeze(-3)`), which broadcasting repeats;
- a block of columns indexed by h, `X[:, (h − 1) w + 1 : h w]`, is X's columns split into H
  blocks of w, the blocks on the head axis: `X.unflatten(-1, (H, w)).transpose(-3, -2)`;
- a member of a family of parameters stacked for the heads (`W^h_q`) is its storage viewed
  with the head axis first (`(H, D, w)`, a vector as `(H, 1, w)`), which `X @ W` and `X + b`
  broadcast over;
- a column picked by h, `W[:, h]` (a table with one column per head, as T5's bias of each
  relative-position bucket), is W's columns as rows: `W.mT`, `(…, H, n)`.

The result holds every head on that axis, `(…, H, T, w)`, which is what `[Y^1, …, Y^H]` joins
(cardc.lower.expressions). Nested maps (groups of query heads, then the heads of a group) nest the
same way, since the function called by the outer map sees the outer head axis as one more
batch axis. A map whose arguments take any other form keeps its literal loop.
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from .. import syntax as s
from ..checker import CallInfo, instance, split_name
from ..dims import Dim
from ..spelling import display
from ..types import BundleTy, FamilyTy, Ty
from .context import Steps
from .values import Family, LowerError, Stacked, Val, attr_name, local_name


def _int(n: int) -> ir.Lit:
    return ir.Lit(str(n))


def _method(obj: ir.Expr, name: str, *args: ir.Expr) -> ir.Call:
    return ir.Call(ir.Attr(obj, name), args)


class _Declined(Exception):
    """The map's arguments take a form this vectorisation does not handle."""


class HeadMap:
    """One map over heads, lowered as one call of its card with a head axis on each value."""

    def __init__(self, body: Steps, st: s.For, call: CallInfo, count: Dim):
        self.body, self.st, self.call, self.count = body, st, call, count
        self.var = st.var
        self.merged = bool(body.merged)  # the heads of a group in a merged variant (below)

    # ------------------------------------------------------------------ arguments
    def argument(self, e: s.Expr) -> Val:
        """An argument of the mapped card, with the head axis in front of its card axes."""
        if self.var not in _names(e):
            return self.shared(self.body.expr(e))
        if isinstance(e, s.Index) and isinstance(e.base, s.Name) and len(e.items) == 2 and \
                _is_all(e.items[0]) and isinstance(e.items[1], s.Slice) and \
                self.var not in _names(e.base):
            return self.block(e)
        if isinstance(e, s.Index) and isinstance(e.base, s.Name) and len(e.items) == 2 and \
                _is_all(e.items[0]) and getattr(e.items[1], "id", None) == self.var:
            return self.column(e)
        if isinstance(e, s.Call):
            return self.through(e)
        raise _Declined

    def through(self, e: s.Call) -> Val:
        """`RoPE(Q[:, (j − 1) d + 1 : j d])`: a card applied to head arguments applies to
        every head at once, as it would to any batch axis; its tensors must not vary by head."""
        call = self.body.info.calls.get(id(e))
        if call is None or self.body.module_for(e, call) is not None or \
                any(self.var in _names(p) for p in e.params):
            raise _Declined
        for a in e.args:
            self.body.given[id(a)] = self.argument(a)
        try:
            val = self.body.expr(e)
        finally:
            for a in e.args:
                self.body.given.pop(id(a), None)
        if val.rows or val.flipped or not val.lifted:
            raise _Declined
        return val

    def shared(self, val: Val) -> Val:
        if val.rows or val.flipped:
            raise _Declined
        if not val.lifted or self.merged:  # a number broadcasts; merged: SDPA's groups share it
            return val
        return replace(val, code=_method(val.code, "unsqueeze", _int(-len(val.ty.shape) - 1)))

    def block(self, e: s.Index) -> Val:
        """`X[:, (h − 1) w + 1 : h w]` for every h: X's columns as H blocks of w."""
        base, width, code = self.columns(e)
        if e.base.id in self.body.merged:  # every group's columns: split into all their heads
            heads = _method(_method(base.code, "unflatten", _int(-1), ir.Seq((
                _int(-1), self.body.dim(width)))), "transpose", _int(-3), _int(-2))
            return Val(heads, Ty((base.ty.shape[0], width), base.ty.elem), True)
        split = ir.Seq((self.body.dim(self.count), self.body.dim(width)))
        heads = _method(_method(code, "unflatten", _int(-1), split), "transpose", _int(-3),
                        _int(-2))
        return Val(heads, Ty((base.ty.shape[0], width), base.ty.elem), True)

    def column(self, e: s.Index) -> Val:
        """`W[:, h]` for every h: W's columns, one per head, on the head axis (the first H
        where W has more)."""
        base = self.body.expr(e.base)
        if base.rows or base.flipped or len(base.ty.shape) != 2 or self.merged:
            raise _Declined
        code = _method(base.code, "transpose", _int(-2), _int(-1))
        if base.ty.shape[1] != self.count:
            code = ir.Sub(code, (ir.Ref("..."), ir.SliceX(None, self.body.dim(self.count)),
                                 ir.SliceX(None, None)))
        return Val(code, Ty((base.ty.shape[0],), base.ty.elem), True)

    def whole(self, e: s.Expr) -> Val:
        """The block argument `X[:, (h − 1) w + 1 : h w]` of an input the callee takes merged:
        X's columns (those the blocks cover) as they are, for the callee to split."""
        if not (isinstance(e, s.Index) and isinstance(e.base, s.Name) and len(e.items) == 2
                and _is_all(e.items[0]) and isinstance(e.items[1], s.Slice)):
            raise _Declined
        base, _, code = self.columns(e)
        return Val(code, base.ty, True)

    def columns(self, e: s.Index) -> tuple[Val, Dim, ir.Expr]:
        """X, the width w of its blocks, and the columns they cover (all of X, or the first)."""
        item = e.items[1]
        if item.lo is None or item.hi is None:
            raise _Declined
        lo, hi = (self.body.low.dim_value(self.body.alg, b) for b in (item.lo, item.hi))
        width = hi - lo + Dim.const(1)
        h = Dim.sym(self.var)
        if self.var in width.symbols or hi != h * width:
            raise _Declined  # not the h-th of equal consecutive blocks
        base = self.body.expr(e.base)
        if not base.lifted or base.rows or base.flipped or len(base.ty.shape) != 2:
            raise _Declined
        code = base.code
        if base.ty.shape[1] != self.count * width:  # the blocks cover only the first columns
            code = ir.Sub(code, (ir.Ref("..."), ir.SliceX(None, self.body.dim(self.count * width))))
        return base, width, code

    def per_head(self, name: str, given: s.Expr) -> ir.Expr:
        """`m = 2^{−8h/H}`: a number the card computes from the head index, one per head, as
        a vector over the head axis (the callee holds it as a value with that axis in front:
        cardc.lower.cards)."""
        hyper = self.body.low.checker.info(self.call.callee).sig.hypers.get(name)
        if isinstance(given, s.Arg):
            if given.op != "=" or isinstance(given.target, s.Index):
                raise _Declined  # a mask rule, or a constant one
            given = given.value
        if hyper is None or hyper.shape:
            raise _Declined  # a tensor per head
        count = self.body.dim(self.count)
        heads = ir.Call(ir.Ref("torch.arange"), (_int(1), ir.Bin("+", count, _int(1))),
                        (("device", self.body.device_expr()),))
        outer = self.body.ranged
        self.body.ranged = {**outer, self.var: Val(heads, Ty(elem="ℕ"), rows=(self.count,))}
        try:
            val = self.body.expr(given)
        finally:
            self.body.ranged = outer
        if val.lifted or val.flipped or val.ty.shape or val.rows != (self.count,):
            raise _Declined  # it varies by more than the head
        return val.code

    # ------------------------------------------------------------------ parameters
    def parameter(self, name: str, rank: int) -> ir.Expr:
        """A tensor handed to the card for head h: its stacked family with the heads first,
        padded to broadcast against values of card rank `rank`."""
        for pattern, fam in self.body.scope.stacked.items():
            if instance(pattern, fam.var, name) == self.var:
                return self.stacked(fam, rank)
        if any(v == self.var for _, v in split_name(name)[1]):
            raise _Declined  # indexed by the head, but not stacked for the heads
        return self.body.expr(s.Name(name, span=self.st.span)).code

    def stacked(self, fam: Stacked, rank: int) -> ir.Expr:
        if fam.axis != "last" or fam.over != self.count or not fam.shape:
            raise _Declined
        width = self.body.dim(fam.shape[-1])
        store = ir.Ref(fam.storage)
        if fam.count > 1:
            dims = ir.Seq((_int(fam.count), self.body.dim(fam.over), width))
            view = ir.Sub(_method(store, "unflatten", _int(-1), dims),
                          (ir.Ref("..."), _int(fam.index), ir.SliceX(None, None),
                           ir.SliceX(None, None)))
        else:
            view = _method(store, "unflatten", _int(-1), ir.Seq((self.body.dim(fam.over), width)))
        if len(fam.shape) > 1:  # (…, H, w) → (H, …, w)
            view = _method(view, "movedim", _int(-2), _int(0))
        for _ in range(rank - len(fam.shape)):  # a vector beside matrices: (H, 1, w)
            view = _method(view, "unsqueeze", _int(1))
        return view

    def parameters(self, rank: int) -> list[tuple[str, ir.Expr]]:
        """Keyword arguments for the callee's tensors, each with its heads."""
        callee = self.body.low.checker.info(self.call.callee).sig
        out: list[tuple[str, ir.Expr]] = []
        for name, entry in callee.params:
            if name in callee.hypers:
                continue
            given = self.call.params.get(name)
            if not isinstance(given, s.Name):
                raise _Declined
            if isinstance(entry, BundleTy):
                mine = self.body.info.types.get(id(given))
                if isinstance(mine, FamilyTy):
                    mine = mine.entry
                if not isinstance(mine, BundleTy):
                    raise _Declined
                theirs = self.body.low.flat_tensors(entry)
                members = self.body.low.flat_tensors(mine)
                if len(theirs) != len(members):
                    raise _Declined
                for (member, _), (own, _) in zip(theirs, members, strict=True):
                    out.append((local_name(member), self.parameter(own, rank)))
            else:
                out.append((local_name(name), self.parameter(given.id, rank)))
        return out


def find(patterns: tuple[str, ...], body: Steps, st: s.For, step: s.Step) -> s.For | None:
    """A map over heads of one step (the rest is checked as it is lowered)."""
    return st if len(st.body) == 1 else None


def lower(body: Steps, st: s.For, step: s.Step, found: s.For) -> bool:
    return vectorise(body, st, step)


def vectorise(body: Steps, st: s.For, step: s.Step) -> bool:
    """`for h ∈ [H] : Y^h ← F(…)` as one call of F over every head; False keeps the loop."""
    if len(st.body) != 1 or not isinstance(st.over, s.Concat) or len(st.over.items) != 1:
        return False
    assign = st.body[0].stmt
    if not (isinstance(assign, s.Assign) and isinstance(assign.target, s.Name) and
            instance(assign.target.id, st.var, assign.target.id) == st.var):
        return False
    e = assign.value
    call = body.info.calls.get(id(e)) if isinstance(e, s.Call) else None
    if call is None or body.module_for(e, call) is not None:
        return False
    callee = body.low.checker.info(call.callee).sig
    if callee.layout == "column" or body.column:
        return False
    heads = HeadMap(body, st, call, body.size(st.over.items[0]))
    merged = _group(body, assign.target.id, call)
    found = _lowered(body, heads, e, merged) if merged else None
    if found is None:
        merged = frozenset()
        found = _lowered(body, heads, e, merged)
    if found is None:
        return False
    fn, args, kwargs = found
    ty = body.ty(e)
    local = body.fresh(f"{attr_name(assign.target.id, st.var)}_{local_name(st.var)}")
    shape = ", ".join(body.dim_text(d) for d in (heads.count, *ty.shape))
    note = f"({body.lead}, {shape}): every {display(st.var)} at once"
    if merged:
        note = f"every {display(st.var)} at once, all their heads side by side on one axis"
    elif heads.merged:
        rest = ", ".join(body.dim_text(d) for d in ty.shape)
        note = f"({body.lead}, groups·{body.dim_text(heads.count)}, {rest}): every " \
               f"{display(st.var)} of every group at once"
    code = ir.Call(ir.Ref(fn), tuple(a.code for a in args), tuple(kwargs))
    body.emit(ir.Assign((local,), code, body.note(step, None, note)))
    fam = Family(st.var, local, ty, Val(ir.Ref(local), Ty(ty.shape, ty.elem), True),
                 merged=heads.merged, count=heads.count)
    body.scope.values[assign.target.id] = fam
    return True


def _lowered(body: Steps, heads: HeadMap, e: s.Call, merged: frozenset[str]
             ) -> tuple[str, list[Val], list[tuple[str, ir.Expr]]] | None:
    """The mapped card's function (its variant taking `merged` inputs merged), its
    arguments with their head axes and its keyword arguments; None if the map's arguments
    take a form this vectorisation does not handle."""
    call = heads.call
    callee = body.low.checker.info(call.callee).sig
    names = [n for n, _ in callee.inputs]
    try:
        args = [heads.whole(a) if n in merged else heads.argument(a)
                for n, a in zip(names, e.args, strict=False)]
        args += [args[0]] * (len(callee.inputs) - len(args))  # Z = X: self-attention
        rank = max((len(a.ty.shape) for a in args if a.lifted), default=0)
        kwargs = heads.parameters(rank)
        if rank < 2 and kwargs:  # one vector per example: `x @ W` of every head's W would
            raise _Declined  # take the examples for a matrix's rows (a loop, member by member)
        if heads.merged and kwargs:
            raise _Declined  # tensors per head beside every group's heads on one axis
    except _Declined:
        return None
    varied = frozenset(n for n, g in call.hypers.items() if heads.var in _names(g))
    if varied and (merged or heads.merged):
        return None  # a value per head beside every group's heads on one axis
    try:
        kwargs += [(local_name(n), heads.per_head(n, g) if n in varied else
                    body.hyper_value(call, n, g)) for n, g in call.hypers.items()]
    except _Declined:
        return None
    try:
        fn = body.low.function(call.callee, merged, varied)
    except LowerError:
        if not merged:
            raise
        return None
    return fn, args, kwargs


# ------------------------------------------------------------------ groups of heads
def _group(body: Steps, target: str, call: CallInfo) -> frozenset[str]:
    """The inputs a map over groups can hand its card merged: every group's heads on one
    axis, `(…, H, T, d)` for H = groups × heads per group, as SDPA's grouped-query attention
    takes them, instead of `(…, groups, heads, T, d)` against keys `(…, groups, 1, T, d)`.

    The card must be a group of heads: steps on its inputs, then one map over its heads
    whose card has no tensors of its own, then `return Y = [Y^1, …, Y^G]`. An input the map
    reads as blocks of columns (through RoPE or a norm, say) and that nothing else reads is
    merged; the map's other arguments are shared by the group's heads and must reach only
    the SDPA of the head's card, which shares them among the heads of each group. The
    result then holds every head, and the caller's family must be read only joined."""
    if body.merged:
        return frozenset()
    checker = body.low.checker
    card = call.callee
    steps = card.steps
    if not steps or not isinstance(steps[-1].stmt, s.Return):
        return frozenset()
    loops = [x.stmt for x in steps[:-1] if isinstance(x.stmt, s.For)]
    if len(loops) != 1 or len(loops[0].body) != 1:
        return frozenset()
    loop = loops[0]
    inner = loop.body[0].stmt
    if not (isinstance(inner, s.Assign) and isinstance(inner.target, s.Name) and
            isinstance(inner.value, s.Call)) or not _joins(steps[-1].stmt.value, inner.target.id):
        return frozenset()
    head = checker.info(card).calls.get(id(inner.value))
    if head is None:
        return frozenset()
    head_sig = checker.info(head.callee).sig
    if any(n not in head_sig.hypers for n, _ in head_sig.params):
        return frozenset()  # tensors of its own, per head
    inputs = {n for n, _ in checker.info(card).sig.inputs}
    merged: set[str] = set()
    shared: list[str] = []
    for (slot, _), arg in zip(head_sig.inputs, inner.value.args, strict=False):
        if loop.var not in _names(arg):
            shared.append(slot)
            continue
        blocks = [n for n in s.nodes(arg) if isinstance(n, s.Index) and
                  isinstance(n.base, s.Name) and n.base.id in inputs]
        if len(blocks) != 1:
            return frozenset()
        merged.add(blocks[0].base.id)
    reads = [n.id for x in steps for n in s.nodes(x.stmt) if isinstance(n, s.Name)]
    within = [n.id for a in inner.value.args for n in s.nodes(a) if isinstance(n, s.Name)]
    if not merged or any(reads.count(m) != within.count(m) for m in merged):
        return frozenset()
    if not _only_joined(body.alg, target) or \
            not _sdpa_only(body, head.callee, {local_name(x) for x in shared}):
        return frozenset()
    return frozenset(merged)


def _joins(e: s.Expr, member: str) -> bool:
    """`[Y^1, Y^2, …, Y^G]`: the members of the family of `member` (Y^j), joined."""
    base = member.split("^")[0]
    return isinstance(e, s.Concat) and any(isinstance(x, s.Ellipsis_) for x in e.items) and \
        all(isinstance(x, s.Ellipsis_) or isinstance(x, s.Name) and
            x.id.split("^")[0] == base and "^" in x.id for x in e.items)


def _only_joined(alg: s.Algorithm, member: str) -> bool:
    """Every other mention of the family of `member` in `alg` is inside its join."""
    base = member.split("^")[0]
    joined: set[int] = set()
    mentions: list[s.Name] = []
    for step in alg.steps:
        for n in s.nodes(step.stmt):
            if isinstance(n, s.Concat) and _joins(n, member):
                joined |= {id(x) for x in n.items}
            elif isinstance(n, s.Name) and "^" in n.id and n.id.split("^")[0] == base:
                mentions.append(n)
    return all(id(n) in joined or n.id == member for n in mentions)


def _sdpa_only(body: Steps, card: s.Algorithm, names: set[str]) -> bool:
    """The arguments `names` of `card`'s function reach nothing but its SDPA call (keys and
    values), the KV cache, and reads of their sizes."""
    fn = body.low.function(card)
    found = next((f for f in body.low.program.functions if f.name == fn), None)
    if found is None:
        return False
    stray: list[str] = []

    def visit(e):
        if isinstance(e, ir.Call) and (e.func == ir.Ref("grouped_sdpa") or
                                       e.func == ir.Attr(ir.Ref("cache"), "extend")):
            return e  # allowed: do not descend
        if isinstance(e, ir.Attr) and e.name == "shape":
            return e
        if isinstance(e, ir.Ref) and e.id in names:
            stray.append(e.id)
        return None

    for st in found.body:
        ir.rewrite(st, visit)
    return not stray and "grouped_sdpa" in ir.ref_ids(found.body)


def _names(e) -> set[str]:
    return {n.id for n in s.nodes(e) if isinstance(n, s.Name)}


def _is_all(item) -> bool:
    return isinstance(item, s.Slice) and item.lo is None and item.hi is None
