"""Math written in a card's prose, found and parsed so that a renderer typesets it as it
typesets the card's steps.

Prose — the `/* … */` comments, the words after a declaration, notes after ▷, `where` clauses —
mixes English with the card's notation: `P̂_θ(x[t+1] | x[1 : t])`, `Q K^⊺/√s`,
`θ_base^{−2(i − 1)/d}`. `pieces` cuts prose into text and formulas by one rule:

* the prose is read as tokens: words, numbers, scripts (`^⊺`, `^{…}` after a bracket), spaces
  and single characters;
* a token is *English* (prose) when it is a word of two letters or more that the card does
  not know as a name, a contraction or a possessive (`Meta's`, `θ's`), an abbreviation
  (`e.g.`), a word led by a digit (`2D`, `1st`; but `2i` is math), or one of the one-letter
  words `a`, `A`, `I` where the card knows no such name or where it begins a sentence; a
  function's name (a builtin, a card the card calls, a function it defines) right before its
  `(` heads a call, not English;
* a token *marks* math when it is a letter standing alone (`row t of X`: a variable, as the
  paper writes one, but for the words a, A, I), a name with a subscript or superscript (but
  not an identifier in snake case: `layer_norm`), a Greek letter, a letter with a hat, a tilde
  or a prime, a script, or a symbol of math (√ ⊺ ∈ ≤ × − + / = …); a name the card knows that
  is spelt as a word or in snake case (`ctx`, `types`, `eos_token`) is math only in a formula
  that something else marks, since English has such words;
* a formula is a span of tokens without an English one, holding a mark, that the card grammar's
  own expression rule (`sum`) parses, or its declaration rule (`x ∈ ℝ^{d}`), or that is a chain
  of such expressions joined by relations (`t − w < t′ ≤ t`, `G = H/H_kv`, `T × d/2`). At each
  token the longest such span is taken; a token where none starts stays prose.

So a formula never swallows an English word, and text that does not parse stays as written:
nothing is lost and nothing raises. A name the grammar reads whole with a braced superscript,
`θ_base^{−2(i − 1)/d}`, is the power of the name before its `^` where the card knows that name
and not the whole, as a step reads `(θ_base)^{…}`.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, replace
from functools import lru_cache

from .. import lalr
from .. import syntax as s
from ..builtins import BUILTINS, UPRIGHT
from ..parser.build import _Build

# symbols of math: prose writes a hyphen, an en dash, a full stop, not these (a `/` or a
# `+` of prose, `key/value`, has words beside it, which no formula holds)
_SYMBOLS = frozenset("√⊺∈∉≤≥≠×⊙·Σ∑‖⌊⌈⌋⌉²³∞←→ℝℕ∝∀¬∧∨∇≅−±∂⊂⊆∘≈⟦⟧+/=<>")
_RELATIONS = frozenset("=<>≤≥≠∈∉×→←≈∝≅⊂⊆")
_GREEK = re.compile(r"[α-ωΑ-Ωℓϵϑϕ𝒩]")
_ONE_LETTER_WORDS = frozenset("aAI")
_SENTENCE = re.compile(r"(?:^|[.!?:;]\s+)\s*$")  # what a sentence begins after
_OPEN, _CLOSE = "([{⟦", ")]}⟧"
# what a formula may begin and end with, besides a word, a number and a script
_STARTS = frozenset("([{√−‖⌊⌈|Σ∑∇∞¬⟦ℝℕ")
_ENDS = frozenset(")]}′²³⊺‖⌋⌉|∞⟧")
_GLUE = frozenset("#$%&@\\_^/")  # what a formula cannot follow or precede: `#1`, `$2`, `://x`
_MAX_TOKENS = 48  # a formula in prose is a few symbols: longer spans are not tried
_TRIES = 2000  # spans parsed for one prose at most: what is left after stays prose
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<english>[A-Za-z]+(?:['’][A-Za-z]+)+|(?<=[^\W_])['’][A-Za-z]+|(?:[A-Za-z]\.){2,}
               |\d+(?:\.\d+)?(?:[A-Za-z]{2,}|[A-Z])[^\W_]*)
  | (?P<word>[^\W\d_](?:[^\W_]|[\u0300-\u036f])*
        (?:[_^](?:\{[^{}\n]*\}|(?:[^\W_]|[\u0300-\u036f])+))*(?:′|'(?![A-Za-z]))*)
  | (?P<number>\d+(?:\.\d+)?)
  | (?P<script>[_^](?:\{[^{}\n]*\}|⊺|[^\W_]+))
  | (?P<other>.)
""", re.X | re.S)

SPACE, ENGLISH, NEUTRAL, MARK = range(4)


