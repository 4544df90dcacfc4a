"""Rule callbacks for whole lines: headers and signatures, block, preset, item and end lines,
and the tail of notes, annotations and comments a line may end with."""

from __future__ import annotations

import re
from typing import Any

from .. import syntax as s
from ..lalr import Token
from .base import (
    Line,
    _comment,
    _first_column,
    _full_stop,
    _meta,
    _note,
    _Rules,
    _shift,
    _span,
)


class _Lines(_Rules):
    """Rules → Line records, one per card line."""

    @_meta
    def start(self, meta, lines):
        return [ln for ln in lines if isinstance(ln, Line)]

    @_meta
    def header(self, meta, c):
        number = next((str(t) for t in c if isinstance(t, Token) and t.type == "NUMBER"), None)
        sig = next(x for x in c if isinstance(x, dict))
        note = next((_note(t) for t in c if isinstance(t, Token) and t.type == "NOTE"), None)
        alg = s.Algorithm(sig["name"], number, sig["outputs"], sig["args"], sig["params"],
                          note=note, span=self.sp(meta))
        return Line("header", self.sp(meta), meta.column, None, alg)

    @_meta
    def titled_header(self, meta, c):
        number = next((str(t) for t in c if isinstance(t, Token) and t.type == "NUMBER"), None)
        title = str(c[-1]).strip()
        if not title:
            self.diags.error(self.sp(meta), "expected a signature or a title after ':'",
                             hint="'Algorithm: Y ← Name(X | θ)' or 'Algorithm 1: Token embedding.'")
        alg = s.Algorithm(None, number, title=title, span=self.sp(meta))
        return Line("header", self.sp(meta), meta.column, None, alg)

    def signature(self, c):
        names = [x for x in c if isinstance(x, list)]
        name = self._function(next(t for t in c if isinstance(t, Token) and t.type == "NAME"))
        params = next((x[1] for x in c if isinstance(x, tuple)), ())
        args = tuple(names[1]) if len(names) > 1 else ()
        return {"outputs": tuple(names[0]), "name": name, "args": args, "params": params}

    def bar_names(self, c):
        return ("|", tuple(c[0]))

    def names(self, c):
        return [str(t) for t in c]

    @_meta
    def comment_line(self, meta, c):
        return Line("comment", self.sp(meta), meta.column, None, _comment(c[0]))

    @_meta
    def block_line(self, meta, c):
        kind = str(c[0]).rstrip(": \t")
        items = c[1] if len(c) == 3 else []
        return self._line("block", meta, None, (kind, items), c[-1], column=meta.column)

    @_meta
    def sentence_line(self, meta, c):
        kind = str(c[0]).rstrip(": \t")
        sentence = s.Sentence(c[1].strip(), span=_span(self.file, c[1]))
        return self._line("block", meta, None, (kind, [sentence]), c[-1], column=meta.column)

    @_meta
    def preset_line(self, meta, c):
        values = tuple(c[2])
        tail = c[-1]
        preset = s.Preset(str(c[1]), values, tail.get("text"), span=self.sp(meta))
        return self._line("preset", meta, None, preset, {}, column=meta.column)

    def preset_values(self, c):
        return c

    def preset_value(self, c):
        return (str(c[0]), c[1])

    @_meta
    def item_line(self, meta, c):
        number = None
        if isinstance(c[0], Token) and c[0].type == "STEPNUM":
            number = c[0].strip().rstrip(":.")
            c = c[1:]
        items, tail = c[0], c[1]
        column = _first_column(items, meta)
        return self._line("items", meta, number, items, tail, column)

    @_meta
    def end_line(self, meta, c):
        number = c[0].strip().rstrip(":.") if c[0].type == "STEPNUM" else None
        end_tok = c[1] if number is not None else c[0]
        return self._line("end", meta, number, None, c[-1], end_tok.column)

    def _line(self, kind, meta, number, payload, tail, column):
        if tail.get("period"):
            payload = _full_stop(kind, payload)
        return Line(kind, self.sp(meta), column, number, payload, tail.get("note"),
                    tail.get("annotation"), tail.get("comment"), tail.get("text"))

    def line_tail(self, c):
        tail: dict[str, Any] = {}
        for tok in c:
            if tok.type == "NOTE":
                text = _note(tok)
                decl = self._annotation(text, tok, offset=len(tok) - len(tok.lstrip("▷/")))
                tail["annotation" if decl else "note"] = decl or text
                tail["text"] = text
            elif tok.type == "ANNOT":
                text = tok.strip()[2:-2]
                decl = self._annotation(text, tok, offset=2)
                tail["annotation" if decl else "note"] = decl or text.strip()
                tail["text"] = text.strip()
            elif tok.type == "COMMENT":
                tail["comment"] = _comment(tok)
            elif tok.type == "PERIOD":
                tail["period"] = True
        return tail

    def _annotation(self, text: str, tok: Token, offset: int) -> s.Decl | None:
        """An annotation that reads as a declaration is checked; anything else is a note."""
        stripped = text.lstrip()
        if "∈" not in stripped and not re.search(r"\bin\b", stripped):
            return None
        decl = self.sub(stripped, "annot")
        if decl is None:
            return None
        col = tok.column + offset + (len(text) - len(stripped))
        return _shift(decl, tok.line, col - 1)

    def items(self, c):
        return list(c)
