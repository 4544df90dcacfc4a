"""`cardc diff A B`: how two cards' architectures differ, step by step.

Steps align by their shape: a step's canonical text with the names of the cards it calls
blanked out, so `X ← X + LayerNorm(X | …)` and `X ← X + RMSNorm(X | …)` align and read as the
swap LayerNorm → RMSNorm. Two aligned calls of different cards are diffed in turn, once per pair,
so a block's changes show under the step that calls the block.
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher

from . import syntax as s
from .checker import Checker
from .render.text import render_algorithm
from .types import BundleTy

_STEP = re.compile(r"^[ \t]*(\d+)[ \t]+(.*)$")
_NOTE = re.compile(r"[ \t]*▷.*$")
_CALL = re.compile(r"([^\W\d][\w\u0302\u0303′]*)\(")


def diff_cards(checker: Checker, a: s.Algorithm, b: s.Algorithm) -> list[str]:
    """Lines describing what changes from card `a` to card `b`."""
    body = _card_diff(checker, a, b, "  ", {(a.label, b.label)})
    return [f"{a.label} → {b.label}", *(body or ["  the same steps"])]


def _card_diff(checker: Checker, a: s.Algorithm, b: s.Algorithm, indent: str,
               seen: set[tuple[str, str]]) -> list[str]:
    out = _names(indent, "hyperparameters", _hypers(a), _hypers(b))
    out += _names(indent, "parameters", _params(checker, a), _params(checker, b))
    return out + _steps(checker, a, b, indent, seen)


def _names(indent: str, what: str, old: list[str], new: list[str]) -> list[str]:
    gone, added = [n for n in old if n not in new], [n for n in new if n not in old]
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


def _lines(checker: Checker, alg: s.Algorithm) -> list[tuple[str, str, list[str]]]:
    """(step number, canonical text without notes, names of the cards the step calls)."""
    cards = {c.callee.label for c in checker.info(alg).calls.values()}
    cards |= {c.callee.name for c in checker.info(alg).calls.values() if c.callee.name}
    out = []
    for line in render_algorithm(alg).splitlines():
        m = _STEP.match(line)
        if m:
            text = _NOTE.sub("", m.group(2)).rstrip()
            out.append((m.group(1), text, [n for n in _CALL.findall(text) if n in cards]))
    return out


def _key(text: str, calls: list[str]) -> str:
    for name in calls:
        text = re.sub(rf"(?<![\w′]){re.escape(name)}\(", "∘(", text)
    return " ".join(text.split())


def _steps(checker: Checker, a: s.Algorithm, b: s.Algorithm, indent: str,
           seen: set[tuple[str, str]]) -> list[str]:
    old, new = _lines(checker, a), _lines(checker, b)
    match = SequenceMatcher(None, [_key(t, c) for _, t, c in old], [_key(t, c) for _, t, c in new],
                            autojunk=False)
    out: list[str] = []
    for op, i1, i2, j1, j2 in match.get_opcodes():
        pairs = list(zip(old[i1:i2], new[j1:j2], strict=False))
        if op == "replace" and i2 - i1 == j2 - j1:  # rewritten steps: their swapped calls first
            for (na, _, ca), (nb, _, cb) in pairs:
                out += _swapped(checker, a, b, (na, ca), (nb, cb), indent, seen)
        if op == "equal":
            for (na, ta, ca), (nb, tb, cb) in pairs:
                if ta != tb:
                    out += _swapped(checker, a, b, (na, ca), (nb, cb), indent, seen)
            continue
        out += [f"{indent}− {n} {' '.join(t.split())}" for n, t, _ in old[i1:i2]]
        out += [f"{indent}+ {n} {' '.join(t.split())}" for n, t, _ in new[j1:j2]]
    return out


def step_keys(checker: Checker, alg: s.Algorithm) -> list[str]:
    """The steps as the diff aligns them: canonical text, the cards they call blanked out."""
    return [_key(t, c) for _, t, c in _lines(checker, alg)]


def likeness(a: list[str], b: list[str]) -> float:
    """How alike two cards' step keys are, 0 to 1: GPT-2 and Llama are alike, a norm and a
    training loop are not."""
    return SequenceMatcher(None, a, b, autojunk=False).ratio()


def _swapped(checker: Checker, a: s.Algorithm, b: s.Algorithm, old: tuple[str, list[str]],
             new: tuple[str, list[str]], indent: str, seen: set[tuple[str, str]]) -> list[str]:
    """One aligned step whose calls differ: each swap, then the two callees' own diff."""
    (na, ca), (nb, cb) = old, new
    where = f"step {na}" if na == nb else f"step {na} → {nb}"
    out = []
    for x, y in zip(ca, cb, strict=False):
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
