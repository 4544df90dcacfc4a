"""Analyses of a model that the rest of cardc needs, made once while it is lowered and recorded
with its program (`ir.Analysis`): whether it decodes with a KV cache, and whether it is a causal
language model (no position's scores read a later token), which training, evaluation and
generic recipes ask of it.

Causality follows from how each attention masks, as the fusion rules find it:

- an attention whose mask rule hides later keys (`t′ > t`, or SDPA's `is_causal`) is causal;
- one masked by a hyperparameter of its card (`¬Mask[t, t′]`) is causal where every call of
  that card gives it a rule that hides later keys, or passes on such a hyperparameter of its own;
- any other attention (unmasked, cross-attention, `Mask ≡ 1`), and any softmax the fusion rules
  left literal, is not proven causal.

The literal pipeline (`fuse=False`) fuses no attention, but the attention cores of a card's
own steps are recorded all the same as they are lowered step by step
(cardc.lower.attention.record_literal), so the masks of the literal IR are known.

A model decodes with a KV cache only where the lowering proved it, attention by attention: each
records how it stands with the cache (`EXTENDS`, `CAUSAL_SDPA`, `CONTEXT`, or `RECOMPUTES`), and
cardc.lower.decoding adds the cache only where none recomputes. A recurrence over positions
(cardc.lower.recurrence) is recorded as an attention is: causal where each position reads
only itself and what came before, `CARRIES` where the cache holds its state. Which values depend on the
tokens decoded is found once from the cards (`decoded_names`): an attention whose keys and
values depend on none of them (an encoder's, a cross-attention's) reads no cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from weakref import WeakKeyDictionary

from .. import ir
from .. import syntax as s
from ..checker import split_name

Given = bool | tuple[int, str]  # a rule hides later keys, or a hyperparameter (card, name) passed on


# How one attention stands with a KV cache, as the lowering records it:
EXTENDS = "extends"  # its keys and values are extended by the cache's before it reads them
CAUSAL_SDPA = "causal SDPA"  # a causal SDPA call of a module's steps: the decoding pass extends it
CONTEXT = "context"  # its keys and values depend on no token decoded (an encoder's source)
CARRIES = "carries"  # a recurrence over positions whose state the cache carries (cardc.lower.recurrence)
RECOMPUTES = "recomputes"  # anything else: the model decodes by recomputing every position


@dataclass
class Masking:
    """How each attention of a model masks and stands with a KV cache, recorded as it is
    lowered."""

    attends: bool = False  # some attention was recognised
    unproven: bool = False  # some attention is not causal, or not proven so
    by_hyper: set[tuple[int, str]] = field(default_factory=set)  # (card, hyperparameter)
    given: dict[tuple[int, str], list[Given]] = field(default_factory=dict)
    caching: list[str] = field(default_factory=list)  # one entry per attention: EXTENDS, …
    softmaxes: int = 0  # attentions recorded that keep their own softmax (a soft-capped core)
    fixed_softmaxes: int = 0  # over an axis the model's sizes fix (a router's, over its
    # experts), never over positions: no attention
    decoded: dict[int, frozenset[str]] = field(default_factory=dict)  # see decoded_names
    positioned: Positioned = field(default_factory=lambda: Positioned())  # see positioned
    position_functions: set[str] = field(default_factory=set)  # the functions they call
    sides: dict[str, set[bool]] = field(default_factory=dict)  # function → called on decoded
    # values (True), on others alone (False: an encoder's), or both
    top: int = 0  # id() of the card the model is
    position_cards: set[int] = field(default_factory=set)  # cards that read rows of a table
    # by the decoded length (W_p[1 : T]): the decoding pass offsets the top's alone
    unknown_positions: bool = False  # a table read by a decoded length in another form

    def positions(self, card: s.Algorithm, known: bool) -> None:
        """`card` reads rows of a stored tensor bounded by a length of decoded tokens: in the
        form `[k + 1 : T + k]` the decoding pass offsets (`known`), or in another."""
        if id(card) != self.top and not self.decoded.get(id(card)):
            return  # a card given no decoded value (an encoder's): its own positions
        self.position_cards.add(id(card))
        self.unknown_positions |= not known

    def positions_offset(self) -> bool:
        """Whether every position a decoded table read is offset by the tokens cached: only
        the top's, each in the form the decoding pass knows."""
        return not self.unknown_positions and self.position_cards <= {self.top}

    def call(self, function: str, decoded: bool) -> None:
        """A call of `function`, given values that depend on the tokens decoded or not."""
        self.sides.setdefault(function, set()).add(decoded)

    def source_only(self, function: str) -> bool:
        """Whether every call of `function` is given values of no token decoded (an
        encoder's): its positions are the source's, which no cache moves."""
        return self.sides.get(function) == {False}

    def attention(self, causal: bool, card: s.Algorithm | None = None,
                  hypers: frozenset[str] = frozenset(), cache: str = RECOMPUTES) -> None:
        """An attention of `card`, causal by its own rules, or masked by `hypers` of `card`;
        `cache`: how it stands with a KV cache."""
        self.attends = True
        self.caching.append(cache)
        if causal:
            return
        if card is None or not hypers:
            self.unproven = True
        else:
            self.by_hyper |= {(id(card), h) for h in hypers}

    def give(self, callee: s.Algorithm, name: str, given: Given) -> None:
        """A call of `callee` gives its hyperparameter `name`."""
        self.given.setdefault((id(callee), name), []).append(given)

    def causal(self) -> bool:
        """Every recognised attention hides later keys (there is at least one)."""
        return self.attends and not self.unproven and \
            all(self._hides_later(key, set()) for key in self.by_hyper)

    def unrecognised(self, program: ir.Program, top: ir.Module) -> bool:
        """Whether the program computes a softmax that no recorded attention accounts for,
        besides the paper's P: an attention no rule recognised."""
        return literal_softmaxes(program) > \
            self.softmaxes + self.fixed_softmaxes + int(top.probabilities)

    def cacheable(self) -> bool:
        """Some attention (or recurrence) reads the KV cache, and every one extends it or
        needs none."""
        return any(c in (EXTENDS, CAUSAL_SDPA, CARRIES) for c in self.caching) and \
            all(c in (EXTENDS, CAUSAL_SDPA, CARRIES, CONTEXT) for c in self.caching)

    def reads_decoded(self, card: s.Algorithm, *exprs: s.Expr) -> bool:
        """Whether any of `exprs`, in `card`, reads a value that depends on the tokens decoded."""
        names = self.decoded.get(id(card), frozenset())
        return any(_reads(e, names) for e in exprs)

    def _hides_later(self, key: tuple[int, str], seen: set[tuple[int, str]]) -> bool:
        rules = self.given.get(key)
        if not rules or key in seen:
            return False
        seen.add(key)
        return all(r is True or (isinstance(r, tuple) and self._hides_later(r, seen))
                   for r in rules)


