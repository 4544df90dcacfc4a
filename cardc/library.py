"""A card library: every algorithm of a set of card files, found by name."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import syntax as s
from .diagnostics import Diagnostics
from .parser import normalize, parse, parse_file, read_card
from .spelling import canonical_name

DEFAULT_ROOT = Path("cards")
Roots = str | Path | list[str | Path] | list[str] | list[Path] | None  # library folders
# The building blocks and recipes that ship with cardc: package data in an installed wheel
# (cardc/cards/…), the repository's cards/nn and cards/recipes in a source checkout.
SHIPPED = ("nn", "recipes")


def shipped_library() -> list[Path]:
    """The library folders installed with cardc, searched after every other."""
    here = Path(__file__).resolve().parent
    installed = [here / "cards" / name for name in SHIPPED]
    source = [here.parent / "cards" / name for name in SHIPPED]
    return [p for p in (installed if installed[0].is_dir() else source) if p.is_dir()]


@dataclass
class Library:
    files: list[s.CardFile] = field(default_factory=list)
    diags: Diagnostics = field(default_factory=Diagnostics)
    # library files not parsed yet (load(lazy=True)): the names each one's headers define
    pending: dict[Path, set[str]] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)  # each file's place in the full library
    # each file's place in the lookup: 0 the given cards, then each library root in turn, the
    # shipped library last
    rank: dict[str, int] = field(default_factory=dict)
    roots: list[Path] = field(default_factory=list)  # the library folders searched, in order
    _file_of: dict[int, s.CardFile] = field(default_factory=dict, repr=False)  # by id(algorithm)

    def algorithms(self) -> list[tuple[s.CardFile, s.Algorithm]]:
        self._parse(list(self.pending))  # whoever asks for every card gets every card
        return self._parsed()

    def _parsed(self) -> list[tuple[s.CardFile, s.Algorithm]]:
        return [(f, a) for f in self.files for a in f.algorithms if a.name]

    def _parse(self, paths: list[Path]) -> None:
        for path in paths:
            del self.pending[path]
            self.files.append(parse_file(path, self.diags))

    def find(self, name: str, near: s.CardFile | None = None) -> s.Algorithm | None:
        """A name resolves lexically: in the calling card's own file, then its folder, then
        each folder above it, then in each library root in turn (the shipped library last),
        the shallowest file first. So a variant of a card in a folder of its own (the paper's
        faithful Algorithm 9) is what that folder's cards call."""
        self._parse([p for p, names in self.pending.items() if name in names])
        found = sorted(((f, a) for f, a in self._parsed() if a.name == name),
                       key=lambda fa: self.order.get(fa[0].path, 0))  # as if parsed in order
        if not found:
            return None
        if near is not None:
            for f, a in found:
                if f is near:
                    return a
            for folder in Path(near.path).parents:
                for f, a in found:
                    if Path(f.path).parent == folder:
                        return a
        return min(found, key=lambda fa: (self.rank.get(fa[0].path, 0),
                                          len(Path(fa[0].path).parts)))[1]

    def file_of(self, alg: s.Algorithm) -> s.CardFile:
        if len(self._file_of) != sum(len(f.algorithms) for f in self.files):  # files were added
            self._file_of = {id(a): f for f in self.files for a in f.algorithms}
        return self._file_of[id(alg)]


_HEADER = re.compile(r"^[ \t]*Algorithm\b[^:\n]*:([^\n]*)$", re.M)
_SIGNATURE = re.compile(r"(?:←|<-)[ \t]*([^\s(←]+)\(")


def defined_names(text: str) -> set[str] | None:
    """The names a card file's headers define, read off its text without parsing it; None where
    a header is not plain enough to be read so."""
    names: set[str] = set()
    for rest in _HEADER.findall(normalize(text)):
        sig = _SIGNATURE.search(rest)
        if sig:
            names.add(canonical_name(sig.group(1)))
        elif any(c in rest for c in "(←") or "<-" in rest:
            return None
    return names


def default_library(card: str | Path) -> str:
    """The `cards/` folder a card lives in (its nearest ancestor of that name, or the folder
    itself), else its folder (a folder given: itself)."""
    path = Path(card).resolve()
    for parent in [path, *path.parents] if path.is_dir() else path.parents:
        if parent.name == "cards":
            return str(parent)
    return str(path if path.is_dir() else path.parent)


