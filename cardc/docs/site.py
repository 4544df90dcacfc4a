"""`cardc docs`: a static site of a card library, readable from `file://` with no server.

`index.html` lists the cards by folder; each card has a page (`<folder>-<file>.<card>.html`)
with its pseudocode (cardc.render.html: MathML, shapes on hover), its generated Python beside
it (cardc.docs.code), its presets' parameters and FLOPs, the cards it calls and that call it,
its architecture diff against the cards most like it (cardc.diff: each such card's pseudocode
with the steps that differ boxed, cardc.docs.boxed, the diff's text as its caption), and its
LaTeX to download.
Every page has a sidebar listing the cards under the index's headings, the page's own marked,
and a search box over the cards, the names they declare and their prose (cardc.docs.search:
the index is a script, `search-index.js`, as a page read from file:// may fetch nothing). The
stylesheet follows the reader's system into a dark scheme.
Pages are jinja2 templates (cardc/templates/docs/) with autoescaping on: card text reaches the
page as text. The site is written to a staging folder and moved into place whole, over a
folder only where that is a site cardc wrote and nothing else (runtime.runs).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from .. import syntax as s
from ..checker import Checker
from ..diagnostics import Diagnostics
from ..diff import changes, diff_cards
from ..flops import card_cost
from ..highlight import highlight_card_html
from ..info import PresetError, byte_size, figure, number, polynomial, summarize
from ..library import Library
from ..render import html as card_html
from ..render.latex import render_latex
from ..runtime.runs import check_destination, staged_run
from ..spelling import display
from .anchors import anchored_figure
from .boxed import BOXED_CSS, boxed_figure, legend
from .catalog import Page, catalog
from .code import Code, card_code, stylesheet
from .search import search_index, search_script

DOCS = "docs"  # the kind of folder a site is (runtime.manifest)


@dataclass
class Related:
    """A card like the page's, as the page compares them: its figure with what differs boxed,
    the legend of the boxes, and the lines of `cardc diff` (without its head line)."""

    page: Page
    figure: Markup
    legend: Markup
    lines: list[str]


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
    base = Path(os.path.abspath(out)).parent  # pages name card files from here
    pages = catalog(lib, checker, targets, broken, base)
    env = Environment(loader=PackageLoader("cardc", "templates/docs"),
                      autoescape=select_autoescape(default=True), keep_trailing_newline=True)
    with staged_run(out, DOCS) as folder:
        for name, text in _assets(env, pages).items():
            (folder / name).write_text(text, encoding="utf-8")
        (folder / "index.html").write_text(_index(env, pages), encoding="utf-8")
        for page in pages:
            errors = [d.message for d in diags.errors if d.span.file == page.path]
            (folder / page.href).write_text(_page(env, page, pages, checker, errors,
                                                  base), encoding="utf-8")
            tex = render_latex(s.CardFile(page.path, (page.alg,)), _typed(checker, page), True)
            (folder / _tex(page)).write_text(tex, encoding="ascii")
    return pages


def _assets(env: Environment, pages: list[Page]) -> dict[str, str]:
    """The files every page loads: the stylesheet, the search script and its index."""
    css = "\n".join([card_html.CSS, stylesheet(), BOXED_CSS, _raw(env, "site.css.j2")])
    return {"style.css": css, "search.js": _raw(env, "search.js.j2"),
            "search-index.js": search_script(search_index(pages, _summary))}


def _raw(env: Environment, name: str) -> str:
    """A file of the templates' folder as it is: a script or a stylesheet, no template (the
    package ships that folder's `*.j2` files)."""
    assert env.loader is not None
    return env.loader.get_source(env, name)[0]


def _folders(pages: list[Page]) -> dict[str, list[Page]]:
    """The pages under the index's headings: their folders, in the pages' order, but the
    numbered algorithms of a folder (the paper's) first and by their number."""
    folders: dict[str, list[Page]] = {}
    for page in pages:
        folders.setdefault(page.folder, []).append(page)
    return {folder: sorted(group, key=_numbered_first) for folder, group in folders.items()}


def _numbered_first(page: Page) -> tuple[int, int]:
    """Algorithm 2 before Algorithm 10, and both before cards without a number (which keep
    their order: the sort is stable)."""
    number = page.alg.number or ""
    return (0, int(number)) if number.isdigit() else (1, 0)


def _index(env: Environment, pages: list[Page]) -> str:
    return env.get_template("index.html.j2").render(folders=_folders(pages), summary=_summary,
                                                    count=len(pages), current="index.html")


def _page(env: Environment, page: Page, pages: list[Page], checker: Checker,
          errors: list[str], base: Path) -> str:
    checked = _typed(checker, page)
    link = _card_line_link(page, pages)
    code = card_code(checker, page.alg, link, base) if page.checked else \
        Code(missing="the card does not check")
    figure_html = anchored_figure(page.alg, checked, _callee_link(pages))
    return env.get_template("card.html.j2").render(
        page=page, figure=Markup(_with_code_links(figure_html, page, code)),
        parts=[(folded, [(n, Markup(line)) for n, line in rows]) for folded, rows in code.parts()],
        missing=code.missing,
        presets=_presets(checker, page) if checked else [], errors=errors,
        related=_related(checker, page, pages),
        tex=_tex(page), summary=_summary, folders=_folders(pages), current=page.href,
        source=Markup(_card_source(checker, page)))


def _related(checker: Checker, page: Page, pages: list[Page]) -> list[Related]:
    """The cards most like the page's, each drawn with its steps that differ from the page's
    boxed: the reader sees what changes in the notation it is written in."""
    out = []
    for n, other in enumerate(page.related, 1):
        changed = changes(checker, page.alg, other.alg)[1]
        figure = boxed_figure(other.alg, checker, changed, page.label, _callee_link(pages),
                              f"related-{n}", other.href)
        out.append(Related(other, Markup(figure), Markup(legend(changed, page.label)),
                           diff_cards(checker, page.alg, other.alg)[1:]))
    return out


def _card_source(checker: Checker, page: Page) -> str:
    """The card's own lines as its file holds them (composed Unicode), highlighted."""
    text = checker.lib.diags.sources.get(page.path, "").split("\n")
    lines = text[max(page.lines.start, 1) - 1:min(page.lines.stop - 1, len(text))]
    while lines and not lines[-1].strip():
        lines.pop()
    return highlight_card_html(display("\n".join(lines)) + "\n")


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
        values = Markup(card_html.assignments_html(  # the names as the card's math sets them
            page.alg, checker, [(k, number(summary.values[k])) for k in order]))
        memory = ", ".join(f"{byte_size(summary.parameters * n)} {k}"
                           for k, n in (("fp32", 4), ("bf16", 2)))
        flops = ""
        if summary.compute is not None:
            c = summary.compute
            flops = figure(c.per_token.evaluate({})) if c.length is None else \
                polynomial(c.per_token, c.length)
        out.append(Preset(preset.name, values, f"{summary.parameters:,}", memory, flops))
    return out
