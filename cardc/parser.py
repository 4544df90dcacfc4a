"""Card text → AST.

The LALR parser of cardc/lalr.py reads each line (cardc/grammar.lark) and calls _Build as rules
reduce, which builds the project's own nodes; a layout pass then nests lines: declarations by
indentation, steps by `do … end` and by indentation. Nothing downstream sees lark types.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from . import lalr
from . import syntax as s
from .diagnostics import Diagnostics
from .lalr import Token
from .spelling import canonical_name, function_name


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


# ------------------------------------------------------------------ rules → nodes


def _meta(fn: Any) -> Any:
    """Mark a _Build callback that takes the rule's lalr.Meta before its children."""
    fn.wants_meta = True
    return fn


@cache
def _callbacks() -> dict[str, tuple[Any, bool]]:
    """_Build's method for each rule that builds a node (by alias or name), and whether it
    takes the rule's Meta; every rule that builds one must have one."""
    out = {}
    for rule in lalr.tables().rules:
        build = getattr(_Build, rule.name, None)
        if build is not None:
            out[rule.name] = (build, getattr(build, "wants_meta", False))
        elif not rule.helper and not (rule.expand and _kept(rule) == 1):
            raise TypeError(f"no callback for the grammar rule {rule.name!r}")
    return out


def _kept(rule: lalr.Rule) -> int:
    return rule.size if rule.keep is None else len(rule.keep)


def _respell(token: Token) -> Token:
    """Names are kept in canonical spelling."""
    name = canonical_name(str(token))
    return token if name == token else token.update(value=name)


# ------------------------------------------------------------------ lines before nesting


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


def _span(file: str, meta_or_token: Any) -> s.Span:
    m = meta_or_token
    if m is None:  # a rule that spans no text
        return s.Span(file, 0, 0, 0, 0)
    return s.Span(file, m.line, m.column, m.end_line, m.end_column)


def _prose(token: Token) -> str:
    return token.lstrip(",").strip()


