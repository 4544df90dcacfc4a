"""The helpers generated models copy (cardc/runtime/modelkit.py), each against a plain
reference: the cache's bookkeeping, joined products, RoPE by its formula, RMSNorm by
F.rms_norm, masks made once, and grouped-query SDPA by repeated heads."""

import torch
import torch.nn.functional as F

from cardc.codegen import HELPERS
from cardc.names import GENERATED
from cardc.runtime import modelkit as mk

torch.manual_seed(0)


def test_kvcache_extends_each_layer_with_its_own_keys_and_values():
    cache = mk.KVCache()
    K1, V1, K2, V2 = (torch.randn(1, 2, n, 4) for n in (3, 3, 1, 1))
    assert cache.extend("a", K1, V1)[0] is K1
    cache.advance(3)  # the next forward, as the model counts its tokens in
    K, V = cache.extend("a", K2, V2)
    assert torch.equal(K, torch.cat([K1, K2], -2)) and torch.equal(V, torch.cat([V1, V2], -2))
    assert cache.extend("b", K2, V2)[0] is K2  # another layer starts empty


def test_kvcache_gives_a_module_called_twice_by_one_forward_two_slots():
    """A module whose output a card writes twice (or whose weights layers share) attends
    anew at each call: its second call must not read the first's keys as earlier positions."""
    cache = mk.KVCache()
    K1, K2 = torch.zeros(1, 1, 2, 2), torch.ones(1, 1, 2, 2)
    assert cache.extend("a", K1, K1)[0] is K1
    assert cache.extend("a", K2, K2)[0] is K2  # the same forward: a slot of its own
    cache.advance(2)
    K3 = torch.full((1, 1, 1, 2), 2.0)
    assert torch.equal(cache.extend("a", K3, K3)[0], torch.cat([K1, K3], -2))
    assert torch.equal(cache.extend("a", K3, K3)[0], torch.cat([K2, K3], -2))


def test_kvcache_keeps_only_a_window_when_asked():
    cache = mk.KVCache()
    K, V = torch.randn(1, 1, 5, 2), torch.randn(1, 1, 5, 2)
    full, _ = cache.extend(0, K, V, keep=3)
    assert torch.equal(full, K)  # this call reads every key it was given
    held, _ = cache.kv[0]
    assert torch.equal(held, K[..., 2:, :])


def test_kvcache_decoding_copies_no_past_per_token():
    """Token by token, without gradients, the keys land in buffers that grow when full: 300
    tokens after a prompt of 5 use a handful of buffers, and every step reads what plain
    concatenation (and a window's cut) would give."""
    for keep in (None, 40):
        cache, want = mk.KVCache(), torch.randn(1, 2, 5, 4)
        buffers = set()
        with torch.no_grad():
            cache.extend(0, want, 2 * want, keep=keep)
            want = want[..., -keep:, :] if keep else want
            for _ in range(300):
                cache.advance(1 if cache.pos else 5)  # the next forward
                k = torch.randn(1, 2, 1, 4)
                got, values = cache.extend(0, k, 2 * k, keep=keep)
                want = torch.cat([want, k], -2)
                assert torch.equal(got, want) and torch.equal(values, 2 * want)
                want = want[..., -keep:, :] if keep else want
                buffers.add(cache.room[0][0].data_ptr())
        assert len(buffers) <= 12, keep  # 300 tokens: room grown by a quarter at a time


def test_kvcache_concatenates_where_gradients_flow():
    cache = mk.KVCache()
    K1 = torch.randn(1, 1, 3, 2, requires_grad=True)
    cache.extend(0, K1, K1)
    cache.advance(3)
    K2 = torch.randn(1, 1, 1, 2, requires_grad=True)
    K, _ = cache.extend(0, K2, K2)
    K.sum().backward()  # no buffer written in place under the graph
    assert not cache.room and torch.equal(K1.grad, torch.ones_like(K1))


def test_kvcache_keys_unnamed_calls_by_their_order_within_a_forward():
    cache = mk.KVCache()
    first, second = torch.zeros(1, 1, 1, 2), torch.ones(1, 1, 1, 2)
    cache.extend(None, first, first)
    cache.extend(None, second, second)
    assert set(cache.kv) == {0, 1}
    cache.advance(1)  # the next forward: its calls count from 0 again
    K, _ = cache.extend(None, second, second)
    assert torch.equal(K, torch.cat([first, second], -2))


def test_kvcache_new_returns_the_tokens_after_the_cached_ones_or_starts_over():
    cache = mk.KVCache()
    x = torch.tensor([[1, 2, 3]])
    assert torch.equal(cache.new(x), x)
    cache.kv["a"] = "held"
    longer = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(cache.new(longer), torch.tensor([[4]])) and cache.kv == {"a": "held"}
    assert torch.equal(cache.new(torch.tensor([[9, 2]])), torch.tensor([[9, 2]]))
    assert cache.kv == {} and cache.pos == 0