def library_roots(paths: list[str] | list[Path], given: Roots = None) -> list[str]:
    """The folders searched for cards, in order (the shipped library comes after them): the
    `cards/` folder each card lives in (else its own folder), then the ones given (--library),
    else ./cards where there is one."""
    found = [default_library(p) for p in paths]
    if given:
        found += [str(p) for p in (given if isinstance(given, list) else [given])]
    elif DEFAULT_ROOT.is_dir():
        found.append(str(DEFAULT_ROOT.resolve()))
    return list(dict.fromkeys(found))


def shown_folders(folders: list[str] | list[Path]) -> list[str]:
    """Folders as a message names them: relative to the working directory where they lie below
    it, each once, and none inside one already named (it is searched with it)."""
    kept: list[str] = []
    for folder in map(os.path.abspath, map(str, folders)):
        if not any(folder == k or folder.startswith(k + os.sep) for k in kept):
            kept.append(folder)
    rel = [os.path.relpath(k) for k in kept]
    return [(k if r.startswith("..") else r).rstrip("/") + "/" for k, r in zip(kept, rel,
                                                                             strict=True)]


def card_paths(paths: list[str | Path]) -> list[Path]:
    """The given card files, and the `.card` files below the given folders, in order; a folder
    that vanishes while it is walked (another program's temporary one) is passed over."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            out.append(p)
            continue
        found = [Path(top, name) for top, _, names in os.walk(p) for name in names
                 if name.endswith(".card")]
        out += sorted(found)
    return out


def load(paths: list[str | Path], root: Roots = DEFAULT_ROOT, lazy: bool = False,
         shipped: bool = True, texts: Mapping[Path, str] | None = None
         ) -> tuple[Library, list[str]]:
    """Parse the given cards plus the library under `root` (a folder or a list of them, searched
    in order) and the shipped library; return it and the given files' paths.

    `lazy`: the library's own files are parsed only when a name they define is looked up (or
    every card is asked for), so checking one card parses the cards it calls and no others.
    Duplicate names are then reported among the given cards alone.

    `texts`: the text of some files by resolved path, read instead of the disk's (an editor's
    unsaved buffers); a given card there need not exist on disk."""
    texts = texts or {}
    lib = Library()
    targets = card_paths(paths)
    seen: set[Path] = set()
    roots = [Path(r) for r in ([] if root is None else root if isinstance(root, list) else [root])]
    lib.roots = [r for r in roots if r.is_dir()] + (shipped_library() if shipped else [])
    ranked = [(0, p) for p in targets]
    ranked += [(rank, p) for rank, r in enumerate(lib.roots, 1) for p in card_paths([r])]
    for i, (rank, path) in enumerate(ranked):
        key = path.resolve()
        if key in seen:
            continue
        seen.add(key)
        if key not in texts and not path.exists():
            if rank == 0:  # a library's file that vanished since the walk is no card of it
                lib.diags.error(s.Span(str(path), 0, 0, 0, 0), "no such card file")
            continue
        lib.order[str(path)] = i
        lib.rank[str(path)] = rank
        if key in texts:
            lib.files.append(parse(texts[key], str(path), lib.diags))
            continue
        names = _names_of(path) if lazy and i >= len(targets) else None
        if names is not None:
            lib.pending[path] = names
        else:
            lib.files.append(parse_file(path, lib.diags))
    _report_duplicates(lib)
    return lib, [str(p) for p in targets]


def _names_of(path: Path) -> set[str] | None:
    text = read_card(path, Diagnostics())
    return None if text is None else defined_names(text)  # else parse_file reports it


def _report_duplicates(lib: Library) -> None:
    first: dict[tuple[str, Path], s.Algorithm] = {}
    for card_file, alg in lib._parsed():
        key = (alg.name, Path(card_file.path).parent)
        if key in first and first[key].span.file != alg.span.file:
            prior = first[key]
            lib.diags.error(alg.span, f"a card named '{alg.name}' is already defined",
                            notes=((prior.span, "first defined here"),),
                            hint="card names are unique within a folder")
        first.setdefault(key, alg)