@dataclass(frozen=True)
class Vocabulary:
    """What a card's prose is read against: the names the card knows (declared, assigned,
    bound by a loop), the functions it may call by name, and those of them its steps define
    (`P(θ) ← …`)."""

    names: frozenset[str] = frozenset()
    functions: frozenset[str] = frozenset()
    defined: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Formula:
    """Math found in prose: expressions joined by relations (`parts` one longer than
    `relations`), or a declaration (`x ∈ ℝ^{d}`) or a type alone; `text` as the prose has it."""

    parts: tuple[object, ...]
    relations: tuple[str, ...] = ()
    text: str = ""


@dataclass(frozen=True)
class _Token:
    start: int
    end: int
    kind: int
    text: str


def pieces(prose: str, vocab: Vocabulary) -> tuple[str | Formula, ...]:
    """`prose` (any Unicode form) as text and formulas in order; the text pieces joined with
    the formulas' `text` give the prose back (decomposed, NFD)."""
    return _pieces(unicodedata.normalize("NFD", prose), vocab)


@lru_cache(maxsize=4096)
def _pieces(text: str, vocab: Vocabulary) -> tuple[str | Formula, ...]:
    tokens = _tokens(text, vocab)
    out: list[str | Formula] = []
    done, i = 0, 0  # the text before `done` is out; the next token tried
    tries = [_TRIES]
    marks, depth = [0], [0]  # the marks among the first k tokens, and their brackets' depth
    for tok in tokens:
        marks.append(marks[-1] + (tok.kind == MARK))
        depth.append(depth[-1] + (tok.text in _OPEN) - (tok.text in _CLOSE))
    while i < len(tokens) and tries[0] > 0:
        found = _longest(text, tokens, i, (marks, depth), vocab.names, tries)
        if found is None:
            i += 1
            continue
        j, formula = found
        if tokens[i].start > done:
            out.append(text[done:tokens[i].start])
        out.append(formula)
        done, i = tokens[j - 1].end, j
    if done < len(text):
        out.append(text[done:])
    return tuple(out)


def _tokens(text: str, vocab: Vocabulary) -> list[_Token]:
    out = []
    for m in _TOKEN.finditer(text):
        kind, word = m.lastgroup, m.group()
        if kind == "space":
            k = SPACE
        elif kind == "english":
            k = ENGLISH
        elif kind == "word":
            called = word in vocab.functions and text.startswith("(", m.end())
            k = NEUTRAL if called and word not in vocab.names else _word_kind(word, vocab)
            if word in _ONE_LETTER_WORDS and _SENTENCE.search(text, 0, m.start()):
                k = ENGLISH  # "A diagonal recurrence …": the article, whatever the card names
        elif kind == "script":
            k = MARK
        elif kind == "other":
            k = MARK if word in _SYMBOLS else NEUTRAL
        else:
            k = NEUTRAL
        out.append(_Token(m.start(), m.end(), k, word))
    return out


def _word_kind(word: str, vocab: Vocabulary) -> int:
    """A word's kind by the rule above. A name the card knows that is spelt as a word
    (`ctx`, `types`, `eos_token`) is math only beside a mark, since English has such words."""
    known = word in vocab.names
    base = re.match(r"[^_^]*", word).group(0)  # type: ignore[union-attr]  # always matches
    letters = re.sub(r"[\u0300-\u036f′']", "", base)
    if _snake(word) or (base == word and len(letters) > 1 and not _GREEK.search(letters)):
        return NEUTRAL if known else ENGLISH
    if letters in _ONE_LETTER_WORDS and not known and base == word:
        return ENGLISH
    return MARK  # a letter alone (row t), scripted (W_q), Greek, with an accent (P̂, t′)


def _snake(word: str) -> bool:
    """An identifier in snake case, `layer_norm`, `mask_token`: words joined by `_`."""
    return re.fullmatch(r"[A-Za-z]{2,}(?:_[A-Za-z]{2,})+", word) is not None


def _longest(text: str, tokens: list[_Token], i: int, counts: tuple[list[int], list[int]],
             names: frozenset[str], tries: list[int]) -> tuple[int, Formula] | None:
    """The end (a token index) and the formula of the longest formula starting at token `i`
    (`counts`: the marks before each token, and the depth of brackets there); each span
    parsed spends one of `tries`."""
    marks, depth = counts
    first = tokens[i]
    if not _may_start(first) or _glued(text, first.start - 1):
        return None
    stop = i
    while stop < len(tokens) and stop - i < _MAX_TOKENS and tokens[stop].kind != ENGLISH:
        stop += 1
    for j in range(stop, i, -1):
        last = tokens[j - 1]
        if marks[j] == marks[i]:
            return None  # no mark from token i to j, nor in any shorter span
        if depth[j] != depth[i] or not _may_end(last) or _glued(text, last.end):
            continue
        span = text[first.start:last.end]
        if not _balanced(span) or tries[0] <= 0:
            continue
        tries[0] -= 1
        formula = _formula(span)
        if formula is not None:
            return j, powers(formula, names)
    return None


def _may_start(t: _Token) -> bool:
    return t.kind in (NEUTRAL, MARK) and (t.text[0].isalnum() or t.text in _STARTS)


