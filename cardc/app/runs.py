"""A finished run read back: its checkpoint's metadata, and its model rebuilt from the cards
the checkpoint records, with its weights, on a device (`cardc sample`, `cardc eval`)."""

from __future__ import annotations

import os

import torch

from .. import build  # called through the module, which tests may patch
from ..runtime.checkpoint import checkpoint_file, load_state, read_checkpoint
from ..runtime.errors import RuntimeInputError
from ..runtime.resume import latest
from ..runtime.runs import check_one_run, interrupted
from ..runtime.train import resolve_device


def trained_model(folder: str, device_name: str
                  ) -> tuple[dict, torch.nn.Module, torch.device]:
    """A run's metadata, and its model rebuilt from the checkpoint's cards with its weights, on
    the device asked for."""
    meta, state = read_run(folder)
    try:
        model = build.rebuild_model(meta, stored=sum(t.numel() for t in state.values()))
    except ValueError as err:
        raise RuntimeInputError(f"{folder}: {err}") from None
    load_state(model, state)
    device = resolve_device(device_name)
    return meta, model.to(device), device


def read_run(folder: str) -> tuple[dict, dict]:
    """A checkpoint's metadata and tensors, from a folder that holds one run."""
    if not os.path.isfile(checkpoint_file(folder)):
        saved = latest(folder) if os.path.isdir(folder) else None
        if saved is not None:
            raise RuntimeInputError(f"'{folder}' holds a run that has not finished; resume it "
                                    f"(cardc train … --resume {folder}), or read its newest "
                                    f"checkpoint, '{saved}'")
        if interrupted(folder):
            raise RuntimeInputError(f"'{folder}' holds no finished run: a run into it is under "
                                    "way or was stopped before it finished")
    meta, state = read_checkpoint(folder)
    check_one_run(folder, meta)
    return meta, state


def trained_context(meta: dict) -> int | None:
    """The positions the run trained, which a sampler's window keeps within (None: all the
    model's, as for an imported checkpoint)."""
    context = meta.get("context")
    return context if isinstance(context, int) and not isinstance(context, bool) \
        and context >= 1 else None
