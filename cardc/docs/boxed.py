"""A diff drawn on the pseudocode: a card's figure (cardc.render.html) with the steps that differ
from another card boxed, and the names it declares that the other does not marked.

Which steps differ is cardc.diff's own alignment (`changes`): a step with no step of its shape
on the other side is boxed solid; a step of the same shape that calls another card (LayerNorm
where the other has RMSNorm) is boxed dashed. The docs site shows the cards most like a card so,
the `cardc diff` text as their caption; `cardc diff A B --to html` shows both sides of a pair
and of every pair of cards they call instead of one another (`diff_page`).
"""

from __future__ import annotations

from html import escape

from .. import syntax as s
from ..checker import Checker
from ..diff import REWRITTEN, SWAPPED, Changed, changes, diff_cards, swapped_cards
from ..render.html import CSS, HtmlRenderer, Link, link_step, page
from ..render.latex import typography

# the boxes' rules, for the site's stylesheet and the page `cardc diff --to html` writes; the
# colours are variables a stylesheet may set (the site sets them again for a dark scheme)
BOXED_CSS = """\
.algorithm .step.boxed { --reach: calc(1.2rem + var(--depth, 0) * (1.3rem + 1px));
  margin: 2px 0 2px calc(-1 * var(--reach)); padding: 0 .3rem 0 calc(var(--reach) - 2px);
  border: 2px solid var(--box-rewritten, #c2410c); border-radius: 3px;
  background: var(--box-rewritten-bg, rgba(234, 88, 12, .08)); }
.algorithm .step.boxed.swapped { border-style: dashed; border-color: var(--box-swapped, #6d28d9);
  background: var(--box-swapped-bg, rgba(109, 40, 217, .07)); }
.algorithm .boxed > .no, .algorithm .boxed > a.no { color: var(--box-rewritten, #c2410c); }
.algorithm .boxed.swapped > .no, .algorithm .boxed.swapped > a.no {
  color: var(--box-swapped, #6d28d9); }
.algorithm .only { background: var(--box-rewritten-bg, rgba(234, 88, 12, .08));
  border-bottom: 2px solid var(--box-rewritten, #c2410c); }
.legend { font-size: .85rem; line-height: 1.9; }
.legend > span { white-space: nowrap; margin-right: 1.5em; }
.legend .key { display: inline-block; width: 1.6em; height: .9em; vertical-align: -.1em;
  margin-right: .3em; box-sizing: border-box; border: 2px solid var(--box-rewritten, #c2410c);
  border-radius: 3px; background: var(--box-rewritten-bg, rgba(234, 88, 12, .08)); }
.legend .key.swapped { border-style: dashed; border-color: var(--box-swapped, #6d28d9);
  background: var(--box-swapped-bg, rgba(109, 40, 217, .07)); }
.legend .key.only { width: auto; height: auto; border-width: 0 0 2px; border-radius: 0;
  padding: 0 .2em; font-style: italic; }
"""

# the page `cardc diff --to html` writes: each pair side by side where the window is wide
_PAGE_CSS = """\
body { max-width: 110rem; }
.pair { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 2.5rem; }
@media (max-width: 70rem) { .pair { grid-template-columns: minmax(0, 1fr); } }
.pair figure.algorithm { margin-bottom: .5rem; }
pre.diff { font-size: .85rem; overflow-x: auto; background: #fafafa; padding: .5rem;
  border: 1px solid #e2e2e6; }
"""

_SAID = {REWRITTEN: "no step of this shape in {other}", SWAPPED: "as in {other}, but calling "
         "another card"}


class BoxedRenderer(HtmlRenderer):
    """The HTML renderer, with the steps of `changed` boxed and its names marked."""

    def __init__(self, bold: frozenset[str] = frozenset(),
                 vectors: frozenset[int] = frozenset()) -> None:
        super().__init__(bold, vectors)
        self.changed = Changed()
        self.other = ""  # the label of the card compared with
        self.blocks = 0  # > 0 while the blocks' declarations are set

    def step_row(self, node: s.Step, depth: int, code: str, lines: bool = False) -> str:
        return self._boxed(super().step_row(node, depth, code, lines), node.number,
                           '<div class="step"')

    def step_tex(self, node: s.Step, depth: int) -> list[str]:
        out = super().step_tex(node, depth)
        stmt = node.stmt
        if isinstance(stmt, s.While | s.For) and out[-1].startswith('<div class="step end"'):
            out[-1] = self._boxed(out[-1], stmt.end_number, '<div class="step end"')
        return out

    def _boxed(self, row: str, number: str | None, start: str) -> str:
        """`row` (which begins with `start`) boxed, where `changed` holds its step's number."""
        kind = self.changed.steps.get(number or "")
        if kind is None:
            return row
        title = escape(_SAID[kind].format(other=self.other), quote=True)
        return f'{start[:-1]} boxed {kind}" title="{title}"' + row[len(start):]

    def items_tex(self, items: tuple[s.Item, ...], depth: int) -> list[str]:
        self.blocks += 1  # the names declared here, not those of the steps
        try:
            return super().items_tex(items, depth)
        finally:
            self.blocks -= 1

    def symbol(self, name: str, bold: bool = False, node: object = None) -> str:
        out = super().symbol(name, bold, node)
        declared = self.blocks and node is None  # a name as declared, not one in a type
        if declared and name in (*self.changed.hypers, *self.changed.params):
            return f'<mrow class="only" title="{escape(f"not in {self.other}", quote=True)}">' \
                   f"{out}</mrow>"
        return out


