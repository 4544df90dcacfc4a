"""Bench worker: the model cardc generates from cards/<family>.card, or from any model card
(spec["card"]), see bench/timing.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from timing import Built, encodes, source_of, worker_main
from torch import nn

ROOT = Path(__file__).resolve().parent.parent


def build(spec: dict[str, Any]) -> Built:
    from cardc.build import build_model

    card = spec.get("card") or str(ROOT / "cards" / f"{spec['family']}.card")
    model = build_model(card, spec["preset"], spec["overrides"], name=spec.get("name"))
    W_p = getattr(model, "W_p", None)  # GPT-2's learned positions
    return model, W_p.numel() if W_p is not None else 0


def logits_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(source_of(x), x) if encodes(model) else model(x)


if __name__ == "__main__":
    worker_main("cardc", build, logits_of)
