"""Rule callbacks for declarations (typed, prose, datasets, definitions, bundles, families)
and the types they declare."""

from __future__ import annotations

from dataclasses import replace

from .. import syntax as s
from ..lalr import Token
from .base import _join, _meta, _prose, _Rules, _span


class _Decls(_Rules):
    """Rules → Decl, Dataset, Bundle, Family and type nodes."""

    @_meta
    def decls(self, meta, c):
        decls = [x for x in c if isinstance(x, s.Decl)]
        prose = next((_prose(t) for t in c if isinstance(t, Token) and t.type == "PROSE"), None)
        if prose is not None:
            last = decls[-1]
            decls[-1] = replace(last, prose=_join(last.prose, prose))
        return decls

    @_meta
    def decls_continued(self, meta, c):
        decls = [x for x in c if isinstance(x, s.Decl)]
        decls[-1] = replace(decls[-1], end=",")
        return decls

    @_meta
    def typed_decl(self, meta, c):
        value = next((x[1] for x in c if isinstance(x, tuple) and x[0] == "="), None)
        init = next((x[1] for x in c if isinstance(x, tuple) and x[0] == "~"), None)
        pad = next((x[1] for x in c if isinstance(x, tuple) and x[0] == "pad"), None)
        seed = any(isinstance(x, tuple) and x[0] == "seed" for x in c)
        format_of = next((x[1] for x in c if isinstance(x, tuple) and x[0] == "format"), None)
        return s.Decl(tuple(c[0]), c[2], value, init, pad=pad, seed=seed, format_of=format_of,
                      span=self.sp(meta))

    def decl_pad(self, c):
        return ("pad", str(c[-1]))

    def decl_seed(self, c):
        return ("seed", None)

    def decl_format(self, c):
        return ("format", str(c[-1]))

    @_meta
    def card_decl(self, meta, c):
        return s.Decl(tuple(c[0]), c[2], span=self.sp(meta))

    @_meta
    def card_type(self, meta, c):
        window = c[3] if len(c) > 3 else (None, None)
        return s.CardType(c[0], c[2], *window, span=self.sp(meta))

    def card_window(self, c):
        if str(c[2]) not in ("≤", "<="):
            self.diags.error(_span(self.file, c[2]), "a card's window is written 'for T ≤ T_max'")
        return (str(c[1]), str(c[3]))

    @_meta
    def prose_decl(self, meta, c):
        return s.Decl((str(c[0]),), prose=_prose(c[1]), span=self.sp(meta))

    @_meta
    def dataset(self, meta, c):
        elems, index, lo, hi = c[0], str(c[1]), c[2], self._dim(c[3])
        prose = _prose(c[4]) if len(c) > 4 else None
        return s.Dataset(tuple(elems), index, lo, hi, prose, span=self.sp(meta))

    def dataset_elems(self, c):
        return [str(t) for t in c if isinstance(t, Token) and t.type == "NAME"]

    def decl_value(self, c):
        return ("=", c[0])

    @_meta
    def decl_init(self, meta, c):
        args = tuple(x for x in c[3:] if not isinstance(x, Token))
        return ("~", s.Call(str(c[1]), args, span=self.sp(meta)))

    @_meta
    def definition(self, meta, c):
        """`d = D/H, the width of a head`: prose makes a bind a declaration (a list, as decls)."""
        target, value, prose = c[0], c[1], _prose(c[2])
        if not isinstance(target, s.Name):
            self.diags.error(self.sp(meta), "prose after ',' follows a declaration, not a step",
                             hint="write a note instead: '▷ …'")
            return s.Assign(target, value, "=", span=self.sp(meta))
        return [s.Decl((target.id,), value=value, prose=prose, span=self.sp(meta))]

    def annot(self, c):
        return c[0]

    @_meta
    def bundle(self, meta, c):
        prose = _prose(c[2]) if len(c) > 2 else None
        intro = "includes all of the following parameters" if "includes" in c[1] else "consisting of"
        return s.Bundle(str(c[0]), (), prose, intro, span=self.sp(meta))

    @_meta
    def family(self, meta, c):  # For h ∈ [H], W^h consisting of:
        return s.Family(str(c[1]), c[3], (c[-1],), span=self.sp(meta))

    # --- types
    @_meta
    def scalar_type(self, meta, c):
        return s.Scalar("ℝ" if c[0] in ("ℝ", "RR", "R") else "ℕ", span=self.sp(meta))

    @_meta
    def bits_type(self, meta, c):
        if (str(c[0]), str(c[1])) != ("0", "1"):
            self.diags.error(self.sp(meta), "the only finite set written out is {0,1}",
                             hint="use [N] for {1, …, N} or {a..b} for a range")
        return s.Bits(span=self.sp(meta))

    @_meta
    def int_range_type(self, meta, c):
        return s.IntRange(c[0], c[2], span=self.sp(meta))

    @_meta
    def formats_type(self, meta, c):
        names = tuple(str(x) for x in c if isinstance(x, Token) and x.type == "NAME")
        unknown = [n for n in names if n not in s.FORMATS]
        if unknown:
            self.diags.error(self.sp(meta), f"'{unknown[0]}' is not a number format",
                             hint=f"the formats are {', '.join(s.FORMATS)}")
        return s.Formats(names, span=self.sp(meta))

    @_meta
    def finite_type(self, meta, c):
        return s.Finite(c[0], span=self.sp(meta))

    @_meta
    def seq_type(self, meta, c):
        if str(c[1]) != "*":
            self.diags.error(self.sp(meta), "expected a type", hint="V* is the set of sequences over V")
        return s.Sequences(str(c[0]), span=self.sp(meta))

    @_meta
    def iso_type(self, meta, c):
        return s.Iso(str(c[0]), c[2], span=self.sp(meta))

    @_meta
    def simplex_type(self, meta, c):
        return s.Simplex(str(c[-1]), span=self.sp(meta))

    @_meta
    def interval_type(self, meta, c):
        lo, hi = [x for x in c if not isinstance(x, Token) or x.type in ("NAME", "NUMBER")]
        text = self._text(meta)
        return s.Interval(lo, hi, text.startswith("["), text.rstrip().endswith("]"),
                          span=self.sp(meta))

    @_meta
    def tensor_type(self, meta, c):
        dims = c[1] if isinstance(c[1], tuple) else (self._dim(c[1]),)
        return s.Tensor(c[0], dims, span=self.sp(meta))

    @_meta
    def tensor_type_t(self, meta, c):  # ℝ^T lexes as a transpose; here it is the dimension T
        tok = c[1]
        if "⊺" in tok:
            self.diags.error(self.sp(meta), "expected a dimension after '^', found '⊺'")
        dim = s.Name("T", span=s.Span(self.file, tok.line, tok.column + 1, tok.line, tok.column + 2))
        return s.Tensor(c[0], (dim,), span=self.sp(meta))

    def dims(self, c):
        return tuple(x for x in c if not isinstance(x, Token))