def hides_later(rule: s.Arg, key_first: bool) -> bool:
    """`Mask[t, t′] = [[t′ ≤ t]]` (keys after queries hidden), alone or in a conjunction: a
    window hides more. `key_first`: the mask's first axis is the keys' (the paper's layout)."""
    q, k = (getattr(i, "id", None) for i in rule.target.items)
    if key_first:
        q, k = k, q
    cond = rule.value.cond if isinstance(rule.value, s.Iverson) else rule.value
    return _visible_before(cond, q, k)


def _visible_before(cond: s.Expr, q: str | None, k: str | None) -> bool:
    if isinstance(cond, s.Iverson):
        cond = cond.cond
    if isinstance(cond, s.BinOp) and cond.op == "∧":
        return _visible_before(cond.left, q, k) or _visible_before(cond.right, q, k)
    if isinstance(cond, s.BinOp) and isinstance(cond.left, s.Name) and \
            isinstance(cond.right, s.Name):
        return (cond.left.id, cond.op, cond.right.id) in ((k, "≤", q), (q, "≥", k))
    return False


def decoded_names(checker: Any, top: s.Algorithm) -> dict[int, frozenset[str]]:
    """By card (its id): the base names of its values that depend on the tokens the language
    model `top` decodes (its last input), through its steps and the calls that pass such
    values on. A name is taken whole with its indices (`Y^h`: every `Y`), and a call's result
    depends on all of its arguments: what is left out depends on no decoded token."""
    tainted: dict[int, set[str]] = {}
    todo = [(top, {_base(checker.info(top).sig.inputs[-1][0])})]
    while todo:
        card, given = todo.pop()
        names = tainted.setdefault(id(card), set())
        names |= given
        grown = True
        while grown:
            before = len(names)
            names |= {_base(_target(n)) for n in s.nodes(card.steps)
                      if isinstance(n, s.Assign) and _target(n) and _reads(n.value, names)}
            grown = len(names) > before
        calls = checker.info(card).calls
        for node in s.nodes(card.steps):
            call = calls.get(id(node)) if isinstance(node, s.Call) else None
            if call is None:
                continue
            inputs = [_base(n) for n, _ in checker.info(call.callee).sig.inputs]
            hit = {name for name, arg in zip(inputs, node.args, strict=False)
                   if _reads(arg, names)}
            if hit - tainted.get(id(call.callee), set()):
                todo.append((call.callee, hit))
    return {k: frozenset(v) for k, v in tainted.items()}


