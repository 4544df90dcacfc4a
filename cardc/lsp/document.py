"""One card file as the editor holds it, checked: its diagnostics, its names' index, and the
library its calls resolve in.

Checking a file loads it from the editor's text (and every other open card file from theirs),
with the library it lives in, lazily: only the cards it calls are parsed and checked, so a
keystroke in one card costs that card and its callees, not the whole library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import syntax as s
from ..checker import Checker, check
from ..diagnostics import Diagnostic
from ..library import Library, library_roots, load
from ..parser import normalize
from .index import FileIndex
from .positions import Columns


@dataclass
class Document:
    """A card file checked as the editor holds it."""

    path: str
    text: str  # as the editor holds it
    lib: Library
    checker: Checker | None
    diagnostics: list[Diagnostic]
    index: FileIndex
    columns: Columns = field(init=False)

    def __post_init__(self) -> None:
        self.columns = Columns(self.text)

    @property
    def card_file(self) -> s.CardFile:
        return self.index.file

    def file_index(self, path: str) -> FileIndex | None:
        """The index of another file of the library, parsed if it was not yet."""
        card_file = next((f for f in self.lib.files if f.path == path), None)
        text = self.lib.diags.sources.get(path)
        return None if card_file is None or text is None else FileIndex(card_file, text)

    def resolve(self, name: str, near: s.CardFile | None = None) -> s.Algorithm | None:
        """The card a call to `name` from `near` (this file) resolves to, as the checker
        resolves it."""
        return self.lib.find(name, near=near or self.card_file)


def analyse(path: str, text: str, open_texts: dict[Path, str] | None = None) -> Document:
    """Check the card file at `path` whose text is `text`; `open_texts`: other files' unsaved
    texts, by resolved path."""
    key = Path(path).resolve()
    texts = {**(open_texts or {}), key: text}
    lib, _ = load([path], root=library_roots([path]), lazy=True, texts=texts)
    checker: Checker | None
    try:
        checker, diags = check(lib)
        found = diags.items
    except RecursionError:  # past the parser's own limits: say so where the card starts
        checker, found = None, [Diagnostic(s.Span(path, 1, 1, 1, 2),
                                           "this card is nested too deeply to check")]
    items = list(dict.fromkeys(d for d in [*lib.diags.items, *found] if d.span.file == path))
    card_file = next((f for f in lib.files if f.path == path), s.CardFile(path, ()))
    normalized = lib.diags.sources.get(path, normalize(text))
    return Document(path, text, lib, checker, items, FileIndex(card_file, normalized))
