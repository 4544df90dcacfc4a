"""A bias table with one column per head, read at a tensor of buckets, as T5 writes it:

    β ← RelativeBuckets(X | N_b = N_b, d_max = d_max)
    for h ∈ [H] : Y^h ← Head(Q[:, (h − 1) d + 1 : h d], …, β, W_b[:, h])
    ∀t, t′: S[t, t′] ← S[t, t′] + w[β[t, t′]]      (in Head)

The map over heads hands every head its own column `W_b[:, h]` (the table's columns on the head
axis) and the buckets shared by all; the head's bias is the column looked up at the bucket of
each pair of positions, the examples' axes and the heads' broadcast against each other
(modelkit's lookup), and lowers to SDPA's float mask. Fused, literal and the reference
interpreter agree in float64, values and gradients, and equal the math written in plain torch.

A bias added under a condition, `∀t, t′, if c then S[t, t′] ← S[t, t′] − m`, is the bias where c
holds and 0 elsewhere in the same float mask, and a KV cache computes it again at the positions
it decodes (cache == recomputation, tests/decodecheck.py).
"""

from __future__ import annotations

import math

import torch
from test_intmath import t5_buckets
from test_reproducers import ATOL, RTOL, Built, _randn
from test_score_bias import _fused

HEADS = """\
Algorithm: Y ← BucketBiased(X | W)
/* Heads whose scores add their own column of a table, read at the bucket of each pair. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, H, N_b, d_max ∈ ℕ; d = D/H
Parameters: W consisting of:
    W_q, W_k, W_v ∈ ℝ^{D×D}
    W_b ∈ ℝ^{N_b×H}
1 Q ← X W_q
2 K ← X W_k
3 V ← X W_v
4 β ← {buckets}(X | N_b = N_b, d_max = d_max)
5 for h ∈ [H] : Y^h ← Head(Q[:, (h − 1) d + 1 : h d], K[:, (h − 1) d + 1 : h d], V[:, (h − 1) d + 1 : h d], β, W_b[:, h])
6 return Y = [Y^1, Y^2, …, Y^H]

Algorithm: Y ← Head(Q, K, V, β, w)
/* One head, its scores biased by w at the buckets β. */
Input: Q, K, V ∈ ℝ^{T×d}
Input: β ∈ ℕ^{T×T}
Input: w ∈ ℝ^{N_b}
Output: Y ∈ ℝ^{T×d}
1 S ← Q K^⊺
2 ∀t, t′: S[t, t′] ← S[t, t′] + w[β[t, t′]]
{mask}3 return Y = softmax(S) V
"""

CAUSAL_MASK = "3 ∀t, t′, if t′ > t then S[t, t′] ← −∞\n"


def _card(causal: bool) -> str:
    text = HEADS.replace("{buckets}", "CausalRelativeBuckets" if causal else "RelativeBuckets")
    text = text.replace("{mask}", CAUSAL_MASK if causal else "")
    return text if not causal else text.replace("3 return Y = softmax", "4 return Y = softmax")


def _plain(X, w, H: int, n_buckets: int, d_max: int, causal: bool) -> torch.Tensor:
    """The heads in plain torch: unscaled scores plus column h of the table at each bucket."""
    T, D = X.shape[-2:]
    d = D // H
    buckets = t5_buckets(T, n_buckets, d_max, not causal) - 1
    Q, K, V = X @ w.W_q, X @ w.W_k, X @ w.W_v
    out = []
    for h in range(H):
        cols = slice(h * d, (h + 1) * d)
        S = Q[..., cols] @ K[..., cols].mT + w.W_b[:, h][buckets]
        if causal:
            S = S.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        out.append(torch.softmax(S, dim=-1) @ V[..., cols])
    return torch.cat(out, dim=-1)


