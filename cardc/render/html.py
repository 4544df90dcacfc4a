"""A card as a self-contained HTML page, its math as MathML Core (what browsers lay out natively).

The layout is the LaTeX rendering's (cardc.render.latex): per algorithm a `<figure>` whose caption
is `Algorithm 4:` and the signature, the `/* … */` comments, the `Input:`, `Output:`,
`Hyperparameters:` and `Parameters:` blocks filled into lines by the LaTeX renderer's own
`items_tex`, then the steps, numbered as the card numbers them, loops as `for … do … end` with a
rule along the body, annotations and notes right-aligned after ▷. Each step is a
`<div class="step" id="L12" data-line="12">` for the card's source line 12, so that a page can
link to a line.

The math mirrors the LaTeX typography: HtmlRenderer subclasses LatexRenderer, keeping its
precedence, its bold sets (`typography`) and its block layout, and answers every `text_<Kind>`
with one MathML element (built from cardc.render.mathml) instead of LaTeX. Every fenced group is an `<mrow>` of its own, so that MathML's
operator forms (prefix, infix, postfix) come out as TeX's spacing does.

Each name that the checker typed carries its shape: a `title` attribute, and a class `s{n}` that
a per-figure `<style>` rule ties to a hidden `<div class="tip s{n}">`, shown while the name is
hovered (CSS `:has`, no script), and highlighting the name's other occurrences. A call of
another card shows its name as a link (an HTML `<a>` inside `<mtext>`, which the HTML parser
allows and Chromium lays out and follows); the caller decides the href (`link`).

A step wider than a narrow pane's line (`STEP` characters of its text) wraps within its row,
beside its number, its continuation lines hung: its math is in pieces, split at the points of
cardc.render.breaks that would fit it in such a line, each piece a `<math>` of its own with a
`<wbr>` after it, so that the browser breaks where the pane needs it (MathML's own line breaks
are not laid out by Chromium). The figure carries the rules this needs (`LINES_CSS`) in a
`<style>` of its own, wherever it is shown.

Math written in prose is MathML as the steps' math is (cardc.render.prose), its names with their
shapes on hover; a tip sets its declaration's prose so too. All card text is escaped
(`html.escape`): prose, names and numbers cannot open markup. The page fetches nothing: its
fonts are the reader's own, its links are anchors or relative paths.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from html import escape

from .. import syntax as s
from ..builtins import UPRIGHT
from ..checker import Checker
from ..spelling import display
from .breaks import BREAK, pieces, points, width
from .latex import HANG, LatexRenderer, typography
from .mathml import (
    ELLIPSIS,
    REL,
    THIN,
    corrected,
    fenced,
    function,
    joined,
    mi,
    mo,
    mtext,
    number,
    row,
    shape_math,
    symbol,
    tag,
    with_class,
)
from .prose import Formula
from .text import COND, CONJ, POSTFIX, PRODUCT, SUM, TEXT, TIGHT, notation

Link = Callable[[s.Algorithm], str | None]
_TRIANGLE = '<span class="tri">▷</span>'
STEP = 48  # characters of card text past which a step may wrap: a narrow pane's line
LEVEL = 2  # the characters a loop's body is indented by
# a step that may wrap: its code beside its number, as wide as the row, each line after the
# first hung; the pieces of its math, each a <math>, wrap between them (<wbr>); a long note
# wraps as prose does
LINES_CSS = (".algorithm .step .code.lines{max-width:100%;min-width:0;box-sizing:border-box;"
             "padding-left:2em;text-indent:-2em}\n.algorithm .code.lines math{text-indent:0}\n"
             ".algorithm .step .note.lines{white-space:normal;max-width:100%;"
             "box-sizing:border-box}")
_TAG = re.compile(r"<(/?)([a-z]+)\b[^>]*?(/?)>|" + BREAK)


# ⌊x⌋, ⌈x⌉, |x|: the builtin → its delimiters
_BRACKETS = {"floor": ("⌊", "⌋"), "ceil": ("⌈", "⌉"), "abs": ("|", "|")}


class HtmlRenderer(LatexRenderer):
    """Card AST → HTML with MathML; `bold` and `vectors` as the LaTeX renderer's.

    After `attach`, names carry the shapes the checker found and calls link to their cards.
    """

    indent = '<span class="indent"></span>'

    def __init__(self, bold: frozenset[str] = frozenset(), vectors: frozenset[int] = frozenset()):
        super().__init__(bold, vectors)
        self.about: dict[str, str] = {}  # a declared name's prose
        # a name's shape as text → n of its class s{n} (in order of appearance), and its tip
        self.tips: dict[str, tuple[int, str]] = {}
        self.callees: dict[int, s.Algorithm] = {}  # id(call node) → the card it calls
        self.link: Link = lambda alg: None
        self.line_ids = True
        self.wrapped = False  # whether a step of the figure wraps: LINES_CSS goes with it
        self.plain = False  # while a tip's prose is set: its names carry no tips of their own

    def attach(self, checker: Checker | None, alg: s.Algorithm, link: Link) -> None:
        """Take the declarations' prose and the calls the checker found in `alg` (the types
        `typography` took)."""
        self.link = link
        info = checker.infos.get(id(alg)) if checker is not None else None
        if info is None:
            return
        for d in checker.decls(alg):
            if isinstance(d, s.Decl) and d.prose:
                for name in d.names:
                    self.about.setdefault(name, d.prose)
        self.callees = {k: c.callee for k, c in info.calls.items()
                        if isinstance(c.callee, s.Algorithm)}

    def math(self, tex: str) -> str:
        if BREAK not in tex:
            return f"<math>{_unwrapped(tex)}</math>"
        return "<wbr>".join(f"<math>{_unwrapped(p)}</math>" for p in split_rows(tex))

    def words(self, prose: str) -> str:
        return escape(display(prose))

    def formula(self, f: Formula) -> str:
        if isinstance(f.parts[0], s.Decl):
            return self.decl_math(f.parts[0], label=True)
        out = [self.text(f.parts[0])]
        for rel, part in zip(f.relations, f.parts[1:], strict=True):
            out += [mo(rel), self.text(part)]
        return row(*out)

    def sub(self, node: object, min_prec: int, tail: bool = True) -> str:
        if self.precedence(node) < min_prec or (not tail and isinstance(node, s.Sum)):
            return fenced(self.text(node))
        return self.text(node, tail)

    def symbol(self, name: str, bold: bool = False, node: object = None) -> str:
        """A name, with its shape where the checker knows it (at `node`, else declared)."""
        out = symbol(name, bold)
        ty = self.at.get(id(node)) if node is not None else None
        ty = ty or self.named.get(name)
        if ty is None or self.plain:
            return out
        shape = f"{display(name)} ∈ {ty}"
        about = self.about.get(name)
        if shape not in self.tips:  # the tip typesets what the title spells
            tip = self.math(row(symbol(name, self.bolded(name)), mo("∈"), shape_math(ty)))
            said = f" — {self.tip_prose(about)}" if about else ""
            self.tips[shape] = (len(self.tips) + 1, tip + said)
        n = self.tips[shape][0]
        said = f", {display(about)}" if about else ""
        return with_class(out, f"name s{n}", title=shape + said)

    def tip_prose(self, prose: str) -> str:
        """A declaration's prose as its tip shows it: its math set, its names without tips."""
        self.plain, was = True, self.plain
        try:
            return self.prose(prose)
        finally:
            self.plain = was

    def tip_html(self, anchor: str) -> list[str]:
        """The hidden tips of the names shown, and the rules that show them on hover."""
        if not self.tips:
            return []
        out = [f'<div class="tip s{n}" role="tooltip">{tip}</div>' for n, tip in self.tips.values()]
        fig = "#" + _css_ident(anchor)
        rules = [f"{fig}:has(.name.s{n}:hover) .tip.s{n}{{display:block}}\n"
                 f"{fig}:has(.name.s{n}:hover) .name.s{n}{{background:var(--hover)}}"
                 for n, _ in self.tips.values()]
        return [*out, "<style>" + "\n".join(rules) + "</style>"]

    # ------------------------------------------------------------------ expressions

    def text_Name(self, node: s.Name, tail: bool) -> str:
        if node.id in UPRIGHT and not self.bolded(node.id):  # log, exp: upright
            return self.function(node.id)
        return self.name_math(node.id, node)

    def text_Num(self, node: s.Num, tail: bool) -> str:
        return number(node.text, id(node) in self.vectors)

    def text_BinOp(self, node: s.BinOp, tail: bool) -> str:
        prec = self.precedence(node)
        if prec == CONJ:
            return row(self.sub(node.left, CONJ), mo("∧"), self.sub(node.right, COND, tail))
        if prec == COND:
            return row(self.sub(node.left, SUM), mo(node.op), self.sub(node.right, SUM, tail))
        left = self.sub(node.left, self.left_min(node), tail=prec == SUM)
        right = self.sub(node.right, self.right_min(node.op), tail)
        if node.op == "/":  # TeX's / is a letter: no space either side
            return row(left, mo("/", lspace="0", rspace="0"), right)
        return row(left, THIN if node.op == " " else mo(node.op), self.mark(node, 1) + right)

    def text_Unary(self, node: s.Unary, tail: bool) -> str:
        if node.op == "−":
            return row(mo("−"), self.sub(node.operand, self.negand_min(), tail))
        if node.op == "¬":
            return row(mo("¬"), self.sub(node.operand, COND, tail))
        if node.op == "√":
            return tag("msqrt", self.text(node.operand))
        return row(mo(node.op), self.sub(node.operand, TIGHT, tail))

    def text_Power(self, node: s.Power, tail: bool) -> str:
        return tag("msup", corrected(self.sub(node.base, POSTFIX)), self.text(node.exponent))

    def text_Transpose(self, node: s.Transpose, tail: bool) -> str:
        return tag("msup", corrected(self.sub(node.operand, POSTFIX)), mo("⊺"))

    def text_Index(self, node: s.Index, tail: bool) -> str:
        items = joined(self.sub(i, SUM) for i in node.items)
        base = corrected(self.sub(node.base, POSTFIX))
        return row(base, fenced(items, "[", "]", stretchy=False))

    def text_Slice(self, node: s.Slice, tail: bool) -> str:
        lo = "" if node.lo is None else self.sub(node.lo, SUM)
        hi = "" if node.hi is None else self.sub(node.hi, SUM)
        if lo and hi:  # TeX's relation spacing
            return row(lo, mo(":", lspace=REL, rspace=REL), hi)
        return row(lo, mo(":", lspace="0", rspace="0"), hi)  # TeX's {:}, an ordinary colon

    def text_Progression(self, node: s.Progression, tail: bool) -> str:
        return joined([self.sub(node.first, SUM), self.sub(node.second, SUM), ELLIPSIS,
                       self.sub(node.last, SUM)])

    def text_Arg(self, node: s.Arg, tail: bool) -> str:
        return row(self.sub(node.target, POSTFIX), mo(node.op), self.text(node.value))

    def text_Call(self, node: s.Call, tail: bool) -> str:
        written = notation(node)
        if written in _BRACKETS:  # ⌊x⌋, ⌈x⌉, |x|
            return fenced(self.text(node.args[0]), *_BRACKETS[written])
        if written == "log2":
            return row(tag("msub", function("log"), tag("mn", "2")),
                       self.sub(node.args[0], TIGHT, tail))
        args = [self.text(a) for a in node.args]
        inner = joined(self.marked(node, args))
        if node.params or node.bar:
            params = joined(self.marked(node, [self.text(p) for p in node.params], len(args)))
            inner = row(inner, mo("∣", stretchy="false"), self.mark(node, len(args)) + params)
        if self.lettered(node.func):  # P(θ): a name, its value's type
            return row(corrected(self.name_math(node.func, node)), fenced(inner))
        callee = self.callees.get(id(node))
        href = self.link(callee) if callee is not None else None
        return row(self.function(node.func, href), fenced(inner))

    def function(self, name: str, href: str | None = None) -> str:
        return function(name, href)

    def text_Ellipsis(self, node: s.Ellipsis_, tail: bool) -> str:
        return ELLIPSIS

    def text_Concat(self, node: s.Concat, tail: bool) -> str:
        items = self.marked(node, [self.sub(i, SUM) for i in node.items])
        return fenced(joined(items, node.sep), "[", "]")

    def text_Several(self, node: s.Several, tail: bool) -> str:
        return joined(self.marked(node, [self.sub(i, SUM) for i in node.items]))

    def text_Iverson(self, node: s.Iverson, tail: bool) -> str:
        return fenced(self.text(node.cond), "⟦", "⟧", stretchy=False)

    def text_Norm(self, node: s.Norm, tail: bool) -> str:
        return fenced(self.text(node.operand), "‖", "‖")

    def text_Sum(self, node: s.Sum, tail: bool) -> str:
        index = self.name_math(node.index)
        if node.over is not None:
            head = tag("munder", mo("∑"), row(index, mo("∈"), self.sub(node.over, SUM)))
        elif node.lo is None and node.hi is None:
            head = tag("munder", mo("∑"), index)
        else:
            lo = "" if node.lo is None else self.sub(node.lo, SUM)
            hi = "" if node.hi is None else self.sub(node.hi, SUM)
            head = tag("munderover", mo("∑"), row(index, mo("="), lo), row(hi) or tag("mrow"))
        return row(head, self.sub(node.body, PRODUCT, tail))

    def text_Choice(self, node: s.Choice, tail: bool) -> str:
        options = [self.sub(x, SUM) for x in node.options]
        probs = [self.sub(x, SUM) for x in node.probs]
        return row(joined(options, mtext("or")), mtext("randomly with probability"),
                   self.mark(node, 1) + joined(probs, mtext("or")))

    def text_SetBuilder(self, node: s.SetBuilder, tail: bool) -> str:
        inner = row(self.name_math(node.var), mo("∈"), self.sub(node.domain, SUM),
                    mo(":", lspace=REL, rspace=REL),
                    self.sub(node.cond, COND))
        return fenced(inner, "{", "}", stretchy=False)

    def text_Range(self, node: s.Range, tail: bool) -> str:
        return joined([*(self.text(x) for x in node.first), ELLIPSIS, self.text(node.last)])

    # ------------------------------------------------------------------ types

    def text_Scalar(self, node: s.Scalar, tail: bool) -> str:
        return mi(node.set)

    def text_Interval(self, node: s.Interval, tail: bool) -> str:
        lo, hi = "[" if node.lo_closed else "(", "]" if node.hi_closed else ")"
        return fenced(joined([self.text(node.lo), self.text(node.hi)]), lo, hi, stretchy=False)

    def text_Bits(self, node: s.Bits, tail: bool) -> str:
        return fenced(joined([tag("mn", "0"), tag("mn", "1")]), "{", "}", stretchy=False)

    def text_IntRange(self, node: s.IntRange, tail: bool) -> str:
        return fenced(joined([self.text(node.lo), ELLIPSIS, self.text(node.hi)]), "{", "}",
                      stretchy=False)

    def text_Formats(self, node: s.Formats, tail: bool) -> str:
        return fenced(joined(mi(n, mathvariant="monospace") for n in node.names), "{", "}",
                      stretchy=False)

    def text_Finite(self, node: s.Finite, tail: bool) -> str:
        return fenced(self.text(node.size), "[", "]", stretchy=False)

    def text_Sequences(self, node: s.Sequences, tail: bool) -> str:
        return tag("msup", self.name_math(node.of), mo("*"))

    def text_Iso(self, node: s.Iso, tail: bool) -> str:
        return row(self.name_math(node.name), mo("≅"), self.text(node.of))

    def text_Simplex(self, node: s.Simplex, tail: bool) -> str:
        return row(mi("Δ", mathvariant="normal"), fenced(self.name_math(node.over)))

    def text_Tensor(self, node: s.Tensor, tail: bool) -> str:
        dims = joined((self.dim_text(node, d) for d in node.dims), "×")
        return tag("msup", self.text(node.elem), dims)

    def dim_text(self, node: s.Tensor, d: s.Expr) -> str:
        sum_ = isinstance(d, s.BinOp) and d.op in ("+", "−") and len(node.dims) > 1
        return fenced(self.text(d)) if sum_ else self.text(d)

    def text_CardType(self, node: s.CardType, tail: bool) -> str:
        window = []
        if node.window:
            window = [mtext("for"), self.name_math(node.length or ""), mo("≤"),
                      self.name_math(node.window)]
        return row(self.text(node.input), mo("→"), self.text(node.output), *window)

    # ------------------------------------------------------------------ declarations

    def decl_math(self, node: s.Decl, label: bool = False) -> str:
        """As LatexRenderer.decl_math: in a `label` (a step's annotation, prose) a word that
        names nothing of the card's is upright (`Query`)."""
        names = [mi(n) if label and self.unknown_word(n) else self.name_math(n)
                 for n in node.names]
        out = [joined(names)]
        if node.type is not None:
            out += [mo("∈"), self.text(node.type)]
        if isinstance(node.type, s.Formats) and isinstance(node.value, s.Name):
            out += [mo("="), mi(node.value.id, mathvariant="monospace")]  # as its set shows it
        elif node.value is not None:
            out += [mo("="), self.text(node.value)]
        if node.init is not None:
            init = node.init
            if isinstance(init, s.Call):
                args = joined(self.text(a) for a in init.args)
                out += [mo("∼"), row(self.function(init.func), fenced(args))]
            else:
                out += [mo("∼"), self.text(init)]
        return row(*out)

    def decl_tex(self, node: s.Decl) -> str:
        out = self.math(self.decl_math(node))
        if node.pad is not None:
            out += f", padding row {self.math(self.name_math(node.pad))}"
        if node.seed:
            out += ", seed of every random draw"
        if node.format_of is not None:
            out += f", number format of {self.math(self.name_math(node.format_of))}"
        if node.prose is not None:
            out += ", " + self.prose(node.prose)
        return out + self.prose(node.end)

    def item_tex(self, item: s.Item, depth: int) -> list[str]:
        indent = self.indent * depth
        if isinstance(item, s.Bundle):
            head = f"{self.math(self.name_math(item.name))} {self.prose(item.intro)}:"
            if item.prose is not None:
                head += " " + self.prose(item.prose)
            return [indent + head, *self.items_tex(item.items, depth + 1)]
        if isinstance(item, s.Family):
            binder = "=" if isinstance(item.over, s.Range) else "∈"
            head = row(self.name_math(item.index), mo(binder), self.text(item.over))
            return [indent + f"For {self.math(head)}:", *self.items_tex(item.items, depth + 1)]
        if isinstance(item, s.Dataset):
            elems = joined(self.name_math(e) for e in item.elems)
            if len(item.elems) > 1:
                elems = fenced(elems)
            line = self.math(tag("msubsup", fenced(elems, "{", "}", stretchy=False),
                                 row(self.name_math(item.index), mo("="), self.text(item.lo)),
                                 self.text(item.hi)))
            return [indent + line + ("" if item.prose is None else ", " +
                                     self.prose(item.prose))]
        if isinstance(item, s.Sentence):
            return [indent + self.prose(item.text)]
        return []

    # ------------------------------------------------------------------ statements

    def stmt_tex(self, node: s.Stmt) -> str:
        """One statement as a line of the algorithm: text, math inside `<math>`."""
        if isinstance(node, s.Assign):
            op = "←" if node.op == "←" else "="
            return self.math(row(self.sub(node.target, POSTFIX), mo(op),
                                 self.mark(node, 1) + self.text(node.value)))
        if isinstance(node, s.Return):
            name = [] if node.name is None else \
                [self.name_math(node.name), mo("=")]
            value = self.mark(node, 1) + self.text(node.value)
            return f"{_kw('return')} {self.math(row(*name, value))}"
        if isinstance(node, s.Sample):
            dist = row(self.name_math(node.dist), mo("∝"), self.weights_text(node.weights))
            return f"{_kw('sample')} a token {self.math(self.name_math(node.var))} from " \
                   f"{self.math(dist)}"
        if isinstance(node, s.ForAll):
            over = node.over or (None,) * len(node.vars)
            names = joined(self.name_math(v) if o is None else
                           row(self.name_math(v), mo("∈"), self.text(o))
                           for v, o in zip(node.vars, over, strict=True))
            return f"{self.math(row(mo('∀'), names))}, {self.stmt_tex(node.body)}"
        if isinstance(node, s.If):
            return f"{_kw('if')} {self.math(self.sub(node.cond, CONJ))} {_kw('then')} " \
                   f"{self.stmt_tex(node.then)}"
        if isinstance(node, s.For):  # a map: `for h ∈ [H] : step`
            body = " ".join(self.stmt_tex(step.stmt) for step in node.body)
            return f"{_kw('for')} {self.math(self.loop_head(node))} : {body}"
        raise TypeError(f"cannot render {type(node).__name__} as a line")

    def loop_head(self, node: s.For) -> str:
        return row(self.name_math(node.var), mo(node.binder), self.text(node.over))

    def step_tex(self, node: s.Step, depth: int) -> list[str]:
        """A step as a `<div class="step">`, a loop's body in a `<div class="body">` after it,
        then its `end`."""
        out = [f'<div class="comment">/* {self.prose(c)} */</div>' for c in node.comments]
        stmt = node.stmt
        where = "" if node.where is None else ", where " + self.prose(node.where)
        opens = isinstance(stmt, s.While) or isinstance(stmt, s.For) and stmt.style != "map"
        if not opens:  # a step wider than a narrow pane's line wraps, even where its
            # math cannot: its prose can, and it keeps to the row beside its number
            said = TEXT.text(stmt) + ("" if node.where is None else ", where " + node.where)
            lines = width(said) > STEP - LEVEL * depth
            self.wrapped |= lines
            return [*out, self.step_row(node, depth, self.broken(stmt, depth) + where, lines)]
        if isinstance(stmt, s.While):
            head = f"{_kw('while')} {self.math(self.sub(stmt.cond, CONJ))} {_kw('do')}"
        else:
            head = f"{_kw('for')} {self.math(self.loop_head(stmt))} {_kw('do')}"
        out += [self.step_row(node, depth, head + where), '<div class="body">']
        out += [row_ for step in stmt.body for row_ in self.step_tex(step, depth + 1)]
        out.append("</div>")
        if isinstance(stmt, s.While) or stmt.style == "do":
            out.append(f'<div class="step end"{_depth(depth)}>{_number(stmt.end_number)}'
                       f'<span class="code">{_kw("end")}</span></div>')
        return out

    def broken(self, stmt: s.Stmt, depth: int) -> str:
        """`stmt` as stmt_tex sets it; where it is wider than a narrow pane's line, its math in
        pieces at every point of the kinds that would bring it within one, for the reader's
        browser to wrap at (0: outside any loop)."""
        self.breaks = points(pieces(stmt), STEP - LEVEL * depth, HANG)
        try:
            return self.stmt_tex(stmt)
        finally:
            self.breaks = frozenset()

    def step_row(self, node: s.Step, depth: int, code: str, lines: bool = False) -> str:
        """The row of a step: its number, its code (`lines`: in pieces that wrap), and after ▷
        its annotation and note."""
        margin = []
        if node.annotation is not None:
            margin.append(self.math(self.decl_math(node.annotation, label=True)))
        if node.note is not None:
            margin.append(f'<span class="prose">{self.prose(node.note)}</span>')
        wide = node.note is not None and width(display(node.note)) > STEP - LEVEL * depth
        self.wrapped |= wide  # a note wider than a narrow pane wraps too, right-aligned
        cls = "note lines" if wide else "note"
        side = f'<span class="{cls}">{_TRIANGLE} {" ".join(margin)}</span>' if margin else ""
        line = node.span.line
        at = "" if line <= 0 else f' id="L{line}" data-line="{line}"' if self.line_ids else \
            f' data-line="{line}"'
        cls = "code lines" if lines else "code"
        return f'<div class="step"{at}{_depth(depth)}>{_number(node.number)}' \
               f'<span class="{cls}">{code}</span>{side}</div>'

    # ------------------------------------------------------------------ algorithms

    def caption(self, node: s.Algorithm) -> str:
        if node.name is None:
            return self.prose(node.title or "")
        outs = joined(self.name_math(o) for o in node.outputs)
        args = joined(self.name_math(a) for a in node.args)
        if node.params:
            params = joined(self.name_math(p) for p in node.params)
            args = row(args, mo("∣", stretchy="false"), params)
        return self.math(row(outs, mo("←"), self.function(node.name), fenced(args)))

    def algorithm_tex(self, node: s.Algorithm) -> list[str]:
        """The figure's lines: caption, comments, blocks, steps, then the tips."""
        number = f" {escape(node.number)}" if node.number is not None else ""
        caption = self.caption(node)
        if node.note is not None:
            note = f'<span class="prose">{self.prose(node.note)}</span>'
            caption += f' <span class="note">{_TRIANGLE} {note}</span>'
        out = [f"<figcaption><b>Algorithm{number}:</b> {caption}</figcaption>"]
        out += [f'<div class="comment">/* {self.prose(c)} */</div>' for c in node.comments]
        for block in node.blocks:
            lines = "".join(f'<div class="line">{line}</div>'
                            for line in self.items_tex(block.items, 0))
            out.append(f'<div class="block"><b class="kw">{escape(block.kind)}:</b>'
                       f'<div class="items">{lines}</div></div>')
        steps = [line for step in node.steps for line in self.step_tex(step, 0)]
        if steps:
            out += ['<div class="steps">', *steps, "</div>"]
        if self.wrapped:  # the rules a step in pieces needs, in whatever page shows the figure
            out.append(f"<style>{LINES_CSS}</style>")
        return out


