"""Latent attention in its absorbed form (DeepSeek-V2's): every head attends over one key all
heads share, a latent beside a rotary key, and reads its values from the key's first columns
(`softmax(S) K[:, 1 : D_c]`). One SDPA call over the heads batched, in the association of the
products that costs least at the sizes it runs at, and in a causal decoder a cache that keeps
the keys alone: D_c + d_r numbers per token and layer. The fused and literal
modules equal the reference interpreter in float64, values and gradients; decoding through the
cache equals recomputation; values that are not the keys' first columns keep their own cache.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import cardc
from cardc import build
from cardc.library import library_roots

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decodecheck import check_incremental_decoding  # noqa: E402
from test_reproducers import Built  # noqa: E402

SIZES = dict(V=23, D=8, H=2, d_n=3, d_r=2, d_v=3, D_c=4, N=2)

LATENT = """\
Algorithm: P ← Latent(x | θ)
/* A causal decoder of absorbed latent attention layers. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: P ∈ ℝ^{T×V}
Hyperparameters: V, D, N ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
    For ℓ ∈ [N]:
        θ^attn_ℓ, the attention of layer ℓ.
    W_u ∈ ℝ^{D×V}
1 X ← W_e[x]
2 for ℓ = 1, …, N do
3     X ← X + Absorbed(X | θ^attn_ℓ)
4 end
5 return P = X W_u

Algorithm: Y ← Absorbed(X | W)
/* Heads over one shared key: the latent X W_c beside a rotary key. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, H, d_n, d_r, d_v, D_c ∈ ℕ
Parameters: W includes all of the following parameters:
    W_q ∈ ℝ^{D×H d_n}, W_qr ∈ ℝ^{D×H d_r}, W_c ∈ ℝ^{D×D_c}, W_kr ∈ ℝ^{D×d_r}
    For h ∈ [H]:
        W^h_uk ∈ ℝ^{D_c×d_n}, W^h_uv ∈ ℝ^{D_c×d_v}
    W_o ∈ ℝ^{H d_v×D}
1 K ← [X W_c, RoPE(X W_kr)]
2 Q ← X W_q
3 Q_r ← X W_qr
4 for h ∈ [H] : Y^h ← Head(Q[:, (h − 1) d_n + 1 : h d_n], Q_r[:, (h − 1) d_r + 1 : h d_r], K | W^h_uk, W^h_uv)
5 Y ← [Y^1, Y^2, …, Y^H]
6 return Y W_o

Algorithm: Y ← Head(Q, Q_r, K | U_k, U_v)
/* One causal head in the latent space. */
Input: Q ∈ ℝ^{T×d_n}, Q_r ∈ ℝ^{T×d_r}, K ∈ ℝ^{T×(D_c + d_r)}
Output: Y ∈ ℝ^{T×d_v}
Parameters: U_k ∈ ℝ^{D_c×d_n}, U_v ∈ ℝ^{D_c×d_v}
1 Q̃ ← [Q U_k^⊺, RoPE(Q_r)]
2 S ← Q̃ K^⊺/√(d_n + d_r)
3 ∀t, t′, if t′ > t then S[t, t′] ← −∞
4 return Y = softmax(S) K[:, 1 : D_c] U_v
"""

# the rotary key first: the values are the key's last columns, not its first
ROTARY_FIRST = LATENT.replace("1 K ← [X W_c, RoPE(X W_kr)]", "1 K ← [RoPE(X W_kr), X W_c]") \
    .replace("1 Q̃ ← [Q U_k^⊺, RoPE(Q_r)]", "1 Q̃ ← [RoPE(Q_r), Q U_k^⊺]") \
    .replace("softmax(S) K[:, 1 : D_c] U_v", "softmax(S) K[:, d_r + 1 : d_r + D_c] U_v")

# the queries' latent part the product of an expression, not of a name: named for the mask
SCALED = LATENT.replace("1 Q̃ ← [Q U_k^⊺, RoPE(Q_r)]", "1 Q̃ ← [(2 Q) U_k^⊺, RoPE(Q_r)]")


@pytest.mark.parametrize("card", [LATENT, ROTARY_FIRST, SCALED],
                         ids=["latent first", "rotary first", "scaled query"])
def test_fused_and_literal_equal_the_interpreter(tmp_path, card):
    built = Built(tmp_path, card, **SIZES)
    x = torch.randint(0, SIZES["V"], (2, 6), generator=torch.Generator().manual_seed(1))
    built.agree(x, tokens=True)


def _model(tmp_path: Path, card: str):
    path = tmp_path / "latent.card"
    path.write_text(card, encoding="utf-8")
    torch.manual_seed(0)
    model = cardc.model(str(path), **SIZES).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("card, width", [
    (LATENT, SIZES["D_c"] + SIZES["d_r"]),  # the keys alone
    (ROTARY_FIRST, 2 * SIZES["D_c"] + SIZES["d_r"]),  # keys and values
], ids=["latent first", "rotary first"])
def test_the_cache_keeps_the_keys_alone_where_the_values_are_their_first_columns(
        tmp_path, card, width):
    model = _model(tmp_path, card)
    x = torch.randint(0, SIZES["V"], (2, 12), generator=torch.Generator().manual_seed(2))
    check_incremental_decoding(model, [x])
    cache = model.new_cache()
    with torch.no_grad():
        model(x, cache=cache)
    held = sum(K.numel() + V.numel() for K, V in cache.kv.values())
    assert held == SIZES["N"] * 2 * 12 * width


@pytest.mark.parametrize("card", [LATENT, SCALED], ids=["latent first", "scaled query"])
def test_the_heads_are_one_attention_call_over_the_shared_key(tmp_path, card):
    """No loop over heads: the heads' queries batched, the shared key broadcast over them."""
    path = tmp_path / "latent.card"
    path.write_text(card, encoding="utf-8")
    lib, checker, _ = build.checked([str(path)], library_roots([str(path)], None))
    text = build.source(checker, build.find_card(lib, checker, str(path), None))
    head = text[text.index("def Head("):text.index("class Absorbed(")]
    attention = text[text.index("class Absorbed("):text.index("class Latent(")]
    assert head.count("factored_sdpa(") == 1 and "softmax" not in head
    assert "for h in" not in attention and "cache.extend(None, K, K[..., :0])" in head


