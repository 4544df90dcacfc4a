"""What a run saves to go on exactly where it stopped, and finding it again.

A checkpoint is a folder `checkpoints/step-NNNNNNN/` in the run: the weights as any checkpoint
(`model.safetensors`, so `cardc sample` reads it too) and `state.safetensors`, which holds the
optimizer's tensors and every random generator's state, with the update count, the optimizer's
settings and the run's `fingerprint` (what must not change for the run to go on) as JSON. The
folder is written beside its final name and renamed into place, so a checkpoint is whole or
absent; the newest `keep` are kept.

Checkpoints are untrusted input: the JSON holds numbers and names only, each checked against
the optimizer the training card makes before it is used.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from cardc.atomic import fsync_path, pid_alive
from cardc.runtime.checkpoint import read_checkpoint, save_checkpoint
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.jsontext import MAX_DEPTH, depth_over

CHECKPOINTS = "checkpoints"
STATE_NAME = "state.safetensors"
STATE_KEY = "cardc_state"
_STEP = re.compile(r"step-(\d{7,})")
_PARTIAL = re.compile(r"\.step-\d+\.(\d+)\.tmp")  # a checkpoint being written, by process id


@dataclass
class Snapshot:
    """A checkpoint read back: where it is, its update count, its weights and state."""

    path: Path
    update: int
    meta: dict[str, Any]  # the weights' metadata (the run's)
    weights: dict[str, torch.Tensor]
    state: dict[str, Any]  # update, fingerprint, optimizer groups
    tensors: dict[str, torch.Tensor]  # the optimizer's and the generators' tensors


# ------------------------------------------------------------------ writing


def save_snapshot(run: str | os.PathLike[str], model: nn.Module | dict[str, torch.Tensor],
                  meta: dict[str, Any], optimizer: torch.optim.Optimizer | dict[str, Any],
                  update: int, fingerprint: dict[str, Any],
                  keep: int, extra: dict[str, Any] | None = None,
                  seen: torch.Tensor | None = None, beside: tuple[Path, ...] = (),
                  generators: dict[str, list[torch.Tensor]] | None = None) -> Path:
    """Write the checkpoint of update `update` into `run`'s checkpoints/, keep the newest
    `keep`, and return its folder. `model` and `optimizer` may be state dicts already (the
    whole of what several processes shard). `extra`: more of the harness's state, as JSON; `seen`: the
    losses since its last record, a row per process; `beside`: files copied in too (the
    tokenizer), so that the checkpoint reads as a run of its own; `generators`: the states of
    the generators every process draws from ("cpu", and "cuda": its device's), by rank (this
    process's CPU generator by default)."""
    root = Path(run) / CHECKPOINTS
    root.mkdir(exist_ok=True)
    _remove_partial(root)
    final = root / f"step-{update:07d}"
    partial = root / f".step-{update:07d}.{os.getpid()}.tmp"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        save_checkpoint(partial, model, {**meta, "update": update})
        for file in beside:
            shutil.copyfile(file, partial / file.name)
        tensors, groups = _optimizer_tensors(optimizer)
        for kind, states in (generators or {"cpu": [torch.get_rng_state()]}).items():
            tensors.update({f"rng.{kind}.{rank}": s for rank, s in enumerate(states)})
        if seen is not None:
            tensors["seen"] = seen
        state = {**(extra or {}), "update": update, "fingerprint": fingerprint,
                 "param_groups": groups}
        save_file(tensors, str(partial / STATE_NAME),
                  metadata={STATE_KEY: json.dumps(state, sort_keys=True)})
        fsync_path(partial)
        if final.exists():  # the same update saved again (an interrupt right after a save)
            shutil.rmtree(final)
        partial.rename(final)
        fsync_path(root)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    for old in snapshots(run)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _optimizer_tensors(optimizer: torch.optim.Optimizer | dict[str, Any]
                       ) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """An optimizer's per-parameter state as flat tensors `optimizer.<index>.<key>`, and its
    groups' settings (lists for tuples) without their parameter indices."""
    saved = optimizer if isinstance(optimizer, dict) else optimizer.state_dict()
    tensors = {}
    for index, values in saved["state"].items():
        for key, value in values.items():
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value)  # a plain number some optimizers keep (a step)
            tensors[f"optimizer.{index}.{key}"] = value.detach().cpu().contiguous()
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items() if k != "params"}
              for g in saved["param_groups"]]
    return tensors, groups


def _remove_partial(root: Path) -> None:
    """Checkpoints a killed process was writing when it died."""
    for path in root.iterdir():
        found = _PARTIAL.fullmatch(path.name)
        if found and int(found[1]) != os.getpid() and not pid_alive(int(found[1])):
            shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------ reading


