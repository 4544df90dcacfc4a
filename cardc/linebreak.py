"""Break the lines of generated Python that run past WIDTH characters, deterministically.

The printer writes each statement on one line; this pass rewrites only the lines that are too
long, and only their whitespace (and a trailing comma where a bracket's items then stand one
per line), so the module's syntax tree stays what it was. Black's layout, simplified:

- a trailing comment that would overflow goes on its own line above the statement;
- a statement breaks at the last bracket whose opening line fits (a call's arguments, a
  list, a subscript): its items on one continuation line indented four more, or one item per
  line with a trailing comma if they do not fit either, then the closing bracket;
- inside brackets an item that is still too long breaks before its loosest operators
  (`for` of a comprehension, `if`/`else`, `or`, `and`, comparisons, `|`, `&`, `+`, `*`…).
"""

from __future__ import annotations

import io
import keyword
import re
import textwrap
import tokenize
from dataclasses import dataclass

WIDTH = 120
INDENT = "    "

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>\#.*)
  | (?P<string>[rRbBuUfF]{0,2}(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'))
  | (?P<number>(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?[jJ]?)
  | (?P<name>[^\W\d]\w*)
  | (?P<op>\*\*=?|//=?|<<|>>|<=|>=|==|!=|->|:=|\.\.\.|[-+*/%@&|^~<>=.,:;()\[\]{}!])
""", re.VERBOSE)
_OPEN, _CLOSE = "([{", ")]}"
_NOT_OPERANDS = frozenset(keyword.kwlist) - {"None", "True", "False"}
# Where an item inside brackets breaks, loosest first: it breaks before every operator of the
# loosest kind it holds at its own bracket depth (binary operators only: `-x` stays whole).
_LOOSENESS = {"for": 0, "if": 1, "else": 1, "or": 2, "and": 3, "not": 4, "is": 4, "in": 4,
              "<": 4, ">": 4, "==": 4, "!=": 4, "<=": 4, ">=": 4, "|": 5, "^": 6, "&": 7,
              "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "//": 10, "%": 10, "@": 10,
              "**": 11}


@dataclass(frozen=True)
class _Tok:
    kind: str  # comment, string, number, name, op
    text: str
    start: int
    end: int


def break_lines(text: str) -> str:
    """`text`, a Python module, with every line over WIDTH characters broken where it can be
    (a line inside a string, or with nothing to break at, stays as it is)."""
    lines = text.split("\n")
    if all(len(line) <= WIDTH for line in lines):
        return text
    depth, in_string = _context(text)
    out: list[str] = []
    for row, line in enumerate(lines, 1):
        if len(line) <= WIDTH or row in in_string:
            out.append(line)
        else:
            out += break_line(line, enclosed=depth.get(row, 0) > 0)
    return "\n".join(out)


def _context(text: str) -> tuple[dict[int, int], set[int]]:
    """Each line's bracket depth where it starts, and the lines a string spans past its first."""
    depth: dict[int, int] = {}
    in_string: set[int] = set()
    level = 0
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        row, end_row = tok.start[0], tok.end[0]
        depth.setdefault(row, level)
        in_string.update(range(row + 1, end_row + 1))
        if tok.type == tokenize.OP and tok.string in _OPEN:
            level += 1
        elif tok.type == tokenize.OP and tok.string in _CLOSE:
            level -= 1
    return depth, in_string


def break_line(line: str, enclosed: bool = False) -> list[str]:
    """One physical line as lines of at most WIDTH characters where it can be. `enclosed`:
    the line stands inside brackets opened above it, so it may break between any tokens."""
    if len(line) <= WIDTH:
        return [line]
    indent = line[: len(line) - len(line.lstrip())]
    code = line.strip()
    toks = _lex(code)
    if toks is None:
        return [line]
    if toks and toks[-1].kind == "comment":
        rest = code[: toks[-1].start].rstrip()
        if not rest:
            return _comment(indent, toks[-1].text)
        return _comment(indent, toks[-1].text) + break_line(indent + rest, enclosed)
    return _item(code, indent) if enclosed else _at_bracket(code, indent, False)


def _comment(indent: str, text: str) -> list[str]:
    """A comment on lines of its own, wrapped at spaces where it overflows."""
    if len(indent) + len(text) <= WIDTH:
        return [indent + text]
    words = text[1:].strip()
    wrapped = textwrap.wrap(words, WIDTH - len(indent) - 2, break_long_words=False,
                            break_on_hyphens=False)
    return [f"{indent}# {part}" for part in wrapped]


def _lex(code: str) -> list[_Tok] | None:
    """The tokens of one line of code; None where it holds something this lexer does not read
    (a backslash continuation, an unterminated string)."""
    toks, at = [], 0
    while at < len(code):
        m = _TOKEN.match(code, at)
        if m is None:
            return None
        if m.lastgroup != "space":
            toks.append(_Tok(m.lastgroup, m.group(), m.start(), m.end()))
        at = m.end()
    return toks


def _pairs(toks: list[_Tok]) -> list[tuple[int, int]]:
    """The token indices of each bracket pair at the line's own depth, in order."""
    pairs, depth, opened = [], 0, 0
    for i, tok in enumerate(toks):
        if tok.kind != "op":
            continue
        if tok.text in _OPEN:
            if depth == 0:
                opened = i
            depth += 1
        elif tok.text in _CLOSE and depth > 0:
            depth -= 1
            if depth == 0:
                pairs.append((opened, i))
    return pairs


def _at_bracket(code: str, indent: str, enclosed: bool) -> list[str]:
    """`code` broken at the last bracket pair whose opening line fits (else the first): the
    opening line, the items, then the closing bracket and what follows it."""
    if len(indent) + len(code) <= WIDTH:
        return [indent + code]
    toks = _lex(code) or []
    pairs = [(o, c) for o, c in _pairs(toks) if c > o + 1]
    if not pairs:
        return [indent + code]
    fits = [(o, c) for o, c in pairs if len(indent) + toks[o].end <= WIDTH]
    o, c = fits[-1] if fits else pairs[0]
    head, tail = code[: toks[o].end], code[toks[c].start:]
    items = code[toks[o].end: toks[c].start].strip()
    lines = _at_bracket(head, indent, enclosed)
    lines += _items(items, indent + INDENT)
    return lines + (_item(tail, indent) if enclosed else _at_bracket(tail, indent, False))


def _items(code: str, indent: str) -> list[str]:
    """A bracket's contents: on one line if they fit; else one item per line, each with a
    comma after it (where there are two or more)."""
    if len(indent) + len(code) <= WIDTH:
        return [indent + code]
    toks = _lex(code) or []
    commas = [t for i, t in enumerate(toks) if t.text == "," and _depth_zero(toks, i)]
    if not commas:
        return _item(code, indent)
    starts = [0] + [t.end for t in commas]
    ends = [t.start for t in commas] + [len(code)]
    parts = [code[a:b].strip() for a, b in zip(starts, ends, strict=True)]
    if parts[-1] == "":  # a comma after the last item already
        parts.pop()
    return [line for part in parts for line in _item(part + ",", indent)]  # the comma counts


def _depth_zero(toks: list[_Tok], index: int) -> bool:
    depth = 0
    for tok in toks[:index]:
        if tok.kind == "op" and tok.text in _OPEN:
            depth += 1
        elif tok.kind == "op" and tok.text in _CLOSE:
            depth = max(0, depth - 1)
    return depth == 0


def _item(code: str, indent: str) -> list[str]:
    """One item inside brackets: whole if it fits; else broken before its loosest operators;
    else at a bracket of its own."""
    if len(indent) + len(code) <= WIDTH:
        return [indent + code]
    toks = _lex(code) or []
    cuts = _operators(toks)
    if not cuts:
        return _at_bracket(code, indent, True)
    bounds = [0] + [toks[i].start for i in cuts] + [len(code)]
    return [line for a, b in zip(bounds, bounds[1:], strict=False) for line in _item(code[a:b].strip(), indent)]


def _operators(toks: list[_Tok]) -> list[int]:
    """Indices of the loosest binary operators at the item's own depth (never its first
    token)."""
    found: dict[int, list[int]] = {}
    depth, comprehension = 0, False
    for i, tok in enumerate(toks):
        if tok.kind == "op" and tok.text in _OPEN:
            depth += 1
        elif tok.kind == "op" and tok.text in _CLOSE:
            depth = max(0, depth - 1)
        elif depth == 0 and i > 0 and tok.text in _LOOSENESS and tok.kind in ("op", "name"):
            comprehension |= tok.text == "for"
            if _binary(toks, i, comprehension):
                found.setdefault(_LOOSENESS[tok.text], []).append(i)
    return found[min(found)] if found else []


def _binary(toks: list[_Tok], i: int, comprehension: bool) -> bool:
    """Whether toks[i] joins two operands: not a sign, a star argument or `not x`; `not in`
    and `is not` break before their first word; `in` of a comprehension never breaks."""
    tok, before = toks[i], toks[i - 1]
    operand = before.kind in ("number", "string") or before.text in _CLOSE or \
        (before.kind == "name" and before.text not in _NOT_OPERANDS)
    if tok.text == "not":
        return operand and i + 1 < len(toks) and toks[i + 1].text == "in"
    if tok.text == "in":
        return operand and not comprehension
    return operand