def boxed_figure(alg: s.Algorithm, checker: Checker | None, changed: Changed, other: str,
                 link: Link, figure_id: str, step_href: str | None = None) -> str:
    """`alg` as cardc.render.html.algorithm_html draws it, with `changed` (its side of a diff
    against the card labelled `other`) boxed and marked. `figure_id` is the figure's id (a page
    may hold the card's own figure too); `step_href`, the card's own page, links each step's
    number to its row there."""
    r = typography(checker, alg, BoxedRenderer)
    assert isinstance(r, BoxedRenderer)
    r.attach(checker, alg, link)
    r.changed, r.other, r.line_ids = changed, other, False  # no ids: the page has its own
    lines = r.algorithm_tex(alg) + r.tip_html(figure_id)
    figure = f'<figure class="algorithm" id="{escape(figure_id)}">\n' + "\n".join(lines) + \
        "\n</figure>\n"
    if step_href is not None:
        for line in sorted(_step_lines(alg), reverse=True):
            figure = link_step(figure, line, f"{step_href}#L{line}")
    return figure


def _step_lines(alg: s.Algorithm) -> set[int]:
    return {n.span.line for n in s.nodes(alg.steps) if isinstance(n, s.Step) and n.span.line > 0}


def legend(changed: Changed, other: str) -> str:
    """What the boxes and marks of a figure with `changed` (against the card labelled
    `other`) say: those it has, or that it has none."""
    other = escape(other)
    kinds = set(changed.steps.values())
    keys = [f'<span class="key"></span>a step that {other} has not, or writes otherwise'] * \
        (REWRITTEN in kinds)
    keys += ['<span class="key swapped"></span>the same step as in ' + other +
             ", calling another card"] * (SWAPPED in kinds)
    keys += [f'<span class="key only">name</span> declared here, not in {other}'] * \
        bool(changed.hypers or changed.params)
    if not keys:
        return f'<p class="legend">The same steps as {other}.</p>'
    return '<p class="legend">' + " ".join(f"<span>{k}</span>" for k in keys) + "</p>"


def diff_page(checker: Checker, a: s.Algorithm, b: s.Algorithm) -> str:
    """A whole HTML page: the text of `cardc diff`, then `a` and `b` side by side, each with
    what differs from the other boxed, then each pair of cards they call instead of one
    another, alike. A call of a card the page shows links to its figure."""
    pairs = [(a, b), *swapped_cards(checker, a, b)]
    ids: dict[int, str] = {}
    for n, pair in enumerate(pairs):
        for side, alg in zip("ab", pair, strict=True):
            ids.setdefault(id(alg), f"pair{n}-{side}")
    text = "\n".join(escape(line) for line in diff_cards(checker, a, b))
    body = [f"<h1>{escape(_label(a))} → {escape(_label(b))}</h1>\n",
            f'<pre class="diff">{text}</pre>\n']
    for n, (x, y) in enumerate(pairs):
        if n:
            body.append(f"<h2>{escape(_label(x))} → {escape(_label(y))}</h2>\n")
        body.append('<div class="pair">\n')
        for side, mine, theirs in zip("ab", (x, y), (y, x), strict=True):
            changed = changes(checker, x, y)["ab".index(side)]
            figure = boxed_figure(mine, checker, changed, _label(theirs),
                                  lambda alg: "#" + ids[id(alg)] if id(alg) in ids else None,
                                  f"pair{n}-{side}")
            body.append(f"<div>{figure}{legend(changed, _label(theirs))}</div>\n")
        body.append("</div>\n")
    return page(f"{_label(a)} → {_label(b)}", "".join(body), CSS + BOXED_CSS + _PAGE_CSS)


def _label(alg: s.Algorithm) -> str:
    return alg.label or ""