class _Build:
    """Grammar rules → AST nodes and Line records: one method per rule (or alias), called with
    the rule's children once they are built. Its diagnostics wait in `diags` until the parse
    succeeds: a line that fails to parse reports only its syntax error."""

    def __init__(self, file: str, source: str):
        self.file = file
        self.diags = Diagnostics()
        self.source = source  # the text parsed, for constructs read back from it
        self.bad_lines: set[int] = set()  # lines whose syntax error a callback reported

    def run(self, start: str, at: tuple[int, int] = (0, 1)) -> Any:
        return lalr.parse(self.source, start, self.node, _respell, at)

    def node(self, rule: lalr.Rule, meta: lalr.Meta | None, kids: list) -> Any:
        build, wants_meta = _callbacks()[rule.name]
        return build(self, meta, kids) if wants_meta else build(self, kids)

    def sub(self, text: str, start: str) -> Any:
        """A part of the line parsed on its own (an annotation, an exponent); None if it fails."""
        build = _Build(self.file, text)
        try:
            node = build.run(start)
        except lalr.ParseError:
            return None
        if s.too_deep(node) is not None:  # before _shift walks it
            return None
        self.diags.items += build.diags.items
        return node

    def sp(self, meta: Any) -> s.Span:
        return _span(self.file, meta)

    # --- lines
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

    # --- declarations
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

    def _text(self, meta) -> str:
        return self.source[meta.start_pos:meta.end_pos]

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

    def _dim(self, tok):
        if isinstance(tok, Token):
            node = s.Num if tok.type == "NUMBER" else s.Name
            return node(str(tok), span=_span(self.file, tok))
        return tok

    def dims(self, c):
        return tuple(x for x in c if not isinstance(x, Token))

    # --- statements
    @_meta
    def assign(self, meta, c):
        return self._where(s.Assign(c[0], c[2], "←", span=self.sp(meta)), c)

    @_meta
    def bind(self, meta, c):
        return self._where(s.Assign(c[0], c[1], "=", span=self.sp(meta)), c)

    @_meta
    def return_(self, meta, c):
        return self._where(s.Return(c[1], span=self.sp(meta)), c)

    @_meta
    def named_return(self, meta, c):
        return self._where(s.Return(c[2], str(c[1]), span=self.sp(meta)), c)

    def _where(self, stmt, c):
        where = next((t for t in c if isinstance(t, Token) and t.type == "WHERE"), None)
        if where is None:
            return stmt
        return _Where(stmt, where.lstrip(",").strip()[len("where"):].strip())

    @_meta
    def sample(self, meta, c):
        weights = c[5]
        if not self.source[c[4].end_pos:].lstrip().startswith("("):  # (W^{e/d}) is a name
            weights = self._power_weights(weights)
        return self._where(s.Sample(str(c[1]), str(c[3]), weights, span=self.sp(meta)), c)

    def _power_weights(self, e: s.Expr) -> s.Expr:
        """The weights of `q ∝ p^{1/τ}` or of `q ∝ top_k(p^{1/τ} | k)`, a filter's weights
        written bare after its "(" (`top_k((W^{e/d}) | k)` keeps the name)."""
        if isinstance(e, s.Call) and e.func in s.FILTERS and e.args:
            first, sp = e.args[0], e.span
            if (first.span.line, first.span.col) == (sp.line, sp.col + len(e.func) + 1):
                return replace(e, args=(self._power_weights(first), *e.args[1:]))
            return e
        return self._power_name(e)

    def _power_name(self, e: s.Expr) -> s.Expr:
        """`p^{1/τ}` lexes as one name; in `q ∝ p^{1/τ}` it is p to the power 1/τ."""
        m = re.fullmatch(r"(.+)\^\{([^{}]*)\}", e.id) if isinstance(e, s.Name) else None
        if m is None:
            return e
        exponent = self.sub(m.group(2), "sum")
        if exponent is None:
            return e
        sp = e.span
        exponent = _shift(exponent, sp.line, sp.col - 1 + len(m.group(1)) + 2)
        base = s.Name(m.group(1), span=s.Span(sp.file, sp.line, sp.col, sp.line, sp.col + len(m.group(1))))
        return s.Power(base, exponent, span=sp)

    @_meta
    def for_do(self, meta, c):
        var, over, binder, at = c[1]
        return _Open(s.For(var, over, (), "do", binder, span=self.sp(meta), var_span=at))

    @_meta
    def for_map(self, meta, c):
        var, over, binder, at = c[1]
        body = self._inline(c[2]) if len(c) > 2 else None
        if body is None:
            return _Open(s.For(var, over, (), "block", binder, span=self.sp(meta), var_span=at))
        step = s.Step(_unwhere(body), span=_stmt_span(body))
        loop = s.For(var, over, (step,), "map", binder, span=self.sp(meta), var_span=at)
        return _Where(loop, body.where) if isinstance(body, _Where) else loop

    def _inline(self, body):
        """The statement of a one-line loop or condition; one that opens a block cannot be."""
        if not isinstance(body, _Open):
            return body
        self.diags.error(body.stmt.span, f"a '{_keyword(body.stmt)}' loop that opens a block "
                         "cannot be the body of a one-line statement",
                         hint="put the loop on a line of its own")
        return body.stmt

    @_meta
    def while_do(self, meta, c):
        return _Open(s.While(c[1], (), span=self.sp(meta)))

    def loop_in(self, c):
        return (str(c[0]), c[2], "∈", _span(self.file, c[0]))

    def loop_range(self, c):
        binder = "←" if isinstance(c[1], Token) and c[1].type == "ARROW" else "="
        return (str(c[0]), c[-1], binder, _span(self.file, c[0]))

    @_meta
    def range(self, meta, c):
        exprs = [x for x in c if not isinstance(x, Token)]
        return s.Range(tuple(exprs[:-1]), exprs[-1], span=self.sp(meta))

    @_meta
    def forall(self, meta, c):
        names, body = c[1]
        body = self._inline(body)
        return _lift_where(body, lambda b: s.ForAll(tuple(names), b, span=self.sp(meta)))

    def forall_tail(self, c):
        name = str(c[0])
        rest = c[-1]
        if isinstance(rest, tuple):
            return ([name, *rest[0]], rest[1])
        return ([name], rest)

    @_meta
    def if_(self, meta, c):
        return _lift_where(self._inline(c[3]), lambda body: s.If(c[1], body, span=self.sp(meta)))

    # --- expressions
    @_meta
    def name(self, meta, c):
        return s.Name(str(c[0]), span=self.sp(meta))

    @_meta
    def number(self, meta, c):
        return s.Num(str(c[0]), span=self.sp(meta))

    @_meta
    def inf(self, meta, c):
        return s.Num("∞", span=self.sp(meta))

    @_meta
    def binop(self, meta, c):
        return s.BinOp(_OPS.get(str(c[1]), str(c[1])), c[0], c[2], span=self.sp(meta))

    @_meta
    def juxt(self, meta, c):
        return s.BinOp(" ", c[0], c[1], span=self.sp(meta))

    @_meta
    def compare(self, meta, c):
        return s.BinOp(_OPS.get(str(c[1]), str(c[1])), c[0], c[2], span=self.sp(meta))

    @_meta
    def conj(self, meta, c):
        return s.BinOp("∧", c[0], c[2], span=self.sp(meta))

    @_meta
    def neg(self, meta, c):
        return s.Unary("−", c[1], span=self.sp(meta))

    @_meta
    def not_(self, meta, c):
        return s.Unary("¬", c[1], span=self.sp(meta))

    @_meta
    def sqrt(self, meta, c):
        return s.Unary("√", c[-1], span=self.sp(meta))

    @_meta
    def nabla(self, meta, c):
        return s.Unary("∇", c[1], span=self.sp(meta))

    @_meta
    def square(self, meta, c):
        return s.Power(c[0], s.Num("2"), span=self.sp(meta))

    @_meta
    def power(self, meta, c):
        return s.Power(c[0], c[-2] if isinstance(c[-1], Token) else c[-1], span=self.sp(meta))

    @_meta
    def transpose(self, meta, c):
        return s.Transpose(c[0], span=self.sp(meta))

    @_meta
    def index(self, meta, c):
        return s.Index(c[0], tuple(c[2]), span=self.sp(meta))

    def index_ellipsis(self, c):
        return c[0]

    def index_items(self, c):
        """The items of an index; `a, b, …, c` among them is one Progression."""
        items = [x for x in c if not (isinstance(x, Token) and x.type != "ELLIPSIS")]
        out: list = []
        for k, x in enumerate(items):
            if not isinstance(x, Token):
                out.append(x)
                continue
            last = items[k + 1] if k + 1 < len(items) else None
            terms = [*out[-2:], last]
            if len(out) < 2 or not all(_term(y) for y in terms):
                self.diags.error(_span(self.file, x), "a progression in an index is written with "
                                 "its first two terms, '…' and its last",
                                 hint="the odd columns of X are 'X[:, 1, 3, …, d − 1]' (ASCII "
                                      "'X[:, 1, 3, ..., d - 1]'), the even ones "
                                      "'X[:, 2, 4, …, d]'")
                self.bad_lines.add(x.line)  # a syntax error: the card is not checked
                continue
            first, second = out[-2:]
            out[-2:] = [s.Progression(first, second, last, span=s.Span(
                self.file, first.span.line, first.span.col, last.span.end_line,
                last.span.end_col))]
            items[k + 1] = None  # taken
        return [x for x in out if x is not None]

    @_meta
    def slice_all(self, meta, c):
        return s.Slice(None, None, span=self.sp(meta))

    @_meta
    def slice_from(self, meta, c):
        return s.Slice(c[0], None, span=self.sp(meta))

    @_meta
    def slice_to(self, meta, c):
        return s.Slice(None, c[0], span=self.sp(meta))

    @_meta
    def slice_both(self, meta, c):
        return s.Slice(c[0], c[1], span=self.sp(meta))

    @_meta
    def call(self, meta, c):
        args, params, bar = next((x for x in c if isinstance(x, tuple)), ((), (), False))
        return s.Call(self._function(c[0]), args, params, bar, span=self.sp(meta))

    def _function(self, tok: Token) -> str:
        """A card's or function's name, as written (`Phi` stays `Phi`; see function_name)."""
        return function_name(self.source[tok.start_pos:tok.end_pos])

    def call_args(self, c):
        return (tuple(c[0]), (), False)

    def call_args_params(self, c):
        return (tuple(c[0]), tuple(c[-1]), True)

    def call_params_only(self, c):
        return ((), tuple(c[-1]), True)

    def args(self, c):
        return [x for x in c if not isinstance(x, Token)]

    def params(self, c):
        return [x for x in c if not isinstance(x, Token)]

    @_meta
    def named_arg(self, meta, c):
        op = "≡" if str(c[1]) in ("≡", "==") else "="
        return s.Arg(c[0], c[-1], op, span=self.sp(meta))

    @_meta
    def iverson(self, meta, c):
        exprs = [x for x in c if not isinstance(x, Token) or x.type == "CMP"]
        left, op, right = exprs
        cond = s.BinOp(_OPS.get(str(op), str(op)), left, right, span=self.sp(meta))
        return s.Iverson(cond, span=self.sp(meta))

    @_meta
    def norm(self, meta, c):
        return s.Norm(c[1], span=self.sp(meta))

    @_meta
    def concat(self, meta, c):
        sep, items = next(x for x in c if isinstance(x, tuple))
        return s.Concat(items, sep, span=self.sp(meta))

    def col_list(self, c):
        return (",", tuple(_item(x, self.file) for x in c if not _is_punct(x)))

    def row_list(self, c):
        return (";", tuple(_item(x, self.file) for x in c if not _is_punct(x)))

    @_meta
    def choice(self, meta, c):
        split = next(i for i, x in enumerate(c) if isinstance(x, Token) and x.type == "RANDOMLY")
        options = tuple(x for x in c[:split] if not isinstance(x, Token))
        probs = tuple(x for x in c[split + 1:] if not isinstance(x, Token))
        return s.Choice(options, probs, span=self.sp(meta))

    @_meta
    def set_builder(self, meta, c):
        parts = [x for x in c if not isinstance(x, Token) or x.type == "NAME"]
        return s.SetBuilder(str(parts[0]), parts[1], parts[2], span=self.sp(meta))

    @_meta
    def set_eq(self, meta, c):
        return s.BinOp("=", c[0], c[-1], span=self.sp(meta))

    @_meta
    def sum_range(self, meta, c):
        parts = [x for x in c if not isinstance(x, Token) or x.type in ("NAME", "NUMBER")]
        index, lo, hi, body = parts[0], parts[1], parts[2], parts[3]
        return s.Sum(str(index), lo, self._dim(hi), None, body, span=self.sp(meta))

    @_meta
    def sum_free(self, meta, c):
        index = next(t for t in c if isinstance(t, Token) and t.type == "NAME")
        return s.Sum(str(index), None, None, None, c[-1], span=self.sp(meta))

    @_meta
    def sum_over(self, meta, c):
        parts = [x for x in c if not isinstance(x, Token) or x.type == "NAME"]
        return s.Sum(str(parts[0]), None, None, parts[1], parts[2], span=self.sp(meta))


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
        if name == "span" and isinstance(value, s.Span) and value.line:
            changes[name] = s.Span(value.file, line, value.col + col_offset, line,
                                   value.end_col + col_offset)
        elif hasattr(value, "__dataclass_fields__") or isinstance(value, tuple):
            changes[name] = _shift(value, line, col_offset)
    return replace(node, **changes)


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
    for test, hint in _HINTS:
        if test(before, rest):
            return hint
    return None


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


_EXPRS = (s.Name, s.Num, s.BinOp, s.Unary, s.Power, s.Transpose, s.Slice, s.Progression, s.Index,
          s.Arg, s.Call, s.Concat, s.Iverson, s.Sum, s.Choice, s.SetBuilder, s.Norm)


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


def _keyword(stmt) -> str:
    return "while" if isinstance(stmt, s.While) else "for"


def _opens(ln: Line) -> bool:
    last = ln.payload[-1] if ln.payload else None
    if isinstance(last, list):
        return False
    return isinstance(last, (s.Bundle, s.Family, _Open))


def _fill(item, body: tuple) -> s.Item:
    if isinstance(item, s.Family) and item.items and isinstance(item.items[0], s.Bundle):
        return replace(item, items=(replace(item.items[0], items=body),))
    return replace(item, items=body)
