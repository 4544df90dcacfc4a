"""What the parity tests share: copying a `transformers` model into a generated one through a
card's mapping file, and measuring how far two tensors differ."""

from __future__ import annotations

import torch


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def mapped_names(mapping, layers: int, tied: bool) -> dict[str, tuple[str, bool]]:
    """HF name → (our name, transposed), from the mapping file; an untied model adds its own
    lm_head → W_u, which the mapping (written for the tied model) leaves out."""
    table = {e.hf: (e.card, e.transpose) for e in mapping.entries(layers)}
    assert all(e.chunk == (0, 1) for e in mapping.entries(layers)), "no fused tensors here"
    if not tied:
        table["lm_head.weight"] = ("W_u", True)
    return table


def load_through_mapping(hf, ours, mapping, layers: int,
                         tied: bool) -> dict[str, tuple[str, bool]]:
    """Copy every HF parameter into `ours`, strictly: none left over, none missing."""
    table = mapped_names(mapping, layers, tied)
    hf_params = dict(hf.named_parameters(remove_duplicate=False))
    used = set(table) | (set(mapping.tied) if tied else set())
    assert set(hf_params) == used, f"unmapped {set(hf_params) - used}, missing {used - set(hf_params)}"
    state = {mine: (hf_params[name].detach().T if t else hf_params[name].detach()).clone()
             for name, (mine, t) in table.items()}
    ours.load_state_dict(state, strict=True)
    return table
