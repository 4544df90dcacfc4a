"""Cards checked once per test module or fuzz run: `cardc.build.checked` remembered by the card
paths, the library roots and the cards' text, for tests whose cards never change between calls
(only a mapping file or a folder does). Checking the library is most of an import's cost."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cardc.build


@contextlib.contextmanager
def cards_checked_once() -> Iterator[None]:
    original = cardc.build.checked
    seen: dict[tuple, Any] = {}

    def checked(paths: list[str], library: Any, lazy: bool = False) -> Any:
        texts = tuple(Path(p).read_bytes() if Path(p).is_file() else b"" for p in paths)
        key = (tuple(map(str, paths)), repr(library), texts, lazy)
        if key not in seen:
            seen[key] = original(paths, library, lazy)
        return seen[key]

    cardc.build.checked = checked
    try:
        yield
    finally:
        cardc.build.checked = original
