"""cardc: algorithm cards in the notation of Phuong & Hutter (arXiv:2207.09238), compiled.

`check`, `render` and `fmt` never import torch; `model()`, `train()` and `sample()` do, when
called (`train` and `sample` are `cardc.app`'s, loaded on first use), as do `run_with_cache()`
and `run_with_hooks()` (cardc.runtime.observe: every value a card names, read or replaced).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app.sampling import sample
    from .app.training import train
    from .runtime.observe import run_with_cache, run_with_hooks

__version__ = "0.1.0"

__all__ = ["load", "model", "run_with_cache", "run_with_hooks", "sample", "train"]


def model(card: str, preset: str | None = None, library: list[str] | None = None,
          name: str | None = None, **overrides: Any):
    """Build the `nn.Module` a model card describes, with a preset's hyperparameters.

    `library`: folders of cards its calls resolve against, after the card's own folder and
    those above it and before the library cardc ships (as `--library` on the command line).
    `name`: which card of the file (as `--name`; default its model card). The other keywords
    set hyperparameters, each a number."""
    from .build import build_model

    if isinstance(library, str):
        library = [library]
    return build_model(card, preset, overrides, library, name)


def load(run: str | os.PathLike[str], device: str = "cpu"):
    """The model of a finished run (`cardc train … --out RUN`, `cardc import … --out RUN`),
    rebuilt from the cards its checkpoint records, with its weights, in evaluation mode."""
    from .app.runs import trained_model

    _, built, _ = trained_model(os.fspath(run), device)
    return built.eval()


def __getattr__(name: str) -> Any:
    """`cardc.train`, `cardc.sample`, `cardc.run_with_cache` and `cardc.run_with_hooks`,
    imported when first asked for: they import torch."""
    if name == "train":
        from .app.training import train

        return train
    if name == "sample":
        from .app.sampling import sample

        return sample
    if name in ("run_with_cache", "run_with_hooks"):
        from .runtime import observe

        return getattr(observe, name)
    raise AttributeError(f"module 'cardc' has no attribute {name!r}")
