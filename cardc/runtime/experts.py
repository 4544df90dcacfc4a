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
    run of them, and its outputs, weighted, are added back at their tokens (one gather for
    all experts, whose gradient is one scatter; a scatter per expert, whose gradient is a
    gather of its own rows: joining the outputs to scatter them at once copied them all
    twice). x is (…, D), chosen and weight (…, E).

    Each run is padded to a multiple of ROWS rows: a token's output is then the same to the
    bit however many other tokens chose its expert (so a position's logits never depend,
    even in rounding, on the tokens after it). The padding rows are weighted 0 and added to
    a spare row past the last token, dropped.

    Where no gradient is taken an expert no token chose is not called (a decoded token calls
    its k experts, not all E); under autograd it runs on no rows, so that its weights get a
    zero gradient, as the dense sum gives them, not none. And there, for at most FEW chosen
    (token, expert) pairs, the runs are laid out in Python rather than by a dozen small tensor
    operations: the same runs, outputs and sums, to the bit. A lone token (a decoded one) is
    no run among others: each of its experts runs on its one row, unpadded, at a third of the
    cost of 16 rows; its output then differs from the same token's among others in rounding
    alone, as a decoded token's attention does."""
    lead, E, D = chosen.shape[:-1], chosen.shape[-1], x.shape[-1]
    tokens = (x if x.shape[:-1] == lead else x.expand(*lead, D)).reshape(-1, D)
    weight = torch.as_tensor(weight, dtype=x.dtype, device=x.device)
    if weight.shape != chosen.shape:
        weight = weight.expand(chosen.shape)
    weight = weight.reshape(-1, E)
    expert_of, token = chosen.reshape(-1, E).T.nonzero(as_tuple=True)  # grouped by expert
    spare = tokens.shape[0]
    if spare == 1 and not torch.is_grad_enabled():
        y = route_one(tokens, expert_of.tolist(), weight[0], experts)
        return y.reshape(*lead, *y.shape[1:])
    if 0 < len(token) <= FEW and not torch.is_grad_enabled():
        runs = {}  # expert → its tokens, the experts in order
        for e, t in zip(expert_of.tolist(), token.tolist(), strict=True):
            runs.setdefault(e, []).append(t)
        rows = [t for ts in runs.values() for t in ts + ts[:1] * (-len(ts) % ROWS)]
        parts = tokens.index_select(0, torch.tensor(rows, device=x.device)).split(
            [len(ts) + -len(ts) % ROWS for ts in runs.values()])
        y = torch.cat([experts[e](run)[:len(ts)] for (e, ts), run in
                       zip(runs.items(), parts, strict=True)])
        y = y * weight[token, expert_of].reshape(-1, *[1] * (y.dim() - 1))
        return y.new_zeros(spare, *y.shape[1:]).index_add_(0, token, y).reshape(*lead, *y.shape[1:])
    counts = torch.bincount(expert_of, minlength=E).tolist()
    sizes = [n + -n % ROWS for n in counts]  # each run and its padding
    # each chosen token's row among the padded runs: the padding of the runs before it later
    shift, padding = [], 0
    for n, size in zip(counts, sizes, strict=True):
        shift.append(padding)
        padding += size - n
    slot = torch.arange(len(token), device=x.device)
    if padding:
        slot = slot + torch.tensor(shift, device=x.device)[expert_of]
    # where each row's output goes: the padding's to a spare row past the last token, dropped
    at = token.new_full((sum(sizes),), spare).index_put_((slot,), token)
    # the padding rows read the last token (any row serves: a product's row depends on its
    # own row alone), weighted 0
    rows = at.clamp(max=max(spare - 1, 0))
    scale = weight.new_zeros(rows.shape).index_put_((slot,), weight[token, expert_of])
    called = [n > 0 or torch.is_grad_enabled() for n in counts]
    if not any(called):  # no token at all: one run on no rows gives the output's shape
        called[0] = True
    runs = tokens.index_select(0, rows).split(sizes)
    out = None
    for expert, run, to, weights, call in zip(experts, runs, at.split(sizes),
                                              scale.split(sizes), called, strict=True):
        if not call:
            continue
        y = expert(run)
        y = y * weights.reshape(-1, *[1] * (y.dim() - 1))
        if out is None:
            out = y.new_zeros(spare + 1, *y.shape[1:])
        out.index_add_(0, to, y)  # each token's experts added in their order
    return out[:spare].reshape(*lead, *out.shape[1:])


def route_one(token, chosen, weight, experts):
    """Σ over the experts e of `chosen` (their indices, ascending) of weight[e] ·
    experts[e](token), for one token (1, D): each expert called on that row."""
    if not chosen:  # none: the first expert's output, weighted 0, gives the shape
        return experts[0](token) * 0
    y = experts[chosen[0]](token) * weight[chosen[0]]
    for e in chosen[1:]:
        y = y + experts[e](token) * weight[e]
    return y


# Rows a run of tokens is padded to a multiple of: CPU kernels compute a product of fewer
# than 4 rows, and the last entries of an element-wise op (past the last full vector of 16),
# another way, whose rounding differs
ROWS = 16
# Chosen (token, expert) pairs up to which route lays out its runs in Python: a few decoded
# tokens' k experts each
FEW = 16


def route_dense(x, chosen, weight, experts):
    """The same sum with every expert on every token, weighted 0 where not chosen."""
    weight = torch.where(chosen, torch.as_tensor(weight, dtype=x.dtype, device=x.device), 0)
    return sum(weight[..., e, None] * expert(x) for e, expert in enumerate(experts))