def split_rows(markup: str) -> list[str]:
    """MathML split at each BREAK into pieces that are MathML of their own: a piece closes the
    `<mrow>`s open at its end and the next opens them again (a break inside any other element
    is dropped: it cannot be split)."""
    out: list[str] = []
    stack: list[tuple[str, str]] = []  # the elements open here: name, start tag
    start, reopened = 0, ""
    for m in _TAG.finditer(markup):
        if m.group(0) == BREAK:
            if all(name == "mrow" for name, _ in stack):
                closing = "".join(f"</{name}>" for name, _ in reversed(stack))
                out.append(reopened + markup[start:m.start()] + closing)
                reopened, start = "".join(tag_ for _, tag_ in stack), m.end()
        elif m.group(1):
            stack.pop()
        elif not m.group(3):
            stack.append((m.group(2), m.group(0)))
    return [piece.replace(BREAK, "") for piece in [*out, reopened + markup[start:]]]


def _unwrapped(markup: str) -> str:
    """`markup` without an `<mrow>` around all of it: `<math>` is a row itself."""
    if not markup.startswith("<mrow>") or not markup.endswith("</mrow>"):
        return markup
    depth = 0
    for tag_ in re.finditer(r"<(/?)mrow\b[^>]*>", markup):
        depth += -1 if tag_.group(1) else 1
        if depth == 0:
            return markup[len("<mrow>"):-len("</mrow>")] if tag_.end() == len(markup) else markup
    return markup


