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


def swap_columns(w: torch.Tensor, first: int, width: int) -> None:
    """Exchange, in place, columns first…first+width−1 with the next `width`: two heads' slices
    of a projection, a negative control that must break parity."""
    a, b = slice(first, first + width), slice(first + width, first + 2 * width)
    w[:, a], w[:, b] = w[:, b].clone(), w[:, a].clone()


def next_token_grad_diffs(hf, ours, table: dict[str, tuple[str, bool]],
                          idx: torch.Tensor) -> dict[str, float]:
    """HF name → max |gradient difference| of the next-token loss, HF shifting its labels
    itself and ours given the shifted targets."""
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    hf(idx, labels=idx).loss.backward()
    ours(idx[:, :-1], idx[:, 1:])[1].backward()
    hf_params, mine = dict(hf.named_parameters()), dict(ours.named_parameters())
    diffs = {}
    for name, (ours_name, t) in table.items():
        g = hf_params[name].grad
        diffs[name] = max_diff(mine[ours_name].grad, g.T if t else g)
    return diffs


def logits_diff(hf, ours, idx: torch.Tensor, shape: tuple[int, ...]) -> float:
    """max |logits difference| of the two models on the same tokens, both of `shape`."""
    with torch.no_grad():
        want, got = hf(idx).logits, ours(idx)
    assert got.shape == want.shape == shape
    return max_diff(got, want)


def padding_row_grad_diff(hf, ours, broken, table: dict[str, tuple[str, bool]],
                          idx: torch.Tensor) -> float:
    """A negative control: `broken`, a card without the padding row, given `ours`' weights;
    its largest gradient difference, which the pad row's gradient must make large."""
    broken.load_state_dict(ours.state_dict(), strict=True)
    return max(next_token_grad_diffs(hf, broken, table, idx).values())
