"""cardc: algorithm cards in the notation of Phuong & Hutter (arXiv:2207.09238), compiled.

`check`, `render` and `fmt` never import torch; `model()` does, when called.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def model(card: str, preset: str | None = None, library: list[str] | None = None,
          **overrides: Any):
    """Build the `nn.Module` a model card describes, with a preset's hyperparameters.

    `library`: folders of cards its calls resolve against, after the card's own folder and
    those above it and before the library cardc ships (as `--library` on the command line)."""
    from .build import build_model

    if isinstance(library, str):
        library = [library]
    return build_model(card, preset, overrides, library)
