"""Recurrences over positions: a sequential loop `for t = 1, …, T do … end` of a module whose
steps read row t of values (`X[t, :]`), carry a state from one position to the next
(`h ← a ⊙ h + b`, h assigned before the loop) and write an output row by row (`Y[t, :] ← v`).

The literal lowering is a Python loop over the positions: each step as written, the rows of
each output collected and stacked after it. Where the state's update is linear in the state,
h_t = a_t ⊙ h_{t−1} + b_t with a and b free of h (a elementwise: a gate σ(X W_a), a parameter
vector, a number), the fusion rule `find`/`lower` computes every position at once instead: a
and b as maps over the positions, then every state by `linear_scan` (cardc/runtime/modelkit.py:
⌈log₂ T⌉ rounds of whole-tensor products and sums, no logarithms and no division, so a gate
may be 0 or negative and nothing overflows), then the steps after the update as maps over the
positions. Each state a loop carries gets its own scan (a sum and a normaliser decayed alike),
and a loop that carries none is a map; a step before an update may read the state before
it (h_{t−1}: `previous_states`). A loop whose state enters non-linearly, or whose state read
before its update feeds the update, keeps its Python loop, and the generated code says why on
its line.

Both lowerings record the recurrence with the model's analysis (cardc.lower.analysis): a loop
that reads every value at its own position t only, never t as a number, is causal, and where
the model decodes, the state the last position left is carried in the KV cache
(`cache.resume`, `cache.hold`): each new token costs one step of the recurrence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .. import ir
from .. import syntax as s
from ..dims import Dim
from ..spelling import display
from ..types import Ty
from .analysis import CARRIES, CONTEXT, RECOMPUTES
from .body import _call, _int, _is_all, _method
from .context import Steps
from .values import LowerError, Val, local_name

CACHE = ir.Ref("cache")
HAS_CACHE = ir.Bin("is not", CACHE, ir.Lit("None"))


@dataclass(frozen=True)
class Linear:
    """The step `h ← a ⊙ h + b` of a recurrence, its parts found."""

    step: s.Step
    state: str
    a: s.Expr
    b: s.Expr
    early: tuple[s.Step, ...] = ()  # steps before it that read the state before its update


# ------------------------------------------------------------------ what a loop is
def sequential(st: s.For) -> bool:
    """A `do` or indented loop over `1, …, T` whose steps index values by its variable: a
    recurrence over positions, lowered by this module."""
    over = st.over
    if st.style == "map" or not isinstance(over, s.Range) or not _from_one(over):
        return False
    return any(isinstance(n, s.Index) and any(st.var in _names(i) for i in n.items)
               for n in s.nodes(st.body))


def _from_one(r: s.Range) -> bool:
    first = [getattr(e, "text", None) for e in r.first]
    return first in (["1"], ["1", "2"])


def _names(node) -> set[str]:
    return {n.id for n in s.nodes(node) if isinstance(n, s.Name)}


def row_write(st: s.Stmt, var: str) -> str | None:
    """How a step writes one position of an output: "row" (`Y[t, :] ← v`), "column"
    (`Y[:, t] ← v`) or "entry" (`y[t] ← v`); None for any other step."""
    if not (isinstance(st, s.Assign) and isinstance(st.target, s.Index) and
            isinstance(st.target.base, s.Name)):
        return None
    items = tuple(getattr(i, "id", None) == var or (_is_all(i) and "all")
                  for i in st.target.items)
    return {(True,): "entry", ("all", True): "column", (True, "all"): "row"}.get(items)


def carried(st: s.For) -> list[str]:
    """The names the loop's steps read before a step of the same iteration assigns them:
    states carried from one position to the next."""
    out: list[str] = []
    assigned: set[str] = set()
    for step in st.body:
        stmt = step.stmt
        reads = _names(stmt.value) if isinstance(stmt, s.Assign) else _names(stmt)
        if isinstance(stmt, s.Assign) and isinstance(stmt.target, s.Name):
            name = stmt.target.id
            if name in reads and name not in assigned and name not in out:
                out.append(name)
            assigned.add(name)
    return out


def causal_reads(st: s.For) -> bool:
    """Every index that names the loop variable is the variable itself (`X[t, :]`, never
    `X[t + 1, :]`), so position t reads nothing after it."""
    return all(st.var not in _names(i) or getattr(i, "id", None) == st.var
               for n in s.nodes(st.body) if isinstance(n, s.Index) for i in n.items)


def numbered(st: s.For) -> bool:
    """Whether a step reads the loop variable as a number, not as an index (`t/T`)."""
    indices = {id(i) for n in s.nodes(st.body) if isinstance(n, s.Index) for i in n.items}
    return any(isinstance(n, s.Name) and n.id == st.var and id(n) not in indices
               for n in s.nodes(st.body))


def linear_steps(st: s.For, number: Callable[[s.Expr], bool]) -> tuple[Linear, ...] | str:
    """Each state the loop carries and its update `h ← a ⊙ h + b` (either order of the
    product and of the sum; `a · h` where `number(a)`, a number), whose a and b read no
    state before its update; else why not. Steps before the update may read the state
    before it (h_{t−1}) where nothing up to the update reads what they assign."""
    found = []
    for h in carried(st):
        updates = [k for k, step in enumerate(st.body) if isinstance(step.stmt, s.Assign) and
                   isinstance(step.stmt.target, s.Name) and step.stmt.target.id == h]
        if len(updates) != 1:
            return "a state is updated more than once"
        u = updates[0]
        early = tuple(step for step in st.body[:u] if h in _names(step.stmt))
        feeds = {_target(step.stmt) for step in early}
        if any(not isinstance(step.stmt, s.Assign) or _target(step.stmt) in carried(st)
               for step in early) or \
                any(feeds & _names(step.stmt.value) for step in st.body[:u + 1]
                    if isinstance(step.stmt, s.Assign)):
            return "a state read before its update feeds the update"
        parts = _affine(st.body[u].stmt.value, h, number)
        if parts is None:
            return "the state enters non-linearly"
        found.append(Linear(st.body[u], h, *parts, early))
    return tuple(found)


def _target(st: s.Stmt) -> str | None:
    """The name a step assigns, whole or part by part."""
    target = st.target.base if isinstance(st.target, s.Index) else st.target
    return target.id if isinstance(target, s.Name) else None


def _affine(e: s.Expr, h: str, number: Callable[[s.Expr], bool]
            ) -> tuple[s.Expr, s.Expr] | None:
    """(a, b) of `a ⊙ h + b`, `h ⊙ a + b`, `b + a ⊙ h` or `b + h ⊙ a`, a and b free of h;
    `·` for ⊙ where a is a number."""
    if not (isinstance(e, s.BinOp) and e.op == "+"):
        return None
    for prod, b in ((e.left, e.right), (e.right, e.left)):
        if h in _names(b) or not (isinstance(prod, s.BinOp) and prod.op in ("⊙", "·")):
            continue
        for x, a in ((prod.right, prod.left), (prod.left, prod.right)):
            if isinstance(x, s.Name) and x.id == h and h not in _names(a) and \
                    (prod.op == "⊙" or number(a)):
                return a, b
    return None


# ------------------------------------------------------------------ the scan (fused)
def find(patterns: tuple[str, ...], body: Steps, st: s.For, step: s.Step
         ) -> tuple[Linear, ...] | None:
    """A recurrence whose every state's update is linear in that state."""
    found = linear_steps(st, lambda e: body.ty(e).rank == 0)
    return found if isinstance(found, tuple) else None


