"""The helpers of generated models that route tokens to experts: the set of each token's k
best-scored experts, as a mask, and the sum over those experts of their weighted outputs,
sparse (each expert run on the tokens that chose it) or dense (every expert on every token, the
card's math as written, for the literal lowering).

`cardc build` copies the ones a model uses into its generated file, by name and as written
here (cardc.codegen reads this file as text, never imports it); each uses torch alone.
"""

import torch


def top_mask(scores, k):
    """argtop_k(scores | k) of every row: True at the k largest entries of the last axis."""
    best = scores.topk(min(k, scores.shape[-1]), dim=-1).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, best, True)


def route(x, chosen, weight, experts):
    """Σ over each token's chosen experts e of weight[e] · experts[e](token): every expert
    runs once, on the tokens that chose it (gathered), and its weighted outputs are added back
    at their tokens. x is (…, D), chosen and weight (…, E)."""
    lead = chosen.shape[:-1]
    tokens = x.expand(*lead, x.shape[-1]).reshape(-1, x.shape[-1])
    chosen = chosen.reshape(-1, chosen.shape[-1])
    weight = torch.as_tensor(weight, dtype=x.dtype, device=x.device)
    weight = weight.expand(*lead, chosen.shape[-1]).reshape(chosen.shape)
    out = None
    for e, expert in enumerate(experts):
        at = chosen[:, e].nonzero().squeeze(-1)
        y = expert(tokens[at]) * weight[at, e, None]
        out = y.new_zeros(tokens.shape[0], *y.shape[1:]) if out is None else out
        out = out.index_add(0, at, y)
    return out.reshape(*lead, *out.shape[1:])


def route_dense(x, chosen, weight, experts):
    """The same sum with every expert on every token, weighted 0 where not chosen."""
    weight = torch.where(chosen, torch.as_tensor(weight, dtype=x.dtype, device=x.device), 0)
    return sum(weight[..., e, None] * expert(x) for e, expert in enumerate(experts))
