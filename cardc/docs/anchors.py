"""The names a card declares, each with an anchor on its page, and the pseudocode figure that
carries those anchors.

A search result for a declared name links to `page.html#d-<name>`; the figure's declaration
holds that id. Both come from `declared`, so an anchor the search index names is one the page
has. The figure is cardc.render.html's, from a renderer that wraps each declaration (and the
head of each bundle, each data set) in a `<span class="decl" id="d-…">`.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from .. import syntax as s
from ..checker import Checker
from ..render.html import HtmlRenderer, Link, anchor
from ..render.latex import typography
from ..spelling import display, python_name


@dataclass(frozen=True)
class Declared:
    """A name a card's blocks declare: `kind` is the block (`Input`, `Parameters`, …)."""

    name: str
    kind: str
    prose: str
    anchor: str
    node: object  # the Decl, Bundle or Dataset that declares it


def declared(alg: s.Algorithm) -> list[Declared]:
    """Every name of `alg`'s blocks, in the order the page shows them, each with an id unique
    on the page: `d-` and the name's Python spelling (`θ` → `d-theta`), numbered on a repeat."""
    out: list[Declared] = []
    taken: set[str] = set()
    for block in alg.blocks:
        for node, name, prose in _names(block.items):
            out.append(Declared(display(name), block.kind, display(prose or ""),
                                _fresh("d-" + python_name(name), taken), node))
    return out


def _names(items: tuple[s.Item, ...]) -> list[tuple[object, str, str | None]]:
    """(node, name, prose) of the names `items` declare, bundles and families opened."""
    out: list[tuple[object, str, str | None]] = []
    for item in items:
        if isinstance(item, s.Decl):
            out += [(item, name, item.prose) for name in item.names]
        elif isinstance(item, s.Bundle):
            out += [(item, item.name, item.prose), *_names(item.items)]
        elif isinstance(item, s.Family):
            out += _names(item.items)
        elif isinstance(item, s.Dataset):
            out += [(item, name, item.prose) for name in item.elems]
    return out


def _fresh(slug: str, taken: set[str]) -> str:
    n, out = 1, slug
    while out.lower() in taken:  # ids compare exactly, but keep them apart for a reader too
        n += 1
        out = f"{slug}-{n}"
    taken.add(out.lower())
    return out


class AnchoredRenderer(HtmlRenderer):
    """The HTML renderer, with each declaration wrapped in a span holding its names' ids."""

    def __init__(self, bold: frozenset[str] = frozenset(),
                 vectors: frozenset[int] = frozenset()) -> None:
        super().__init__(bold, vectors)
        self.ids: dict[int, list[str]] = {}  # id(node) → the anchors of the names it declares

    def decl_tex(self, node: s.Decl) -> str:
        return self._marked(node, super().decl_tex(node))

    def item_tex(self, item: s.Item, depth: int) -> list[str]:
        lines = super().item_tex(item, depth)
        if lines and isinstance(item, s.Bundle | s.Dataset):  # the head line names it
            indent = self.indent * depth
            lines[0] = indent + self._marked(item, lines[0].removeprefix(indent))
        return lines

    def _marked(self, node: object, text: str) -> str:
        """`text` in a span with the first name's id, the other names' as empty spans in it;
        each id once (a node rendered twice keeps its ids on the first)."""
        ids = self.ids.pop(id(node), [])
        if not ids:
            return text
        more = "".join(f'<span id="{escape(i)}"></span>' for i in ids[1:])
        return f'<span class="decl" id="{escape(ids[0])}">{more}{text}</span>'


def anchored_figure(alg: s.Algorithm, checker: Checker | None, link: Link) -> str:
    """`alg` as cardc.render.html.algorithm_html draws it, its declarations anchored."""
    r = typography(checker, alg, AnchoredRenderer)
    assert isinstance(r, AnchoredRenderer)
    r.attach(checker, alg, link)
    for d in declared(alg):
        r.ids.setdefault(id(d.node), []).append(d.anchor)
    lines = r.algorithm_tex(alg) + r.tip_html(anchor(alg))
    return f'<figure class="algorithm" id="{escape(anchor(alg))}">\n' + "\n".join(lines) + \
        "\n</figure>\n"
