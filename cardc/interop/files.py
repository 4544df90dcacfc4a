"""Reading and writing Hugging Face model folders (config.json, safetensors, sharded indexes)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..runtime import jsontext
from ..runtime.errors import RuntimeInputError
from ..runtime.runs import check_destination, staged_run

EXPORT = "export"  # the kind of folder an export is (runtime.manifest)

HF_WEIGHTS, HF_INDEX, HF_CONFIG = "model.safetensors", "model.safetensors.index.json", "config.json"

def read_hf(source: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, dict[str, torch.Tensor]]:
    """config.json (None if absent) and the tensors of a Hugging Face model folder or file."""
    path = Path(source)
    if not path.exists():
        raise RuntimeInputError(f"no such file or directory: '{path}'")
    folder = path if path.is_dir() else path.parent
    if path.is_dir():
        path = path / HF_WEIGHTS if (path / HF_WEIGHTS).is_file() else path / HF_INDEX
        if not path.is_file():
            raise RuntimeInputError(f"'{source}' has neither {HF_WEIGHTS} nor {HF_INDEX}")
    files = _shards(path) if path.name.endswith(".index.json") else [path]
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(_read_safetensors(file))
    config_file = folder / HF_CONFIG
    config = _read_json(config_file) if config_file.is_file() else None
    return config, tensors


def _shards(index: Path) -> list[Path]:
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise RuntimeInputError(f"'{index}' has no weight_map")
    for tensor, name in weight_map.items():
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
            raise RuntimeInputError(f"'{index}': weight_map gives tensor '{tensor}' the shard "
                                    f"{json.dumps(name)[:60]}; expected a file name beside it")
    return [index.parent / name for name in sorted(set(weight_map.values()))]


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    if not file.is_file():
        raise RuntimeInputError(f"no such file: '{file}'")
    try:
        with safe_open(file, framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (not iterable)
    except Exception as err:  # safetensors raises its own error type for every kind of damage
        raise RuntimeInputError(f"'{file}' is not a valid safetensors file: {err}") from None


def _read_json(file: Path) -> dict[str, Any]:
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise RuntimeInputError(f"cannot read '{file}': {err}") from None
    value = jsontext.loads(text, f"'{file}'")
    if not isinstance(value, dict):
        raise RuntimeInputError(f"'{file}' is not a JSON object")
    return value


def write_hf(dest: str | os.PathLike[str], tensors: dict[str, torch.Tensor],
             config: dict[str, Any], extra: dict[str, str] | None = None) -> Path:
    """config.json, model.safetensors and the `extra` text files (a tokenizer's) in `dest`,
    which appears whole or not at all. An existing `dest` is replaced only if it is a model
    folder cardc exported and nothing else (runtime.runs.staged_run)."""
    texts = {**(extra or {}), HF_CONFIG: json.dumps(config, indent=2, sort_keys=True) + "\n"}
    check_destination(dest, EXPORT)
    try:
        with staged_run(dest, EXPORT) as folder:
            save_file(tensors, str(folder / HF_WEIGHTS), metadata={"format": "pt"})
            for name, text in texts.items():
                (folder / name).write_text(text, encoding="utf-8")
    except OSError as err:
        raise RuntimeInputError(f"cannot write '{dest}': {err.strerror or err}") from None
    return Path(dest)