@dataclass(frozen=True)
class Positioned:
    """Values of the decoded rows' positions alone, which a cache computes again at the rows it
    decodes (see `positioned`): the calls of the top card that make one (by node id), and by
    card (its id) the inputs that every call of the card gives one."""

    calls: frozenset[int] = frozenset()
    inputs: dict[int, frozenset[str]] = field(default_factory=dict)

    def given(self, card: s.Algorithm, name: str) -> bool:
        return name in self.inputs.get(id(card), frozenset())


def positioned(checker: Any, top: s.Algorithm, decoded: frozenset[str]) -> Positioned:
    """A step of the language model `top`, `β ← F(X | …)`, where F reads none of its inputs
    (only their sizes: a value of positions, T5's buckets) and returns a T×T matrix over the
    rows of X, which are the decoded tokens': a value of every pair of decoded positions.
    Under a cache it is made for the new rows against every position (cardc.lower.calls), as
    a position table is read at the new rows. An input of a card is such a value where every
    call of the card gives it one (the top's, or an input of the caller that is one)."""
    calls: set[int] = set()
    values: set[str] = set()
    assigned: dict[str, int] = {}
    for n in s.nodes(top.steps):
        if isinstance(n, s.Assign) and _target(n):
            assigned[_target(n)] = assigned.get(_target(n), 0) + 1
    info = checker.info(top)
    for n in s.nodes(top.steps):
        if not (isinstance(n, s.Assign) and isinstance(n.target, s.Name) and
                isinstance(n.value, s.Call)):
            continue
        call = info.calls.get(id(n.value))
        if call is not None and assigned[n.target.id] == 1 and n.value.args and \
                _reads(n.value.args[0], decoded) and _of_positions(checker, call.callee):
            calls.add(id(n.value))
            values.add(n.target.id)
    inputs: dict[int, set[str]] = {id(top): values}
    sites = _call_sites(checker, top)
    grown = True
    while grown:
        grown = False
        for key, (callee, found) in sites.items():
            names = [name for name, _ in checker.info(callee).sig.inputs]
            held = {name for k, name in enumerate(names)
                    if all(k < len(args) and isinstance(args[k], s.Name) and
                           args[k].id in inputs.get(caller, set()) for caller, args in found)}
            if held - inputs.get(key, set()):
                inputs[key] = inputs.get(key, set()) | held
                grown = True
    return Positioned(frozenset(calls), {k: frozenset(v) for k, v in inputs.items() if k != id(top)})