def test_kvcache_mask_sees_the_cached_keys_and_the_new_ones_up_to_each_query():
    cache = mk.KVCache()
    Q, K = torch.zeros(1, 2, 4), torch.zeros(1, 5, 4)
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(cache.mask(Q, K), expected)
    assert cache.mask(Q[:, :1], K) is None


def test_project_joined_equals_one_product_each():
    X = torch.randn(2, 3, 8)
    weights = [(torch.randn(8, 4), torch.randn(4)), (torch.randn(8, 6), None)]
    apart = mk.project(X, *weights)
    with torch.no_grad():
        cache = mk.KVCache()
        joined = mk.project(X, *weights, cache=cache)
        assert cache.joined(weights) is not None  # made once, then kept
    for a, b in zip(apart, joined, strict=True):
        torch.testing.assert_close(a, b)


def _rope_reference(X, base, past, r, pairs):
    """x_a cos φ − x_b sin φ, x_b cos φ + x_a sin φ for each plane (a, b) of the first r
    columns, φ = (past + t) base^(−2i/r)."""
    T = X.shape[-2]
    phi = torch.arange(past, past + T, dtype=torch.float32)[:, None] * \
        base ** -(torch.arange(0, r, 2, dtype=torch.float32) / r)
    cos, sin = phi.cos(), phi.sin()
    a, b = (X[..., 0:r:2], X[..., 1:r:2]) if pairs else (X[..., : r // 2], X[..., r // 2: r])
    ya, yb = a * cos - b * sin, b * cos + a * sin
    turned = torch.stack([ya, yb], -1).flatten(-2) if pairs else torch.cat([ya, yb], -1)
    return torch.cat([turned, X[..., r:]], -1)


def test_rotate_half_and_rotate_pairs_follow_the_formula_with_and_without_gradients():
    for grad in (False, True):
        X = torch.randn(2, 5, 8, requires_grad=grad)
        for width in (None, 4):
            r = 8 if width is None else width
            torch.testing.assert_close(mk.rotate_half(X, 100.0, past=3, width=width),
                                       _rope_reference(X, 100.0, 3, r, pairs=False))
            torch.testing.assert_close(mk.rotate_pairs(X, 100.0, past=3, width=width),
                                       _rope_reference(X, 100.0, 3, r, pairs=True))


def _rope_reference64(X, base, past, r, pairs):
    """_rope_reference with its angles in float64, exact to the last digits."""
    T = X.shape[-2]
    phi = torch.arange(past, past + T, dtype=torch.float64)[:, None] * \
        base ** -(torch.arange(0, r, 2, dtype=torch.float64) / r)
    cos, sin = phi.cos(), phi.sin()
    a, b = (X[..., 0:r:2], X[..., 1:r:2]) if pairs else (X[..., : r // 2], X[..., r // 2: r])
    ya, yb = a * cos - b * sin, b * cos + a * sin
    turned = torch.stack([ya, yb], -1).flatten(-2) if pairs else torch.cat([ya, yb], -1)
    return torch.cat([turned, X[..., r:]], -1)


def test_rope_angles_follow_a_float64_model_and_float32_ones_are_unchanged():
    """In float64 the angles (past + t) ω_i are float64 (float32 ones were 1e-8 off at these
    sizes); in float32 the tables are those of float32 arithmetic, bit for bit."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(2, 40, 12, generator=g, dtype=torch.float64)
    for helper, pairs in ((mk.rotate_half, False), (mk.rotate_pairs, True)):
        for width in (None, 8):
            r = 12 if width is None else width
            want = _rope_reference64(X, 10000.0, 5, r, pairs)
            torch.testing.assert_close(helper(X, 10000.0, past=5, width=width), want,
                                       rtol=1e-13, atol=1e-14)
            cos, sin, *_ = mk.rope_angles(pairs, X.float(), 10000.0, 5, width)
            assert cos.dtype == sin.dtype == torch.float32
            phi = torch.arange(5, 45, dtype=torch.float32)[:, None] * \
                10000.0 ** -(torch.arange(0, r, 2, dtype=torch.float32) / r)
            assert torch.equal(cos[:, :r:2] if pairs else cos[:, : r // 2], phi.cos())


def test_rms_normalize_equals_rms_norm():
    X, gamma = torch.randn(2, 3, 16), torch.randn(16)
    for g in (gamma, None):
        expected = F.rms_norm(X, (16,), g, 1e-6)
        with torch.no_grad():  # the CPU path a decoded token takes
            torch.testing.assert_close(mk.rms_normalize(X, (16,), g, 1e-6), expected)
        torch.testing.assert_close(mk.rms_normalize(X, (16,), g, 1e-6), expected)


def test_offset_rms_norm_scales_by_one_plus_its_gains():
    X, gamma = torch.randn(2, 3, 16), torch.randn(16)
    torch.testing.assert_close(mk.offset_rms_norm(X, (16,), gamma, 1e-6),
                               F.rms_norm(X, (16,), 1 + gamma, 1e-6))


def test_shared_mask_is_made_once_per_key_and_none_where_all_is_visible():
    made = []

    def causal():
        made.append(1)
        return torch.ones(3, 3, dtype=torch.bool).tril()

    first = mk.shared_mask(901, causal, 3, 3, "cpu", 2)
    assert mk.shared_mask(901, causal, 3, 3, "cpu", 2) is first and len(made) == 1
    assert torch.equal(first, torch.ones(3, 3, dtype=torch.bool).tril())
    bias = mk.shared_mask(901, causal, 3, 3, "cpu", 2, dtype=torch.float32)
    assert torch.equal(bias, torch.zeros(3, 3).masked_fill(~first, float("-inf")))
    assert mk.shared_mask(902, lambda: torch.ones(1, 3, dtype=torch.bool), 1, 3, "cpu") is None


def test_grouped_sdpa_equals_sdpa_over_repeated_key_and_value_heads():
    Q, K, V = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    expected = F.scaled_dot_product_attention(Q, K.repeat_interleave(2, 1),
                                              V.repeat_interleave(2, 1), is_causal=True)
    torch.testing.assert_close(mk.grouped_sdpa(Q, K, V, is_causal=True), expected)
    torch.testing.assert_close(mk.grouped_sdpa(Q, Q, Q), F.scaled_dot_product_attention(Q, Q, Q))
    # a group of query heads on their own axis against its one key/value head
    Qg = Q.unflatten(1, (2, 2))
    grouped = mk.grouped_sdpa(Qg, K[:, :, None], V[:, :, None], is_causal=True)
    torch.testing.assert_close(grouped, expected.unflatten(1, (2, 2)))


def _factored_reference(A, B, R, K, V, out=None, cols=None, **options):
    Q = A @ B.mT if R is None else torch.cat([A @ B.mT, R.expand(A.shape[:-1] + R.shape[-1:])],
                                             -1)
    heads = Q.shape[:-2]
    Y = F.scaled_dot_product_attention(Q, K.expand(heads + K.shape[-2:]),
                                       V.expand(heads + V.shape[-2:]), **options)
    Y = Y if cols is None else Y[..., :cols]
    return Y if out is None else Y @ out


def test_factored_sdpa_equals_the_products_in_either_association():
    """Queries A Bᵀ beside R against keys whose first columns are a latent, the values the
    latent, then projected up: one query against many keys keeps the card's association,
    a sequence moves B onto the keys and U onto the values. Equal to the card's in float64,
    values and gradients, with and without a scale, a rotary part, a slice or a product."""
    g = torch.Generator().manual_seed(4)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    B, U = randn(3, 6, 4), randn(3, 6, 5)  # three heads: latent 6 → key part 4, value 5
    for tq, tk in ((1, 9), (9, 9), (4, 9)):
        A, R, K = randn(2, 3, tq, 4), randn(2, 1, tq, 2), randn(2, 1, tk, 8)
        mask = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
        cases = [dict(R=R, V=K, out=U, cols=6, attn_mask=mask, scale=0.3),
                 dict(R=R, V=K, out=U, cols=6, attn_mask=mask),
                 dict(R=None, V=K[..., :6], out=None, cols=None, attn_mask=mask),
                 dict(R=R, V=randn(2, 1, tk, 7), out=None, cols=3, attn_mask=mask)]
        for case in cases:
            Kc = K[..., :6] if case["R"] is None else K
            args = (A, B, case.pop("R"), Kc, case.pop("V"))
            got, want = mk.factored_sdpa(*args, **case), _factored_reference(*args, **case)
            torch.testing.assert_close(got, want)
            leaves = [t for t in (A, B, U, K, R) if t.requires_grad]
            dgot = torch.autograd.grad(got.square().sum(), leaves, allow_unused=True)
            dwant = torch.autograd.grad(want.square().sum(), leaves, allow_unused=True)
            for a, b in zip(dgot, dwant, strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    torch.testing.assert_close(a, b)


def test_factored_sdpa_moves_the_products_onto_the_keys_for_a_sequence_only(monkeypatch):
    widths = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda Q, K, V, **o: widths.append(Q.shape[-1]) or sdpa(Q, K, V, **o))
    B, U = torch.randn(3, 64, 32), torch.randn(3, 64, 32)
    for t in (1, 128):
        A, R = torch.randn(2, 3, t, 32), torch.randn(2, 3, t, 16)
        mk.factored_sdpa(A, B, R, torch.randn(2, 1, 128, 80), torch.randn(2, 1, 128, 80),
                         out=U, cols=64, scale=0.1)
    assert widths == [64 + 16, 32 + 16]  # a decoded token in the latent; a sequence in a head


def test_every_helper_name_is_reserved_from_cards():
    """A card name never shadows a helper its model may copy (cardc.names.GENERATED)."""
    assert set(HELPERS) <= GENERATED
    assert {"math"} | set(HELPERS) >= {n for h in HELPERS.values() for n in h.uses}
