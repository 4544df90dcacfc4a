"""`cardc docs`: a static site of a card library, readable from `file://` with no server.

`index.html` lists the cards by folder; each card has a page (`<folder>-<file>.<card>.html`)
with its pseudocode (cardc.render.html: MathML, shapes on hover), its generated Python beside
it (cardc.docs.code), its presets' parameters and FLOPs, the cards it calls and that call it,
its architecture diff against the cards most like it (cardc.diff), and its LaTeX to download.
Pages are jinja2 templates (cardc/templates/docs/) with autoescaping on: card text reaches the
page as text. The site is written to a staging folder and moved into place whole, over a
folder only where that is a site cardc wrote and nothing else (runtime.runs).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from .. import syntax as s
from ..checker import Checker
from ..diagnostics import Diagnostics
from ..diff import diff_cards
from ..flops import card_cost
from ..info import PresetError, byte_size, figure, number, polynomial, summarize
from ..library import Library
from ..render import html as card_html
from ..render.latex import render_latex
from ..runtime.runs import check_destination, staged_run
from .catalog import Page, catalog
from .code import Code, card_code, stylesheet

DOCS = "docs"  # the kind of folder a site is (runtime.manifest)


@dataclass
class Preset:
    """A preset's figures as the page shows them."""

    name: str
    values: str
    parameters: str
    memory: str
    flops: str


def write_site(lib: Library, checker: Checker, diags: Diagnostics, targets: list[str],
               out: str | os.PathLike[str]) -> list[Page]:
    """Write the site of `targets` (and the cards they call) to `out`; its pages."""
    check_destination(out, DOCS)  # before any page is made
    broken = {d.span.file for d in diags.errors}
    pages = catalog(lib, checker, targets, broken)
    env = Environment(loader=PackageLoader("cardc", "templates/docs"),
                      autoescape=select_autoescape(default=True), keep_trailing_newline=True)
    with staged_run(out, DOCS) as folder:
        (folder / "style.css").write_text(card_html.CSS + "\n" + _CSS + stylesheet(),
                                          encoding="utf-8")
        (folder / "index.html").write_text(_index(env, pages), encoding="utf-8")
        for page in pages:
            errors = [d.message for d in diags.errors if d.span.file == page.path]
            (folder / page.href).write_text(_page(env, page, pages, checker, errors),
                                            encoding="utf-8")
            tex = render_latex(s.CardFile(page.path, (page.alg,)), _typed(checker, page), True)
            (folder / _tex(page)).write_text(tex, encoding="ascii")
    return pages


def _index(env: Environment, pages: list[Page]) -> str:
    folders: dict[str, list[Page]] = {}
    for page in pages:
        folders.setdefault(page.folder, []).append(page)
    return env.get_template("index.html.j2").render(folders=folders, summary=_summary,
                                                    count=len(pages))


def _page(env: Environment, page: Page, pages: list[Page], checker: Checker,
          errors: list[str]) -> str:
    checked = _typed(checker, page)
    link = _card_line_link(page, pages)
    code = card_code(checker, page.alg, link) if page.checked else \
        Code(missing="the card does not check")
    figure_html = card_html.algorithm_html(page.alg, checked, _callee_link(pages))
    return env.get_template("card.html.j2").render(
        page=page, figure=Markup(_with_code_links(figure_html, page, code)),
        parts=[(folded, [(n, Markup(line)) for n, line in rows]) for folded, rows in code.parts()],
        missing=code.missing,
        presets=_presets(checker, page) if checked else [], errors=errors,
        diffs=[(other, diff_cards(checker, page.alg, other.alg)[1:]) for other in page.related],
        tex=_tex(page), summary=_summary)


def _typed(checker: Checker, page: Page) -> Checker | None:
    """The checker where the card checks: a card with errors renders without its types."""
    return checker if page.checked and id(page.alg) in checker.infos else None


def _tex(page: Page) -> str:
    return page.href.removesuffix(".html") + ".tex"


