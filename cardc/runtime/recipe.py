"""Running a training card: the paper's DTraining, ETraining and EDTraining drive their models.

The card's generated function is the training loop: this module only builds the model the card
calls, makes a dataset the model can read, and measures the card's own objective on held-out
examples before and after (the same function with η = 0 leaves the weights alone).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cardc.runtime.atomic import write_text_atomic
from cardc.runtime.checkpoint import save_checkpoint
from cardc.runtime.data import load_corpus, to_tensor
from cardc.runtime.plot import plot_losses
from cardc.runtime.tasks import reversal_pairs, windows

REPORT_EVERY = 100  # examples between progress lines and metric records


def make_data(model: torch.nn.Module, inputs: int, count: int, length: int, seed: int,
              data_path: str | None) -> list[list[torch.Tensor]]:
    """One list per dataset input of the card: corpus windows, or (z_n, x_n) reversal pairs."""
    if inputs == 2:
        vocab = int(model.card_meta["hyperparameters"].get("N_V", 0)) or 32
        pairs = reversal_pairs(count, vocab, 2, max(2, min(length, 6)), seed)
        return [[z for z, _ in pairs], [x for _, x in pairs]]
    return [windows(to_tensor(load_corpus(data_path)), count, length, seed)]


def held_out_loss(train_fn: Callable[..., Any], model: torch.nn.Module, data, hypers) -> float:
    """Mean over examples of the card's own loss, with η = 0 so nothing changes."""
    losses: list[float] = []
    rng = torch.get_rng_state()
    torch.manual_seed(0)  # the same masks each time it is measured
    train_fn(*data, model, **{**hypers, "N_epochs": 1, "eta": 0.0}, report=losses.append)
    torch.set_rng_state(rng)
    return sum(losses) / max(1, len(losses))


def run_training_card(train_fn: Callable[..., Any], model: torch.nn.Module, hypers: dict[str, Any],
                      out_dir: str, *, examples: int, length: int, seed: int,
                      data_path: str | None, name: str) -> dict[str, float]:
    """Train with the card's loop; write metrics.jsonl, loss.png and model.safetensors."""
    inputs = train_fn.__code__.co_argcount - 2 - len(hypers)  # datasets precede θ and hypers
    train = make_data(model, inputs, examples, length, seed, data_path)
    val = make_data(model, inputs, max(50, examples // 10), length, seed + 1, data_path)
    records: list[dict[str, Any]] = []
    before = held_out_loss(train_fn, model, val, hypers)
    records.append({"step": 0, "val_loss": before})
    print(f"held-out loss of the card's objective: {before:.3f} before training")
    seen: list[float] = []
    start = time.perf_counter()

    def report(loss: float) -> None:
        seen.append(loss)
        if len(seen) % REPORT_EVERY == 0:
            recent = sum(seen[-REPORT_EVERY:]) / REPORT_EVERY
            records.append({"step": len(seen), "train_loss": recent})
            print(f"  example {len(seen)}: train loss {recent:.3f}", flush=True)

    model.train()
    train_fn(*train, model, **hypers, report=report)
    after = held_out_loss(train_fn, model, val, hypers)
    records.append({"step": len(seen), "val_loss": after})
    seconds = time.perf_counter() - start
    print(f"held-out loss of the card's objective: {before:.3f} → {after:.3f} "
          f"({len(seen)} updates in {seconds:.1f} s)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    plot_losses(records, out / "loss.png", title=f"{name}: the card's own loss")
    save_checkpoint(out, model, model.card_meta)
    return {"before": before, "after": after, "updates": len(seen), "seconds": seconds}
