"""cardc: algorithm cards in the notation of Phuong & Hutter (arXiv:2207.09238), compiled.

`check`, `render` and `fmt` never import torch; `model()` does, when called.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def model(card: str, preset: str | None = None, **overrides: Any):
    """Build the `nn.Module` a model card describes, with a preset's hyperparameters."""
    from .build import build_model

    return build_model(card, preset, overrides)
