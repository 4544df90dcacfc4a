"""Additive score biases and numbers computed per head, as cards write them:

- `∀t, t′: S[t, t′] ← S[t, t′] − m · (t − t′)` (or `+ G[t, t′]`, a table the caller gives),
  an unconditional update of every entry, lowers literally to one tensor expression, and
  between an attention's scores and its softmax to SDPA with the bias as a float `attn_mask`
  (the hidden positions −∞ added to it);
- `for h ∈ [H] : Y^h ← Head(… | m = 2^{−8h/H})`, a hyperparameter computed from the head index,
  is one vector over the head axis handed to one call for every head (no loop over heads).

Each card's generated module, fused and literal, computes what the reference interpreter says
the card means (values and gradients, float64), and what the math written out here in plain
torch gives. Decoding through the cache with a bias is tested on BLOOM
(tests/test_parity_bloom.py) and on the library's test cards (tests/test_decoding.py)."""

from __future__ import annotations

import math

import pytest
import torch
from test_reproducers import ATOL, RTOL, Built, _randn

from cardc.build import checked, model_cards, source
from cardc.diagnostics import CardError
from cardc.library import library_roots

ALIBI = """\
Algorithm: Y ← ALiBi(X | W)
/* Causal heads, head h with the slope 2^{−8h/H}. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, H ∈ ℕ; d = D/H
Parameters: W consisting of:
    W_q, W_k, W_v ∈ ℝ^{D×D}
1 Q ← X W_q
2 K ← X W_k
3 V ← X W_v
4 for h ∈ [H] : Y^h ← Head(Q[:, (h − 1) d + 1 : h d], K[:, (h − 1) d + 1 : h d], V[:, (h − 1) d + 1 : h d] | m = 2^{−8 h/H})
5 return Y = [Y^1, Y^2, …, Y^H]

Algorithm: Y ← Head(Q, K, V | m)
/* One causal head whose scores fall by m for each position the key lies back. */
Input: Q, K, V ∈ ℝ^{T×d}
Output: Y ∈ ℝ^{T×d}
Hyperparameters: m ∈ (0, ∞)
1 S ← Q K^⊺/√d
2 ∀t, t′: S[t, t′] ← S[t, t′] − m · (t − t′)
3 ∀t, t′, if t′ > t then S[t, t′] ← −∞
4 return Y = softmax(S) V
"""


def _fused(tmp_path, text: str) -> str:
    path = tmp_path / "card.card"
    path.write_text(text, encoding="utf-8")
    lib, checker, _ = checked([str(path)], library_roots([str(path)], None))
    (alg,) = model_cards(lib, checker, [str(path)])
    return source(checker, alg, fuse=True)


def _heads(Q, K, V, H: int, bias) -> torch.Tensor:
    """Causal attention of each head, its scores plus bias(h) (1-based h), joined."""
    d = Q.shape[-1] // H
    T = Q.shape[-2]
    later = torch.ones(T, T, dtype=torch.bool).triu(1)
    out = []
    for h in range(H):
        cols = slice(h * d, (h + 1) * d)
        S = Q[..., cols] @ K[..., cols].mT / math.sqrt(d) + bias(h + 1)
        out.append(torch.softmax(S.masked_fill(later, -math.inf), dim=-1) @ V[..., cols])
    return torch.cat(out, dim=-1)


def test_alibi_slopes_per_head_batch_the_heads_into_sdpa(tmp_path):
    built = Built(tmp_path, ALIBI, D=8, H=4)
    X = _randn(6, 8)
    want = built.agree(X)
    w = built.literal
    t = torch.arange(6, dtype=torch.float64)
    distance = t[:, None] - t[None, :]
    plain = _heads(X @ w.W_q, X @ w.W_k, X @ w.W_v, 4, lambda h: -2 ** (-8 * h / 4) * distance)
    torch.testing.assert_close(want, plain.detach(), rtol=RTOL, atol=ATOL)
    fused = _fused(tmp_path, ALIBI)
    assert "for h in" not in fused and "softmax" not in fused
    assert "def Head_per_head(Q, K, V, m)" in fused
    assert "return 2 ** ((-8 * torch.arange(1, self.H + 1" in fused  # made once: shared_value
    assert "m=shared_value(" in fused
    assert "grouped_sdpa(Q, K, V, attn_mask=" in fused


TABLE = """\
Algorithm: Y ← TableBias(X, G | W)
/* Heads whose scores add a table the caller gives, the same for every head. */
Input: X ∈ ℝ^{T×D}, G ∈ ℝ^{T×T}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, H ∈ ℕ; d = D/H
Parameters: W consisting of:
    W_q, W_k, W_v ∈ ℝ^{D×D}
1 Q ← X W_q
2 K ← X W_k
3 V ← X W_v
4 for h ∈ [H] : Y^h ← Head(Q[:, (h − 1) d + 1 : h d], K[:, (h − 1) d + 1 : h d], V[:, (h − 1) d + 1 : h d], G)
5 return Y = [Y^1, Y^2, …, Y^H]

Algorithm: Y ← Head(Q, K, V, G)
/* One causal head, its scores biased by G, then the later keys hidden. */
Input: Q, K, V ∈ ℝ^{T×d}, G ∈ ℝ^{T×T}
Output: Y ∈ ℝ^{T×d}
1 S ← Q K^⊺/√d
2 ∀t, t′: S[t, t′] ← G[t, t′] + S[t, t′]
3 ∀t, t′, if t′ > t then S[t, t′] ← −∞
4 return Y = softmax(S) V
"""


