"""Safetensors checkpoints with cardc metadata, written atomically."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from cardc.atomic import atomic_path
from cardc.runtime.errors import RuntimeInputError

CHECKPOINT_NAME = "model.safetensors"
META_KEY = "cardc"
ALIAS_KEY = "cardc_aliases"

_ViewKey = tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype, torch.device]


def save_checkpoint(
    directory: str | os.PathLike[str], model: nn.Module | dict[str, torch.Tensor],
    meta: dict[str, Any]
) -> str:
    """Write ``directory/model.safetensors`` atomically (a model's weights, or a state dict
    gathered from the processes that shard it); return its path."""
    state = model if isinstance(model, dict) else model.state_dict()
    tensors, aliases = _dedupe(state)
    metadata = {META_KEY: json.dumps(meta, sort_keys=True), ALIAS_KEY: json.dumps(aliases)}
    path = os.path.join(os.fspath(directory), CHECKPOINT_NAME)
    with atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)
    return path


def _dedupe(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Store each tied tensor once and map its other names to the stored one.

    safetensors refuses tensors that share storage, and tied weights (embedding and
    unembedding) appear under two names in a state_dict.
    """
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen_views: dict[_ViewKey, str] = {}
    seen_storages: set[int] = set()
    for name, t in state.items():
        t = t.detach()
        key = _view_key(t)
        if key is not None and key in seen_views:
            aliases[name] = seen_views[key]
            continue
        storage = t.untyped_storage().data_ptr()
        # Partial overlaps (e.g. slices of one buffer) cannot be aliased: copy them out.
        copy = storage in seen_storages or not t.is_contiguous()
        out = t.clone(memory_format=torch.contiguous_format) if copy else t
        tensors[name] = out.cpu()
        if key is not None:
            seen_views[key] = name
            seen_storages.add(storage)
    return tensors, aliases


def _view_key(t: torch.Tensor) -> _ViewKey | None:
    # Empty tensors may all report a null pointer; never treat them as tied.
    if t.numel() == 0:
        return None
    ptr = t.untyped_storage().data_ptr()
    return ptr, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t.device


def checkpoint_file(path: str | os.PathLike[str]) -> str:
    """Accept a run directory or the .safetensors file itself."""
    path = os.fspath(path)
    return os.path.join(path, CHECKPOINT_NAME) if os.path.isdir(path) else path


def read_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Return ``(meta, state_dict)`` with tied names restored."""
    file = checkpoint_file(path)
    if not os.path.isfile(file):
        raise RuntimeInputError(f"checkpoint not found: '{file}'")
    try:
        with safe_open(file, framework="pt") as f:
            metadata = f.metadata() or {}
            state = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except Exception as e:  # safetensors raises its own error type for every kind of damage
        raise RuntimeInputError(f"'{file}' is not a valid safetensors file: {e}") from e
    if META_KEY not in metadata:
        raise RuntimeInputError(f"'{file}' has no '{META_KEY}' metadata; not a cardc checkpoint")
    meta = _parse_json(metadata[META_KEY], file)
    for alias, target in _parse_json(metadata.get(ALIAS_KEY, "{}"), file).items():
        if target not in state:
            raise RuntimeInputError(f"'{file}' aliases '{alias}' to missing tensor '{target}'")
        state[alias] = state[target]
    return meta, state


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's cardc metadata, its tensors left unread (None of a file without it)."""
    file = checkpoint_file(path)
    try:
        with safe_open(file, framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error type for every kind of damage
        raise RuntimeInputError(f"'{file}' is not a valid safetensors file: {e}") from e
    return _parse_json(metadata.get(META_KEY, "{}"), file)


def _parse_json(text: str, file: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise RuntimeInputError(f"'{file}' has corrupt cardc metadata: {e}") from e
    if not isinstance(value, dict):
        raise RuntimeInputError(f"'{file}' has corrupt cardc metadata: expected a JSON object")
    return value


def load_state(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Strictly load ``state_dict`` into ``model``, naming the first mismatch on failure."""
    expected = model.state_dict()
    for name, want in expected.items():
        if name not in state_dict:
            raise RuntimeInputError(f"checkpoint is missing tensor '{name}' that the model expects")
        got = state_dict[name]
        if got.shape != want.shape:
            raise RuntimeInputError(
                f"checkpoint tensor '{name}' has shape {_shape(got)}, model expects {_shape(want)}"
            )
    for name in state_dict:
        if name not in expected:
            raise RuntimeInputError(f"checkpoint tensor '{name}' does not exist in the model")
    # Copies in place, so parameters tied in the model stay tied.
    model.load_state_dict(state_dict, strict=True)


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))
