"""A card as Markdown, its math as `$…$` as GitHub renders it (MathJax).

The layout is the LaTeX rendering's (cardc.render.latex), line for line: the signature in bold,
the `/* … */` comments in italics, the blocks, then the steps with their numbers, keywords in
bold and bodies indented, annotations after ▷. The math is the LaTeX renderer's, with braces
written `\\lbrace`/`\\rbrace`, which Markdown's backslash escapes leave alone (`<`, `>` as
`\\lt`, `\\gt`); math written in prose is math too (cardc.render.prose), and the rest of the prose
has Markdown's special characters escaped, so that no card text turns into links, emphasis or
HTML.
"""

from __future__ import annotations

import re

from .. import syntax as s
from ..checker import Checker
from .latex import CONJ, POSTFIX, LatexRenderer, typography

_SPECIAL = re.compile(r"([\\`*_\[\]<>#|$~&])")  # what can start markup mid-line
INDENT = "&emsp;&emsp;"


def md_text(prose: str) -> str:
    """Prose with every character Markdown gives a meaning backslash-escaped."""
    return _SPECIAL.sub(r"\\\1", prose)


def _math(tex: str) -> str:
    """Inline math as GitHub reads it: braces that Markdown would unescape spelled out, and
    `<` and `>` too, which Markdown would read as the start of HTML (`x_{<b>}`)."""
    tex = tex.replace(r"\{", r"\lbrace ").replace(r"\}", r"\rbrace ")
    return "$" + tex.replace("<", r"\lt ").replace(">", r"\gt ") + "$"


class MarkdownRenderer(LatexRenderer):
    """Card AST → Markdown: the LaTeX renderer's math and block layout, in Markdown's text."""

    indent = INDENT

    def math(self, tex: str) -> str:
        return _math(tex)

    def words(self, prose: str) -> str:
        return md_text(prose)

    def algorithm(self, node: s.Algorithm) -> list[str]:
        number = f" {node.number}" if node.number is not None else ""
        head = f"**Algorithm{md_text(number)}:** "
        if node.name is None:
            head += self.prose(node.title or "")
        else:
            head += _math(self.caption(node).strip("$"))
        out = [head, ""]
        out += [f"*/\\* {self.prose(c)} \\*/*  " for c in node.comments]
        for block in node.blocks:
            lines = self.items_tex(block.items, 0)
            first = lines[0] if lines else ""
            out.append(f"**{block.kind}:** {first}  ")
            out += [line + "  " for line in lines[1:]]
        for step in node.steps:
            out += self.step(step, 0)
        return [*out, ""]

    def stmt(self, node: s.Stmt) -> str:
        tex = self
        if isinstance(node, s.Assign):
            op = r"\gets" if node.op == "←" else "="
            return _math(f"{tex.sub(node.target, POSTFIX)} {op} {tex.text(node.value)}")
        if isinstance(node, s.Return):
            name = "" if node.name is None else f"{tex.name_math(node.name)} = "
            return "**return** " + _math(name + tex.text(node.value))
        if isinstance(node, s.Sample):
            return f"**sample** a token {_math(tex.name_math(node.var))} from " + \
                _math(rf"{tex.name_math(node.dist)} \propto {tex.text(node.weights)}")
        if isinstance(node, s.ForAll):
            return _math(rf"\forall {tex.quantified(node)}") + ", " + self.stmt(node.body)
        if isinstance(node, s.If):
            return f"**if** {_math(tex.sub(node.cond, CONJ))} **then** {self.stmt(node.then)}"
        if isinstance(node, s.For):
            body = " ".join(self.stmt(step.stmt) for step in node.body)
            return f"**for** {_math(tex.loop_head(node))} : {body}"
        raise TypeError(f"cannot render {type(node).__name__} as a line")

    def step(self, node: s.Step, depth: int) -> list[str]:
        number = md_text(node.number) + " " if node.number is not None else ""
        pad = INDENT * depth
        out = [f"{pad}*/\\* {self.prose(c)} \\*/*  " for c in node.comments]
        stmt = node.stmt
        side = ""
        if node.where is not None:
            side += ", where " + self.prose(node.where)
        if node.annotation is not None:
            side += " ▷ " + _math(self.decl_math(node.annotation, label=True))
        if node.note is not None:
            side += " ▷ " + self.prose(node.note)
        opens = isinstance(stmt, s.While) or isinstance(stmt, s.For) and stmt.style != "map"
        if not opens:
            return [*out, f"{number}{pad}{self.stmt(stmt)}{side}  "]
        if isinstance(stmt, s.While):
            head = f"**while** {_math(self.sub(stmt.cond, CONJ))} **do**"
        else:
            head = f"**for** {_math(self.loop_head(stmt))} **do**"
        out.append(f"{number}{pad}{head}{side}  ")
        for step in stmt.body:
            out += self.step(step, depth + 1)
        if isinstance(stmt, s.While) or stmt.style == "do":
            end = md_text(stmt.end_number) + " " if stmt.end_number is not None else ""
            out.append(f"{end}{pad}**end**  ")
        return out


def render_markdown(card: s.CardFile, checker: Checker | None = None) -> str:
    """Markdown of every algorithm of `card`, a horizontal rule between them."""
    parts = ["\n".join(typography(checker, alg, MarkdownRenderer).algorithm(alg))
             for alg in card.algorithms]
    return "\n---\n\n".join(parts)
