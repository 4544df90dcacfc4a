"""`cardc diff A B`: how two cards' architectures differ, step by step.

Steps align by their shape: a step's canonical text with the names of the cards it calls
blanked out, so `X ← X + LayerNorm(X | …)` and `X ← X + RMSNorm(X | …)` align and read as the
swap LayerNorm → RMSNorm. Two aligned calls of different cards are diffed in turn, once per pair,
so a block's changes show under the step that calls the block.

The same alignment says which steps of each side changed (`changes`), for a rendering that boxes
them (cardc.docs.boxed), and which pairs of cards the two sides call instead of one another
(`swapped_cards`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import NamedTuple

from . import syntax as s
from .checker import Checker
from .render.text import render_algorithm
from .types import BundleTy

_STEP = re.compile(r"^[ \t]*(\d+)[ \t]+(.*)$")
_NOTE = re.compile(r"[ \t]*▷.*$")
_CALL = re.compile(r"([^\W\d][\w\u0302\u0303′]*)\(")

REWRITTEN = "rewritten"  # a step with no step of its shape on the other side
SWAPPED = "swapped"  # a step of the same shape that calls another card


class _Line(NamedTuple):
    number: str  # the step's number, as the card writes it
    text: str  # its canonical text without notes
    calls: list[str]  # the names of the cards it calls, in order


@dataclass(frozen=True)
class Changed:
    """One side of a diff: its steps that changed (number → REWRITTEN or SWAPPED), and the
    hyperparameters and parameters it declares that the other side does not."""

    steps: dict[str, str] = field(default_factory=dict)
    hypers: tuple[str, ...] = ()
    params: tuple[str, ...] = ()


def diff_cards(checker: Checker, a: s.Algorithm, b: s.Algorithm) -> list[str]:
    """Lines describing what changes from card `a` to card `b`."""
    body = _card_diff(checker, a, b, "  ", {(a.label, b.label)})
    return [f"{a.label} → {b.label}", *(body or ["  the same steps"])]


def changes(checker: Checker, a: s.Algorithm, b: s.Algorithm) -> tuple[Changed, Changed]:
    """What of `a` and what of `b` differ, as diff_cards aligns them: (a's side, b's side)."""
    old: dict[str, str] = {}
    new: dict[str, str] = {}
    for op, xs, ys in _align(checker, a, b):
        if op != "equal":
            old.update(dict.fromkeys((x.number for x in xs), REWRITTEN))
            new.update(dict.fromkeys((y.number for y in ys), REWRITTEN))
            continue
        for x, y in zip(xs, ys, strict=True):
            if x.text != y.text:  # the same shape: only the cards called differ
                old[x.number], new[y.number] = SWAPPED, SWAPPED
    ha, hb, pa, pb = _hypers(a), _hypers(b), _params(checker, a), _params(checker, b)
    return (Changed(old, _only(ha, hb), _only(pa, pb)), Changed(new, _only(hb, ha), _only(pb, pa)))


def swapped_cards(checker: Checker, a: s.Algorithm,
                  b: s.Algorithm) -> list[tuple[s.Algorithm, s.Algorithm]]:
    """The pairs of cards that aligned steps of `a` and `b` call instead of one another, and
    those their pairs call in turn, each pair once, in the order diff_cards diffs them."""
    out: list[tuple[s.Algorithm, s.Algorithm]] = []
    _collect(checker, a, b, {(a.label or "", b.label or "")}, out)
    return out


def _collect(checker: Checker, a: s.Algorithm, b: s.Algorithm, seen: set[tuple[str, str]],
             out: list[tuple[s.Algorithm, s.Algorithm]]) -> None:
    for x, y in _call_pairs(checker, a, b):
        if (x, y) in seen:
            continue
        seen.add((x, y))
        callee_a, callee_b = _callee(checker, a, x), _callee(checker, b, y)
        if callee_a is not None and callee_b is not None:
            out.append((callee_a, callee_b))
            _collect(checker, callee_a, callee_b, seen, out)


def _only(mine: list[str], theirs: list[str]) -> tuple[str, ...]:
    return tuple(n for n in mine if n not in theirs)


def _card_diff(checker: Checker, a: s.Algorithm, b: s.Algorithm, indent: str,
               seen: set[tuple[str, str]]) -> list[str]:
    out = _names(indent, "hyperparameters", _hypers(a), _hypers(b))
    out += _names(indent, "parameters", _params(checker, a), _params(checker, b))
    return out + _steps(checker, a, b, indent, seen)


def _names(indent: str, what: str, old: list[str], new: list[str]) -> list[str]:
    gone, added = _only(old, new), _only(new, old)
    if not gone and not added:
        return []
    parts = [f"− {', '.join(gone)}"] * bool(gone) + [f"+ {', '.join(added)}"] * bool(added)
    return [f"{indent}{what}: {'; '.join(parts)}"]


def _hypers(alg: s.Algorithm) -> list[str]:
    """Declared hyperparameters, in declaration order."""
    names: list[str] = []
    for item in alg.decls("Hyperparameters"):
        if isinstance(item, s.Decl):
            names += [n for n in item.names if n not in names]
    return names


def _params(checker: Checker, alg: s.Algorithm) -> list[str]:
    """Top-level parameters: the members of an anonymous bundle θ, else the header's names."""
    out: list[str] = []
    for name, entry in checker.info(alg).sig.params:
        anonymous = isinstance(entry, BundleTy) and entry.card is None and entry.members
        out += list(entry.members) if anonymous else [name]
    return out