def snapshots(run: str | os.PathLike[str]) -> list[Path]:
    """A run's checkpoint folders, oldest first."""
    root = Path(run) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m[1]), p) for p in root.iterdir()
             if (m := _STEP.fullmatch(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def read_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """A checkpoint folder's weights and state, checked for shape (not yet for fit)."""
    path = Path(path)
    meta, weights = read_checkpoint(path)
    file = path / STATE_NAME
    try:
        with safe_open(str(file), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except Exception as err:  # safetensors' own error type, for every kind of damage
        raise RuntimeInputError(f"'{file}' is not a valid checkpoint state: {err}") from None
    try:
        state = json.loads(metadata[STATE_KEY])
    except (KeyError, json.JSONDecodeError, RecursionError):
        state = None
    if state is None or depth_over(state, MAX_DEPTH):
        raise RuntimeInputError(f"'{file}' has no readable '{STATE_KEY}' record")
    update = state.get("update") if isinstance(state, dict) else None
    if not _count(update) or not isinstance(state.get("param_groups"), list) or \
            not isinstance(state.get("fingerprint"), dict) or meta.get("update") != update:
        raise RuntimeInputError(f"'{file}' has a damaged '{STATE_KEY}' record")
    return Snapshot(path, update, meta, weights, state, tensors)


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


# ------------------------------------------------------------------ restoring


def restore_optimizer(snap: Snapshot, optimizer: torch.optim.Optimizer,
                      load: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Load the checkpoint's optimizer state into the one the training card made (its groups
    and parameters must be the same; settings are taken only where the card has them, with
    the card's types). `load` puts the checked state dict in (by default the optimizer's
    own load_state_dict; processes that shard it share it out)."""
    fresh = optimizer.state_dict()
    groups = snap.state["param_groups"]
    if len(groups) != len(fresh["param_groups"]):
        raise _mismatch(snap, f"{len(groups)} parameter groups, the training card makes "
                        f"{len(fresh['param_groups'])}")
    merged = [_group(snap, saved, own) for saved, own in zip(groups, fresh["param_groups"],
                                                             strict=True)]
    sizes = {i: p.shape for i, p in enumerate(p for g in optimizer.param_groups
                                              for p in g["params"])}
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in snap.tensors.items():
        if not name.startswith("optimizer."):
            continue
        _, index, key = name.split(".", 2)
        if not index.isdigit() or int(index) not in sizes:
            raise _mismatch(snap, f"state for a parameter the model lacks ({name})")
        if tensor.ndim and tensor.shape != sizes[int(index)]:
            raise _mismatch(snap, f"'{name}' of shape {tuple(tensor.shape)}, for a parameter "
                            f"of shape {tuple(sizes[int(index)])}")
        state.setdefault(int(index), {})[key] = tensor
    try:
        (load or optimizer.load_state_dict)({"state": state, "param_groups": merged})
    except (ValueError, KeyError, RuntimeError, TypeError) as err:
        raise _mismatch(snap, str(err)) from None


def _group(snap: Snapshot, saved: Any, own: dict[str, Any]) -> dict[str, Any]:
    """A saved group's settings, each of the kind the fresh group's is."""
    if not isinstance(saved, dict):
        raise _mismatch(snap, "a parameter group that is not a table")
    out = dict(own)
    for key, value in saved.items():
        if key not in own:
            raise _mismatch(snap, f"an optimizer setting '{key}' the training card's lacks")
        mine = own[key]
        if isinstance(mine, tuple) and isinstance(value, list) and \
                all(_number(v) for v in value):
            out[key] = tuple(value)
        elif (mine is None or _number(mine)) and (value is None or _number(value)):
            out[key] = value
        else:
            raise _mismatch(snap, f"optimizer setting {key} = {value!r}")
    return out


def _number(x: object) -> bool:
    return isinstance(x, int | float)  # bools too: a setting such as fused=True


def restore_rng(snap: Snapshot, rank: int = 0, device: torch.device | None = None) -> None:
    """Put the generators of the process of this rank back where they were when the
    checkpoint was written: the CPU's, and its GPU's."""
    cpu = snap.tensors.get(f"rng.cpu.{rank}")
    if cpu is None or cpu.dtype != torch.uint8 or cpu.shape != torch.get_rng_state().shape:
        raise _mismatch(snap, f"no CPU generator state for process {rank}")
    torch.set_rng_state(cpu)
    cuda = snap.tensors.get(f"rng.cuda.{rank}")
    if cuda is not None and device is not None and device.type == "cuda":
        try:
            torch.cuda.set_rng_state(cuda, device)
        except RuntimeError as err:
            raise _mismatch(snap, f"its GPU generator state: {err}") from None


def _mismatch(snap: Snapshot, what: str) -> RuntimeInputError:
    return RuntimeInputError(f"'{snap.path / STATE_NAME}' does not fit this run: {what}")


def latest(run: str | os.PathLike[str]) -> Path | None:
    """The newest whole checkpoint of `run`."""
    found = snapshots(run)
    return found[-1] if found else None
