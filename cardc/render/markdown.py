"""A card as Markdown, its math as `$…$` as GitHub renders it (MathJax).

The layout is the LaTeX rendering's (cardc.render.latex), line for line: the signature in bold,
the `/* … */` comments in italics, the blocks, then the steps with their numbers, keywords in
bold and bodies indented, annotations after ▷. The math is the LaTeX renderer's, with braces
written `\\lbrace`/`\\rbrace`, which Markdown's backslash escapes leave alone; prose has
Markdown's special characters escaped, so that no card text turns into links, emphasis or HTML.
"""

from __future__ import annotations

import re

from .. import syntax as s
from ..checker import Checker
from .latex import CONJ, POSTFIX, LatexRenderer, symbol, typography

_SPECIAL = re.compile(r"([\\`*_\[\]<>#|$~&])")  # what can start markup mid-line
INDENT = "&emsp;&emsp;"


def md_text(prose: str) -> str:
    """Prose with every character Markdown gives a meaning backslash-escaped."""
    return _SPECIAL.sub(r"\\\1", prose)


def _math(tex: str) -> str:
    """Inline math as GitHub reads it: braces that Markdown would unescape spelled out."""
    tex = tex.replace(r"\{", r"\lbrace ").replace(r"\}", r"\rbrace ")
    return f"${tex}$"


class MarkdownRenderer:
    """Card AST → Markdown, the math from a LaTeX renderer that knows the card's types."""

    def __init__(self, latex: LatexRenderer):
        self.tex = latex

    def math(self, node) -> str:
        return _math(self.tex.text(node))

    def algorithm(self, node: s.Algorithm) -> list[str]:
        number = f" {node.number}" if node.number is not None else ""
        head = f"**Algorithm{md_text(number)}:** "
        if node.name is None:
            head += md_text(node.title or "")
        else:
            head += _math(self.tex.caption(node).strip("$"))
        out = [head, ""]
        out += [f"*/\\* {md_text(c)} \\*/*  " for c in node.comments]
        for block in node.blocks:
            lines = self.items(block.items, 0)
            first = lines[0] if lines else ""
            out.append(f"**{block.kind}:** {first}  ")
            out += [line + "  " for line in lines[1:]]
        for step in node.steps:
            out += self.step(step, 0)
        return [*out, ""]

    def items(self, items: tuple[s.Item, ...], depth: int) -> list[str]:
        lines: list[str] = []
        run: list[str] = []
        pad = INDENT * depth

        def flush() -> None:
            nonlocal run
            if run:
                lines.append(pad + ", ".join(run))
            run = []

        for item in items:
            if isinstance(item, s.Decl):
                text = _math(self.tex.decl_math(item))
                if item.pad is not None:
                    text += f", padding row {_math(symbol(item.pad))}"
                if item.prose is not None:
                    text += ", " + md_text(item.prose)
                run.append(text + md_text(item.end))
                if item.prose is not None or item.end:
                    flush()
                continue
            flush()
            lines += self.item(item, depth)
        flush()
        return lines

    def item(self, item: s.Item, depth: int) -> list[str]:
        pad = INDENT * depth
        if isinstance(item, s.Bundle):
            head = f"{_math(symbol(item.name))} {md_text(item.intro)}:"
            if item.prose is not None:
                head += " " + md_text(item.prose)
            return [pad + head, *self.items(item.items, depth + 1)]
        if isinstance(item, s.Family):
            binder = "=" if isinstance(item.over, s.Range) else r"\in"
            head = f"For {_math(f'{symbol(item.index)} {binder} {self.tex.text(item.over)}')}:"
            return [pad + head, *self.items(item.items, depth + 1)]
        if isinstance(item, s.Dataset):
            elems = ", ".join(symbol(e) for e in item.elems)
            if len(item.elems) > 1:
                elems = rf"\left({elems}\right)"
            math = _math(rf"\{{{elems}\}}_{{{symbol(item.index)}={self.tex.text(item.lo)}}}"
                         rf"^{{{self.tex.text(item.hi)}}}")
            return [pad + math + ("" if item.prose is None else ", " + md_text(item.prose))]
        if isinstance(item, s.Sentence):
            return [pad + md_text(item.text)]
        return []

    def stmt(self, node: s.Stmt) -> str:
        tex = self.tex
        if isinstance(node, s.Assign):
            op = r"\gets" if node.op == "←" else "="
            return _math(f"{tex.sub(node.target, POSTFIX)} {op} {tex.text(node.value)}")
        if isinstance(node, s.Return):
            name = "" if node.name is None else \
                f"{symbol(node.name, node.name in tex.bold)} = "
            return "**return** " + _math(name + tex.text(node.value))
        if isinstance(node, s.Sample):
            return f"**sample** a token {_math(symbol(node.var))} from " + \
                _math(rf"{symbol(node.dist)} \propto {tex.text(node.weights)}")
        if isinstance(node, s.ForAll):
            names = ", ".join(symbol(v) for v in node.vars)
            return _math(rf"\forall {names}") + ", " + self.stmt(node.body)
        if isinstance(node, s.If):
            return f"**if** {_math(tex.sub(node.cond, CONJ))} **then** {self.stmt(node.then)}"
        if isinstance(node, s.For):
            body = " ".join(self.stmt(step.stmt) for step in node.body)
            return f"**for** {_math(tex.loop_head(node))} : {body}"
        raise TypeError(f"cannot render {type(node).__name__} as a line")

    def step(self, node: s.Step, depth: int) -> list[str]:
        number = md_text(node.number) + " " if node.number is not None else ""
        pad = INDENT * depth
        out = [f"{pad}*/\\* {md_text(c)} \\*/*  " for c in node.comments]
        stmt = node.stmt
        side = ""
        if node.where is not None:
            side += ", where " + md_text(node.where)
        if node.annotation is not None:
            side += " ▷ " + _math(self.tex.decl_math(node.annotation, label=True))
        if node.note is not None:
            side += " ▷ " + md_text(node.note)
        opens = isinstance(stmt, s.While) or isinstance(stmt, s.For) and stmt.style != "map"
        if not opens:
            return [*out, f"{number}{pad}{self.stmt(stmt)}{side}  "]
        if isinstance(stmt, s.While):
            head = f"**while** {_math(self.tex.sub(stmt.cond, CONJ))} **do**"
        else:
            head = f"**for** {_math(self.tex.loop_head(stmt))} **do**"
        out.append(f"{number}{pad}{head}{side}  ")
        for step in stmt.body:
            out += self.step(step, depth + 1)
        if isinstance(stmt, s.While) or stmt.style == "do":
            end = md_text(stmt.end_number) + " " if stmt.end_number is not None else ""
            out.append(f"{end}{pad}**end**  ")
        return out


def render_markdown(card: s.CardFile, checker: Checker | None = None) -> str:
    """Markdown of every algorithm of `card`, a horizontal rule between them."""
    parts = ["\n".join(MarkdownRenderer(typography(checker, alg)).algorithm(alg))
             for alg in card.algorithms]
    return "\n---\n\n".join(parts)
