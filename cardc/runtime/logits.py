"""The next token from a model's logits: greedy, or sampled with temperature, top-k and top-p;
and the rows that have drawn a stop token.

One definition for three users: `cardc.runtime.sample.generate`, the `generate` method of every
generated causal decoder, into whose module `cardc build` copies these functions' source (a
generated module imports torch alone), and a card's `top_k(w | k)` and `top_p(w | p)` steps,
whose module gets `filter_logits`. So they use torch and nothing else from this package.
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, top_k: int | None = None,
                  top_p: float | None = None) -> torch.Tensor:
    """logits (…, V) with −∞ outside the top_k largest and outside the nucleus, the fewest
    most probable tokens whose probabilities sum to top_p or more; None keeps every token."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        probs, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)
        # a token is dropped when the tokens more probable than it already reach top_p
        drop = probs.cumsum(dim=-1) - probs >= top_p
        drop = torch.zeros_like(drop).scatter(-1, order, drop)  # back in vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def pick_token(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of logits (B, V), as (B, 1) int64: the most probable at temperature
    0, else drawn from softmax(logits / temperature) within top_k and top_p."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    probs = torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
    if generator is not None:
        probs = probs.to(generator.device)  # multinomial draws on its generator's device
    return torch.multinomial(probs, 1, generator=generator).to(logits.device)


def hold_stopped(token: torch.Tensor, held: torch.Tensor,
                 stop_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens (B, 1) a step appends, a row that drew a stop token before repeating it, and
    `held` (B, 1) after the step: each row's stop token, or −1 while the row goes on."""
    token = torch.where(held >= 0, held, token)
    held = torch.where((held < 0) & torch.isin(token, stop_tokens), token, held)
    return token, held
