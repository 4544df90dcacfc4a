"""The canonical text of a card: its AST written back as pseudocode in the paper's notation.

``parse(render_card(parse(src))) == parse(src)`` for every card, and rendering is idempotent,
so ``cardc fmt`` can rewrite files in place. Output is composed Unicode (NFC) for display.

Rendering dispatches on the node's class with ``cardc.syntax.dispatch``, as every visitor does:
``Renderer.text(node)`` calls the method ``text_<Kind>`` (one line of text: expressions, types,
statement heads) and ``Renderer.lines`` calls ``lines_<Kind>`` (constructs that span lines:
algorithms, blocks, bundles, steps), where ``<Kind>`` is the class name (``text_BinOp``).

Expressions get the fewest parentheses the grammar allows, from a precedence table that mirrors
``grammar.lark`` (``?cond``, ``?sum``, ``?product``, ``?unary``, ``?tight``, ``?postfix``, ``?atom``).
Values of typed declarations have a smaller grammar of their own (``?value``, ``?vterm``,
``?vatom``) and are rendered by a subclass with that grammar's precedences; a definition
``d = D/H`` holds an expression.

Canonical layout:

* the header, its ``▷`` note, then the ``/* … */`` comments;
* the blocks in their order. Consecutive typed declarations share a line, joined by ``, ``; a
  declaration without a type (``H, prose``, ``d = D/H``) is joined by ``; `` (after ``, `` it
  would read as prose); a declaration with prose ends its line, and so does one written at the
  end of a line with a comma or a full stop (the paper prints long lists so, ``Decl.end``); a
  line breaks before it would pass 100 columns. The first line sits on the block's own line (``Input: X ∈ …``), and so does a
  bundle or family that is the block's only item (``Parameters: W consisting of:``); every other
  line is indented 4 spaces, and the items of a bundle or family 4 more;
* presets, one a line;
* the steps. A step's number is written exactly as the AST holds it (numbers are compared in
  the AST, so renumbering would not round-trip), right-aligned so that statements line up; a
  step without one gets none; the ``end`` of a loop keeps the number it was written with
  (the paper's ``9 end``). Loop bodies are indented 4 spaces a level; a step's annotation and
  note follow two spaces and ``▷``.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache

from .. import syntax as s
from ..builtins import BRACKETS, SUBSCRIPTED
from ..diagnostics import Diagnostics
from ..spelling import display

# precedence levels, loosest first, as in grammar.lark (a random choice is an ?expr);
# GROUPED is tighter than anything: an operand held to it is always parenthesised
CHOICE, CONJ, COND, SUM, PRODUCT, UNARY, TIGHT, POSTFIX, ATOM, GROUPED = range(10)

_BINARY = {"+": SUM, "−": SUM, "·": PRODUCT, "⊙": PRODUCT, "/": PRODUCT, " ": PRODUCT,
           "mod": PRODUCT}
_POSTFIX_NODES = (s.Power, s.Transpose, s.Index)
# the written operators a reader takes as binding looser than each product (Renderer.left_min)
_LOOSER_TO_READ = {" ": ("⊙", "/", "mod"), "·": ("⊙", "/", "mod")}

# an index's "[" must touch a character that grammar.lark's INDEX_OPEN accepts
_INDEXABLE_END = re.compile(r"[\w\u0302\u0303′'~)\]}⊺²]$")

INDENT = "    "
WIDTH = 100


class Renderer:
    """Card AST → canonical text."""

    # ------------------------------------------------------------------ dispatch

    def text(self, node: object, tail: bool = True) -> str:
        """One line of text for ``node``.

        ``tail`` says whether the text may end the enclosing product: a Σ's body runs as far
        right as a product does, so a Σ that something product-level follows needs parentheses.
        """
        return s.dispatch(self, "text", node, tail)

    def lines(self, node: object, depth: int = 0) -> list[str]:
        return s.dispatch(self, "lines", node, depth)

    # ------------------------------------------------------------------ precedence

    def precedence(self, node: object) -> int:
        if isinstance(node, s.BinOp):
            if node.op == "∧":
                return CONJ
            return _BINARY.get(node.op, COND)  # anything else is a comparison
        if isinstance(node, s.Unary):
            return {"−": UNARY, "¬": COND}.get(node.op, TIGHT)
        if isinstance(node, s.Sum):
            return TIGHT
        if isinstance(node, s.Choice):
            return CHOICE
        if isinstance(node, _POSTFIX_NODES):
            return POSTFIX
        if isinstance(node, s.Call) and notation(node) in SUBSCRIPTED:
            return TIGHT  # log₂ x binds as √x does
        return ATOM

    def sub(self, node: object, min_prec: int, tail: bool = True) -> str:
        """``node`` as an operand that must bind at least as tightly as ``min_prec``."""
        if self.precedence(node) < min_prec or (not tail and isinstance(node, s.Sum)):
            return f"({self.text(node)})"
        return self.text(node, tail)

    def left_min(self, node: s.BinOp) -> int:
        """The level the left operand of ``node`` needs: the grammar's, or more where a reader
        would group it otherwise.

        The grammar reads ``⊙``, ``·``, ``/`` and juxtaposition alike, left to right. A person
        reads by another table, tightest first: postfix ``^⊺``, ``²``, indices and calls; ``√``;
        the products, juxtaposition and ``·``; then ``⊙`` and ``/``; a leading ``−``; ``+`` and
        ``−``. So ``H ⊙ H W`` reads ``H ⊙ (H W)`` and ``1/N · Σ…`` reads ``1/(N · Σ…)``: where
        the parse groups a looser written operator first, it keeps its parentheses,
        ``(H ⊙ H) W``. Elsewhere the two tables agree, or their readings are equal: a leading
        ``−`` negates its product whichever way it is grouped, and juxtaposition and ``·`` are
        associative.
        """
        left = node.left
        if isinstance(left, s.BinOp) and left.op in _LOOSER_TO_READ.get(node.op, ()):
            return GROUPED
        return self.precedence(node)

    # the operand levels a binary operator needs, overridden for declaration values
    def right_min(self, op: str) -> int:
        if op in ("+", "−"):
            return PRODUCT
        return TIGHT if op == " " else UNARY

    def negand_min(self) -> int:
        return UNARY

    # ------------------------------------------------------------------ expressions

    def text_Name(self, node: s.Name, tail: bool) -> str:
        return node.id

    def text_Num(self, node: s.Num, tail: bool) -> str:
        return node.text

    def text_BinOp(self, node: s.BinOp, tail: bool) -> str:
        prec = self.precedence(node)
        if prec == CONJ:  # c ∧ c′, grouping to the left
            return f"{self.sub(node.left, CONJ)} ∧ {self.sub(node.right, COND, tail)}"
        if prec == COND:  # comparisons: sum CMP sum, not associative
            return f"{self.sub(node.left, SUM)} {node.op} {self.sub(node.right, SUM, tail)}"
        left = self.sub(node.left, self.left_min(node), tail=prec == SUM)
        right = self.sub(node.right, self.right_min(node.op), tail)
        if node.op == "/":
            return f"{left}/{right}"
        return f"{left} {right}" if node.op == " " else f"{left} {node.op} {right}"

    def text_Unary(self, node: s.Unary, tail: bool) -> str:
        if node.op == "−":
            return "−" + self.sub(node.operand, self.negand_min(), tail)
        if node.op == "¬":
            return "¬" + self.sub(node.operand, COND, tail)
        return node.op + self.sub(node.operand, TIGHT, tail)  # √, ∇

    def text_Power(self, node: s.Power, tail: bool) -> str:
        base = self.sub(node.base, POSTFIX)
        if node.exponent == s.Num("2"):
            return base + "²"
        if isinstance(node.base, s.Name) and not (
                isinstance(node.exponent, s.Num) and node.exponent.text.isdigit()):
            base = f"({base})"  # "X^{e}" would read as the name X^{e}; X^{3} is the power
        return f"{base}^{{{self.sub(node.exponent, SUM)}}}"

    def text_Transpose(self, node: s.Transpose, tail: bool) -> str:
        return self.sub(node.operand, POSTFIX) + "^⊺"

    def text_Index(self, node: s.Index, tail: bool) -> str:
        base = self.sub(node.base, POSTFIX)
        if not _INDEXABLE_END.search(unicodedata.normalize("NFD", base)):  # ∞[i]
            base = f"({base})"
        return f"{base}[{', '.join(self.sub(i, SUM) for i in node.items)}]"

    def text_Slice(self, node: s.Slice, tail: bool) -> str:
        lo = "" if node.lo is None else self.sub(node.lo, SUM)
        hi = "" if node.hi is None else self.sub(node.hi, SUM)
        if lo and hi:
            return f"{lo} : {hi}"
        return f"{lo}:{hi}"

    def text_Progression(self, node: s.Progression, tail: bool) -> str:
        return f"{self.sub(node.first, SUM)}, {self.sub(node.second, SUM)}, …, " \
               f"{self.sub(node.last, SUM)}"

    def text_Arg(self, node: s.Arg, tail: bool) -> str:
        return f"{self.sub(node.target, POSTFIX)} {node.op} {self.text(node.value)}"

    def text_Call(self, node: s.Call, tail: bool) -> str:
        written = notation(node)
        if written in BRACKETS:  # ⌊x⌋, ⌈x⌉, |x|
            left, right = BRACKETS[written]
            return f"{left}{self.text(node.args[0])}{right}"
        if written in SUBSCRIPTED:  # log₂ x, as √x: its operand binds tightly
            operand = self.sub(node.args[0], TIGHT, tail)
            return SUBSCRIPTED[written] + ("" if operand.startswith("(") else " ") + operand
        return self.called(node, ", ".join(self.text(a) for a in node.args))

    def called(self, node: s.Call, args: str) -> str:
        """`node` called with its arguments written `args`."""
        if node.params or node.bar:
            params = ", ".join(self.text(p) for p in node.params)
            args = f"{args} | {params}" if args else f"| {params}"
        return f"{node.func}({args})"

    def text_Ellipsis(self, node: s.Ellipsis_, tail: bool) -> str:
        return "…"

    def text_Concat(self, node: s.Concat, tail: bool) -> str:
        return "[" + f"{node.sep} ".join(self.sub(i, SUM) for i in node.items) + "]"

    def text_Several(self, node: s.Several, tail: bool) -> str:
        return ", ".join(self.sub(i, SUM) for i in node.items)

    def text_Iverson(self, node: s.Iverson, tail: bool) -> str:
        return f"[[{self.text(node.cond)}]]"

    def text_Norm(self, node: s.Norm, tail: bool) -> str:
        return f"‖{self.text(node.operand)}‖"

    def text_Sum(self, node: s.Sum, tail: bool) -> str:
        if node.over is not None:
            head = f"Σ_{{{node.index}∈{self.sub(node.over, SUM)}}}"
        elif node.lo is None and node.hi is None:  # Σ_u: braces only where the index needs them
            head = f"Σ_{node.index}" if re.fullmatch(r"\w+", node.index) else f"Σ_{{{node.index}}}"
        else:
            lo = "" if node.lo is None else self.sub(node.lo, SUM)
            hi = "" if node.hi is None else self.sub(node.hi, SUM)
            head = f"Σ_{{{node.index}={lo}}}^{{{hi}}}"
        return f"{head} {self.sub(node.body, PRODUCT, tail)}"

    def text_Choice(self, node: s.Choice, tail: bool) -> str:
        options = " or ".join(self.sub(x, SUM) for x in node.options)
        probs = " or ".join(self.sub(x, SUM) for x in node.probs)
        return f"{options} randomly with probability {probs}"

    def text_SetBuilder(self, node: s.SetBuilder, tail: bool) -> str:
        cond = node.cond
        if isinstance(cond, s.BinOp) and cond.op == "=":
            text = f"{self.sub(cond.left, SUM)} = {self.sub(cond.right, SUM)}"
        else:
            text = self.sub(cond, COND)
        return f"{{{node.var} ∈ {self.sub(node.domain, SUM)} : {text}}}"

    def text_Range(self, node: s.Range, tail: bool) -> str:
        return ", ".join([*(self.text(x) for x in node.first), "…", self.text(node.last)])

    # ------------------------------------------------------------------ types

    def text_Scalar(self, node: s.Scalar, tail: bool) -> str:
        return node.set

    def text_Interval(self, node: s.Interval, tail: bool) -> str:
        lo, hi = "[" if node.lo_closed else "(", "]" if node.hi_closed else ")"
        return f"{lo}{self.text(node.lo)}, {self.text(node.hi)}{hi}"

    def text_Bits(self, node: s.Bits, tail: bool) -> str:
        return "{0,1}"

    def text_IntRange(self, node: s.IntRange, tail: bool) -> str:
        return f"{{{self.text(node.lo)}..{self.text(node.hi)}}}"

    def text_Formats(self, node: s.Formats, tail: bool) -> str:
        return f"{{{', '.join(node.names)}}}"

    def text_Finite(self, node: s.Finite, tail: bool) -> str:
        return f"[{self.text(node.size)}]"

    def text_Sequences(self, node: s.Sequences, tail: bool) -> str:
        return f"{node.of}*"

    def text_Iso(self, node: s.Iso, tail: bool) -> str:
        return f"{node.name} ≅ {self.text(node.of)}"

    def text_Simplex(self, node: s.Simplex, tail: bool) -> str:
        return f"Δ({node.over})"

    def text_Tensor(self, node: s.Tensor, tail: bool) -> str:
        return f"{self.text(node.elem)}^{{{'×'.join(self.dim_text(node, d) for d in node.dims)}}}"

    def text_CardType(self, node: s.CardType, tail: bool) -> str:
        window = f" for {node.length} ≤ {node.window}" if node.window else ""
        return f"{self.text(node.input)} → {self.text(node.output)}{window}"

    def dim_text(self, node: s.Tensor, d: s.Expr) -> str:
        """× binds loosest, so `ctx + 2×D` already means (ctx + 2)×D; the parentheses are for
        the reader."""
        sum_ = isinstance(d, s.BinOp) and d.op in ("+", "−") and len(node.dims) > 1
        return f"({self.text(d)})" if sum_ else self.text(d)

    # ------------------------------------------------------------------ declarations

    def text_Decl(self, node: s.Decl, tail: bool) -> str:
        """A declaration without its prose, which the line that holds it adds."""
        out = ", ".join(node.names)
        if node.type is not None:
            out += f" ∈ {self.text(node.type)}"
        if node.value is not None:  # `d = D/H` is a bind: an expression, not a typed value
            out += f" = {(VALUES if node.type is not None else TEXT).text(node.value)}"
        if node.init is not None:
            init = node.init
            if isinstance(init, s.Call):
                out += f" ~ {init.func}({', '.join(VALUES.text(a) for a in init.args)})"
            else:
                out += f" ~ {VALUES.text(init)}"
        if node.pad is not None:
            out += f", padding row {node.pad}"
        if node.seed:
            out += ", seed of every random draw"
        if node.format_of is not None:
            out += f", number format of {node.format_of}"
        return out

    def decl_line_text(self, node: s.Decl) -> str:
        text = self.text_Decl(node, True)
        if node.prose is None:
            return text
        return text + prose_suffix(node.prose, needs_prose=node.type is None and node.value is None)

    def item_lines(self, items: tuple[s.Item, ...], depth: int) -> list[str]:
        """Declarations filled into lines (see the module docstring); bundles and families."""
        pad = INDENT * depth
        out: list[str] = []
        line: list[str] = []  # the current line's declarations with their separators
        prev: s.Decl | None = None
        for item in items:
            if not isinstance(item, s.Decl):
                if line:
                    out.append(pad + "".join(line))
                line, prev = [], None
                out += self.lines(item, depth)
                continue
            text = self.decl_line_text(item)
            if line:
                sep = ", " if prev is not None and prev.type and item.type else "; "
                if len(pad) + sum(map(len, line)) + len(sep) + len(text) > WIDTH:
                    out.append(pad + "".join(line))
                    line = []
                else:
                    text = sep + text
            line.append(text)
            prev = item
            if item.prose is not None or item.end:  # prose runs to the end of its line
                line.append(item.end)
                out.append(pad + "".join(line))
                line, prev = [], None
        if line:
            out.append(pad + "".join(line))
        return out

    def lines_Bundle(self, node: s.Bundle, depth: int) -> list[str]:
        head = f"{node.name} {node.intro}:"
        if node.prose is not None:
            head += prose_suffix(node.prose)
        return [INDENT * depth + head, *self.item_lines(node.items, depth + 1)]

    def lines_Family(self, node: s.Family, depth: int) -> list[str]:
        over = self.text(node.over)
        binder = "=" if isinstance(node.over, s.Range) else "∈"
        head = f"For {node.index} {binder} {over}"
        items = node.items
        if len(items) == 1 and isinstance(items[0], s.Bundle) and binder == "∈":
            bundle = items[0]  # For h ∈ [H], W^h consisting of:
            head += f", {bundle.name} {bundle.intro}:"
            if bundle.prose is not None:
                head += prose_suffix(bundle.prose)
            items = bundle.items
        else:
            head += ":"
        return [INDENT * depth + head, *self.item_lines(items, depth + 1)]

    def lines_Dataset(self, node: s.Dataset, depth: int) -> list[str]:
        elems = node.elems[0] if len(node.elems) == 1 else f"({', '.join(node.elems)})"
        text = f"{{{elems}}}_{{{node.index}={self.text(node.lo)}}}^{{{self.text(node.hi)}}}"
        if node.prose is not None:
            text += prose_suffix(node.prose)
        return [INDENT * depth + text]

    def lines_Sentence(self, node: s.Sentence, depth: int) -> list[str]:
        return [INDENT * depth + node.text]  # reads back only as the first item of a block

    def lines_Block(self, node: s.Block, depth: int) -> list[str]:
        head = f"{node.kind}:"
        items = node.items
        if not items:
            return [head]
        if isinstance(items[0], s.Sentence):  # Input: Trained transformer parameters θ̂.
            return [f"{head} {items[0].text}", *self.item_lines(items[1:], depth + 1)]
        if len(items) == 1 and not isinstance(items[0], s.Decl):  # Parameters: W consisting of:
            first, *rest = self.item_lines(items, depth)
            return [f"{head} {first}", *rest]
        body = self.item_lines(items, depth + 1)
        if isinstance(items[0], s.Decl):
            return [f"{head} {body[0].lstrip()}", *body[1:]]
        return [head, *body]

    def lines_Preset(self, node: s.Preset, depth: int) -> list[str]:
        values = ", ".join(f"{name} = {self.text(v)}" for name, v in node.values)
        line = f"Preset {node.name}: {values}"
        return [line + (f"  ▷ {node.prose}" if node.prose is not None else "")]

    # ------------------------------------------------------------------ statements

    def text_Assign(self, node: s.Assign, tail: bool) -> str:
        return f"{self.sub(node.target, POSTFIX)} {node.op} {self.text(node.value)}"

    def text_Return(self, node: s.Return, tail: bool) -> str:
        name = f"{node.name} = " if node.name is not None else ""
        return f"return {name}{self.text(node.value)}"

    def text_Sample(self, node: s.Sample, tail: bool) -> str:
        return f"sample a token {node.var} from {node.dist} ∝ {self.weights_text(node.weights)}"

    def weights_text(self, node: s.Expr) -> str:
        """`p^{1/τ}` as the paper writes it: there the parser reads such a name as a power."""
        if isinstance(node, s.Power) and isinstance(node.base, s.Name) and node.exponent != s.Num("2"):
            exponent = self.sub(node.exponent, SUM)
            if not re.search(r"[{}\n]", exponent) and not re.search(r"[′']$", node.base.id):
                return f"{node.base.id}^{{{exponent}}}"
        if isinstance(node, s.Name) and node.id.endswith("}"):  # W^{e/d} itself, not a power
            return f"({node.id})"
        if isinstance(node, s.Call) and node.func in s.FILTERS and node.args:  # top_k(p^{1/τ} | k)
            return self.called(node, ", ".join([self.weights_text(node.args[0]),
                                                *(self.text(a) for a in node.args[1:])]))
        return self.text(node)

    def text_For(self, node: s.For, tail: bool) -> str:
        over = self.text(node.over)
        if node.style == "block":
            return f"For {node.var} {node.binder} {over}:"
        head = f"for {node.var} {node.binder} {over}"
        if node.style == "map":
            body = " ".join(self.text(step.stmt) for step in node.body)
            return f"{head} : {body}"
        return f"{head} do"

    def text_While(self, node: s.While, tail: bool) -> str:
        return f"while {self.sub(node.cond, CONJ)} do"

    def text_ForAll(self, node: s.ForAll, tail: bool) -> str:
        names = ", ".join(v if o is None else f"{v} ∈ {self.text(o)}"
                          for v, o in zip(node.vars, node.over or (None,) * len(node.vars),
                                          strict=True))
        if isinstance(node.body, s.If):  # ∀t_z, t_x, if … then …
            return f"∀{names}, {self.text(node.body)}"
        return f"∀{names}: {self.text(node.body)}"

    def text_If(self, node: s.If, tail: bool) -> str:
        return f"if {self.sub(node.cond, CONJ)} then {self.text(node.then)}"

    # ------------------------------------------------------------------ steps and algorithms

    def lines_Step(self, node: s.Step, depth: int, width: int = 0) -> list[str]:
        """A step, its body and its ``end``; ``width`` is the algorithm's widest step number."""

        def margin(number: str | None) -> str:
            if not width:
                return ""
            return (number or "").rjust(width) + " "

        stmt = node.stmt
        line = margin(node.number) + INDENT * depth + self.text(stmt)
        if node.where is not None:
            line += f", where {node.where}"
        if node.annotation is not None:
            line += f"  ▷ {self.text(node.annotation)}"
        if node.note is not None:
            line += f"  ▷ {node.note}"
        out = [f"/* {c} */" for c in node.comments] + [line]
        opens = isinstance(stmt, s.While) or isinstance(stmt, s.For) and stmt.style != "map"
        if opens:
            for step in stmt.body:
                out += self.lines_Step(step, depth + 1, width)
            if isinstance(stmt, s.While) or stmt.style == "do":
                out.append(margin(stmt.end_number) + INDENT * depth + "end")
        return out

    def lines_Algorithm(self, node: s.Algorithm, depth: int = 0) -> list[str]:
        number = f" {node.number}" if node.number is not None else ""
        if node.name is None:
            head = f"Algorithm{number}: {node.title or ''}".rstrip()
        else:
            args = ", ".join(node.args)
            if node.params:
                params = ", ".join(node.params)
                args = f"{args} | {params}" if args else f"| {params}"
            head = f"Algorithm{number}: {', '.join(node.outputs)} ← {node.name}({args})"
            if node.note is not None:
                head += f"  ▷ {node.note}"
        out = [head]
        out += [f"/* {c} */" for c in node.comments]
        for block in node.blocks:
            out += self.lines(block)
        for preset in node.presets:
            out += self.lines(preset)
        width = max((len(n) for n in _step_numbers(node.steps)), default=0)
        for step in node.steps:
            out += self.lines_Step(step, 0, width)
        return out

    def lines_CardFile(self, node: s.CardFile, depth: int = 0) -> list[str]:
        out: list[str] = []
        for i, alg in enumerate(node.algorithms):
            if i:
                out.append("")
            out += self.lines(alg)
        return out