def _lines(checker: Checker, alg: s.Algorithm) -> list[_Line]:
    """The numbered steps (and loop ends), as the canonical text writes them."""
    cards = {c.callee.label for c in checker.info(alg).calls.values()}
    cards |= {c.callee.name for c in checker.info(alg).calls.values() if c.callee.name}
    out = []
    for line in render_algorithm(alg).splitlines():
        m = _STEP.match(line)
        if m:
            text = _NOTE.sub("", m.group(2)).rstrip()
            out.append(_Line(m.group(1), text, [n for n in _CALL.findall(text) if n in cards]))
    return out


def _key(text: str, calls: list[str]) -> str:
    for name in calls:
        text = re.sub(rf"(?<![\w′]){re.escape(name)}\(", "∘(", text)
    return " ".join(text.split())


def _align(checker: Checker, a: s.Algorithm,
           b: s.Algorithm) -> list[tuple[str, list[_Line], list[_Line]]]:
    """The steps of `a` and `b` in aligned runs: (difflib's opcode, a's steps, b's steps)."""
    old, new = _lines(checker, a), _lines(checker, b)
    match = SequenceMatcher(None, [_key(x.text, x.calls) for x in old],
                            [_key(y.text, y.calls) for y in new], autojunk=False)
    return [(op, old[i1:i2], new[j1:j2]) for op, i1, i2, j1, j2 in match.get_opcodes()]


def _paired(op: str, xs: list[_Line], ys: list[_Line]) -> list[tuple[_Line, _Line]]:
    """The aligned steps whose calls may be swapped: those of the same shape and different
    text, and a rewritten run's steps one for one where both sides have as many."""
    if op == "equal":
        return [(x, y) for x, y in zip(xs, ys, strict=True) if x.text != y.text]
    return list(zip(xs, ys, strict=True)) if op == "replace" and len(xs) == len(ys) else []


def _call_pairs(checker: Checker, a: s.Algorithm, b: s.Algorithm) -> list[tuple[str, str]]:
    return [(x, y) for op, xs, ys in _align(checker, a, b) for old, new in _paired(op, xs, ys)
            for x, y in zip(old.calls, new.calls, strict=False) if x != y]


def _steps(checker: Checker, a: s.Algorithm, b: s.Algorithm, indent: str,
           seen: set[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    for op, xs, ys in _align(checker, a, b):
        for x, y in _paired(op, xs, ys):  # rewritten steps: their swapped calls first
            out += _swapped(checker, a, b, x, y, indent, seen)
        if op == "equal":
            continue
        out += [f"{indent}− {x.number} {' '.join(x.text.split())}" for x in xs]
        out += [f"{indent}+ {y.number} {' '.join(y.text.split())}" for y in ys]
    return out


def step_keys(checker: Checker, alg: s.Algorithm) -> list[str]:
    """The steps as the diff aligns them: canonical text, the cards they call blanked out."""
    return [_key(x.text, x.calls) for x in _lines(checker, alg)]


def likeness(a: list[str], b: list[str]) -> float:
    """How alike two cards' step keys are, 0 to 1: GPT-2 and Llama are alike, a norm and a
    training loop are not."""
    return SequenceMatcher(None, a, b, autojunk=False).ratio()


def _swapped(checker: Checker, a: s.Algorithm, b: s.Algorithm, old: _Line, new: _Line,
             indent: str, seen: set[tuple[str, str]]) -> list[str]:
    """One aligned step whose calls differ: each swap, then the two callees' own diff."""
    where = f"step {old.number}" if old.number == new.number else \
        f"step {old.number} → {new.number}"
    out = []
    for x, y in zip(old.calls, new.calls, strict=False):
        if x == y:
            continue
        out.append(f"{indent}{where}: {x} → {y}")
        if (x, y) in seen:
            continue
        seen.add((x, y))
        callee_a, callee_b = _callee(checker, a, x), _callee(checker, b, y)
        if callee_a is not None and callee_b is not None:
            out += _card_diff(checker, callee_a, callee_b, indent + "    ", seen)
    return out


def _callee(checker: Checker, alg: s.Algorithm, name: str) -> s.Algorithm | None:
    return next((c.callee for c in checker.info(alg).calls.values()
                 if name in (c.callee.name, c.callee.label)), None)