def test_a_column_per_head_read_at_bidirectional_buckets(tmp_path):
    built = Built(tmp_path, _card(causal=False), D=8, H=4, N_b=8, d_max=6)
    X = _randn(12, 8)  # 12 positions: distances past d_max share the last buckets
    want = built.agree(X)
    plain = _plain(X, built.literal, 4, 8, 6, causal=False)
    torch.testing.assert_close(want, plain.detach(), rtol=RTOL, atol=ATOL)
    fused = _fused(tmp_path, _card(causal=False))
    assert "for h in" not in fused and "softmax" not in fused
    assert "W_b.transpose(-2, -1)" in fused  # the columns on the head axis
    assert "lookup(w, beta, 2, 1)" in fused and "grouped_sdpa(Q, K, V, attn_mask=" in fused


def test_a_column_per_head_read_at_causal_buckets_beside_a_mask(tmp_path):
    built = Built(tmp_path, _card(causal=True), D=6, H=2, N_b=6, d_max=5)
    X = _randn(11, 6)
    want = built.agree(X)
    plain = _plain(X, built.literal, 2, 6, 5, causal=True)
    torch.testing.assert_close(want, plain.detach(), rtol=RTOL, atol=ATOL)
    fused = _fused(tmp_path, _card(causal=True))
    assert "for h in" not in fused and "lookup(w, beta, 2, 1)" in fused


def test_lookup_broadcasts_the_heads_against_the_examples():
    """modelkit's lookup: a table per head (H, n) at indices per example (B, 1, T, T) gives
    (B, H, T, T), entry [b, h, i, j] = table[h, index[b, 0, i, j]]."""
    from cardc.runtime.modelkit import lookup

    table = torch.arange(12.0).reshape(3, 4)  # 3 heads, 4 buckets
    index = torch.tensor([[[[0, 3], [2, 1]]], [[[1, 1], [0, 2]]]])  # (2, 1, 2, 2)
    got = lookup(table, index, 2)
    assert got.shape == (2, 3, 2, 2)
    for b in range(2):
        for h in range(3):
            assert torch.equal(got[b, h], table[h][index[b, 0]])


# ------------------------------------------------------------------ a bias under a condition

COND_HEAD = """\
Algorithm: Y ← FarPenalty(X | W)
/* Causal heads whose scores fall by the head's m for every key more than 2 positions back. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, H ∈ ℕ; d = D/H
Parameters: W consisting of:
    W_q, W_k, W_v ∈ ℝ^{D×D}
1 Q ← X W_q
2 K ← X W_k
3 V ← X W_v
4 for h ∈ [H] : Y^h ← Head(Q[:, (h − 1) d + 1 : h d], K[:, (h − 1) d + 1 : h d], V[:, (h − 1) d + 1 : h d] | m = 2^{−h/2})
5 return Y = [Y^1, Y^2, …, Y^H]

Algorithm: Y ← Head(Q, K, V | m)
/* One causal head, the keys more than 2 back penalised by m. */
Input: Q, K, V ∈ ℝ^{T×d}
Output: Y ∈ ℝ^{T×d}
Hyperparameters: m ∈ (0, ∞)
1 S ← Q K^⊺/√d
2 ∀t, t′, if t − t′ > 2 then S[t, t′] ← S[t, t′] − m
3 ∀t, t′, if t′ > t then S[t, t′] ← −∞
4 return Y = softmax(S) V
"""


def test_a_bias_under_a_condition_is_sdpas_mask_where_it_holds(tmp_path):
    """`∀t, t′, if c then S[t, t′] ← S[t, t′] − m`: −m where c holds, 0 elsewhere, in SDPA's
    float mask beside the causal one (no softmax of its own)."""
    built = Built(tmp_path, COND_HEAD, D=8, H=4)
    X = _randn(7, 8)
    want = built.agree(X)
    w = built.literal
    T, d = 7, 2
    t = torch.arange(T)
    far = (t[:, None] - t[None, :] > 2).double()
    Q, K, V = X @ w.W_q, X @ w.W_k, X @ w.W_v
    out = []
    for h in range(4):
        cols = slice(h * d, (h + 1) * d)
        S = Q[..., cols] @ K[..., cols].mT / math.sqrt(d) - 2.0 ** (-(h + 1) / 2) * far
        S = S.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        out.append(torch.softmax(S, dim=-1) @ V[..., cols])
    torch.testing.assert_close(want, torch.cat(out, dim=-1).detach(), rtol=RTOL, atol=ATOL)
    fused = _fused(tmp_path, COND_HEAD)
    assert "softmax" not in fused and "for h in" not in fused
    assert "torch.where(" in fused and "grouped_sdpa(Q, K, V, attn_mask=" in fused


