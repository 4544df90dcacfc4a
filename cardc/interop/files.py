"""Reading and writing Hugging Face model folders (config.json, safetensors, sharded indexes)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..atomic import atomic_path, write_text_atomic
from ..runtime import jsontext
from ..runtime.errors import RuntimeInputError

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
    """config.json, model.safetensors and the `extra` text files (a tokenizer's) in `dest`. A
    new folder appears whole or not at all; in an existing one each file is replaced
    atomically."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise RuntimeInputError(f"'{dest}' exists and is not a folder")
    if (dest / HF_INDEX).exists():  # transformers would read the old shards, not the new file
        raise RuntimeInputError(f"'{dest}' holds a sharded model ({HF_INDEX}); "
                                "export to a new folder")
    texts = {**(extra or {}), HF_CONFIG: json.dumps(config, indent=2, sort_keys=True) + "\n"}
    try:
        return _write_hf_files(dest, tensors, texts)
    except OSError as err:
        raise RuntimeInputError(f"cannot write '{dest}': {err.strerror or err}") from None


def _write_hf_files(dest: Path, tensors: dict[str, torch.Tensor], texts: dict[str, str]) -> Path:
    if dest.is_dir() and any(dest.iterdir()):
        with atomic_path(dest / HF_WEIGHTS) as tmp:
            save_file(tensors, tmp, metadata={"format": "pt"})
        for name, text in texts.items():
            write_text_atomic(dest / name, text)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        with atomic_path(tmp_dir / HF_WEIGHTS) as tmp:
            save_file(tensors, tmp, metadata={"format": "pt"})
        for name, text in texts.items():
            write_text_atomic(tmp_dir / name, text)
        tmp_dir.chmod(0o755)  # mkdtemp makes it private; a model folder is readable like any
        if dest.is_dir():
            dest.rmdir()  # empty: replaced by the finished folder
        tmp_dir.rename(dest)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return dest

