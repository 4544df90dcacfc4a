"""Autoregressive sampling from a trained model, and where a sample stops."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from cardc.runtime.logits import hold_stopped, pick_token


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
    stop_tokens: Iterable[int] | None = None,
) -> torch.Tensor:
    """Extend ``idx`` (int64 ``(B, T)``) by ``max_new_tokens``; temperature 0 is greedy, top_k
    and top_p (nucleus) narrow the tokens drawn from. The model reads at most the last
    ``window`` tokens (the positions it was trained on) and never more than its
    ``max_seq_len``. A row that draws one of ``stop_tokens`` is done: it repeats that token
    while other rows go on, and generation ends once every row is done (so fewer than
    ``max_new_tokens`` may be added)."""
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
    stops = torch.tensor(sorted({int(t) for t in stop_tokens or ()}), dtype=torch.long,
                         device=idx.device)
    held = torch.full((idx.shape[0], 1), -1, dtype=torch.long, device=idx.device)
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
            if len(stops):
                nxt, held = hold_stopped(nxt.to(idx.device), held, stops)
            idx = torch.cat([idx, nxt.to(idx.device)], dim=1)
            if len(stops) and bool((held >= 0).all()):
                break
    finally:
        model.train(was_training)
    return idx


def ids_text(ids: Iterable[int]) -> str:
    """Token IDs as `cardc sample` prints them, a space at each end so that a run of IDs is
    found whole (" 1 2 " is not in " 11 2 ")."""
    return f" {' '.join(map(str, ids))} "


@dataclass(frozen=True)
class Stops:
    """Where a continuation ends: before the first of `marks` in its text as `show` writes its
    tokens (decoded text, or token IDs between spaces), any mark whole in its last `tail`."""

    marks: tuple[str, ...]
    show: Callable[[list[int]], str]
    tail: int

    @classmethod
    def texts(cls, texts: Iterable[str], decode: Callable[[list[int]], str]) -> Stops:
        """Stop texts; a token decodes to a byte or more, and one more token before them
        reads a word's leading space as the whole text does."""
        marks = tuple(texts)
        return cls(marks, decode, max(len(m.encode("utf-8")) for m in marks) + 2)

    @classmethod
    def token_ids(cls, runs: Iterable[list[int]]) -> Stops:
        """Runs of token IDs, for prompts and outputs of token IDs."""
        runs = list(runs)
        return cls(tuple(ids_text(r) for r in runs), ids_text, max(map(len, runs)))

    def find(self, text: str) -> int | None:
        found = [i for i in (text.find(m) for m in self.marks) if i >= 0]
        return min(found) if found else None

    def cut(self, text: str) -> str:
        """`text` up to its first mark."""
        at = self.find(text)
        return text if at is None else text[:at]

    def watch(self, rows: int) -> Callable[[torch.Tensor], bool]:
        """The `stop` a sampling card calls with the tokens it draws for a batch, y (B,): True
        once every row's continuation holds a mark (rows that have one draw on until then)."""
        drawn: list[list[int]] = [[] for _ in range(rows)]
        done = [False] * rows

        def stop(y: torch.Tensor) -> bool:
            for row, token in enumerate(y.reshape(-1).tolist()):
                if not done[row]:
                    drawn[row].append(token)
                    done[row] = self.find(self.show(drawn[row][-self.tail:])) is not None
            return all(done)
        return stop
