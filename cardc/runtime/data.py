"""Byte-level corpus loading, splitting and batching."""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

from cardc.runtime.errors import RuntimeInputError

Tokens = bytes | bytearray | torch.Tensor


def default_corpus() -> bytes:
    """English text of the pydoc topics shipped with CPython: offline and deterministic."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics)).encode("utf-8")


def load_corpus(path: str | None) -> bytes:
    """The default corpus when ``path`` is None, else the file's raw bytes."""
    if path is None:
        return default_corpus()
    check_corpus_path(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise RuntimeInputError(f"cannot read corpus file '{path}': {e.strerror or e}") from e
    if not data:
        raise RuntimeInputError(f"corpus file '{path}' is empty")
    return data


def check_corpus_path(path: str) -> None:
    """Refuse what is not a regular file (a FIFO or /dev/zero never ends) before reading it."""
    if not os.path.exists(path):
        raise RuntimeInputError(f"cannot read corpus file '{path}': No such file or directory")
    if not os.path.isfile(path):
        raise RuntimeInputError(f"corpus file '{path}' is not a regular file")


def to_tensor(tokens: Tokens) -> torch.Tensor:
    """Bytes become a uint8 tensor (4x smaller than int64); tensors pass through."""
    if isinstance(tokens, torch.Tensor):
        return tokens
    return torch.frombuffer(bytearray(tokens), dtype=torch.uint8)


def split(tokens: Tokens, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Hold out the last ``val_fraction`` of the tokens for validation."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    data = to_tensor(tokens)
    n_train = len(data) - int(len(data) * val_fraction)
    return data[:n_train], data[n_train:]


def get_batch(
    data: torch.Tensor,
    batch_size: int,
    block_size: int,
    generator: torch.Generator,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows ``x`` and their next-token targets ``y`` as int64 ``(B, T)``."""
    if len(data) <= block_size:
        raise RuntimeInputError(
            f"data split has {len(data)} tokens; need more than block_size={block_size}"
        )
    # Offsets come from a CPU generator so a run is reproducible whatever the device.
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    index = starts[:, None] + torch.arange(block_size + 1)
    chunk = data[index.to(data.device)].to(device=device, dtype=torch.long)
    return chunk[:, :-1], chunk[:, 1:]


def encode(text: str) -> list[int]:
    """UTF-8 bytes of ``text`` as token ids."""
    return list(text.encode("utf-8"))


def decode(ids: Iterable[int] | torch.Tensor) -> str:
    """Token ids back to text; a sampled sequence may split a multi-byte character."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    return bytes(ids).decode("utf-8", errors="replace")
