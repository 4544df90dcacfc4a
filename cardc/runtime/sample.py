"""Autoregressive sampling from a trained model."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from cardc.runtime.logits import pick_token


def is_language_model(model: nn.Module) -> bool:
    """forward(x, targets=None, …): one token sequence in, scores over the vocabulary out."""
    return list(inspect.signature(model.forward).parameters)[1:2] == ["targets"]


@torch.inference_mode()  # no autograd bookkeeping at all: each decoded token costs less
def generate(
    model: nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    window: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Extend ``idx`` (int64 ``(B, T)``) by ``max_new_tokens``; temperature 0 is greedy, top_k
    and top_p (nucleus) narrow the tokens drawn from. The model reads at most the last
    ``window`` tokens (the positions it was trained on) and never more than its
    ``max_seq_len``."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if idx.ndim != 2 or idx.shape[1] == 0:
        raise ValueError(f"idx must have shape (B, T) with T >= 1, got {tuple(idx.shape)}")
    limits = [n for n in (getattr(model, "max_seq_len", None), window)
              if isinstance(n, int) and n > 0]
    limit = min(limits) if limits else None
    cache = model.new_cache() if hasattr(model, "new_cache") else None  # a causal decoder's
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            context = idx[:, -limit:] if limit is not None else idx
            logits = model(context) if cache is None else model(cache.new(context), cache=cache)
            if isinstance(logits, tuple):  # tolerate models that always return (logits, loss)
                logits = logits[0]
            if getattr(model, "returns", "logits") == "probabilities":  # the paper's P
                logits = logits.clamp_min(torch.finfo(logits.dtype).tiny).log()
            nxt = pick_token(logits[:, -1, :].float(), temperature, top_k, top_p, generator)
            idx = torch.cat([idx, nxt.to(idx.device)], dim=1)
    finally:
        model.train(was_training)
    return idx