def test_a_bias_table_the_caller_gives_is_sdpas_float_mask(tmp_path):
    built = Built(tmp_path, TABLE, D=6, H=2)
    X, G = _randn(5, 6), _randn(5, 5).flip(0)
    want = built.agree(X, G)
    w = built.literal
    plain = _heads(X @ w.W_q, X @ w.W_k, X @ w.W_v, 2, lambda h: G)
    torch.testing.assert_close(want, plain.detach(), rtol=RTOL, atol=ATOL)
    fused = _fused(tmp_path, TABLE)
    assert "bias = G.to(Q.dtype)" in fused and "softmax" not in fused


UPDATE = """\
Algorithm: A ← Weighted(X | W)
/* Every entry of X W scaled by the sum of its indices, then shifted by a table of them. */
Input: X ∈ ℝ^{n×m}
Output: A ∈ ℝ^{n×k}
Hyperparameters: n, m, k ∈ ℕ
Parameters: W ∈ ℝ^{m×k}
1 A ← X W
2 ∀i, j: A[i, j] ← (i + j) · A[i, j]
3 for i ∈ [n] : for j ∈ [k] : B[i, j] ← i − 2 j
4 ∀i, j: A[i, j] ← A[i, j] + B[i, j]
5 return A
"""


def test_an_unconditional_update_outside_attention_is_one_tensor_expression(tmp_path):
    built = Built(tmp_path, UPDATE, n=3, m=4, k=5)
    X = _randn(3, 4)
    i, j = torch.arange(1, 4, dtype=torch.float64)[:, None], torch.arange(1, 6)[None, :]
    want = built.agree(X)
    torch.testing.assert_close(want, ((i + j) * (X @ built.literal.W) + (i - 2 * j)).detach(),
                               rtol=RTOL, atol=ATOL)


def test_an_update_at_entries_other_than_its_variables_is_refused_at_its_place(tmp_path):
    card = UPDATE.replace("2 ∀i, j: A[i, j] ← (i + j) · A[i, j]", "2 ∀i, j: A[j, i] ← A[i, j]")
    with pytest.raises(CardError, match=r"card\.card:8:3: error: code generation handles "
                                        r"'∀…: A\[…\] ← v' with A indexed by exactly"):
        Built(tmp_path, card, n=3, m=3, k=3)


def test_the_bias_reaches_sdpa_with_the_queries_rank(tmp_path):
    """SDPA's fused CPU kernel takes a mask of the queries' rank only (another rank falls back to
    its exact math, three times slower for a decoded token): the bias is viewed at that rank, and
    heads grouped on two axes (…, groups, heads, T, d) flatten it with their queries."""
    from cardc.runtime.modelkit import grouped_sdpa

    fused = _fused(tmp_path, ALIBI)
    assert "attn_mask=torch.broadcast_to(bias, Q.shape[:-1] + K.shape[-2:-1])" in fused
    g = torch.Generator().manual_seed(2)
    Q = torch.randn(2, 3, 2, 5, 4, generator=g, dtype=torch.float64)  # 3 groups of 2 heads
    K, V = (torch.randn(2, 3, 1, 5, 4, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.randn(2, 3, 2, 5, 5, generator=g, dtype=torch.float64)
    want = torch.softmax(Q @ K.mT / 2 + mask, dim=-1) @ V
    torch.testing.assert_close(grouped_sdpa(Q, K, V, attn_mask=mask), want, rtol=RTOL, atol=ATOL)


def test_a_slope_with_a_whole_negative_exponent_is_a_real_power(tmp_path):
    """`m = 2^{−h}` over heads: h is a whole number, but 2 to its negative power is a real
    (1/2, 1/4, …), never torch's integer power of integer tensors (which floors to 0)."""
    card = ALIBI.replace("2^{−8 h/H}", "2^{−h}").replace("2^{−8h/H}", "2^{−h}")
    built = Built(tmp_path, card, D=8, H=4)
    X = _randn(6, 8)
    want = built.agree(X)
    w = built.literal
    t = torch.arange(6, dtype=torch.float64)
    distance = t[:, None] - t[None, :]
    plain = _heads(X @ w.W_q, X @ w.W_k, X @ w.W_v, 4, lambda h: -2.0 ** -h * distance)
    torch.testing.assert_close(want, plain.detach(), rtol=RTOL, atol=ATOL)
