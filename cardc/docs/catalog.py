"""What a docs site holds: a page per card, with the cards it calls, those that call it and
the cards it is most like, from the checked library."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import syntax as s
from ..build import files_used, shipped_name, shown_card_path
from ..checker import Checker
from ..diff import likeness, step_keys
from ..library import Library

RELATED = 3  # architecture diffs a page shows at most
ALIKE = 0.5  # the step likeness (0–1) below which two cards are not compared


@dataclass(eq=False)
class Page:
    """One card's page: `href` is its file name in the site's folder."""

    alg: s.Algorithm
    path: str  # the card file, as given
    folder: str  # the index's heading: the file's folder, relative where it can be
    href: str
    checked: bool  # it and everything it calls check
    lines: range  # the file's lines the card spans: to the next card's header
    calls: list[Page] = field(default_factory=list)
    callers: list[Page] = field(default_factory=list)
    related: list[Page] = field(default_factory=list)
    shown: str = ""  # the card file as the page names it: never an absolute path

    @property
    def label(self) -> str:
        return self.alg.label or ""


def catalog(lib: Library, checker: Checker, targets: list[str], broken: set[str],
            base: str | os.PathLike[str] = ".") -> list[Page]:
    """The pages of the cards in `targets` and of every card they call, in file order;
    `broken` holds the files with errors, `base` the folder that holds the site."""
    wanted = files_used(lib, checker, {str(Path(t)) for t in targets})
    pages: list[Page] = []
    taken: set[str] = set()
    for card_file in lib.files:
        if card_file.path not in wanted:
            continue
        starts = [a.span.line for a in card_file.algorithms]
        ends = [*starts[1:], 1 << 30]
        for alg, end in zip(card_file.algorithms, ends, strict=True):
            if alg.label is None:
                continue
            href = _unique(_slug(card_file.path, alg.label), taken)
            ok = not files_used(lib, checker, {card_file.path}) & broken
            pages.append(Page(alg, card_file.path, _folder(card_file.path, base), href, ok,
                              range(alg.span.line, end),
                              shown=shown_card_path(card_file.path, base)))
    _link(pages, checker)
    return pages


def _link(pages: list[Page], checker: Checker) -> None:
    by_alg = {id(p.alg): p for p in pages}
    for page in pages:
        info = checker.infos.get(id(page.alg))
        callees = [] if info is None else [c.callee for c in info.calls.values()]
        for callee in dict.fromkeys(map(id, callees)):
            if callee in by_alg and by_alg[callee] not in page.calls:
                page.calls.append(by_alg[callee])
                by_alg[callee].callers.append(page)
    keys = {id(p.alg): step_keys(checker, p.alg) for p in pages
            if p.checked and id(p.alg) in checker.infos}
    for page in pages:
        page.related = _related(page, pages, checker, keys)


def _related(page: Page, pages: list[Page], checker: Checker,
             keys: dict[int, list[str]]) -> list[Page]:
    """The cards most like this one, step for step: the same kind of card (a model, a
    procedure, a block: the same arity), whose steps match at least ALIKE."""
    if id(page.alg) not in keys:
        return []
    scored = []
    for other in pages:
        if other is page or id(other.alg) not in keys \
                or _kind(checker, other.alg) != _kind(checker, page.alg):
            continue
        score = likeness(keys[id(page.alg)], keys[id(other.alg)])
        if score >= ALIKE:
            scored.append((-score, other.label, other))
    out: list[Page] = []
    for *_, other in sorted(scored, key=lambda t: t[:2]):  # one card of a file: its variants
        if len(out) < RELATED and all(p.path != other.path for p in out):  # say the same
            out.append(other)
    return out


def _kind(checker: Checker, alg: s.Algorithm) -> tuple[int, int, bool]:
    sig = checker.infos[id(alg)].sig
    return len(sig.inputs), len(alg.outputs), bool(sig.tree.members)


def _folder(path: str, base: str | os.PathLike[str]) -> str:
    """The index's heading for a card file's folder: relative to the working directory where
    it lies below it, `library/nn` for the library cardc ships, else relative to `base`, the
    folder that holds the site (a page holds no path of the machine that wrote it)."""
    parent = os.path.dirname(os.path.abspath(path))
    rel = os.path.relpath(parent)
    if rel == ".":
        return os.path.basename(parent) or parent
    if not rel.startswith(".."):
        return rel
    shipped = shipped_name(path)
    if shipped:
        return os.path.dirname(shipped)
    try:
        rel = os.path.relpath(parent, os.path.abspath(base))
    except ValueError:  # another drive: no relative path exists
        return os.path.basename(parent)
    return os.path.basename(parent) if rel == "." else Path(rel).as_posix()


def _slug(path: str, label: str) -> str:
    """`cards/nn/attention.card`, `CausalSelfAttention` → `nn-attention.CausalSelfAttention`:
    ASCII letters, digits, `-` and `.` only, whatever the card's names hold."""
    stem = Path(path).with_suffix("").parts[-2:]
    words = [re.sub(r"[^A-Za-z0-9]+", "_", w).strip("_") or "card" for w in (*stem, label)]
    return "-".join(words[:-1]) + "." + words[-1]


def _unique(slug: str, taken: set[str]) -> str:
    n, out = 1, slug
    while out.lower() in taken:  # file systems that ignore case hold one of two
        n += 1
        out = f"{slug}-{n}"
    taken.add(out.lower())
    return out + ".html"
