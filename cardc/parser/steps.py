"""Rule callbacks for a step's statements: assignments, returns, sampling, loops, conditions."""

from __future__ import annotations

import re
from dataclasses import replace

from .. import syntax as s
from ..lalr import Token
from .base import (
    _keyword,
    _lift_where,
    _meta,
    _Open,
    _Rules,
    _shift,
    _span,
    _stmt_span,
    _unwhere,
    _Where,
)


class _Steps(_Rules):
    """Rules → statements; a loop that opens a block waits for the layout pass as _Open."""

    @_meta
    def assign(self, meta, c):
        return self._where(s.Assign(c[0], c[2], "←", span=self.sp(meta)), c)

    @_meta
    def assign_many(self, meta, c):
        """P, r ← M(x | θ): each name a target, the spans of the names together."""
        names = [tok for tok in c if isinstance(tok, Token) and tok.type == "NAME"]
        items = tuple(s.Name(str(tok), span=self.sp(tok)) for tok in names)
        first, last = items[0].span, items[-1].span
        target = s.Several(items, span=s.Span(first.file, first.line, first.col,
                                              last.end_line, last.end_col))
        value = next(x for x in c if not isinstance(x, Token))
        return self._where(s.Assign(target, value, "←", span=self.sp(meta)), c)

    @_meta
    def bind(self, meta, c):
        return self._where(s.Assign(c[0], c[1], "=", span=self.sp(meta)), c)

    @_meta
    def return_(self, meta, c):
        return self._where(s.Return(c[1], span=self.sp(meta)), c)

    @_meta
    def return_many(self, meta, c):
        values = tuple(x for x in c[1:] if not isinstance(x, Token))
        first, last = values[0].span, values[-1].span
        span = s.Span(first.file, first.line, first.col, last.end_line, last.end_col)
        return self._where(s.Return(s.Several(values, span=span), span=self.sp(meta)), c)

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
        pairs, body = c[1]
        body = self._inline(body)
        names = tuple(name for name, _ in pairs)
        over = tuple(o for _, o in pairs) if any(o is not None for _, o in pairs) else ()
        return _lift_where(body, lambda b: s.ForAll(names, b, over, span=self.sp(meta)))

    def forall_tail(self, c):
        var = c[0]
        rest = c[-1]
        if isinstance(rest, tuple):
            return ([var, *rest[0]], rest[1])
        return ([var], rest)

    def forall_var(self, c):
        """A quantified variable and its range (`t′ ∈ [T]`), or None where it has none."""
        return (str(c[0]), c[-1] if len(c) > 1 else None)

    @_meta
    def if_(self, meta, c):
        return _lift_where(self._inline(c[3]), lambda body: s.If(c[1], body, span=self.sp(meta)))