def test_a_sequence_attends_in_the_heads_width_and_a_decoded_token_in_the_latent(
        tmp_path, monkeypatch):
    """The products are associated as costs least (factored_sdpa): a whole sequence moves
    each head's key and value up-projections onto the keys and values, and attends at the
    head's width d_n + d_r (the values padded to it: SDPA's fused kernels take values as wide
    as the keys only); a decoded token keeps them on its query and attends over the cached
    latent, reading the values as the keys' first columns, (softmax(S) K)[:, 1 : D_c]. The
    output is the card's either way: the same as without a cache, and as the interpreter's
    in test_fused_and_literal_equal_the_interpreter."""
    model = _model(tmp_path, LATENT)
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(Q, K, V, **options):
        seen.append((Q.shape[-2], K.shape[-1], V.shape[-1]))
        return sdpa(Q, K, V, **options)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    x = torch.randint(0, SIZES["V"], (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        model(x[:, :6], cache=cache)
        last = model(x[:, 6:], cache=cache)
    head = SIZES["d_n"] + SIZES["d_r"]
    latent = SIZES["D_c"] + SIZES["d_r"]
    N = SIZES["N"]
    assert seen == [(7, head, head)] * N + [(6, head, head)] * N + [(1, latent, latent)] * N
    torch.testing.assert_close(last[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


# any head whose queries are a product by a transposed matrix, a whole sequence
TRANSPOSED = """\
Algorithm: Y ← Head(X | W)
/* One causal head whose queries are the input times a transposed matrix. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×d}
Hyperparameters: D, d ∈ ℕ
Parameters: W consisting of:
    W_q ∈ ℝ^{d×D}, W_k, W_v ∈ ℝ^{D×d}
1 Q ← X W_q^⊺
2 S ← Q (X W_k)^⊺/√d
3 ∀t, t′, if t′ > t then S[t, t′] ← −∞
4 return Y = softmax(S) (X W_v)
"""


@pytest.mark.parametrize("sizes, width", [(dict(D=6, d=3), 3), (dict(D=2, d=8), 2)],
                         ids=["kept", "moved"])
def test_any_attention_whose_queries_are_a_product_is_factored(tmp_path, monkeypatch, sizes,
                                                               width):
    """Q = X W_qᵀ: with d < D, moving W_q onto the keys would make the scores D wide, and
    the queries keep it (SDPA sees queries d wide); with D < d, the keys take it (D wide).
    Either way the module equals the interpreter, values and gradients."""
    built = Built(tmp_path, TRANSPOSED, **sizes)
    X = torch.randn(2, 5, sizes["D"], generator=torch.Generator().manual_seed(4),
                    dtype=torch.float64)
    built.agree(X)
    seen = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda Q, K, V, **o: seen.append(Q.shape[-1]) or sdpa(Q, K, V, **o))
    with torch.no_grad():
        built.fused(X)
    assert seen == [width]
    path = tmp_path / "head.card"
    path.write_text(TRANSPOSED, encoding="utf-8")
    lib, checker, _ = build.checked([str(path)], library_roots([str(path)], None))
    text = build.source(checker, build.find_card(lib, checker, str(path), None))
    assert "factored_sdpa(X, self.W_q, None" in text
