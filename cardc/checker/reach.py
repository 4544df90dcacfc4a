"""Which errors of a checked library stop a command: those in the cards it was given, in the
cards they call, transitively, or in no card file at all. Errors in a card nobody given calls
do not (a broken card elsewhere in the library must not block the rest)."""

from __future__ import annotations

from ..diagnostics import CardError, Diagnostics
from ..library import Library
from .driver import Checker


def require_clean(lib: Library, checker: Checker, diags: Diagnostics, files: set[str]) -> None:
    """Raise the errors in `files`, in the cards they call, or in no card file at all."""
    used = files_used(lib, checker, files)
    errors = [d for d in diags.errors if d.span.file in used or d.span.file not in
              {f.path for f in lib.files}]
    if errors:
        raise CardError(Diagnostics(errors, diags.sources))


def files_used(lib: Library, checker: Checker, files: set[str]) -> set[str]:
    """The given card files and every file their cards call into, transitively."""
    used = set(files)
    todo = [a for f in lib.files if f.path in files for a in f.algorithms]
    seen: set[int] = set()
    while todo:
        alg = todo.pop()
        if id(alg) in seen or id(alg) not in checker.infos:
            continue
        seen.add(id(alg))
        used.add(lib.file_of(alg).path)
        todo += [call.callee for call in checker.infos[id(alg)].calls.values()]
    return used
