"""What the rule callbacks share: the Line records they build before the layout pass nests
them, the statements that wait for it (_Open, _Where), small readers of tokens and nodes, and
_Rules, the state every group of callbacks works on."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .. import syntax as s
from ..diagnostics import Diagnostics
from ..lalr import Token
from ..spelling import function_name


def _meta(fn: Any) -> Any:
    """Mark a _Build callback that takes the rule's lalr.Meta before its children."""
    fn.wants_meta = True
    return fn


@dataclass
class Line:
    kind: str  # header | comment | block | preset | items | end
    span: s.Span
    indent: int  # column of the first statement or declaration token
    number: str | None
    payload: Any
    note: str | None = None
    annotation: s.Decl | None = None
    comment: str | None = None
    note_text: str | None = None  # the note even where it reads as an annotation: prose for decls


class _Rules:
    """The state the callbacks share, and the readers of it that more than one group uses. Its
    diagnostics wait in `diags` until the parse succeeds: a line that fails to parse reports
    only its syntax error."""

    def __init__(self, file: str, source: str):
        self.file = file
        self.diags = Diagnostics()
        self.source = source  # the text parsed, for constructs read back from it
        self.bad_lines: set[int] = set()  # lines whose syntax error a callback reported

    def sp(self, meta: Any) -> s.Span:
        return _span(self.file, meta)

    def _text(self, meta) -> str:
        return self.source[meta.start_pos:meta.end_pos]

    def _dim(self, tok):
        if isinstance(tok, Token):
            node = s.Num if tok.type == "NUMBER" else s.Name
            return node(str(tok), span=_span(self.file, tok))
        return tok

    def _function(self, tok: Token) -> str:
        """A card's or function's name, as written (`Phi` stays `Phi`; see function_name)."""
        return function_name(self.source[tok.start_pos:tok.end_pos])


def _span(file: str, meta_or_token: Any) -> s.Span:
    m = meta_or_token
    if m is None:  # a rule that spans no text
        return s.Span(file, 0, 0, 0, 0)
    return s.Span(file, m.line, m.column, m.end_line, m.end_column)


def _prose(token: Token) -> str:
    return token.lstrip(",").strip()


def _keyword(stmt) -> str:
    return "while" if isinstance(stmt, s.While) else "for"


_EXPRS = (s.Name, s.Num, s.BinOp, s.Unary, s.Power, s.Transpose, s.Slice, s.Progression, s.Index,
          s.Arg, s.Call, s.Concat, s.Iverson, s.Sum, s.Choice, s.SetBuilder, s.Norm)


_OPS = {"-": "−", "*": "·", "(.)": "⊙", "<=": "≤", ">=": "≥", "!=": "≠", "==": "≡"}


@dataclass
class _Open:
    """A statement that opens a block: `for … do`, `while … do`, `For h ∈ [H]:`."""

    stmt: s.For | s.While


@dataclass
class _Where:
    stmt: s.Stmt
    where: str


def _lift_where(body, make):
    """`, where …` prose belongs to the whole step, not to the statement nested in it."""
    if isinstance(body, _Where):
        return _Where(make(body.stmt), body.where)
    return make(body)


def _unwhere(x):
    return x.stmt if isinstance(x, _Where) else x


def _stmt_span(x) -> s.Span:
    return _unwhere(x).span


def _is_punct(x) -> bool:
    return isinstance(x, Token) and x.type != "ELLIPSIS"


def _item(x, file):
    if isinstance(x, Token):  # an ellipsis
        return s.Ellipsis_(span=_span(file, x))
    return x


def _note(tok: Token) -> str:
    return str(tok).lstrip("▷/").strip()


def _full_stop(kind: str, payload: Any) -> Any:
    """A line of declarations that ends with a full stop, as the paper prints the last line of
    a list: kept on its last declaration. A period after anything else is dropped."""
    items = payload[1] if kind == "block" else payload
    last = items[-1] if kind in ("block", "items") and items else None
    if not isinstance(last, list) or not last or not isinstance(last[-1], s.Decl):
        return payload
    decl = last[-1]
    if decl.prose is not None or decl.end:
        return payload
    items = [*items[:-1], [*last[:-1], replace(decl, end=".")]]
    return (payload[0], items) if kind == "block" else items


def _term(x) -> bool:
    """A term of a progression: an expression, not a slice or another progression."""
    return isinstance(x, _EXPRS) and not isinstance(x, s.Slice | s.Progression)


def _comment(tok: Token) -> str:
    return str(tok)[2:-2].strip()


def _join(a: str | None, b: str) -> str:
    return b if not a else f"{a}, {b}"


def _first_column(items, meta) -> int:
    first = items[0]
    first = first[0] if isinstance(first, list) else first
    span = getattr(_unwhere(first.stmt) if isinstance(first, _Open) else _unwhere(first), "span", None)
    return span.col if span and span.line else meta.column


def _shift(node, line: int, col_offset: int):
    """Move a sub-parsed annotation's spans to where it stands in the file."""
    if isinstance(node, tuple):
        return tuple(_shift(x, line, col_offset) for x in node)
    if not hasattr(node, "__dataclass_fields__"):
        return node
    changes = {}
    for name in node.__dataclass_fields__:
        value = getattr(node, name)
        if name in s.LOCATIONS and isinstance(value, s.Span) and value.line:
            changes[name] = s.Span(value.file, line, value.col + col_offset, line,
                                   value.end_col + col_offset)
        elif hasattr(value, "__dataclass_fields__") or isinstance(value, tuple):
            changes[name] = _shift(value, line, col_offset)
    return replace(node, **changes)