class ValueRenderer(Renderer):
    """Declaration values (``= v``, ``~ 𝒩(0, 0.02²)``): grammar.lark's ``?value`` rules.

    There a leading minus covers a whole term (``−a b`` is ``−(a b)``) and may only start a
    value, and the right operand of ``·``, ``/`` and juxtaposition is an atom or its square.
    """

    def precedence(self, node: object) -> int:
        if isinstance(node, s.Unary) and node.op == "−":
            return SUM
        return super().precedence(node)

    def right_min(self, op: str) -> int:
        return PRODUCT if op in ("+", "−") else POSTFIX

    def negand_min(self) -> int:
        return PRODUCT


TEXT = Renderer()
VALUES = ValueRenderer()


def _step_numbers(steps: tuple[s.Step, ...]):
    for step in steps:
        if step.number is not None:
            yield step.number
        stmt = step.stmt
        if isinstance(stmt, s.While) or isinstance(stmt, s.For) and stmt.style != "map":
            yield from _step_numbers(stmt.body)
            if stmt.end_number is not None:
                yield stmt.end_number


@cache
def _prose_pattern() -> re.Pattern[str] | None:
    """grammar.lark's PROSE terminal, so that prose it would not read back becomes a note."""
    try:
        from ..lalr import tables

        return re.compile(tables().terminals["PROSE"])
    except Exception:  # a grammar without PROSE: write prose as notes
        return None


