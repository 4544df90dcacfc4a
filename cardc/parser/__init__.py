"""Card text → AST.

The LALR parser of cardc/lalr.py reads each line (cardc/grammar.lark) and calls _Build as rules
reduce, which builds the project's own nodes (build.py, its callbacks by kind of rule in lines.py,
decls.py, steps.py and exprs.py); a layout pass here then nests lines: declarations by
indentation, steps by `do … end` and by indentation. Nothing downstream sees lark types.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import lalr
from .. import syntax as s
from ..diagnostics import Diagnostics
from ..spelling import edit_distance
from .base import _EXPRS, Line, _join, _keyword, _Open, _Where
from .build import _Build


def normalize(text: str) -> str:
    """Decomposed Unicode (Ṽ = V + U+0303), so hats and tildes are marks on any letter; line
    breaks as LF (a lone CR, old Mac style, breaks a line too); a leading byte-order mark
    dropped."""
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    text = unicodedata.normalize("NFD", text.replace("\t", "    "))
    return text.replace("=\u0338", "≠")  # NFD splits ≠ into = and a slash; keep the operator


# characters a card may not hold: C0 and C1 controls but the line break (tabs are spaces by
# now), DEL, line/paragraph separators and byte-order marks that are not the file's first
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff]")
_MAX_CONTROL_ERRORS = 20


def _blank_controls(text: str, file: str, diags: Diagnostics) -> str:
    """Each control character reported where it stands (the first of each line), then read as
    a space, so that the rest of the file is still checked at the same columns."""
    if not _CONTROL.search(text):
        return text
    last, line, line_start, count = -1, 1, 0, 0
    for m in _CONTROL.finditer(text):
        pos = m.start()
        line += text.count("\n", line_start, pos)
        line_start = text.rfind("\n", line_start, pos) + 1 or line_start
        if line == last:
            continue
        last, count = line, count + 1
        if count > _MAX_CONTROL_ERRORS:
            break
        col = pos - line_start + 1
        diags.error(s.Span(file, line, col, line, col + 1),
                    f"control character U+{ord(m.group()):04X} in card text",
                    hint="a card holds printable text, spaces, tabs and line breaks only")
    return _CONTROL.sub(" ", text)


# ------------------------------------------------------------------------------ parse errors

_TOKEN_WORDS = {
    "NAME": "a name", "NUMBER": "a number", "_NL": "end of line", "$END": "end of file",
    "ARROW": "'←'", "IN": "'∈'", "RPAR": "')'", "RSQB": "']'", "RBRACE": "'}'", "COMMA": "','",
    "COLON": "':'", "EQUAL": "'='", "LPAR": "'('", "LSQB": "'['", "DO": "'do'", "THEN": "'then'",
}


_GREEDY = {"TITLE", "PROSE", "WHERE", "NOTE", "ANNOT", "COMMENT"}


def _expected(tokens: set[str]) -> str:
    words = sorted({_TOKEN_WORDS.get(t, "") for t in tokens} - {""})
    if not words:
        return ""
    return "expected " + (", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0])


_MAX_SYNTAX_ERRORS = 50  # per file; past that the rest of the file is not read


def _syntax_error(err: Exception, file: str, diags: Diagnostics, text: str) -> int:
    """Report a syntax error as lark describes it; return the line it is on."""
    import lark

    line = getattr(err, "line", 0)
    line = line if isinstance(line, int) and line > 0 else text.count("\n") + 1
    col = max(getattr(err, "column", 0) or 1, 1)
    if isinstance(err, lark.UnexpectedToken):
        tok = err.token
        if tok.type == "$END":
            msg = "unexpected end of file"
        elif tok.type == "_NL":
            msg = "unexpected end of line"
        else:
            shown = str(tok.value).split("\n")[0]
            if tok.type in _GREEDY:  # a fallback lexer grabbed the rest of the line: show a word
                word = re.match(r"\w+|\S", shown.lstrip())
                shown = word.group(0) if word else shown.strip() or shown
            msg = f"unexpected {shown!r}"
            tok = tok.update(value=shown)
        end = col + max(len(str(tok.value).split("\n")[0]), 1)
        hint = _hint(text, err, line, col) or _expected(err.expected) or None
        diags.error(s.Span(file, line, col, line, end), msg, hint=hint)
    elif isinstance(err, lark.UnexpectedCharacters):
        lines = text.split("\n")
        src = lines[line - 1] if line <= len(lines) else ""
        ch = src[col - 1] if col <= len(src) else "?"
        hint = _hint(text, err, line, col) or _expected(set(err.allowed or ())) or None
        diags.error(s.Span(file, line, col, line, col + 1), f"unexpected character {ch!r}",
                    hint=hint)
    else:
        diags.error(s.Span(file, line, col, line, col + 1), str(err).splitlines()[0])
    return line


def _hint(text: str, err: Exception, line: int, col: int) -> str | None:
    """A hint toward the card spelling of what people type from other notations (Python,
    LaTeX, other pseudocode), read off the text around the error."""
    lines = text.split("\n")
    src = lines[line - 1] if line <= len(lines) else ""
    before, rest = src[:col - 1], src[col - 1:]
    for rule in (_header_hint, _bracket_power_hint):
        found = rule(before, rest)
        if found is not None:
            return found
    for test, hint in _HINTS:
        if test(before, rest):
            return hint
    return None


HEADERS = {"Algorithm": "Algorithm:", "Input": "Input:", "Output": "Output:",
           "Hyperparameters": "Hyperparameters:", "Parameters": "Parameters:",
           "Preset": "Preset NAME:"}  # each header's word, and how a line starts with it


def _header_hint(before: str, rest: str) -> str | None:
    """A line that starts with one word a slip away from a header (`Ouput:`, `inputs:`,
    `Prest tiny: …`): the header meant."""
    word = re.fullmatch(r"\s*([A-Za-z]+)\s*", before)
    if word is None or not re.match(r"[\w.-]*\s*:", rest):
        return None
    typed = word.group(1)
    allowed = 1 if len(typed) < 5 else 2  # a short word is a slip of one letter at most
    close = [h for h in HEADERS if h != typed and edit_distance(typed.lower(), h.lower()) <= allowed]
    if not close:
        return None
    header = min(close, key=lambda h: edit_distance(typed.lower(), h.lower()))
    return f"did you mean '{HEADERS[header]}'? A card's headers are " + \
        ", ".join(f"'{h}'" for h in HEADERS.values())


def _bracket_power_hint(before: str, rest: str) -> str | None:
    """`f(x)^2`: a power of a bracketed expression, its exponent not in braces (a name takes
    `x^2` as one name, so only a bracket gets here). The hint writes it as a card does."""
    exponent = re.match(r"\d+", rest)
    if exponent is None or not re.search(r"[)\]}]\s*\^\s*$", before):
        return None
    base = _bracketed_tail(before.rstrip()[:-1].rstrip())
    n = exponent.group(0)
    square = f" or '{base}²'" if n == "2" else ""
    return f"a power's exponent goes in braces: '{base}^{{{n}}}'{square}"


def _bracketed_tail(text: str) -> str:
    """The bracketed expression `text` ends with, with the name it is a call or index of
    (`E ← ReLU(X W)` → `ReLU(X W)`); `(…)` where the brackets do not match."""
    pairs, depth = {")": "(", "]": "[", "}": "{"}, []
    for i in range(len(text) - 1, -1, -1):
        ch = text[i]
        if ch in pairs:
            depth.append(pairs[ch])
        elif ch in "([{":
            if not depth or depth.pop() != ch:
                return "(…)"
            if not depth:
                name = re.search(r"[\w\u0302\u0303′]*$", text[:i])
                return text[i - len(name.group(0)) if name else i:]
    return "(…)"


def _after(pattern: str) -> Any:
    rx = re.compile(pattern)
    return lambda before, rest: rx.match(rest) is not None


def _before(pattern: str, then: str = "") -> Any:
    rx, nxt = re.compile(pattern + r"\s*$"), re.compile(then)
    return lambda before, rest: rx.search(before) is not None and nxt.match(rest) is not None


_POWER = "a power is 'x²' or 'x^{2}': the exponent goes in braces"
_HINTS: list[tuple[Any, str]] = [
    (_before(r"(∈|\bin)\s*N"), "the natural numbers are 'ℕ' (ASCII 'NN'): 'D, H ∈ ℕ'"),
    (_before(r"(∈|\bin)\s*R"), "the reals are 'ℝ' (ASCII 'RR'), a tensor type 'ℝ^{D×T}' "
                                "(ASCII 'R^{D x T}')"),
    (_before(r"(∈|\bin)\s*Z"), "integers are written as a set: '[N]' for 1…N, '{a..b}' for a…b"),
    (_before(r"[ℝR]\^", r"\("), "a tensor type's shape goes in braces: 'ℝ^{D×T}' (ASCII "
                                "'R^{D x T}')"),
    (_after(r"->|:=|=>"), "assignment is '←' (ASCII '<-'); '=' binds a name"),
    (_after(r"=<"), "'≤' is written '≤' or '<='"),
    (_after(r"\*\*|\^\("), _POWER),
    (_before(r"[*^]", r"[*(]"), _POWER),
    (_after(r"@"), "a matrix product is written 'W X' (side by side) or 'W · X'"),
    (_before(r"\w\.", r"T\b"), "a transpose is 'X^⊺' (ASCII 'X^T')"),
    (_after(r"\.T\b"), "a transpose is 'X^⊺' (ASCII 'X^T')"),
    (_after(r"\.\.(?!\.)"), "a loop over a range is 'for i = 1, …, N do' (ASCII '1, ..., N'), "
                          "or 'for i ∈ [N] do'"),
    (_before(r"\bfor\b.*\b(to|range)\b.*"), "a loop over a range is 'for i = 1, …, N do' "
                                             "(ASCII '1, ..., N'), or 'for i ∈ [N] do'"),
    (_after(r"#"), "a comment is '/* … */' on a line of its own, or '▷ …' (ASCII '// …') "
                   "after a step"),
    (_after(r"&&?"), "'and' is written '∧' or 'and'"),
    (_after(r"\|\|"), "'or' is written 'or' (in a random choice) or as two conditions"),
    (_after(r"!(?!=)"), "'not' is written '¬' or 'not'"),
    (_after(r"\\[A-Za-z]+"), "write symbols in Unicode or their ASCII spelling ('in', 'RR', "
                             "'sqrt', 'sum_{i=1}^{N}', Greek letters by name), not LaTeX "
                             "commands"),
]


# ------------------------------------------------------------------------------ layout pass


def parse(text: str, file: str = "<card>", diags: Diagnostics | None = None) -> s.CardFile:
    """Parse a card file. Errors go to ``diags``; the result holds what could be read.

    After a syntax error the parse goes on at the next line (the grammar reads a card line by
    line), so every syntax error of a file is reported; a file with one has no algorithms."""
    diags = diags if diags is not None else Diagnostics()
    text = normalize(text)
    text = _blank_controls(text, file, diags)
    diags.sources[file] = text
    build = _Build(file, text)
    lines, bad = _parse_lines(build, file, diags, text)
    if bad or build.bad_lines:
        diags.items += [d for d in build.diags.items if d.span.line not in bad]
        return s.CardFile(file, ())
    diags.items += build.diags.items
    layout = _Layout(file, diags)
    card = s.CardFile(file, tuple(layout.algorithms(lines)))
    deep = layout.too_deep or s.too_deep(card.algorithms)
    if deep is not None:
        _nested_too_deeply(deep, file, diags)
        return s.CardFile(file, ())
    return card


def _parse_lines(build: _Build, file: str, diags: Diagnostics, text: str
                 ) -> tuple[list[Line], set[int]]:
    """The lines of the file, and the numbers of the lines with a syntax error."""
    lines: list[Line] = []
    bad: set[int] = set()
    at = (0, 1)
    while True:
        try:
            lines += build.run("start", at)
            return lines, bad
        except lalr.ParseError as err:
            line = max(_syntax_error(err.lark_error(), file, diags, text), at[1])  # progress
        bad.add(line)
        nxt = _line_start(text, line + 1)
        if nxt is None or len(bad) >= _MAX_SYNTAX_ERRORS:
            return lines, bad
        at = (nxt, line + 1)


def _line_start(text: str, line: int) -> int | None:
    """The offset at which line `line` (from 1) begins; None past the end."""
    pos = 0
    for _ in range(line - 1):
        pos = text.find("\n", pos) + 1
        if pos == 0:
            return None
    return pos if pos < len(text) else None


def _nested_too_deeply(node: object, file: str, diags: Diagnostics) -> None:
    span = getattr(node, "span", None)
    if isinstance(span, s.Span) and span.line > 0:
        span = s.Span(file, span.line, span.col, span.line, span.col + 1)
    else:
        span = s.Span(file, 1, 1, 1, 2)
    hint = "split the expression into steps with names of their own" if isinstance(
        node, _EXPRS) else "nest loops, bundles and families less deeply"
    diags.error(span, f"nested too deeply (more than {s.MAX_DEPTH} levels)", hint=hint)


MAX_CARD_BYTES = 256 << 10  # a card is a page of text (the largest in cards/ is under 5 KiB)


def read_card(path: str | Path, diags: Diagnostics) -> str | None:
    """A card file's text, or None with a located error: a path that is not a regular file
    (a folder, a FIFO, a device) is refused before it is read, a file is read up to
    MAX_CARD_BYTES, and a byte that is not UTF-8 is reported at its line and column."""
    path = Path(path)
    where = s.Span(str(path), 0, 0, 0, 0)
    try:
        data = _read_regular(path)
    except OSError as err:
        diags.error(where, f"cannot read card: {err.strerror or err}")
        return None
    if data is None:
        diags.error(where, "cannot read card: not a regular file",
                    hint="give a .card file, or a folder of them")
        return None
    if len(data) > MAX_CARD_BYTES:
        at = _byte_span(str(path), data, MAX_CARD_BYTES)
        diags.sources[str(path)] = normalize(data[:MAX_CARD_BYTES].decode("utf-8", "replace"))
        diags.error(at, f"card file is larger than {MAX_CARD_BYTES >> 10} KiB",
                    hint="a card is a page of pseudocode; is this the right file?")
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        diags.sources[str(path)] = normalize(data.decode("utf-8", "replace"))
        diags.error(_byte_span(str(path), data, err.start),
                    f"not UTF-8 text: byte 0x{data[err.start]:02x}",
                    hint="save the card as UTF-8")
        return None


def _read_regular(path: Path) -> bytes | None:
    """The first MAX_CARD_BYTES + 1 bytes of a regular file; None for anything else. Opened
    without blocking, so a FIFO with no writer is seen for what it is rather than waited on."""
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_CARD_BYTES + 1)
    finally:
        os.close(fd)


def _byte_span(file: str, data: bytes, offset: int) -> s.Span:
    """The line and column of a byte offset, counted in the text as the parser reads it."""
    before = normalize(data[:offset].decode("utf-8", "replace"))
    line = before.count("\n") + 1
    col = len(before) - (before.rfind("\n") + 1) + 1
    return s.Span(file, line, col, line, col + 1)


def parse_file(path: str | Path, diags: Diagnostics) -> s.CardFile:
    text = read_card(path, diags)
    if text is None:
        return s.CardFile(str(path), ())
    return parse(text, str(path), diags)


class _Layout:
    """Nests the flat lines into algorithms, blocks and step trees."""

    def __init__(self, file: str, diags: Diagnostics):
        self.file = file
        self.diags = diags
        self.too_deep: Line | None = None  # the first line nested past s.MAX_DEPTH

    def algorithms(self, lines: list[Line]) -> list[s.Algorithm]:
        groups: list[list[Line]] = []
        for ln in lines:
            if ln.kind == "header":
                groups.append([ln])
            elif groups:
                groups[-1].append(ln)
            elif ln.kind != "comment":
                self.diags.error(ln.span, "expected 'Algorithm' before this line",
                                 hint="a card starts with a header such as 'Algorithm: Y ← Name(X | θ)'")
        return [self.algorithm(g) for g in groups]

    def algorithm(self, group: list[Line]) -> s.Algorithm:
        head, rest = group[0], group[1:]
        comments, blocks, presets = [], [], []
        decl_lines: list[Line] = []
        current: tuple[str, s.Span, int] | None = None
        step_lines: list[Line] = []

        def close_block():
            if current is not None:
                blocks.append(s.Block(current[0], tuple(self.nest_items(decl_lines, current[2])),
                                      span=current[1]))

        loose: list[Line] = []  # comments after a block: they introduce a step, or go on top
        for ln in rest:
            if step_lines and ln.kind in ("block", "preset"):
                self.diags.error(ln.span, f"a {ln.kind} line cannot follow the steps",
                                 hint="put Input/Output/Parameters/Preset lines before step 1")
                continue
            if ln.kind == "comment" and (step_lines or blocks or current is not None):
                loose.append(ln)  # /* Encode the context sequence: */
                continue
            if ln.kind in ("block", "preset") or (current is not None and not step_lines
                                                  and self.is_declaration(ln)):
                comments += [c.payload for c in loose]
            else:
                step_lines += loose
            loose = []
            if ln.kind == "comment":
                comments.append(ln.payload)
            elif ln.kind == "block":
                close_block()
                kind, items = ln.payload
                current = (kind, ln.span, -1)
                decl_lines = [replace(ln, kind="items", payload=items)] if items else []
            elif ln.kind == "preset":
                presets.append(ln.payload)
            elif current is not None and not step_lines and self.is_declaration(ln):
                decl_lines.append(ln)
            else:
                step_lines.append(ln)
        close_block()
        steps = self.nest_steps(step_lines)
        return replace(head.payload, comments=tuple(comments), blocks=tuple(blocks),
                       presets=tuple(presets), steps=tuple(steps))

    @staticmethod
    def is_declaration(ln: Line) -> bool:
        if ln.kind != "items" or ln.number is not None:
            return False
        for item in ln.payload:
            if isinstance(item, (list, s.Bundle, s.Family, s.Dataset)):
                continue
            if _definition(item):
                continue  # a definition such as d = D/H
            if isinstance(item, _Open) and isinstance(item.stmt, s.For) and item.stmt.style == "block":
                continue  # For l ∈ [L]: opens a family
            return False
        return True

    # --- declarations
    def nest_items(self, lines: list[Line], parent_indent: int, depth: int = 0) -> list[s.Item]:
        """Lines indented under a bundle or family header belong to it."""
        if depth > s.MAX_DEPTH and lines:  # the recursion stops here; parse() reports it
            self.too_deep = self.too_deep or lines[0]
            return []
        out: list[s.Item] = []
        i = 0
        while i < len(lines):
            ln = lines[i]
            j = i + 1
            while j < len(lines) and lines[j].indent > ln.indent and ln is not lines[0] or (
                    j < len(lines) and lines[j].indent > ln.indent and _opens(ln)):
                j += 1
            items = self.line_items(ln)
            if _opens(ln):
                body = self.nest_items(lines[i + 1:j], ln.indent, depth + 1)
                items[-1] = _fill(items[-1], tuple(body))
            else:
                j = i + 1
            out += items
            i = j
        return out

    def line_items(self, ln: Line) -> list[s.Item]:
        items: list[s.Item] = []
        for item in ln.payload:
            if isinstance(item, list):
                items += item
            elif isinstance(item, (s.Bundle, s.Family, s.Dataset, s.Sentence)):
                items.append(item)
            elif _definition(item):
                bind, where = (item.stmt, item.where) if isinstance(item, _Where) else (item, None)
                prose = None if where is None else f"where {where}"  # `d = …, where …`
                items.append(s.Decl((bind.target.id,), value=bind.value, prose=prose, span=bind.span))
            elif isinstance(item, _Open):
                f = item.stmt
                items.append(s.Family(f.var, f.over, (), span=f.span))
        if ln.note_text and items:  # a note on a declaration line is more of its prose
            items[-1] = _add_prose(items[-1], ln.note_text)
        return items

    # --- steps
    def nest_steps(self, lines: list[Line]) -> list[s.Step]:
        root: list[s.Step] = []
        # the stack holds (open statement, its body, its step, closing style, indent)
        stack: list[tuple[Any, list[s.Step], Line, int]] = []
        pending: list[str] = []  # comment lines waiting for the step they introduce
        self.step_comments: dict[int, tuple[str, ...]] = {}
        for ln in lines:
            if ln.kind == "comment":
                pending.append(ln.payload)
                continue
            if ln.kind == "items" and pending:
                self.step_comments[id(ln)] = tuple(pending)
                pending = []
            while stack and getattr(stack[-1][0], "style", "do") == "block" \
                    and ln.indent <= stack[-1][3]:
                self.close(stack, root)
            if ln.kind == "end":
                if not stack or getattr(stack[-1][0], "style", "do") == "block":
                    self.diags.error(ln.span, "'end' without an open 'for … do' or 'while … do'")
                    continue
                self.close(stack, root, ln.number)
                continue
            if ln.kind != "items":
                continue
            if len(ln.payload) != 1 or isinstance(ln.payload[0], (list, s.Bundle, s.Family, s.Dataset)):
                self.diags.error(ln.span, "expected one statement on this line",
                                 hint="declarations belong in the Input/Output/Parameters blocks")
                continue
            item = ln.payload[0]
            if isinstance(item, _Open):
                stack.append((item.stmt, [], ln, ln.indent))
                continue
            stmt, where = (item.stmt, item.where) if isinstance(item, _Where) else (item, None)
            step = s.Step(stmt, ln.number, ln.annotation, ln.note, where,
                          self.step_comments.get(id(ln), ()), span=ln.span)
            (stack[-1][1] if stack else root).append(step)
        while stack:
            stmt, _, ln, _ = stack[-1]
            if getattr(stmt, "style", "do") != "block":
                self.diags.error(ln.span, f"'{_keyword(stmt)} … do' is never closed by 'end'")
            self.close(stack, root)
        return root

    def close(self, stack, root, end_number: str | None = None) -> None:
        stmt, body, ln, _ = stack.pop()
        stmt = replace(stmt, body=tuple(body))
        if end_number is not None:
            stmt = replace(stmt, end_number=end_number)
        step = s.Step(stmt, ln.number, ln.annotation, ln.note, None,
                      self.step_comments.get(id(ln), ()), span=ln.span)
        (stack[-1][1] if stack else root).append(step)


def _definition(item) -> bool:
    """`d = D/H` (or `d = D/H, where …`) read as a declaration where one may stand."""
    bind = item.stmt if isinstance(item, _Where) else item
    return isinstance(bind, s.Assign) and bind.op == "=" and isinstance(bind.target, s.Name)


def _add_prose(item: s.Item, text: str) -> s.Item:
    if isinstance(item, (s.Decl, s.Bundle, s.Dataset)):
        return replace(item, prose=_join(item.prose, text))
    if isinstance(item, s.Family) and item.items:  # For h ∈ [H], W consisting of:  ▷ …
        return replace(item, items=(_add_prose(item.items[0], text),))
    return item  # a family header has no prose


def _opens(ln: Line) -> bool:
    last = ln.payload[-1] if ln.payload else None
    if isinstance(last, list):
        return False
    return isinstance(last, (s.Bundle, s.Family, _Open))


def _fill(item, body: tuple) -> s.Item:
    if isinstance(item, s.Family) and item.items and isinstance(item.items[0], s.Bundle):
        return replace(item, items=(replace(item.items[0], items=body),))
    return replace(item, items=body)