def _of_positions(checker: Any, card: s.Algorithm) -> bool:
    """A card with no parameters whose steps read none of its inputs, returning a matrix over
    its first input's rows by its rows (row-major)."""
    sig = checker.info(card).sig
    if any(name not in sig.hypers for name, _ in sig.params) or not sig.inputs or \
            sig.output is None or sig.layout == "column":
        return False
    inputs = {_base(name) for name, _ in sig.inputs}
    if any(_reads(st, inputs) for st in card.steps):
        return False
    rows = tuple(getattr(sig.inputs[0][1], "shape", ()))[:1]
    return len(rows) == 1 and tuple(getattr(sig.output, "shape", ())) == rows * 2


def _call_sites(checker: Any, top: s.Algorithm
                ) -> dict[int, tuple[s.Algorithm, list[tuple[int, tuple[s.Expr, ...]]]]]:
    """By card (its id) called from `top` on: the card, and each call of it (the caller's id
    and the call's inputs)."""
    sites: dict[int, tuple[s.Algorithm, list[tuple[int, tuple[s.Expr, ...]]]]] = {}
    todo, seen = [top], {id(top)}
    while todo:
        card = todo.pop()
        calls = checker.info(card).calls
        for node in s.nodes(card.steps):
            call = calls.get(id(node)) if isinstance(node, s.Call) else None
            if call is None:
                continue
            sites.setdefault(id(call.callee), (call.callee, []))[1].append(
                (id(card), tuple(node.args)))
            if id(call.callee) not in seen:
                seen.add(id(call.callee))
                todo.append(call.callee)
    return sites


def _base(name: str) -> str:
    return split_name(name)[0]


def _target(st: s.Assign) -> str | None:
    target = st.target.base if isinstance(st.target, s.Index) else st.target
    return target.id if isinstance(target, s.Name) else None


def _reads(e: s.Expr, names: frozenset[str] | set[str]) -> bool:
    return any(isinstance(n, s.Name) and _base(n.id) in names for n in s.nodes(e))


# A model's analysis, by the checker and pipeline it was lowered with: a training or inference
# card that runs the model asks for it (does it decode with a cache?) instead of lowering it again.
_RECORDED: WeakKeyDictionary[Any, dict[tuple[int, int], tuple[s.Algorithm, ir.Analysis]]] = \
    WeakKeyDictionary()


def record(checker: Any, alg: s.Algorithm, pipeline: Any, analysis: ir.Analysis) -> None:
    _RECORDED.setdefault(checker, {})[id(alg), id(pipeline)] = (alg, analysis)


def recorded(checker: Any, alg: s.Algorithm, pipeline: Any) -> ir.Analysis | None:
    kept = _RECORDED.get(checker, {}).get((id(alg), id(pipeline)))
    return kept[1] if kept is not None and kept[0] is alg else None


def analyse(program: ir.Program, top: ir.Module, masking: Masking) -> ir.Analysis:
    """The model's analysis, once its program is lowered and rewritten."""
    decodes = top.cached
    tokens_in = [a.name for a in top.inputs[1:2]] == ["targets"]  # forward(x, targets)
    causal = top.language_model and tokens_in and masking.causal() and \
        not masking.unrecognised(program, top)
    likelihood = any(a.name == "nll" for a in top.inputs)
    return ir.Analysis(decodes=decodes, causal=causal or decodes and top.generates,
                       likelihood=likelihood)


def literal_softmaxes(program: ir.Program) -> int:
    """How many softmaxes the program computes: a literal attention's, or the paper's P."""
    count = 0

    def visit(e):
        nonlocal count
        if isinstance(e, ir.Call) and e.func == ir.Ref("torch.softmax"):
            count += 1
        return None

    for unit in (*program.functions, *program.modules):
        for st in unit.body:
            ir.rewrite(st, visit)
    return count