def lower(body: Steps, st: s.For, step: s.Step, linear: tuple[Linear, ...]) -> bool:
    """Every position at once: the steps before an update as maps over the positions, every
    state by `linear_scan`, the steps after it as maps reading them. Declines (the Python
    loop) where a step cannot be lowered as a map over the positions."""
    size = body.size(st.over.last)
    values, out = dict(body.scope.values), len(body.out)
    outer = body.positions
    body.positions = (st.var, size)
    try:
        scanned = _scan_steps(body, st, {id(x.step): x for x in linear}, size)
    except LowerError:
        scanned = None
    finally:
        body.positions = outer
    if scanned is None:
        body.scope.values.clear()
        body.scope.values.update(values)
        del body.out[out:]
        return False
    for states, held in scanned:
        rank = len(states.ty.shape)
        _hold(body, held, ir.Sub(states.code, (ir.Ref("..."), _int(-1),
                                               *[ir.SliceX(None, None)] * rank)))
    _keep_last(body, st)
    return True


def _scan_steps(body: Steps, st: s.For, updates: dict[int, Linear], size: Dim
                ) -> list[tuple[Val, str | None]] | None:
    """The loop's steps as maps over its positions, each state's update a scan: every
    position's states, and the names the cache holds their last under. A step that reads a
    state before its update comes after the scan, reading every position's state before."""
    scanned = []
    later = {id(step) for linear in updates.values() for step in linear.early}
    for sub in st.body:
        linear = updates.get(id(sub))
        if linear is not None:
            found = _scan(body, st, sub, linear, size)
            if found is None:
                return None
            scanned.append(found)
            states, h0 = body.scope.values[linear.state], found[2]
            if linear.early:
                dim = _int(-len(states.ty.shape) - 1)
                before = replace(states, code=ir.Ref(body.fresh(f"{states.code.id}_before")))
                body.emit(ir.Assign((before.code.id,), _call("previous_states", states.code, h0,
                                                              dim), body.note(sub, before)))
                body.scope.values[linear.state] = before
            for early in linear.early:
                if not _map_step(body, st, early, size):
                    return None
            body.scope.values[linear.state] = states
        elif id(sub) not in later and not _map_step(body, st, sub, size):
            return None
    return [(states, held) for states, held, _ in scanned]