def _may_end(t: _Token) -> bool:
    end = t.text[-1]
    return t.kind in (NEUTRAL, MARK) and (end.isalnum() or end in _ENDS or end in "}′'" or
                                            unicodedata.combining(end) != 0)


def _glued(text: str, at: int) -> bool:
    """Whether the character at `at` joins what a formula would begin or end with into one
    token of prose (`#1`, `x_i%`): a letter, a digit or one of `_GLUE`."""
    return 0 <= at < len(text) and (text[at].isalnum() or text[at] in _GLUE)


def _balanced(span: str) -> bool:
    depth = 0
    for c in span:
        depth += (c in _OPEN) - (c in _CLOSE)
        if depth < 0:
            return False
    return depth == 0


@lru_cache(maxsize=8192)
def _formula(span: str) -> Formula | None:
    """`span` as a formula: an expression, a declaration, or a chain of expressions joined by
    relations; None where it is none of them."""
    expr = _parse(span, "sum")
    if expr is not None:
        return Formula((expr,), (), span)
    if "∈" in span:
        decl = _parse(span, "annot")
        if isinstance(decl, s.Decl) and decl.type is not None and decl.prose is None and \
                decl.value is None and decl.init is None:
            return Formula((decl,), (), span)
    if span[0] in "ℝℕ{":  # a type alone: ℝ^{T×d}
        decl = _parse("x ∈ " + span, "annot")
        if isinstance(decl, s.Decl) and decl.type is not None and decl.value is None:
            return Formula((decl.type,), (), span)
    parts, relations = _chain(span)
    if not relations:
        return None
    exprs = [_parse(p, "sum") for p in parts]
    if any(e is None for e in exprs):
        return None
    return Formula(tuple(exprs), tuple(relations), span)


def _chain(span: str) -> tuple[list[str], list[str]]:
    """`span` cut at its relations outside brackets: the pieces and the relations between."""
    parts, relations, depth, start = [], [], 0, 0
    for k, c in enumerate(span):
        depth += (c in _OPEN) - (c in _CLOSE)
        if depth == 0 and c in _RELATIONS:
            parts.append(span[start:k].strip())
            relations.append(c)
            start = k + 1
    parts.append(span[start:].strip())
    return parts, relations


def _parse(span: str, rule: str) -> object | None:
    """`span` parsed from the grammar's rule `rule` (`sum`, `annot`); None where it does not
    parse whole, cleanly and shallow enough for a renderer."""
    build = _Build("<prose>", span)
    try:
        node = build.run(rule)
    except (lalr.ParseError, RecursionError):
        return None
    if build.diags.items or s.too_deep(node) is not None:
        return None
    return node


def powers(node: object, names: frozenset[str]) -> object:
    """`node` with each name the card does not know, written as a name it knows with a braced
    superscript that parses (`θ_base^{−2(i − 1)/d}`), read as that name to that power."""
    if isinstance(node, s.Name):
        m = re.fullmatch(r"(.+)\^\{([^{}]*)\}", node.id)
        if m is None or node.id in names or m.group(1) not in names:
            return node
        exponent = _parse(m.group(2), "sum")
        return node if exponent is None else s.Power(s.Name(m.group(1)), exponent)
    if isinstance(node, tuple):
        return tuple(powers(x, names) for x in node)
    if hasattr(node, "__dataclass_fields__") and not isinstance(node, s.Span):
        return replace(node, **{f: powers(getattr(node, f), names)
                                for f in s.child_fields(type(node))})
    return node


def vocabulary(alg: s.Algorithm, called: frozenset[str] = frozenset()) -> Vocabulary:
    """The names `alg` knows and the functions its prose may call: builtins, the cards in
    `called`, and the functions its steps define (`P(θ) ← …`)."""
    names: set[str] = {*alg.outputs, *alg.args, *alg.params}
    defined: set[str] = set()
    for n in s.nodes((alg.blocks, alg.steps)):
        names.update(_bound(n))
        if isinstance(n, s.Assign) and isinstance(n.target, s.Call):
            defined.add(n.target.func)
    names -= UPRIGHT  # log, exp: functions, whatever a step makes of them
    return Vocabulary(frozenset(names), frozenset(BUILTINS | UPRIGHT | called | defined),
                      frozenset(defined))


def _bound(n: object) -> tuple[str, ...]:
    """The names node `n` uses or binds."""
    if isinstance(n, s.Name):
        return (n.id,)
    if isinstance(n, s.Decl):
        return n.names
    if isinstance(n, s.Bundle):
        return (n.name,)
    if isinstance(n, s.Family):
        return (n.index,)
    if isinstance(n, s.Dataset):
        return (*n.elems, n.index)
    if isinstance(n, s.For | s.SetBuilder):
        return (n.var,)
    if isinstance(n, s.Sum):
        return (n.index,)
    if isinstance(n, s.ForAll):
        return n.vars
    if isinstance(n, s.Sample):
        return n.var, n.dist
    if isinstance(n, s.Return) and n.name:
        return (n.name,)
    return ()
