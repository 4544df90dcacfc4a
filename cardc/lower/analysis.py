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

The literal pipeline (`fuse=False`) recognises no attention, so it proves no model causal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from weakref import WeakKeyDictionary

from .. import ir
from .. import syntax as s

Given = bool | tuple[int, str]  # a rule hides later keys, or a hyperparameter (card, name) passed on


@dataclass
class Masking:
    """How the attention of a model masks, recorded as the fusion rules lower it."""

    attends: bool = False  # some attention was recognised
    unproven: bool = False  # some attention is not causal, or not proven so
    by_hyper: set[tuple[int, str]] = field(default_factory=set)  # (card, hyperparameter)
    given: dict[tuple[int, str], list[Given]] = field(default_factory=dict)

    def attention(self, causal: bool, card: s.Algorithm | None = None,
                  hypers: frozenset[str] = frozenset()) -> None:
        """An attention of `card`, causal by its own rules, or masked by `hypers` of `card`."""
        self.attends = True
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
        _softmaxes(program) <= int(top.probabilities)
    return ir.Analysis(decodes=decodes, causal=causal or decodes and top.generates)


def _softmaxes(program: ir.Program) -> int:
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
