"""A card library: every algorithm of a set of card files, found by name."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from . import syntax as s
from .diagnostics import Diagnostics
from .parser import normalize, parse_file, read_card
from .spelling import canonical_name

DEFAULT_ROOT = Path("cards")


@dataclass
class Library:
    files: list[s.CardFile] = field(default_factory=list)
    diags: Diagnostics = field(default_factory=Diagnostics)
    # library files not parsed yet (load(lazy=True)): the names each one's headers define
    pending: dict[Path, set[str]] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)  # each file's place in the full library
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
        each folder above it, then anywhere in the library. So a variant of a card in a folder of
        its own (the paper's faithful Algorithm 9) is what that folder's cards call."""
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
        return min(found, key=lambda fa: len(Path(fa[0].path).parts))[1]

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


def card_paths(paths: list[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.rglob("*.card")) if p.is_dir() else [p]
    return out


def load(paths: list[str | Path], root: str | Path | None = DEFAULT_ROOT,
         lazy: bool = False) -> tuple[Library, list[str]]:
    """Parse the given cards plus the library under `root`; return it and the given files' paths.

    `lazy`: the library's own files are parsed only when a name they define is looked up (or
    every card is asked for), so checking one card parses the cards it calls and no others.
    Duplicate names are then reported among the given cards alone."""
    lib = Library()
    targets = card_paths(paths)
    seen: set[Path] = set()
    extra = card_paths([root]) if root is not None and Path(root).is_dir() else []
    for i, path in enumerate([*targets, *extra]):
        key = path.resolve()
        if key in seen:
            continue
        seen.add(key)
        if not path.exists():
            lib.diags.error(s.Span(str(path), 0, 0, 0, 0), "no such card file")
            continue
        lib.order[str(path)] = i
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
