"""Rule callbacks for expressions: names and numbers, operators, indexing and slices, calls,
and the paper's notations (Iverson brackets, norms, concatenation, sums, choices)."""

from __future__ import annotations

from .. import syntax as s
from ..lalr import Token
from .base import _OPS, _is_punct, _item, _meta, _Rules, _span, _term


class _Exprs(_Rules):
    """Rules → expression nodes."""

    @_meta
    def name(self, meta, c):
        """A name; one that ends in a whole number in braces, `p^{2}`, is that power of the
        name before it (as `p²` is): a superscript that names (γ^1, W^{e/d}) is bare or not a
        number."""
        text, sp = str(c[0]), self.sp(meta)
        power = s.whole_power(text)
        if power is None:
            return s.Name(text, span=sp)
        base, digits = power
        end = sp.col + len(base)
        return s.Power(s.Name(base, span=s.Span(sp.file, sp.line, sp.col, sp.line, end)),
                       s.Num(digits, span=s.Span(sp.file, sp.line, end + 2, sp.line,
                                                 end + 2 + len(digits))), span=sp)

    @_meta
    def number(self, meta, c):
        return s.Num(str(c[0]), span=self.sp(meta))

    @_meta
    def inf(self, meta, c):
        return s.Num("∞", span=self.sp(meta))

    @_meta
    def binop(self, meta, c):
        star = _span(self.file, c[1]) if str(c[1]) == "*" else None
        return s.BinOp(_OPS.get(str(c[1]), str(c[1])), c[0], c[2], span=self.sp(meta),
                       star=star)

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
    def floor(self, meta, c):
        return s.Call("floor", (c[1],), span=self.sp(meta))

    @_meta
    def ceil(self, meta, c):
        return s.Call("ceil", (c[1],), span=self.sp(meta))

    @_meta
    def abs(self, meta, c):
        return s.Call("abs", (c[1],), span=self.sp(meta))

    @_meta
    def log2(self, meta, c):
        return s.Call("log2", (c[1],), span=self.sp(meta))

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
    def iverson_eq(self, meta, c):
        left, right = [x for x in c if not isinstance(x, Token)]
        return s.Iverson(s.BinOp("=", left, right, span=self.sp(meta)), span=self.sp(meta))

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