def _map_step(body: Steps, st: s.For, sub: s.Step, size: Dim) -> bool:
    """A step of the loop as a map over its positions; False where it is no assignment."""
    if row_write(sub.stmt, st.var) is not None:
        body.position_step(sub, st.var, size)
    elif isinstance(sub.stmt, s.Assign) and isinstance(sub.stmt.target, s.Name):
        val = body.expr(sub.stmt.value)
        local = local_name(sub.stmt.target.id)
        body.emit(ir.Assign((local,), val.code, body.note(sub, val)))
        body.scope.values[sub.stmt.target.id] = replace(val, code=ir.Ref(local))
    else:
        return False
    return True


def _scan(body: Steps, st: s.For, sub: s.Step, linear: Linear, size: Dim
          ) -> tuple[Val, str | None, ir.Expr] | None:
    """`h ← a ⊙ h + b` at every position: `linear_scan` from the state before the loop;
    with the name the cache holds the last state under, and that first state."""
    h = linear.state
    start = body.expr(s.Name(h, span=sub.span))
    a, b = body.expr(linear.a), body.expr(linear.b)
    if not (a.rows or b.rows) or a.flipped or b.flipped or start.flipped:
        return None
    ty = body.ty(sub.stmt.value)
    dim = _int(-len(ty.shape) - 1)
    h0, held = _resumed(body, st, sub, h, start)
    code = _call("linear_scan", _positioned(a, dim), _positioned(b, dim), h0, dim)
    states = Val(ir.Ref(body.fresh(f"{local_name(h)}_all")), ty, True, False, (size,))
    body.emit(ir.Assign((states.code.id,), code,
                        body.note(sub, states, "every position's state")))
    body.scope.values[h] = states
    return states, held, h0


def _positioned(v: Val, dim: ir.Expr) -> ir.Expr:
    """A gate or input of the scan with its positions axis: one that is the same at every
    position but carries batch axes gets an axis of one there (a parameter broadcasts)."""
    return _method(v.code, "unsqueeze", dim) if v.lifted and not v.rows else v.code


def _keep_last(body: Steps, st: s.For) -> None:
    """Values the loop's steps assign, its state among them, that a step after the loop
    reads: their last position's, as the loop leaves them."""
    skip = {id(n) for n in s.nodes(st.body)} | {
        id(n.target) for n in s.nodes(body.alg.steps) if isinstance(n, s.Assign)}
    later = {n.id for n in s.nodes(body.alg.steps) if isinstance(n, s.Name) and
             id(n) not in skip}
    for sub in st.body:
        target = sub.stmt.target if isinstance(sub.stmt, s.Assign) else None
        val = body.scope.values.get(target.id) if isinstance(target, s.Name) else None
        if isinstance(val, Val) and val.rows and target.id in later:
            rank = len(val.ty.shape)
            code = ir.Sub(val.code, (ir.Ref("..."), _int(-1), *[ir.SliceX(None, None)] * rank))
            body.emit(ir.Assign((local_name(target.id),), code, body.note(sub, None)))
            body.scope.values[target.id] = replace(val, code=ir.Ref(local_name(target.id)),
                                                   rows=())


