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
    """Σ over each token's chosen experts e of weight[e] · experts[e](token): the tokens are
    gathered once, in order of the expert that chose them, each expert runs once on its own
    run of them, and the weighted outputs are added back at their tokens in one scatter (one
    gather and one scatter for all experts, in the backward pass too). x is (…, D), chosen
    and weight (…, E).

    Each run is padded with zero rows to a multiple of ROWS in that same gather: a token's
    output is then the same to the bit however many other tokens chose its expert (so a
    position's logits never depend, even in rounding, on the tokens after it). The padding
    rows are weighted 0 and added to a spare row past the last token, dropped."""
    lead = chosen.shape[:-1]
    tokens = x.expand(*lead, x.shape[-1]).reshape(-1, x.shape[-1])
    chosen = chosen.reshape(-1, chosen.shape[-1])
    weight = torch.as_tensor(weight, dtype=x.dtype, device=x.device)
    weight = weight.expand(*lead, chosen.shape[-1]).reshape(chosen.shape)
    expert_of, token = chosen.T.nonzero(as_tuple=True)  # grouped by expert
    counts = torch.bincount(expert_of, minlength=len(experts))
    sizes = (counts + ROWS - 1) // ROWS * ROWS  # each run and its padding
    short = sizes - counts
    # each chosen token's row among the padded runs: the padding of the runs before it later
    slot = torch.arange(len(token), device=x.device) + (short.cumsum(0) - short)[expert_of]
    spare = tokens.shape[0]  # the zero row the padding reads, and where its output goes
    rows = token.new_full((int(sizes.sum()),), spare).index_put((slot,), token)
    scale = weight.new_zeros(rows.shape).index_put((slot,), weight[token, expert_of])
    runs = torch.cat([tokens, tokens.new_zeros(1, tokens.shape[1])]).index_select(0, rows)
    y = torch.cat([expert(run) for expert, run in
                   zip(experts, runs.split(sizes.tolist()), strict=True)])
    y = y * scale.reshape(-1, *[1] * (y.dim() - 1))
    out = y.new_zeros(spare + 1, *y.shape[1:]).index_add(0, rows, y)[:spare]
    return out.reshape(*lead, *y.shape[1:])


# Rows a run of tokens is padded to a multiple of: CPU kernels compute a product of fewer
# than 4 rows, and the last entries of an element-wise op (past the last full vector of 16),
# another way, whose rounding differs
ROWS = 16


def route_dense(x, chosen, weight, experts):
    """The same sum with every expert on every token, weighted 0 where not chosen."""
    weight = torch.where(chosen, torch.as_tensor(weight, dtype=x.dtype, device=x.device), 0)
    return sum(weight[..., e, None] * expert(x) for e, expert in enumerate(experts))
