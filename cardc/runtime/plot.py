"""Loss curves as a PNG; matplotlib is imported lazily because it is slow to import."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from cardc.atomic import atomic_path


def plot_losses(
    records: Sequence[dict[str, Any]], path: str | os.PathLike[str], title: str = "cardc training"
) -> None:
    """Draw train and val loss against step and write the PNG atomically."""
    # Figure + Agg canvas, not pyplot: no global backend switch, no GUI, safe in threads.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    steps = [r["step"] for r in records]
    for key, label in (("train_loss", "train"), ("val_loss", "val")):
        ax.plot(steps, [_num(r.get(key)) for r in records], marker="o", markersize=3, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats/byte)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")  # explicit: the temp name has no .png suffix


def _num(x: Any) -> float:
    # A diverged run records null losses; NaN leaves a gap instead of breaking the plot.
    return float("nan") if x is None else float(x)
