"""The site's search index: every card, every name its blocks declare and every piece of its
prose, written as `search-index.js`, a script that assigns one global.

A page read from `file://` may not fetch a JSON file, but it may load a script; search.js (a
template of cardc/templates/docs, copied as it is) reads the global and searches in the page.

The index is a JSON object:
  greek:   the ASCII spellings of Greek letters (cardc.spelling.GREEK), so that the script
           reads a query as a card would (`theta_l` → `θ_l`);
  pages:   [href, label, folder, summary] per card page, in the site's order;
  entries: [page, kind, name, keys, text, anchor]: `page` indexes `pages`; `kind` is `card`,
           `prose` or the block that declares the name (`Input`, `Hyperparameters`, …);
           `keys` are the spellings a name is found by (`θ`, `theta`); `text` its prose;
           `anchor` the id on the page it links to ("" for the page's top).
Same pages, same bytes: nothing here depends on a clock, a path or a set's order.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .. import syntax as s
from ..spelling import GREEK, display, python_name
from .anchors import declared
from .catalog import Page

GLOBAL = "cardcSearchIndex"  # the global search.js reads
Entry = list[object]


def search_index(pages: list[Page], summary: Callable[[s.Algorithm], str]) -> dict[str, object]:
    """The index of `pages`; `summary` gives a card's one line (its note, comment or title)."""
    entries: list[Entry] = []
    for n, page in enumerate(pages):
        entries += _entries(n, page, summary(page.alg))
    return {
        "greek": dict(GREEK),
        "pages": [[p.href, p.label, p.folder, display(summary(p.alg))] for p in pages],
        "entries": entries,
    }


def search_script(index: dict[str, object]) -> str:
    """The index as a script: `window.<GLOBAL> = {…};`."""
    body = json.dumps(index, ensure_ascii=False, separators=(",", ":"))
    return f"window.{GLOBAL} = {body};\n"


def _entries(n: int, page: Page, summary: str) -> list[Entry]:
    alg = page.alg
    keys = [page.label] + ([f"Algorithm {alg.number}"] if alg.number else [])
    out: list[Entry] = [[n, "card", page.label, keys, display(summary), ""]]
    for d in declared(alg):
        spellings = list(dict.fromkeys([d.name, python_name(d.name)]))
        out.append([n, d.kind, d.name, spellings, d.prose, d.anchor])
    out += [[n, "prose", "", [], display(text), where] for text, where in _prose(alg)
            if text and text != summary]  # the card's own entry holds its summary
    return out


def _prose(alg: s.Algorithm) -> list[tuple[str, str]]:
    """(text, anchor) of the card's prose: its title, note and comments at the pseudocode,
    its prose blocks, and each step's comments, note and `where` at the step's row."""
    out = [(t, "pseudocode") for t in (alg.title, alg.note, *alg.comments) if t]
    out += [(item.text, "pseudocode") for block in alg.blocks for item in block.items
            if isinstance(item, s.Sentence)]
    for step in s.nodes(alg.steps):
        if isinstance(step, s.Step):
            row = f"L{step.span.line}" if step.span.line > 0 else "pseudocode"
            out += [(t, row) for t in (*step.comments, step.note, step.where) if t]
    return list(dict.fromkeys(out))  # a comment said twice is found once