COND_LM = """\
Algorithm: P ← FarLM(x | θ)
/* A causal decoder without position embeddings whose heads penalise the keys far back. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: P ∈ ℝ^{T×V}, next-token logits.
Hyperparameters: V, D, H, N ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}, token embeddings, also the unembedding.
    For ℓ ∈ [N]:
        θ^block_ℓ, the parameters of block ℓ.
1 E ← W_e[x]
2 for ℓ = 1, …, N do
3     E ← E + FarPenalty(E | θ^block_ℓ)
4 end
5 return P = E W_e^⊺

""" + COND_HEAD


def test_a_bias_under_a_condition_follows_the_decoded_positions(tmp_path):
    """The condition reads the positions only, so a KV cache computes it again at the
    positions it decodes: chunks through the cache give the logits, greedy tokens and
    gradients of recomputation."""
    from decodecheck import check_incremental_decoding

    import cardc

    path = tmp_path / "far.card"
    path.write_text(COND_LM, encoding="utf-8")
    model = cardc.model(str(path), V=31, D=16, H=4, N=2).eval()
    assert hasattr(model, "new_cache")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(3))
    x = torch.randint(0, 31, (2, 14), generator=torch.Generator().manual_seed(4))
    check_incremental_decoding(model, [x])


def _gathered(table, index, rank):
    """lookup's meaning: the table broadcast against the indices, then gathered."""
    n = table.shape[-1]
    table = table.reshape(table.shape[:-1] + (1,) * rank + (n,))
    shape = torch.broadcast_shapes(table.shape[:-1], index.shape)
    return table.expand(shape + (n,)).gather(-1, index.expand(shape).unsqueeze(-1)).squeeze(-1)


def test_a_table_read_at_indices_every_head_shares_is_one_selection_with_the_gathers_values():
    """was: every read gathered from the table broadcast to the indices' shape, whose gradient
    was made at entries × buckets first (T5's training step at 0.32× transformers'); indices
    the table's front axes share are now one selection of its rows. Values equal, gradients
    equal to rounding, for shared indices and for indices of one head each (the gather)."""
    from cardc.runtime.modelkit import lookup

    torch.manual_seed(0)
    for table, index, rank in [((4, 32), (8, 1, 16, 16), 2), ((4, 32), (16, 16), 2),
                               ((32,), (3, 16, 16), 2), ((4, 32), (4, 16, 16), 2),
                               ((2, 4, 32), (8, 1, 1, 16, 16), 2), ((4, 32), (8, 1, 16), 1),
                               ((32,), (16,), 1), ((4, 32), (1, 1, 5, 7), 2)]:
        w = torch.randn(table, dtype=torch.float64, requires_grad=True)
        at = torch.randint(0, table[-1], index)
        got, want = lookup(w, at, rank), _gathered(w, at, rank)
        assert got.shape == want.shape and torch.equal(got, want), (table, index)
        grad = torch.randn(got.shape, dtype=torch.float64)
        torch.testing.assert_close(torch.autograd.grad(got, w, grad)[0],
                                   torch.autograd.grad(want, w, grad)[0])


def test_indices_every_example_shares_are_read_once():
    """T5's buckets reach its heads as one table broadcast over the examples (a view): the
    bias read at them is made once and broadcast back, not once per example, and equals the
    reading of every example's copy."""
    from cardc.runtime.modelkit import lookup

    torch.manual_seed(0)
    w = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    buckets = torch.randint(1, 9, (12, 12)).expand(6, 1, 12, 12)  # counted from 1, shared
    got = lookup(w, buckets, 2, 1)
    assert got.shape == (6, 4, 12, 12) and got.stride()[0] == 0  # made once, broadcast
    want = _gathered(w, buckets.contiguous() - 1, 2)
    assert torch.equal(got, want)
    grad = torch.randn(got.shape, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(got, w, grad)[0],
                               torch.autograd.grad(want, w, grad)[0])
