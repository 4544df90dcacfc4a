"""Between the parser's spans and an editor's positions.

The parser reads a card normalized (`cardc.parser.normalize`: decomposed Unicode, tabs as four
spaces, LF line breaks) and counts columns in its characters from 1; the Language Server
Protocol counts lines from 0 and columns in UTF-16 code units of the text as the editor holds
it. A `Columns` of one document maps both ways, line by line.
"""

from __future__ import annotations

import unicodedata
from bisect import bisect_right
from dataclasses import dataclass

from lsprotocol import types as lsp

from ..syntax import Span


def _normalized_width(ch: str) -> int:
    """How many characters `ch` of the editor's text is once normalized."""
    return 4 if ch == "\t" else len(unicodedata.normalize("NFD", ch))


def _utf16(ch: str) -> int:
    return 2 if ord(ch) > 0xFFFF else 1


@dataclass
class _Line:
    """One line: for each of its characters, where it starts in the normalized line (a column
    from 1) and in UTF-16 units (from 0)."""

    normalized: list[int]
    utf16: list[int]

    @classmethod
    def of(cls, text: str) -> _Line:
        normalized, utf16, col, unit = [], [], 1, 0
        for ch in text:
            normalized.append(col)
            utf16.append(unit)
            col += _normalized_width(ch)
            unit += _utf16(ch)
        normalized.append(col)  # the end of the line
        utf16.append(unit)
        return cls(normalized, utf16)

    def to_lsp(self, col: int) -> int:
        """The UTF-16 offset of normalized column `col` (inside a character: its start)."""
        return self.utf16[max(bisect_right(self.normalized, col) - 1, 0)]

    def to_col(self, unit: int) -> int:
        """The normalized column of UTF-16 offset `unit`."""
        return self.normalized[max(bisect_right(self.utf16, unit) - 1, 0)]


class Columns:
    """The column maps of one document's text."""

    def __init__(self, text: str):
        text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
        self.lines = [_Line.of(line) for line in text.split("\n")]

    def _line(self, number: int) -> _Line | None:
        return self.lines[number] if 0 <= number < len(self.lines) else None

    def position(self, line: int, col: int) -> lsp.Position:
        """The editor's position of a span's line (from 1) and column (from 1)."""
        if line < 1:
            return lsp.Position(0, 0)
        at = self._line(line - 1)
        if at is None:  # past the end: the end of the last line
            return lsp.Position(len(self.lines) - 1, self.lines[-1].utf16[-1])
        return lsp.Position(line - 1, at.to_lsp(col))

    def range(self, span: Span) -> lsp.Range:
        if span.line < 1:  # a whole-file problem: its first line
            return lsp.Range(lsp.Position(0, 0), lsp.Position(1, 0))
        start = self.position(span.line, span.col)
        end = self.position(span.end_line or span.line, max(span.end_col, 1))
        if (end.line, end.character) <= (start.line, start.character):
            end = lsp.Position(start.line, start.character + 1)
        return lsp.Range(start, end)

    def column(self, position: lsp.Position) -> tuple[int, int]:
        """The span line (from 1) and column (from 1) of an editor's position."""
        at = self._line(position.line)
        return position.line + 1, 1 if at is None else at.to_col(position.character)
