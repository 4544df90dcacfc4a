"""KV-cache decoding: a pass that lets a causal decoder's forward read only the new tokens.

Every attention lowered to causal SDPA keeps its keys and values in a `KVCache`, stored as the
card's attention holds them: after RoPE, one per key/value head (SDPA shares each among its
group of query heads). The modules above pass the cache down, and the language model offsets
its positions by the tokens decoded before. RoPE's angles of the new positions are the same in
every layer, so with a cache the first layer computes them and the others share them. A
function of the decoded rows' positions alone that the top calls (T5's buckets) is made over
the cached positions too (`past=`), and the top reads its new rows; functions only an encoder
calls keep their positions. An encoder–decoder encodes its source once per cache, and each
decoder module's steps that read the source alone (cross-attention's keys and values) are made
once per source and kept; its `generate` takes the source first. Without
a cache the code is what it was, so every equivalence of the fused lowering still holds; with
one, the logits of the new tokens equal full recomputation (tests/test_decoding.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .. import ir
from .analysis import CARRIES, CAUSAL_SDPA, EXTENDS, Masking
from .joining import join_projections

SDPA = ir.Ref("F.scaled_dot_product_attention")
ROTATE = (ir.Ref("rotate_half"), ir.Ref("rotate_pairs"))  # RoPE (cardc.lower.intrinsics): take the positions' start
CACHE = ir.Ref("cache")
PAST = ir.Ref("past")
NO_CACHE = ir.Bin("is", CACHE, ir.Lit("None"))
HAS_CACHE = ir.Bin("is not", CACHE, ir.Lit("None"))


def decodes(program: ir.Program, top: ir.Module, masking: Masking) -> bool:
    """Whether `top` is a language model whose every attention is proven to extend and read a
    KV cache, or to need none (cardc.lower.analysis): each causal SDPA call the lowering
    recorded stands among a module's steps, where this pass extends it, and no softmax is
    left literal (an attention no rule recognised, which would read the new tokens only)."""
    sdpa = _causal_sdpa(program)
    return top.language_model and masking.cacheable() and masking.positions_offset() and \
        sdpa == masking.caching.count(CAUSAL_SDPA) == _causal_sdpa(program, nested=False) and \
        not masking.unrecognised(program, top)


def join_for_cache(program: ir.Program, top: ir.Module, masking: Masking) -> None:
    """Before the cache is added: sibling projections joined (cardc.lower.joining), since
    their modules take the cache, which holds the joined weights."""
    if decodes(program, top, masking):
        join_projections(program)


def add_kv_cache(program: ir.Program, top: ir.Module, masking: Masking) -> None:
    """Give `top`, a language model, incremental decoding where every attention is proven to
    extend and read the cache; the forward takes the cache only where each one does."""
    if not decodes(program, top, masking):
        for unit in (*program.functions, *program.modules):
            unit.body = _without_cache(unit.body)
        return
    expected = sum(masking.caching.count(c) for c in (EXTENDS, CAUSAL_SDPA, CARRIES))
    functions: set[str] = set()  # functions that take the cache
    for f in program.functions:  # callees first
        if f.name in masking.position_functions:
            _over_past(f)
        elif not masking.source_only(f.name) and _cache_function(f, functions):
            functions.add(f.name)
    cached: set[str] = set()  # classes whose forward takes the cache
    for m in program.modules:  # callees first
        attends = _cache_attention(m)
        if attends:
            m.body = _offset_positions(m, m.body)
        calls = _pass_cache(m, cached, functions)
        if attends or calls or _reads_cache(m.body):
            m.body = _with_past(_rotate_after_past(m.body))
            m.inputs.append(ir.Arg("cache", ir.Lit("None")))
            cached.add(m.name)
    if top.name in cached and _extensions(program) == expected:
        _count_positions(top)
        top.source = _encode_once(top)
        if top.source is not None:
            _context_once(program, top)
        top.cached = True
        # tokens alone in, as runtime.sample.is_language_model reads it: no encoder's input
        top.generates = [a.name for a in top.inputs[1:2]] == ["targets"]


def _without_cache(body: list[ir.Stmt]) -> list[ir.Stmt]:
    """Steps lowered to read a cache (cardc.lower.attention), as they read without one."""
    out: list[ir.Stmt] = []
    for st in body:
        st = ir.rewrite(st, _no_cache)
        if isinstance(st, ir.If) and st.cond in (TRUE, FALSE):
            out += _without_cache(list(st.body if st.cond == TRUE else st.orelse))
        elif isinstance(st, ir.If | ir.Loop | ir.While):
            inner = {"body": tuple(_without_cache(list(st.body)))}
            if isinstance(st, ir.If):
                inner["orelse"] = tuple(_without_cache(list(st.orelse)))
            out.append(dataclasses.replace(st, **inner))
        else:
            out.append(st)
    return out


TRUE, FALSE = ir.Lit("True"), ir.Lit("False")


def _no_cache(e):
    """`cache is None` is true; `cache is not None` (alone or first of an `and`) is false."""
    if e == NO_CACHE:
        return TRUE
    if e == HAS_CACHE or isinstance(e, ir.Bin) and e.op == "and" and e.left == HAS_CACHE:
        return FALSE
    if isinstance(e, ir.Call) and e.func == ir.Ref("first_query"):  # keys over the queries'
        q, k = (ir.Sub(ir.Attr(x, "shape"), (ir.Lit("-2"),)) for x in e.args[1:])
        return ir.Bin("-", k, q)
    if isinstance(e, ir.Cond):
        test = ir.rewrite(e.test, _no_cache)
        if test in (TRUE, FALSE):
            return ir.rewrite(e.body if test == TRUE else e.orelse, _no_cache)
    return None


def _causal_sdpa(program: ir.Program, nested: bool = True) -> int:
    """The causal SDPA calls of the program (`nested=False`: those that are whole statements
    of a module's steps, which _cache_attention extends)."""
    if not nested:
        return sum(1 for m in program.modules for st in m.body
                   if isinstance(st, ir.Assign) and _is_causal_sdpa(st.value))
    return _count(program, _is_causal_sdpa)


def _is_causal_sdpa(e) -> bool:
    return isinstance(e, ir.Call) and e.func == SDPA and ("is_causal", ir.Lit("True")) in e.kwargs


def _extensions(program: ir.Program) -> int:
    """The calls that extend the cache: one per attention that reads it, one per recurrence
    that resumes its state from it."""
    return _count(program, lambda e: isinstance(e, ir.Call) and
                  e.func in (ir.Attr(CACHE, "extend"), ir.Attr(CACHE, "resume")))


def _count(program: ir.Program, found: Callable[[object], bool]) -> int:
    count = 0

    def visit(e):
        nonlocal count
        count += found(e)

    for unit in (*program.functions, *program.modules):
        for st in unit.body:
            ir.rewrite(st, visit)
    return count


# ------------------------------------------------------------------ functions
def _cache_function(f: ir.Function, cached: set[str]) -> bool:
    """A function whose attention extends the cache (cardc.lower.attention), whose positions
    (`torch.arange(1, T + 1)` over the rows of an argument) start after the cached ones, or
    that calls such a function, takes the cache and passes it on."""
    rows = {st.targets[0] for st in f.body if isinstance(st, ir.Assign) and
            len(st.targets) == 1 and _rows_of_argument(st.value, f.args)}

    def shift(e):
        if _unplaced_rotation(e):
            return _placed(e, shift)
        if isinstance(e, ir.Call) and e.func == ir.Ref("torch.arange") and len(e.args) == 2 and \
                e.args[0] == ir.Lit("1") and isinstance(e.args[1], ir.Bin) and \
                e.args[1].op == "+" and e.args[1].right == ir.Lit("1") and \
                isinstance(e.args[1].left, ir.Ref) and e.args[1].left.id in rows:
            return dataclasses.replace(e, args=(ir.Bin("+", PAST, ir.Lit("1")),
                                                ir.Bin("+", PAST, e.args[1])))
        return _with_cache(e, cached, shift)

    body = [ir.rewrite(st, shift) for st in f.body]
    if "past" in ir.ref_ids(body):
        at = next((i for i, st in enumerate(body) if not (isinstance(st, ir.Assign) and
                                                         st.targets[0] in rows)), 0)
        body.insert(at, _past())
    f.body = body
    if not _reads_cache(body):
        return False
    f.args.append(ir.Arg("cache", ir.Lit("None")))
    return True


def _over_past(f: ir.Function) -> None:
    """A function of its first input's positions alone (cardc.lower.analysis.positioned) made
    over `past` positions before that input's rows as well: its row count grows by them."""
    f.args.append(ir.Arg("past", ir.Lit("0")))
    first = f.args[:1]
    f.body = [dataclasses.replace(st, value=ir.Bin("+", PAST, st.value))
              if isinstance(st, ir.Assign) and _rows_of_argument(st.value, first) else st
              for st in f.body]


def _unplaced_rotation(e) -> bool:
    """RoPE's call (rotate_half, rotate_pairs) that does not yet say where its rows start."""
    return isinstance(e, ir.Call) and e.func in ROTATE and all(k != "past" for k, _ in e.kwargs)


def _placed(e: ir.Call, inner: Callable) -> ir.Call:
    """RoPE's call turning its rows from position `past`, its arguments rewritten by `inner`."""
    args = tuple(ir.rewrite(a, inner) for a in e.args)
    return dataclasses.replace(e, args=args, kwargs=(*e.kwargs, ("past", PAST)))


def _rows_of_argument(e: ir.Expr, args: list[ir.Arg]) -> bool:
    """`X.shape[-2]` of an argument X: its rows, positions in a row-major card."""
    return isinstance(e, ir.Sub) and e.items == (ir.Lit("-2"),) and \
        isinstance(e.obj, ir.Attr) and e.obj.name == "shape" and \
        isinstance(e.obj.obj, ir.Ref) and e.obj.obj.id in {a.name for a in args}


def _with_cache(e, functions: set[str], inner: Callable | None = None):
    """A call of a function that takes the cache, given it; its arguments rewritten by
    `inner` (this rewrite itself by default)."""
    if isinstance(e, ir.Call) and isinstance(e.func, ir.Ref) and e.func.id in functions and \
            all(k != "cache" for k, _ in e.kwargs):
        again = inner or (lambda x: _with_cache(x, functions))
        args = tuple(ir.rewrite(a, again) for a in e.args)
        kwargs = tuple((k, ir.rewrite(v, again)) for k, v in e.kwargs)
        return dataclasses.replace(e, args=args, kwargs=(*kwargs, ("cache", CACHE)))
    return None


def _reads_cache(body) -> bool:
    return "cache" in ir.ref_ids(body)


# ------------------------------------------------------------------ attention
def _cache_attention(m: ir.Module) -> bool:
    """Before causal SDPA: prepend the cached keys and values; mask with the offset."""
    body = list(m.body)
    found = False
    for j, st in reversed(list(enumerate(body))):
        sdpa = st.value if isinstance(st, ir.Assign) else None
        if not (isinstance(sdpa, ir.Call) and sdpa.func == SDPA and
                ("is_causal", ir.Lit("True")) in sdpa.kwargs):
            continue
        q, k, v = sdpa.args[:3]
        kwargs = tuple(kw for kw in sdpa.kwargs if kw[0] != "is_causal")
        mask = ir.Cond(NO_CACHE, ir.Lit("None"), ir.Call(ir.Attr(CACHE, "mask"), (q, k)))
        body[j] = dataclasses.replace(st, value=dataclasses.replace(
            sdpa, kwargs=(*kwargs, ("attn_mask", mask), ("is_causal", NO_CACHE))))
        extend = ir.Assign((k.id, v.id), ir.Call(ir.Attr(CACHE, "extend"), (ir.Ref("self"), k, v)),
                           ir.Note(text="the cached positions come first"))
        body.insert(j, ir.If(HAS_CACHE, (extend,)))
        found = True
    m.body = body
    return found


def _offset_positions(m: ir.Module, body: list[ir.Stmt]) -> list[ir.Stmt]:
    """`torch.arange(X.shape[-2])`, the positions of the input's rows (RoPE's angles), start
    after the tokens decoded before."""
    rows = ir.Sub(ir.Attr(ir.Ref(m.inputs[0].name), "shape"), (ir.Lit("-2"),))

    def shift(e):
        if isinstance(e, ir.If) and e.cond == NO_CACHE:
            return e  # positions from 0: past is 0 there
        if isinstance(e, ir.Call) and e.func == ir.Ref("torch.arange") and e.args == (rows,):
            return dataclasses.replace(e, args=(PAST, ir.Bin("+", PAST, rows)))
        return None

    return [ir.rewrite(st, shift) for st in body]


def _rotate_after_past(body: list[ir.Stmt]) -> list[ir.Stmt]:
    """RoPE in a module's own steps (keys turned before the heads are mapped) turns the new
    rows from the tokens decoded before, as in the functions it calls."""
    def shift(e):
        return _placed(e, shift) if _unplaced_rotation(e) else None

    return [ir.rewrite(st, shift) for st in body]


def _with_past(body: list[ir.Stmt]) -> list[ir.Stmt]:
    """A module's steps that read `past`, after the step that defines it."""
    return [_past(), *body] if "past" in ir.ref_ids(body) else body


def _past() -> ir.Assign:
    return ir.Assign(("past",), ir.Cond(NO_CACHE, ir.Lit("0"), ir.Attr(CACHE, "pos")),
                     ir.Note(text="tokens decoded before these"))


def _assigns(st: ir.Stmt, target: str, value: ir.Expr | None = None) -> bool:
    return isinstance(st, ir.Assign) and st.targets == (target,) and value in (None, st.value)


def _method(obj: str, name: str) -> ir.Call:
    return ir.Call(ir.Attr(ir.Ref(obj), name))


def _refs(node) -> set[str]:
    """The attributes of the module (`self.d`) that `node` reads."""
    found: set[str] = set()
    ir.rewrite(node, lambda e: found.add(e.id) if isinstance(e, ir.Ref) and
             e.id.startswith("self.") else None)
    return found


# ------------------------------------------------------------------ modules above
def _pass_cache(m: ir.Module, cached: set[str], functions: set[str],
                only_new: bool = False) -> bool:
    """`self.attn(X)` → `self.attn(X, cache=cache)` for submodules that take the cache, and
    alike for functions."""
    attrs = {f"self.{sub.name}" for sub in m.submodules if sub.cls in cached}
    if functions:
        before = m.body
        m.body = [ir.rewrite(st, lambda e: _with_cache(e, functions)) for st in m.body]
        if not attrs:
            return m.body != before
    if not attrs:
        return False
    loops: set[str] = set()  # `for block in self.block`: `block` is one of them

    def visit(st: ir.Stmt) -> None:
        if isinstance(st, ir.Loop) and isinstance(st.iter, ir.Ref) and st.iter.id in attrs:
            loops.add(st.target)

    def submodule(f: ir.Expr) -> bool:  # self.attn, a loop's block, or self.block[l]
        if isinstance(f, ir.Sub):
            f = f.obj
        return isinstance(f, ir.Ref) and (f.id in attrs or f.id in loops)

    def add(e):
        if isinstance(e, ir.Call) and submodule(e.func) and \
                not (only_new and any(k == "cache" for k, _ in e.kwargs)):
            args = tuple(ir.rewrite(a, add) for a in e.args)
            return dataclasses.replace(e, args=args, kwargs=(*e.kwargs, ("cache", CACHE)))
        return None

    before = m.body
    _walk(m.body, visit)
    m.body = [ir.rewrite(st, add) for st in m.body]
    return m.body != before


# ------------------------------------------------------------------ the language model
def _count_positions(top: ir.Module) -> None:
    """The decoded sequence's positions start at `past`; the cache counts the new tokens in."""
    x = _decoded_input(top)
    tokens = ir.Sub(ir.Attr(ir.Ref(x), "shape"), (ir.Lit("-1"),))
    length = next((st.targets[0] for st in top.body if isinstance(st, ir.Assign) and
                   st.value == tokens), None)
    t = ir.Ref(length) if length is not None else tokens
    shifted = ir.Bin("+", PAST, t)

    def shift(e):
        if isinstance(e, ir.Sub) and len(e.items) == 1 and _positions(e.items[0], t):
            lo = e.items[0].lo  # the slice is [lo : t + lo]: t rows from past + lo
            start = PAST if lo is None else ir.Bin("+", PAST, lo)
            return ir.Call(ir.Ref("rows_at"), (e.obj, start, t))
        if isinstance(e, ir.Bin) and e.op == ">" and e.left == t and \
                e.right == ir.Ref("self.max_seq_len"):  # a static cache's bound: its length
            return ir.Call(ir.Ref("beyond"), (shifted, e.right))
        if isinstance(e, ir.Lit) and e.text.startswith('f"sequence length {'):
            return ir.Lit(e.text.replace(f"{{{length}}}", f"{{past + {length}}}"))
        return None

    body = [ir.rewrite(st, shift) for st in top.body]
    if body != top.body:  # positions read: after their count, the tokens decoded before
        at = next(i for i, st in enumerate(body) if isinstance(st, ir.Assign) and
                  st.targets == (length,)) + 1
        body.insert(at, _past())
    done = next(i for i, st in enumerate(body) if isinstance(st, ir.If) and
                st.cond == ir.Bin("is", ir.Ref("targets"), ir.Lit("None")))
    count = ir.Assign((), ir.Call(ir.Attr(CACHE, "advance"), (t,)))
    body.insert(done, ir.If(HAS_CACHE, (count,)))
    top.body = body


def _decoded_input(top: ir.Module) -> str:
    """The input the model decodes: its last but the targets, the likelihood's rows and
    targets (cardc.lower.likelihood) and the cache."""
    return [a.name for a in top.inputs if a.name not in NOT_TOKENS][-1]


NOT_TOKENS = ("targets", "nll", "cache")  # a language model's inputs that are not its tokens


def _encode_once(top: ir.Module) -> str | None:
    """An encoder–decoder's steps that read no decoded token (the source's embedding and its
    encoder), run once per cache: with a cache that holds this source's encoding, the values
    the decoder reads are taken from it; otherwise computed and kept. Comments stay in place;
    a cache that decoded tokens after another source refuses this one (KVCache.holds)."""
    decoded = _decoded_input(top)
    sources = [a.name for a in top.inputs if a.name not in (decoded, *NOT_TOKENS)]
    if len(sources) != 1:
        return None
    tainted = {decoded, "targets", "cache", "past"}
    moved: list[ir.Stmt] = []
    made: set[str] = set()
    for st in top.body:
        if isinstance(st, ir.Comment):
            continue
        if ir.ref_ids([st]) & tainted or isinstance(st, ir.Return):
            tainted |= ir.assigned(st)
        else:
            moved.append(st)
            made |= ir.assigned(st)
    read = ir.ref_ids([st for st in top.body if not any(st is m for m in moved)]) & made
    if not moved or not read:
        return None
    kept = sorted(read)
    source = ir.Ref(sources[0])
    holds = ir.Bin("and", HAS_CACHE, ir.Call(ir.Attr(CACHE, "holds"), (source,)))
    taken = tuple(ir.Assign((name,), ir.Sub(ir.Attr(CACHE, "encoding"), (ir.Lit(str(k)),)),
                            ir.Note(text="the source, encoded once per cache"))
                  for k, name in enumerate(kept))
    keep = ir.If(HAS_CACHE, (ir.Assign((), ir.Call(ir.Attr(CACHE, "keep"), (
        source, *(ir.Ref(n) for n in kept)))),))
    block = ir.If(holds, taken, (*moved, keep))
    at = next(i for i, st in enumerate(top.body) if st is moved[0])
    top.body = [*top.body[:at], block,
                *(st for st in top.body[at:] if not any(st is m for m in moved))]
    return sources[0]


def _context_once(program: ir.Program, top: ir.Module) -> None:
    """Each module's steps that read only values of no decoded token (a cross-attention's keys
    and values of the encoder's output), run once per source the cache encodes: the values
    later steps read are kept in the cache, in the order the forward makes them. A module's
    input is such a value where every call gives one (the encoder's output, handed down)."""
    given: dict[str, list[set[int]]] = {}  # class → the inputs each call gives such a value
    callers: dict[str, list[ir.Module]] = {}
    keeping: set[str] = set()
    for m in reversed(program.modules):  # callers first
        inputs = [a.name for a in m.inputs if a.name != "cache"]
        if m is top:
            free = set(inputs) - {_decoded_input(top), "targets"}
        elif m.name in given:
            free = {inputs[k] for k in set.intersection(*given[m.name]) if k < len(inputs)}
        else:
            continue
        # the top's steps that read the cache besides the source encode it once (above)
        tainted = _tainted(m.body, {*inputs, "past", *(() if m is top else ("cache",))} - free)
        _record_calls(m, tainted, given, callers)
        if m is not top and all(_takes_cache(c) for c in callers[m.name]) and \
                _keep_context(m, tainted):
            keeping.add(m.name)
    for m in program.modules:  # the modules that now keep values are given the cache
        _pass_cache(m, keeping, set(), only_new=True)


def _takes_cache(m: ir.Module) -> bool:
    return any(a.name == "cache" for a in m.inputs)


def _tainted(body: list[ir.Stmt], names: set[str]) -> set[str]:
    """`names` and every name a step that reads one of them assigns."""
    names = set(names)
    for st in body:
        if ir.ref_ids([st]) & names:
            names |= ir.assigned(st)
    return names


def _record_calls(m: ir.Module, tainted: set[str], given: dict[str, list[set[int]]],
                  callers: dict[str, list[ir.Module]]) -> None:
    """For each call of a submodule in `m`, the positions of its arguments that read no
    tainted name."""
    classes = {f"self.{sub.name}": sub.cls for sub in m.submodules}
    loops: dict[str, str] = {}
    _walk(m.body, lambda st: loops.update({st.target: classes[st.iter.id]}) if isinstance(
        st, ir.Loop) and isinstance(st.iter, ir.Ref) and st.iter.id in classes else None)

    def visit(e):
        f = e.func.obj if isinstance(e, ir.Call) and isinstance(e.func, ir.Sub) else \
            getattr(e, "func", None)
        if isinstance(e, ir.Call) and isinstance(f, ir.Ref) and (f.id in classes or f.id in loops):
            cls = classes.get(f.id) or loops[f.id]
            given.setdefault(cls, []).append(
                {k for k, a in enumerate(e.args) if not ir.ref_ids([a]) & tainted})
            callers.setdefault(cls, []).append(m)
        return None

    for st in m.body:
        ir.rewrite(st, visit)


def _keep_context(m: ir.Module, tainted: set[str]) -> bool:
    """Wrap the module's assignments that read no tainted name and whose values later steps
    read: with a cache, made once per source and kept (KVCache.kept)."""
    steps = [st for st in m.body if isinstance(st, ir.Assign) and st.targets and
             not ir.ref_ids([st]) & tainted]
    rest = [st for st in m.body if not any(st is s for s in steps)]
    made = {n for st in steps for n in st.targets}
    kept = sorted(ir.ref_ids(rest) & made)
    if not kept or not any(ir.ref_ids([st]) & tainted for st in rest):
        return False
    found = ir.Ref("kept")
    take = ir.Assign(("kept",), ir.Cond(NO_CACHE, ir.Lit("None"), ir.Call(ir.Attr(CACHE, "kept"))),
                     ir.Note(text="made once per source"))
    unpack = ir.Assign(tuple(kept), found) if len(kept) > 1 else \
        ir.Assign((kept[0],), ir.Sub(found, (ir.Lit("0"),)))
    keep = ir.If(HAS_CACHE, (ir.Assign((), ir.Call(ir.Attr(CACHE, "keep_context"),
                                                   tuple(ir.Ref(n) for n in kept))),))
    block = ir.If(ir.Bin("is not", found, ir.Lit("None")), (unpack,), (*steps, keep))
    at = next(i for i, st in enumerate(m.body) if st is steps[0])
    m.body = [*m.body[:at], take, block, *(st for st in m.body[at:]
                                            if not any(st is s for s in steps))]
    if not _takes_cache(m):
        m.inputs.append(ir.Arg("cache", ir.Lit("None")))
    return True


def _positions(item, t: ir.Ref) -> bool:
    """`[:T]` or `[k:T + k]` (k a number or the module's, `self.o`): the rows of a position
    table that T tokens read."""
    if not isinstance(item, ir.SliceX):
        return False
    if item.lo is None:
        return item.hi == t
    return not _reads_ref(item.lo, t) and item.hi == ir.Bin("+", t, item.lo)


def _reads_ref(e: ir.Expr, ref: ir.Ref) -> bool:
    found: list[bool] = []
    ir.rewrite(e, lambda x: found.append(True) if x == ref else None)
    return bool(found)


# ------------------------------------------------------------------ tree walking
def _walk(stmts, visit: Callable[[ir.Stmt], None]) -> None:
    for st in stmts:
        visit(st)
        for inner in (getattr(st, "body", ()), getattr(st, "orelse", ())):
            _walk(inner, visit)
