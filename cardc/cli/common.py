"""What every verb of the command line shares: exit codes, diagnostics on stderr, files
written whole, and the library folders a verb's cards resolve against."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..app.inputs import library_folders
from ..atomic import write_text_atomic
from ..diagnostics import Diagnostics
from ..runtime.errors import RuntimeInputError

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def report(diags: Diagnostics) -> int:
    """Print diagnostics and their count on stderr; the exit code they call for."""
    if diags.items:
        print(diags.render(), file=sys.stderr)
    errors = len(diags.errors)
    if errors:
        print(f"\n{errors} error{'s' if errors > 1 else ''}", file=sys.stderr)
    return EXIT_ERROR if errors else EXIT_OK


def only_in(diags: Diagnostics, files: set[str]) -> Diagnostics:
    """The diagnostics of `files` alone (a called card's are reported where it is checked)."""
    return Diagnostics([d for d in diags.items if d.span.file in files], diags.sources)


def write(path: Path, text: str) -> None:
    """Write a file atomically, or end in one line saying why it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)
    except OSError as err:
        raise RuntimeInputError(f"cannot write '{path}': {err.strerror or err}") from None


def library(args: argparse.Namespace, paths: list[str]) -> list[str]:
    """The library folders a verb searches after the cards' own: --library, in order, else the
    cards/ folder each card lives in; the shipped library comes after either."""
    return library_folders(args.library, paths)