def _summary(alg: s.Algorithm) -> str:
    """A line saying what the card is: its note, first comment or title."""
    for text in (alg.note, *alg.comments, alg.title):
        if text:
            return text
    return ""


def _callee_link(pages: list[Page]) -> Callable[[s.Algorithm], str | None]:
    by_alg = {id(p.alg): p.href for p in pages}
    return lambda alg: by_alg.get(id(alg))


def _card_line_link(page: Page, pages: list[Page]) -> Callable[[str, int], str | None]:
    """The href of line `n` of a card file: its step's row, else the card's pseudocode."""
    def link(path: str, n: int) -> str | None:
        for other in pages:
            if other.path == path and n in other.lines:
                where = "" if other is page else other.href
                return f"{where}#L{n}" if n in _step_lines(other.alg) else f"{where}#pseudocode"
        return None
    return link


def _step_lines(alg: s.Algorithm) -> set[int]:
    return {n.span.line for n in s.nodes(alg.steps) if isinstance(n, s.Step)}


def _with_code_links(figure_html: str, page: Page, code: Code) -> str:
    """Each step row of the pseudocode with a link to the first line it became."""
    for n in sorted(_step_lines(page.alg), reverse=True):
        target = code.first.get((page.path, n))
        if target is not None:
            figure_html = card_html.link_step(figure_html, n, f"#py-{target}")
    return figure_html


def _presets(checker: Checker, page: Page) -> list[Preset]:
    sig = checker.infos[id(page.alg)].sig
    out = []
    for preset in page.alg.presets:
        try:
            summary = summarize(sig, preset.name, cost=card_cost(checker, page.alg))
        except PresetError as err:
            out.append(Preset(preset.name, str(err), "", "", ""))
            continue
        named = [k for k, _ in preset.values]  # the preset's own order, then the defaults
        order = sorted(summary.values, key=lambda k: (k not in named, named.index(k)
                                                      if k in named else 0))
        values = ", ".join(f"{k} = {number(summary.values[k])}" for k in order)
        memory = ", ".join(f"{byte_size(summary.parameters * n)} {k}"
                           for k, n in (("fp32", 4), ("bf16", 2)))
        flops = ""
        if summary.compute is not None:
            c = summary.compute
            flops = figure(c.per_token.evaluate({})) if c.length is None else \
                polynomial(c.per_token, c.length)
        out.append(Preset(preset.name, values, f"{summary.parameters:,}", memory, flops))
    return out


_CSS = """
body { max-width: 96rem; margin: 0 auto; padding: 1rem 2rem 4rem; }
h1 { font-family: var(--text); font-size: 1.7rem; margin: .5rem 0 0; }
nav { font-size: .9rem; margin-bottom: 1rem; }
.path { color: #555; font-family: ui-monospace, monospace; font-size: .85rem; }
.split { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 2rem; }
@media (max-width: 70rem) { .split { grid-template-columns: minmax(0, 1fr); } }
table.listing { border-collapse: collapse; width: 100%; }
table.listing td, table.listing th { text-align: left; padding: .25rem .6rem;
  border-bottom: 1px solid #e4e4e4; vertical-align: top; }
.python { overflow-x: auto; font-size: .78rem; background: #fbfbfb; border: 1px solid #e4e4e4; }
.python table { border-collapse: collapse; }
.python td { padding: 0 .5rem; white-space: pre; font-family: ui-monospace, monospace; }
.python td.ln { color: #999; text-align: right; user-select: none; }
.python td.ln { width: 3.5em; }
.python td.ln a { color: inherit; text-decoration: none; }
.python summary { color: #555; padding: .2rem .5rem; cursor: pointer; font-size: .85rem; }
.python tr:target { background: #fff3b0; }
.python a { color: inherit; }
pre.diff { background: #fbfbfb; border: 1px solid #e4e4e4; padding: .5rem; overflow-x: auto; }
pre.diff .gone { color: #a31515; } pre.diff .added { color: #116611; }
.errors { color: #a31515; }
td.file { color: #555; font-family: ui-monospace, monospace; font-size: .8rem; white-space: nowrap; }
"""