def prose_suffix(prose: str, needs_prose: bool = False) -> str:
    """``, prose``; or ``  ▷ prose`` where the prose would not lex back (``∈``, ``;``, …).

    A name declared by prose alone (``needs_prose``) must keep some ``, prose``: then the
    longest leading part that lexes stays, and the rest becomes a note (the parser joins the two
    with ``, `` again).
    """
    pattern = _prose_pattern()
    if pattern is None:
        return f"  ▷ {prose}"
    parts = prose.split(", ")
    for n in range(len(parts), 0 if needs_prose else len(parts) - 1, -1):
        head, rest = ", ".join(parts[:n]), ", ".join(parts[n:])
        if pattern.fullmatch(", " + unicodedata.normalize("NFD", head)):
            return f", {head}" + (f"  ▷ {rest}" if rest else "")
    return f"  ▷ {prose}"


# ---------------------------------------------------------------------- API


def render_algorithm(alg: s.Algorithm) -> str:
    """One algorithm as canonical text (no trailing newline)."""
    return display("\n".join(TEXT.lines(alg)))


def render_card(card: s.CardFile) -> str:
    """A card file as canonical text, algorithms separated by a blank line."""
    return display("\n".join(TEXT.lines(card))) + "\n"


def render_expr(node: s.Expr | s.Type) -> str:
    """An expression or a type in canonical notation."""
    return display(TEXT.text(node))


def format_source(text: str, file: str = "<card>") -> tuple[str, Diagnostics]:
    """Parse and re-render (``cardc fmt``). With errors the text comes back unchanged."""
    from ..parser import parse

    diags = Diagnostics()
    card = parse(text, file, diags)
    if diags.errors:
        return text, diags
    return render_card(card), diags


def notation(node: s.Call) -> str | None:
    """The builtin a call writes in the paper's own notation (⌊x⌋, |x|, log₂ x), if any: one
    argument and no parameters."""
    if len(node.args) == 1 and not node.params and not node.bar and \
            (node.func in BRACKETS or node.func in SUBSCRIPTED):
        return node.func
    return None
