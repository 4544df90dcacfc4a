"""A card library: every algorithm of a set of card files, found by name."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import syntax as s
from .diagnostics import Diagnostics
from .parser import parse_file

DEFAULT_ROOT = Path("cards")


@dataclass
class Library:
    files: list[s.CardFile] = field(default_factory=list)
    diags: Diagnostics = field(default_factory=Diagnostics)

    def algorithms(self) -> list[tuple[s.CardFile, s.Algorithm]]:
        return [(f, a) for f in self.files for a in f.algorithms if a.name]

    def find(self, name: str, near: s.CardFile | None = None) -> s.Algorithm | None:
        """A name resolves lexically: in the calling card's own file, then its folder, then
        each folder above it, then anywhere in the library. So a variant of a card (the paper's
        faithful Algorithm 9 in paper/faithful/) sits beside the card it varies."""
        found = [(f, a) for f, a in self.algorithms() if a.name == name]
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
        return next(f for f in self.files if any(a is alg for a in f.algorithms))


def card_paths(paths: list[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.rglob("*.card")) if p.is_dir() else [p]
    return out


def load(paths: list[str | Path], root: str | Path | None = DEFAULT_ROOT) -> tuple[Library, list[str]]:
    """Parse the given cards plus the library under `root`; return it and the given files' paths."""
    lib = Library()
    targets = card_paths(paths)
    seen: set[Path] = set()
    extra = card_paths([root]) if root is not None and Path(root).is_dir() else []
    for path in [*targets, *extra]:
        key = path.resolve()
        if key in seen:
            continue
        seen.add(key)
        if not path.exists():
            lib.diags.error(s.Span(str(path), 0, 0, 0, 0), "no such card file")
            continue
        lib.files.append(parse_file(path, lib.diags))
    _report_duplicates(lib)
    return lib, [str(p) for p in targets]


def _report_duplicates(lib: Library) -> None:
    first: dict[tuple[str, Path], s.Algorithm] = {}
    for card_file, alg in lib.algorithms():
        key = (alg.name, Path(card_file.path).parent)
        if key in first and first[key].span.file != alg.span.file:
            prior = first[key]
            lib.diags.error(alg.span, f"a card named '{alg.name}' is already defined",
                            notes=((prior.span, "first defined here"),),
                            hint="card names are unique within a folder")
        first.setdefault(key, alg)
