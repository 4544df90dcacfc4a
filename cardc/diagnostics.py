"""Diagnostics are values: collected while compiling, rendered rustc-style at the end."""

from __future__ import annotations

from dataclasses import dataclass, field

from .syntax import Span


@dataclass(frozen=True)
class Diagnostic:
    span: Span
    message: str
    hint: str | None = None
    severity: str = "error"
    notes: tuple[tuple[Span, str], ...] = ()

    def render(self, sources: dict[str, str] | None = None,
               lines: dict[str, list[str]] | None = None) -> str:
        """``file:line:col: error: message``, the source line, a caret under the span, a hint.
        `lines`: the sources split into lines, kept between calls (many diagnostics, one split)."""
        lines = {} if lines is None else lines
        out = [f"{self.span}: {self.severity}: {self.message}"]
        out += _excerpt(self.span, sources, lines)
        for span, text in self.notes:
            out.append(f"{span}: note: {text}")
            out += _excerpt(span, sources, lines)
        if self.hint:
            out.append(f"  = hint: {self.hint}")
        return "\n".join(out)


_SHOWN = 120  # columns of a source line shown around the caret


def _excerpt(span: Span, sources: dict[str, str] | None, split: dict[str, list[str]]
             ) -> list[str]:
    text = (sources or {}).get(span.file)
    if text is None or span.line < 1:
        return []
    lines = split.get(span.file)
    if lines is None:  # as the lexer counts lines: not at form feeds or separators
        lines = split[span.file] = text.split("\n")
    if span.line > len(lines):
        return []
    src = lines[span.line - 1]
    width = len(str(span.line))
    col = min(span.col, len(src) + 1)
    end = span.end_col if span.end_line == span.line and span.end_col > col else col + 1
    end = min(max(end, col + 1), len(src) + 2)
    skip = max(0, col - _SHOWN // 2) if len(src) > _SHOWN else 0  # a long line: around the caret
    src, col, end = src[skip:skip + _SHOWN], col - skip, min(end - skip, _SHOWN + 1)
    caret = " " * (col - 1) + "^" * max(end - col, 1)
    return [f"{' ' * width} |", f"{span.line} | {src}", f"{' ' * width} | {caret}"]


@dataclass
class Diagnostics:
    """A growing list of diagnostics, plus the sources they point into."""

    items: list[Diagnostic] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)

    def error(self, span: Span, message: str, hint: str | None = None,
              notes: tuple[tuple[Span, str], ...] = ()) -> None:
        self.items.append(Diagnostic(span, message, hint, "error", notes))

    def warning(self, span: Span, message: str, hint: str | None = None) -> None:
        warning = Diagnostic(span, message, hint, "warning")
        if warning not in self.items:  # a step checked twice (a loop's body) warns once
            self.items.append(warning)

    def extend(self, other: Diagnostics) -> None:
        self.items += other.items
        self.sources.update(other.sources)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.items if d.severity == "error"]

    def render(self) -> str:
        ordered = sorted(self.items, key=lambda d: (d.span.file, d.span.line, d.span.col))
        lines: dict[str, list[str]] = {}
        return "\n\n".join(d.render(self.sources, lines) for d in ordered)


class CardError(Exception):
    """Raised at an API boundary when compilation produced errors; carries them all."""

    def __init__(self, diagnostics: Diagnostics):
        self.diagnostics = diagnostics
        super().__init__(diagnostics.render())