# ------------------------------------------------------------------ the Python loop (literal)
class Recurrences:
    """Sequential loops over positions (part of `cardc.lower.steps.Body`)."""

    def recurrence(self, st: s.For, step: s.Step) -> None:
        """The loop as a scan where a fusion rule takes it, else as a Python loop."""
        written = {sub.stmt.target.base.id for sub in st.body
                   if row_write(sub.stmt, st.var) is not None}
        targets = {id(n.target.base) for n in s.nodes(st.body) if isinstance(n, s.Assign) and
                   isinstance(n.target, s.Index)}
        for n in s.nodes(st.body):
            if isinstance(n, s.Name) and n.id in written and id(n) not in targets:
                v = display(st.var)
                self.fail(n, f"code generation writes '{display(n.id)}' position by position "
                             f"and reads it only after the loop",
                          hint=f"carry what position {v} needs from the one before in a "
                               f"state: 'h ← …' before the loop and in it")
        for n in s.nodes(st.body):
            for item in n.items if isinstance(n, s.Index) else ():
                if st.var in _names(item) and getattr(item, "id", None) != st.var:
                    v = display(st.var)
                    self.fail(item, f"code generation reads position '{v}' itself in a loop "
                                    f"over positions, as 'X[{v}, :]'",
                              hint=f"at '{v} = 1' or at the last position another index may "
                                   f"fall outside the value; carry what '{v}' needs in a state")
        _record(self, st)
        if self.fuse_recurrence(st, step):
            return
        self.recurrence_loop(st, step)

    def recurrence_loop(self, st: s.For, step: s.Step) -> None:
        """`for t in range(T)`: the steps as written, position t read as `X[..., t, :]`; each
        output's rows appended to a list and stacked after the loop."""
        count = self.loop_count(st)
        var = self.loop_var(st.var)
        writes = {id(sub): self.fresh(f"{local_name(sub.stmt.target.base.id)}_rows")
                  for sub in st.body if row_write(sub.stmt, st.var) is not None}
        for sub in st.body:
            if id(sub) in writes:
                self.emit(ir.Assign((writes[id(sub)],), ir.Seq((), "list"), self.note(sub)))
        lifted = any(isinstance(v, Val) and v.lifted for n, v in self.scope.values.items()
                     if n in _names(st.body))
        uneven = lifted and any(isinstance(v, Val) and not v.lifted for h, v in
                                self.scope.values.items() if h in carried(st))
        held = {h: self.start_state(st, step, h, lifted) for h in carried(st)}
        child = self.child()
        child.loop_index[st.var] = ir.Ref(var)
        rows: dict[int, Val] = {}
        for sub in st.body:
            if id(sub) in writes:
                child.at_step = sub
                val = child.expr(sub.stmt.value)
                rows[id(sub)] = val
                child.emit(ir.Assign((), _method(ir.Ref(writes[id(sub)]), "append", val.code),
                                     child.note(sub, val)))
            else:
                child.step(sub)
        self.emit(ir.Loop(var, _call("range", count), tuple(child.out),
                          self.note(step, None, _why_a_loop(self, st) if self.low.fuse else None)))
        for h, key in held.items():
            _hold(self, key, ir.Ref(local_name(h)))
        for sub in st.body:
            if id(sub) in writes:
                self.stack_rows(sub, st.var, self.size(st.over.last), writes[id(sub)],
                                rows[id(sub)], uneven)

    def start_state(self, st: s.For, step: s.Step, h: str, lifted: bool) -> str | None:
        """The state before the first position, in a local of its own (the loop's steps
        replace it), resumed from the cache where the model decodes (the key it is held
        under there)."""
        start = self.scope.values.get(h)
        if not isinstance(start, Val):
            self.fail(st, f"'{display(h)}' is read before the loop assigns it",
                      hint=f"give it a value before the loop, e.g. '{display(h)} ← 0'")
        local = local_name(h)
        code, held = _resumed(self, st, step, h, start)
        if code != ir.Ref(local):
            self.emit(ir.Assign((local,), code, self.note(step, None, "the state")))
        update = next(sub.stmt.value for sub in st.body if isinstance(sub.stmt, s.Assign) and
                      isinstance(sub.stmt.target, s.Name) and sub.stmt.target.id == h)
        self.scope.values[h] = Val(ir.Ref(local), self.ty(update), lifted or start.lifted)
        return held

    def stack_rows(self, sub: s.Step, var: str, size: Dim, rows: str, val: Val,
                   uneven: bool) -> None:
        """The output a loop wrote position by position: its rows stacked, positions in
        front of the card's own axes (a column-major matrix's columns: stored flipped).
        `uneven`: a state starts without the batch axes it has later (a parameter), so the
        first rows may lack them too: `stack_broadcast`."""
        kind = row_write(sub.stmt, var)
        rank = len(val.ty.shape)
        code = _call("stack_broadcast" if uneven else "torch.stack", ir.Ref(rows),
                     dim=_int(-rank - 1))
        name = sub.stmt.target.base.id
        flipped = kind == "column"
        ty = Ty((*val.ty.shape, size), val.ty.elem) if flipped else \
            Ty((size, *val.ty.shape), val.ty.elem)
        whole = Val(ir.Ref(local_name(name)), ty, val.lifted, flipped)
        self.emit(ir.Assign((local_name(name),), code, self.note(sub, whole)))
        self.scope.values[name] = whole