def _kw(word: str) -> str:
    return f'<b class="kw">{word}</b>'


def _depth(depth: int) -> str:
    """A loop body's row: its number moves back to the margin by the bodies' indentation."""
    return f' style="--depth: {depth}"' if depth else ""


def _number(text: str | None) -> str:
    return f'<span class="no">{escape(text)}</span>' if text is not None else ""


def _css_ident(text: str) -> str:
    """`text` as a CSS identifier: anything but ASCII letters, digits, `-` and `_` escaped, so
    that no name can end the rule or the `<style>`."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_") else f"\\{ord(c):x} "
                   for c in text)


# ---------------------------------------------------------------------- API

CSS = """\
:root {
  --ink: #1d1d1f; --muted: #6b6b70; --rule: #1d1d1f; --link: #1f4e8c;
  --hover: #fde68a; --tip: #fffdf4; --tip-edge: #c8b27a;
  --math: 'Latin Modern Math', 'STIX Two Math', 'Cambria Math', math, serif;
  --text: 'Latin Modern Roman', 'STIX Two Text', 'Latin Modern Math', 'Times New Roman', serif;
  --mono: 'Latin Modern Mono', 'DejaVu Sans Mono', monospace;
  color-scheme: light;
}
body { margin: 2rem auto; max-width: 60rem; padding: 0 1.5rem; color: var(--ink);
  background: #fff; font: 17px/1.45 var(--text); }
h1 { font-size: 1.35rem; font-weight: normal; font-family: var(--mono); }
h2 { font-size: 1.2rem; margin-top: 2.5rem; }
math { font-family: var(--math); font-size: 1.05em; }
.source { color: var(--muted); font-family: var(--mono); font-size: .85rem; margin: 1.5rem 0 0; }
figure.algorithm { margin: 1rem 0 2rem; border-top: 2px solid var(--rule);
  border-bottom: 2px solid var(--rule); padding: 0 0 .4rem; }
figure.algorithm figcaption { padding: .3rem 0; border-bottom: 1px solid var(--rule);
  margin-bottom: .35rem; }
.algorithm .comment { font-family: var(--mono); font-size: .92em; padding-left: 1.2rem; }
.algorithm .block { display: flex; gap: .35em; padding-left: 1.2rem; }
.algorithm .block > .kw { white-space: nowrap; }
.algorithm .items { flex: 1; min-width: 0; }
.algorithm .indent { display: inline-block; width: 1.5em; }
.algorithm .steps { padding-left: 1.2rem; }
.algorithm .step { display: flex; flex-wrap: wrap; align-items: baseline; gap: 0 .3rem;
  min-height: 1.45em; }
.algorithm .tri { font-family: var(--math); font-size: .8em; }
.algorithm .step .code { flex: 1 1 auto; }
.algorithm .no { position: relative; left: calc(var(--depth, 0) * (-1.3rem - 1px));
  flex: 0 0 .9rem; margin-left: -1.2rem; text-align: right; font-size: .8em;
  font-weight: bold; }
.algorithm .note { margin-left: auto; padding-left: 1em; text-align: right; white-space: nowrap; }
.algorithm .note .prose { font-family: var(--mono); font-size: .92em; }
.algorithm .body { margin-left: .3rem; padding-left: 1rem; border-left: 1px solid var(--rule); }
.algorithm .step:target { background: var(--hover); }
.algorithm a.no { color: inherit; text-decoration: none; }
.algorithm a.no:hover { color: var(--link); text-decoration: underline; }
.algorithm mtext.call a { color: var(--link); text-decoration: none; }
.algorithm mtext.call a:hover { text-decoration: underline; }
.algorithm .b { font-weight: bold; }
.algorithm .ic { padding-inline-end: .1em; }
.algorithm .tip { display: none; position: fixed; right: 1rem; bottom: 1rem; z-index: 10;
  max-width: min(34rem, calc(100vw - 2rem)); padding: .45rem .8rem; pointer-events: none;
  background: var(--tip); border: 1px solid var(--tip-edge); border-radius: 4px;
  box-shadow: 0 2px 10px rgba(0, 0, 0, .15); font: 1rem/1.4 var(--math); }
@media print {
  body { margin: 0; max-width: none; font-size: 11pt; }
  .algorithm .tip { display: none !important; }
  .algorithm mtext.call a { color: inherit; }
  figure.algorithm { break-inside: avoid; }
}
"""


def anchor(alg: s.Algorithm) -> str:
    """The id of an algorithm's figure: `alg-` and its label."""
    return f"alg-{alg.label or alg.number or 'untitled'}"


def algorithm_html(alg: s.Algorithm, checker: Checker | None, link: Link, *,
                   line_ids: bool = True) -> str:
    """One algorithm as a `<figure>`, with the `<style>` of its tips. `link` gives the href of
    a card it calls (None: no link); `line_ids=False` leaves the steps' `id="L…"` out (a page
    holding cards from several files)."""
    r = typography(checker, alg, HtmlRenderer)
    assert isinstance(r, HtmlRenderer)
    r.attach(checker, alg, link)
    r.line_ids = line_ids
    lines = r.algorithm_tex(alg)
    lines += r.tip_html(anchor(alg))
    return f'<figure class="algorithm" id="{escape(anchor(alg))}">\n' + "\n".join(lines) + \
        "\n</figure>\n"


def assignments_html(alg: s.Algorithm, checker: Checker | None,
                     values: list[tuple[str, str]]) -> str:
    """`name = value, …` (a preset's hyperparameters, each value a number as written) as
    MathML, a `<math>` a pair: each name set as `alg`'s figure sets it, without its tip."""
    r = typography(checker, alg, HtmlRenderer)
    assert isinstance(r, HtmlRenderer)
    r.plain = True
    return ", ".join(r.math(row(r.name_math(k), mo("="), number(v))) for k, v in values)


def link_step(figure: str, line: int, href: str) -> str:
    """`figure` (from algorithm_html) with the step of source line `line` linked to `href`:
    its number becomes the link (a step without a number gets a ›); no such step, no change."""
    step = re.search(rf'<div class="step[^"]*"[^>]*? data-line="{line}"[^>]*>', figure)
    if step is None:
        return figure
    at = step.end()
    no = re.match(r'<span class="no">([^<]*)</span>', figure[at:])
    text, end = (no.group(1), at + no.end()) if no else ("›", at)
    return f'{figure[:at]}<a class="no" href="{escape(href)}">{text}</a>{figure[end:]}'


def page(title: str, body: str, css: str = CSS) -> str:
    """A whole HTML5 document around `body`: no script, nothing fetched."""
    return ("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{escape(title)}</title>\n<style>\n{css}</style>\n</head>\n<body>\n"
            f"{body}</body>\n</html>\n")


def callees(algs: list[s.Algorithm], checker: Checker | None) -> list[s.Algorithm]:
    """The cards `algs` call, directly or through each other, that are not among them; each
    once, in the order the calls are found."""
    seen = {id(a) for a in algs}
    out: list[s.Algorithm] = []
    queue = list(algs)
    while queue and checker is not None:
        info = checker.infos.get(id(queue.pop(0)))
        for call in info.calls.values() if info else ():
            if isinstance(call.callee, s.Algorithm) and id(call.callee) not in seen:
                seen.add(id(call.callee))
                out.append(call.callee)
                queue.append(call.callee)
    return out


def render_cards(cards: list[s.CardFile], checker: Checker | None) -> str:
    """One page: the cards' algorithms, then the cards they call from elsewhere, linked."""
    own = [alg for card in cards for alg in card.algorithms]
    others = callees(own, checker)
    targets = {id(a): "#" + anchor(a) for a in own + others}

    def link(alg: s.Algorithm) -> str | None:
        return targets.get(id(alg))

    body = []
    for card in cards:
        body.append(f"<h1>{escape(card.path)}</h1>\n")
        body += [algorithm_html(alg, checker, link) for alg in card.algorithms]
    if others:
        body.append(f"<h2>Cards {'it calls' if len(cards) == 1 else 'they call'}</h2>\n")
        for alg in others:
            body.append(f'<p class="source">{escape(_shown(alg.span.file))}</p>\n')
            body.append(algorithm_html(alg, checker, link, line_ids=False))
    title = ", ".join(a.label or "" for a in own) or ", ".join(c.path for c in cards)
    return page(title, "".join(body))


def _shown(path: str) -> str:
    """A card's path as the page names it: relative to the working directory below it."""
    rel = os.path.relpath(os.path.abspath(path))
    return path if rel.startswith("..") else rel


def render_html(card: s.CardFile, checker: Checker | None) -> str:
    """The standalone page of one card file (`cardc render --to html`)."""
    return render_cards([card], checker)
