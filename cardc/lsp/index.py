"""Where each name of a card file is written: the index an editor's requests read.

A card's syntax records a span for every expression but not for each name of a declaration
(`E, k, D_e ∈ ℕ` is one span) nor for the name of a call (`Name(x | θ)` spans the whole call):
those are found in the source text, inside the span, by their canonical spelling.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass

from .. import syntax as s
from ..spelling import canonical_name, function_name

# A run of a name's characters as a card writes them (ASCII or Unicode): what lies between
# operators, brackets, commas and spaces; canonical_name tells which name it is
_WORD = re.compile(r"[^\s,;:()\[\]∈←|=·+−*/⊙×<>≤≥…▷]+")


@dataclass(frozen=True)
class Occurrence:
    """One written name. `kind`: "name" (a value used or assigned), "decl" (declared: an input,
    hyperparameter, parameter, loop variable), "card" (a card's name: at a call, or its own
    header, `header` true) or "param" (a hyperparameter of the card called, `ε = ε`'s first ε).
    `node`: the expression, where the name is one (its type is the checker's)."""

    span: s.Span
    name: str
    kind: str
    alg: s.Algorithm
    node: object | None = None
    callee: str | None = None  # the card whose hyperparameter a "param" names
    header: bool = False
    assigned: bool = False  # a "name" that a step assigns (← target)

    def contains(self, line: int, col: int) -> bool:
        sp = self.span
        return sp.line == line and sp.col <= col <= sp.end_col


class FileIndex:
    """Every occurrence of a name in one parsed card file, and each card's lines."""

    def __init__(self, card_file: s.CardFile, text: str):
        self.file = card_file
        self.lines = text.split("\n")
        self.occurrences: list[Occurrence] = []
        for alg in card_file.algorithms:
            self.occurrences += _Indexer(self, alg).run()
        headers = [a.span.line for a in card_file.algorithms] + [len(self.lines) + 1]
        self.extent = {id(a): (headers[i], _last_line(self.lines, headers[i + 1] - 1))
                       for i, a in enumerate(card_file.algorithms)}

    def at(self, line: int, col: int) -> Occurrence | None:
        """The occurrence under a position (1-based); the innermost where several are."""
        found = [o for o in self.occurrences if o.contains(line, col)]
        return min(found, key=lambda o: o.span.end_col - o.span.col, default=None)

    def algorithm_at(self, line: int) -> s.Algorithm | None:
        for alg in self.file.algorithms:
            first, last = self.extent[id(alg)]
            if first <= line <= last:
                return alg
        return None

    def word_span(self, line: int, col: int, name: str, end: s.Span | None = None
                  ) -> s.Span | None:
        """Where `name` is written first from (line, col), within `end`'s lines when given
        (a declaration continued over lines)."""
        last = end.end_line if end is not None and end.end_line >= line else line
        for number in range(line, min(last, len(self.lines)) + 1):
            text = self.lines[number - 1]
            start = col - 1 if number == line else 0
            for m in _WORD.finditer(text, max(start, 0)):
                if _names(m.group(0), name):
                    return s.Span(self.file.path, number, m.start() + 1, number, m.end() + 1)
        return None


def _names(written: str, name: str) -> bool:
    """Whether a written run is `name`: as a value's name, or as a card's."""
    written = written.rstrip(".")
    return canonical_name(written) == name or function_name(written) == name


def _last_line(lines: list[str], line: int) -> int:
    """The last line at or before `line` that is not blank: a card ends at its last text."""
    while line > 1 and not lines[line - 1].strip():
        line -= 1
    return line


class _Indexer:
    """The occurrences of one card, in the order they are written."""

    def __init__(self, index: FileIndex, alg: s.Algorithm):
        self.index = index
        self.alg = alg
        self.found: list[Occurrence] = []

    def run(self) -> list[Occurrence]:
        self.header()
        for block in self.alg.blocks:
            for item in block.items:
                self.item(item)
        for step in self.alg.steps:
            self.node(step)
        return self.found

    def add(self, span: s.Span | None, name: str, kind: str, **extra: object) -> None:
        if span is not None and span.line > 0:
            self.found.append(Occurrence(span, name, kind, self.alg, **extra))  # type: ignore[arg-type]

    def header(self) -> None:
        """`Algorithm: P ← Name(x | θ)`: the card's name, and the names it declares there."""
        alg, number = self.alg, self.alg.span.line
        if alg.name is None or number < 1:
            return
        line = self.index.lines[number - 1]
        after_colon = line.find(":") + 2  # columns from 1
        arrow = max(line.find("←"), line.find("<-"))
        span = self.index.word_span(number, arrow + 2 if arrow >= 0 else after_colon, alg.name)
        self.add(span, alg.name, "card", header=True)
        for name in alg.outputs:
            self.add(self.index.word_span(number, after_colon, name), name, "decl")
        for name in (*alg.args, *alg.params):
            start = span.end_col if span is not None else after_colon
            self.add(self.index.word_span(number, start, name), name, "decl")

    def item(self, item: object) -> None:
        if isinstance(item, s.Decl):
            for name in item.names:
                span = item.span
                self.add(self.index.word_span(span.line, span.col, name, span), name, "decl")
            for expr in (item.type, item.value, item.init):
                self.node(expr)
        elif isinstance(item, s.Bundle):
            self.add(self.index.word_span(item.span.line, item.span.col, item.name), item.name,
                     "decl")
            for sub in item.items:
                self.item(sub)
        elif isinstance(item, s.Family):
            for sub in item.items:
                self.item(sub)

    def node(self, node: object) -> None:
        """Every name under a step or an expression (a dispatch by node kind)."""
        visit = getattr(self, f"visit_{type(node).__name__}", None)
        if visit is not None:
            visit(node)
            return
        for child in _children(node):
            self.node(child)

    def visit_Name(self, node: s.Name) -> None:
        self.add(node.span, node.id, "name", node=node)

    def visit_Assign(self, node: s.Assign) -> None:
        targets = node.target.items if isinstance(node.target, s.Several) else (node.target,)
        for target in targets:
            if isinstance(target, s.Name):  # typed as the value it is given, where it is one
                value = node.value if len(targets) == 1 else target
                self.add(target.span, target.id, "name", node=value, assigned=True)
            else:
                self.node(target)
        self.node(node.value)

    def visit_For(self, node: s.For) -> None:
        self.add(node.var_span, node.var, "decl")
        self.node(node.over)
        for step in node.body:
            self.node(step)

    def visit_Call(self, node: s.Call) -> None:
        span = self.index.word_span(node.span.line, node.span.col, node.func)
        self.add(span, node.func, "card", node=node)
        for arg in node.args:
            self.node(arg)
        for param in node.params:
            if isinstance(param, s.Arg):
                if isinstance(param.target, s.Name):
                    self.add(param.target.span, param.target.id, "param", callee=node.func)
                self.node(param.value)
            else:
                self.node(param)


def _children(node: object) -> Iterator[object]:
    if isinstance(node, tuple):
        yield from node
    elif dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            if f.name != "span":
                yield getattr(node, f.name)
