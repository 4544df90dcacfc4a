"""Bench worker: the model cardc generates from cards/<family>.card (see bench/timing.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from timing import Built, worker_main
from torch import nn

import cardc

ROOT = Path(__file__).resolve().parent.parent


def build(spec: dict[str, Any]) -> Built:
    model = cardc.model(str(ROOT / "cards" / f"{spec['family']}.card"), preset=spec["preset"],
                        **spec["overrides"])
    W_p = getattr(model, "W_p", None)  # GPT-2's learned positions
    return model, W_p.numel() if W_p is not None else 0


def logits_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


if __name__ == "__main__":
    worker_main("cardc", build, logits_of)