def _why_a_loop(body: Steps, st: s.For) -> str:
    """What the fused lowering says of a recurrence it keeps as a loop."""
    found = linear_steps(st, lambda e: body.ty(e).rank == 0)
    why = found if isinstance(found, str) else "a step is not a map over the positions"
    return f"no scan, {why}: one position at a time"


# ------------------------------------------------------------------ the cache
def _cached(body: Steps, st: s.For) -> bool:
    """Whether the recurrence carries its state in the KV cache: the model decodes, the loop
    runs over the positions of the decoded tokens and reads each at its own position only,
    never t as a number."""
    return body.low.decoder and causal_reads(st) and not numbered(st) and \
        _over_positions(body, st) and body.low.masking.reads_decoded(body.alg, *_values(st))


def _over_positions(body: Steps, st: s.For) -> bool:
    """Whether the loop runs over token positions: every value its steps read at t is a
    sequence of tokens or a matrix with one row per position (a column per position in the
    paper's layout), as many as the loop has iterations. A loop over a vector's entries (a
    card on vectors, applied to each token alone) runs within one position."""
    size = body.size(st.over.last)
    targets = {id(n.target) for n in s.nodes(st.body) if isinstance(n, s.Assign)}
    axis = -1 if body.column else 0
    for n in s.nodes(st.body):
        if isinstance(n, s.Index) and id(n) not in targets:
            ty = body.ty(n.base)
            for k, item in enumerate(n.items):
                if getattr(item, "id", None) != st.var:
                    continue
                tokens = ty.rank == 1 and ty.vocab is not None
                if not (tokens or ty.rank == 2 and k == axis % 2) or ty.shape[k] != size:
                    return False
    return True


def _values(st: s.For) -> list[s.Expr]:
    return [sub.stmt.value for sub in st.body if isinstance(sub.stmt, s.Assign)]


def _record(body: Steps, st: s.For) -> None:
    """A recurrence over positions in the model's analysis, as an attention: causal where
    position t reads nothing after it; carrying its state in the cache where `_cached` says
    so. A loop within one position mixes none: nothing to record."""
    if not _over_positions(body, st):
        return
    masking = body.low.masking
    decoded = masking.reads_decoded(body.alg, *_values(st))
    how = CARRIES if _cached(body, st) else RECOMPUTES if decoded or not body.low.decoder \
        else CONTEXT
    masking.attention(causal_reads(st), cache=how)


def _resumed(body: Steps, st: s.For, step: s.Step, h: str, start: Val
             ) -> tuple[ir.Expr, str | None]:
    """The state before the loop's first position, and where the model decodes, the name
    of the key under which the cache keeps it: the state the cached tokens left
    (`cache.resume`), or `start` before any."""
    if not _cached(body, st):
        return start.code, None
    local = local_name(h)
    if start.code != ir.Ref(local):
        body.emit(ir.Assign((local,), start.code, body.note(step, None, "the state")))
    held = body.fresh(f"{local}_held")
    resume = ir.Assign((local, held), _method(CACHE, "resume", ir.Ref(local)),
                       ir.Note(text="the state the cached positions left"))
    body.emit(ir.If(HAS_CACHE, (resume,)))
    body.uses_cache = True
    return ir.Ref(local), held


def _hold(body: Steps, held: str | None, last: ir.Expr) -> None:
    """After the loop, with a cache: its last state, for the next tokens."""
    if held is not None:
        keep = ir.Assign((), _method(CACHE, "hold", ir.Ref(held), last))
        body.emit(ir.If(HAS_CACHE, (keep,)))
