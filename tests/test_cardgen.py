"""Random well-typed cards (tests/cardgen.py) on a small budget: every card `check` accepts either
is refused at build with one located diagnostic or builds a module that runs, whose fused and
literal lowerings agree in float64 (values and gradients), and whose cache, where it offers one,
decodes as full recomputation does. Below, the cards the generator found failing, shrunk; each
is an expected failure until the compiler is fixed, with its result computed in plain torch."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from cardc.build import checked, instantiate
from cardc.names import identifier

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cardgen  # noqa: E402
from decodecheck import check_incremental_decoding  # noqa: E402

BUDGET = 40  # cases of the CI run: about a second each on one core
SEED = 27


@pytest.fixture(scope="module")
def campaign() -> Counter:
    return cardgen.campaign(BUDGET, SEED)


def test_generated_cards_build_run_and_agree(campaign):
    assert campaign["crash"] == 0 and campaign["disagreement"] == 0, cardgen.summary(campaign)


def test_most_generated_cards_check_and_build(campaign):
    """A generator that is mostly rejected tests nothing: at least 9 in 10 cards check, and at
    least 3 in 4 of those build."""
    checked_ = BUDGET - campaign["rejected"]
    assert checked_ >= 0.9 * BUDGET, cardgen.summary(campaign)
    assert checked_ - campaign["refused"] >= 0.75 * checked_, cardgen.summary(campaign)


def test_the_budget_covers_the_constructs():
    features = set().union(*(cardgen.generate(SEED * 1_000_003 + i).features
                             for i in range(BUDGET)))
    assert {"tokens", "attention", "mask t′ > t", "map over positions", "map over heads",
            "loop over layers", "sub-card", "Σ/mean/var", "slice", "transpose", "norm",
            "scalar", "exp/log/√", "row-major", "column-major", "tied logits",
            "shared key and value", "attention within an expression",
            "causal language model", "column-major slice", "parameter-free block",
            "elementwise map over positions", "per-layer hyperparameter",
            "row-major map over tokens"} <= features


def test_generation_is_deterministic_and_seeded():
    a, b, c = cardgen.generate(5), cardgen.generate(5), cardgen.generate(6)
    assert (a.text, a.library) == (b.text, b.library) and a.text != c.text


def test_the_summary_line():
    counts = Counter(rejected=1, refused=2, agreed=7)
    assert cardgen.summary(counts) == ("cardgen: 10 generated, 9 checked, 7 built, 2 refused at "
                                       "build, 0 disagreements, 0 run-time crashes")


def test_the_oracles_allow_rounding_at_a_tensors_scale():
    """An entry that cancels to 5e-4 among entries of 1.4e3 carries a float64 rounding error
    near 1e3 · ε, whichever order the terms were added in (case 1000958 of the long run: a
    gradient of v12.W_qkv, 3.3e-9 apart). A wrong entry, small or large, still differs."""
    want = torch.tensor([1416.0, -1416.0, 5e-4, 0.3], dtype=torch.float64)
    rounded = want + torch.tensor([0.0, 2e-13, 3.3e-9, 0.0], dtype=torch.float64)
    assert cardgen.close(rounded, want)
    assert not torch.allclose(rounded, want, rtol=cardgen.TOLERANCE, atol=cardgen.TOLERANCE)
    for k, wrong in [(2, 1e-3), (3, 1e-5), (0, 1e-3)]:
        off = want.clone()
        off[k] += wrong
        assert not cardgen.close(off, want), k
    assert not cardgen.close(want * 1.000001, want)
    assert not cardgen.close(want, want[:3]) and cardgen.close(want[:0], want[:0])
    nan = torch.tensor([float("nan"), 1.0], dtype=torch.float64)
    assert cardgen.close(nan, nan.clone()) and not cardgen.close(nan, torch.ones(2).double())


def test_the_long_runs_rounding_case_agrees():
    assert cardgen.run_case(cardgen.generate(1000958), [cardgen.fused_equals_literal]).kind \
        == "agreed"


def _fails_on_sigma(built: cardgen.Built) -> None:
    if "σ(" in built.case.text:
        raise cardgen.Disagreement("σ")


def test_the_shrinker_keeps_the_failure_and_drops_the_rest():
    case = cardgen.Case(0, "Shrunk", SHRINKABLE, "/* No sub-cards. */\n", True, "row")
    small = cardgen.shrink(case, [_fails_on_sigma])
    assert cardgen.run_case(small, [_fails_on_sigma]).kind == "disagreement"
    assert "σ(E)" in small.text and "(Q + P)" not in small.text and "Output:" not in small.text


# ------------------------------------------------------------------ cards the generator found

GATED_ROWS = """Algorithm: Y ← GatedRows(X | θ)
/* Each row of X gated by a function of its own projection. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W ∈ ℝ^{D×D}
1 A ← X W
2 for t ∈ [T] : Y[t, :] ← σ(A[t, :]) ⊙ X[t, :]
3 return Y
"""


def test_an_elementwise_map_over_positions(tmp_path):
    model = _model(tmp_path, GATED_ROWS, "GatedRows", D=8)
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    torch.testing.assert_close(model(x), torch.sigmoid(x @ model.W) * x)



def _model(tmp_path: Path, text: str, name: str, **sizes):
    path = tmp_path / "card.card"
    path.write_text(text, encoding="utf-8")
    lib, checker, _ = checked([str(path)], [str(tmp_path)])
    torch.manual_seed(0)
    model, _ = instantiate(checker, lib.find(name), {identifier(k): v for k, v in sizes.items()})
    return model.double()


LOG_SCALE = """Algorithm: Y ← LogScale(X)
/* A value scaled by the log of a ratio of hyperparameters. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ; α ∈ (0, ∞) = 0.5; β ∈ (0, ∞) = 1.25
1 return Y = log(α/β) · X
"""


def test_the_log_of_hyperparameters(tmp_path):
    model = _model(tmp_path, LOG_SCALE, "LogScale", D=8, α=0.5, β=1.25)
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    torch.testing.assert_close(model(x), math.log(0.5 / 1.25) * x)


COLUMN_SLICE = """Algorithm: Y ← ColSlice(x | θ)
/* A column-major card that reads the first K rows of its embeddings. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{K×T}
Hyperparameters: V, D, K ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{D×V}
1 for t ∈ [T] : E[:, t] ← W_e[:, x[t]]
2 return Y = E[1 : K, :]
"""


def test_a_column_major_slice_takes_features(tmp_path):
    model = _model(tmp_path, COLUMN_SLICE, "ColSlice", V=11, D=8, K=3)
    x = torch.randint(0, 11, (2, 7))
    # column t of Y: the first K entries of x[t]'s embedding; the card writes positions as
    # columns, so like every column-major card its module gives positions first: (B, T, K)
    want = model.W_e.mT[x][..., :3]
    got = model(x)
    assert got.shape == want.shape and torch.allclose(got, want)


PARAMETER_FREE_LAYERS = """Algorithm: Y ← ColLayersThenProduct(x | θ)
/* A column-major model: a loop over parameter-free layers, then a product with a weight. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{K×T}
Hyperparameters: V, D, K, N ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{D×V}
    For ℓ ∈ [N]:
        θ^block_ℓ, the parameters of block ℓ.
    W ∈ ℝ^{K×D}
1 for t ∈ [T] : E[:, t] ← W_e[:, x[t]]
2 for ℓ = 1, …, N do
3     E ← Doubled(E | θ^block_ℓ)
4 end
5 return Y = W E

Algorithm: X ← Doubled(X | θ)
/* A block without parameters. */
Input: X ∈ ℝ^{D×T}
Output: X ∈ ℝ^{D×T}
Hyperparameters: D ∈ ℕ
Parameters: θ consisting of:
1 return X + X
"""


def test_column_major_layers_without_parameters(tmp_path):
    model = _model(tmp_path, PARAMETER_FREE_LAYERS, "ColLayersThenProduct", V=11, D=8, K=3, N=2)
    x = torch.randint(0, 11, (2, 7))
    want = (4 * model.W_e.mT[x]) @ model.W.mT  # two layers double E twice
    torch.testing.assert_close(model(x), want)


CAUSAL_THEN_FULL = """Algorithm: Y ← CausalThenFull(x | θ)
/* A model whose first attention is causal and whose second sees every position. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{T×V}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
    W_k, W_v ∈ ℝ^{D×D}
1 E ← W_e[x]
2 K ← E W_k
3 V ← E W_v
4 S ← E K^⊺/√D
5 ∀t, t′, if t′ > t then S[t, t′] ← −∞
6 A ← E + softmax(S) V
7 K_2 ← A W_k
8 V_2 ← A W_v
9 S_2 ← A K_2^⊺/√D
10 return Y = (A + softmax(S_2) V_2) W_e^⊺
"""


def _attend(q, k, v, causal: bool):
    s = q @ k.mT / math.sqrt(q.shape[-1])
    if causal:
        t = torch.arange(q.shape[-2])
        s = s.masked_fill(t[None, :] > t[:, None], -math.inf)
    return torch.softmax(s, dim=-1) @ v


def test_causal_and_full_attention_in_one_model(tmp_path):
    model = _model(tmp_path, CAUSAL_THEN_FULL, "CausalThenFull", V=11, D=8)
    x = torch.randint(0, 11, (2, 7))
    e = model.W_e[x]
    a = e + _attend(e, e @ model.W_k, e @ model.W_v, causal=True)
    want = (a + _attend(a, a @ model.W_k, a @ model.W_v, causal=False)) @ model.W_e.T
    torch.testing.assert_close(model(x), want)
    assert not hasattr(model, "new_cache")  # not causal: no cache to offer


SHARED_KEY_VALUE = """Algorithm: Y ← LiveAttention(x | θ)
/* A causal language model whose attention reads its embeddings as keys and values. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{T×V}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
1 E ← W_e[x]
2 S ← E E^⊺/√D
3 ∀t, t′, if t′ > t then S[t, t′] ← −∞
4 Z ← softmax(S) E
5 return Y = (E + Z) W_e^⊺
"""


def test_a_cache_of_keys_that_are_also_queries(tmp_path):
    """The cache extends a copy of E: the queries and the residual read the new rows only."""
    model = _model(tmp_path, SHARED_KEY_VALUE, "LiveAttention", V=11, D=8).eval()
    x = torch.randint(0, 11, (2, 7))
    e = model.W_e[x]
    want = (e + _attend(e, e, e, causal=True)) @ model.W_e.T
    with torch.no_grad():
        torch.testing.assert_close(model(x), want)
        cache = model.new_cache()
        rows = torch.cat([model(x[:, :3], cache=cache), model(x[:, 3:4], cache=cache),
                          model(x[:, 4:], cache=cache)], dim=1)
    torch.testing.assert_close(rows, want)
    check_incremental_decoding(model, [torch.randint(0, 11, (2, 12))], tolerance=1e-9)


ATTENTION_TWICE = """Algorithm: Y ← AttentionTwice(x | θ)
/* Two causal attentions: the first written twice in one product, the second reading it. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{T×V}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
    W_1, W_2, W_3, W_4 ∈ ℝ^{D×D}
1 E ← W_e[x]
2 K ← E W_1
3 V ← E W_2
4 S ← E K^⊺/√D
5 ∀t, t′, if t′ > t then S[t, t′] ← −∞
6 A ← (softmax(S) V) ⊙ (softmax(S) V)
7 K_2 ← E W_3
8 V_2 ← A W_4
9 S_2 ← E K_2^⊺/√D
10 ∀t, t′, if t′ > t then S_2[t, t′] ← −∞
11 return Y = (softmax(S_2) V_2) W_e^⊺
"""


def test_a_cache_where_an_attention_is_written_twice(tmp_path):
    """One attention (computed once), whose keys and values the cache extends."""
    model = _model(tmp_path, ATTENTION_TWICE, "AttentionTwice", V=11, D=8).eval()
    with torch.no_grad():
        for p in model.parameters():  # weights of order 1: the gap is not hidden in small values
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1),
                                dtype=p.dtype) * 0.5)
        x = torch.randint(0, 11, (2, 7))
        e = model.W_e[x]
        a = _attend(e, e @ model.W_1, e @ model.W_2, causal=True) ** 2
        want = _attend(e, e @ model.W_3, a @ model.W_4, causal=True) @ model.W_e.T
        torch.testing.assert_close(model(x), want)
        cache = model.new_cache()
        rows = torch.cat([model(x[:, :3], cache=cache), model(x[:, 3:], cache=cache)], dim=1)
    torch.testing.assert_close(rows, want)
    check_incremental_decoding(model, [torch.randint(0, 11, (2, 12))], tolerance=1e-9)


TWO_IN_ONE = """Algorithm: Y ← TwoInOne(x | θ)
/* Two causal attentions added in one step. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{T×V}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
    W_1, W_2, W_3, W_4 ∈ ℝ^{D×D}
1 E ← W_e[x]
2 K ← E W_1
3 V ← E W_2
4 S ← E K^⊺/√D
5 ∀t, t′, if t′ > t then S[t, t′] ← −∞
6 K_2 ← E W_3
7 V_2 ← E W_4
8 S_2 ← E K_2^⊺/√D
9 ∀t, t′, if t′ > t then S_2[t, t′] ← −∞
10 return Y = (softmax(S) V + softmax(S_2) V_2) W_e^⊺
"""


def test_a_cache_for_two_attentions_in_one_step(tmp_path):
    """Each attention of the step extends a cache slot of its own."""
    model = _model(tmp_path, TWO_IN_ONE, "TwoInOne", V=11, D=8).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1),
                                dtype=p.dtype) * 0.5)
        x = torch.randint(0, 11, (2, 7))
        e = model.W_e[x]
        want = (_attend(e, e @ model.W_1, e @ model.W_2, causal=True) +
                _attend(e, e @ model.W_3, e @ model.W_4, causal=True)) @ model.W_e.T
        torch.testing.assert_close(model(x), want)
        cache = model.new_cache()
        rows = torch.cat([model(x[:, :3], cache=cache), model(x[:, 3:], cache=cache)], dim=1)
    torch.testing.assert_close(rows, want)
    check_incremental_decoding(model, [torch.randint(0, 11, (2, 12))], tolerance=1e-9)


CALLED_TWICE = """Algorithm: Y ← CalledTwice(x | θ)
/* One causal attention module, its output written twice in a product. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{T×V}
Hyperparameters: V, D, H ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
    θ_1, the parameters of a CausalSelfAttention.
1 E ← W_e[x]
2 A ← CausalSelfAttention(E | θ_1) ⊙ CausalSelfAttention(E | θ_1)
3 return Y = (E + A) W_e^⊺
"""


def _heads(x, W_qkv, b_qkv, W_o, b_o, H: int):
    """Causal multi-head self-attention, its projections joined as the module holds them."""
    q, k, v = (x @ W_qkv + b_qkv).chunk(3, dim=-1)
    split = lambda a: a.unflatten(-1, (H, -1)).transpose(-3, -2)  # noqa: E731
    y = _attend(split(q), split(k), split(v), causal=True)
    return y.transpose(-3, -2).flatten(-2) @ W_o + b_o


def test_a_cache_for_a_module_called_twice_in_one_step(tmp_path):
    """Both calls of one attention module extend the cache, each a slot of its own: keyed by
    the module alone, the second call read the first's keys as earlier positions (10.1 away)."""
    model = _model(tmp_path, CALLED_TWICE, "CalledTwice", V=11, D=8, H=2).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1),
                                dtype=p.dtype) * 0.5)
        x = torch.randint(0, 11, (2, 7))
        e = model.W_e[x]
        m = model.v1
        a = _heads(e, m.W_qkv, m.b_qkv, m.W_o, m.b_o, 2)
        want = (e + a * a) @ model.W_e.T
        torch.testing.assert_close(model(x), want)
        cache = model.new_cache()
        rows = torch.cat([model(x[:, :3], cache=cache), model(x[:, 3:4], cache=cache),
                          model(x[:, 4:], cache=cache)], dim=1)
    torch.testing.assert_close(rows, want)
    check_incremental_decoding(model, [torch.randint(0, 11, (2, 12))], tolerance=1e-9)


HEAD_KEYS_ARE_QUERIES = """Algorithm: Y ← HeadsOnInput(x | θ)
/* Heads whose keys are their input, which their output adds back. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{T×V}
Hyperparameters: V, D, H ∈ ℕ; d = D/H
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
    For h ∈ [H], W^h_qkv consisting of:
        W^h_q, W^h_v ∈ ℝ^{D×d}
1 E ← W_e[x]
2 for h ∈ [H] : Y^h ← KeyIsInput(E | W^h_qkv)
3 A ← [Y^1, Y^2, …, Y^H]
4 return Y = (E + A) W_e^⊺

Algorithm: Y ← KeyIsInput(X | W_qkv)
/* A head whose keys are its input projected by its query weights. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×d}
Hyperparameters: D, d ∈ ℕ
Parameters: W_qkv consisting of:
    W_q, W_v ∈ ℝ^{D×d}
1 Q ← X W_q
2 V ← X W_v
3 S ← Q Q^⊺/√d
4 ∀t, t′, if t′ > t then S[t, t′] ← −∞
5 return Y = softmax(S) V + Q
"""


def test_a_cache_of_a_heads_keys_that_are_its_queries(tmp_path):
    """A head function whose keys are its queries: the cache extends a copy, not Q, which the
    head's output adds back over the new positions only."""
    model = _model(tmp_path, HEAD_KEYS_ARE_QUERIES, "HeadsOnInput", V=11, D=8, H=2).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1),
                                dtype=p.dtype) * 0.5)
        x = torch.randint(0, 11, (2, 7))
        e = model.W_e[x]
        w_q, w_v = model.W_qv.unflatten(-1, (2, 2, 4)).unbind(-3)  # (D, H, d) each
        q, v = (torch.einsum("btD,Dhd->bhtd", e, w) for w in (w_q, w_v))
        a = (_attend(q, q, v, causal=True) + q).transpose(1, 2).flatten(-2)
        want = (e + a) @ model.W_e.T
        torch.testing.assert_close(model(x), want)
        cache = model.new_cache()
        rows = torch.cat([model(x[:, :3], cache=cache), model(x[:, 3:4], cache=cache),
                          model(x[:, 4:], cache=cache)], dim=1)
    torch.testing.assert_close(rows, want)
    check_incremental_decoding(model, [torch.randint(0, 11, (2, 12))], tolerance=1e-9)


CAPPED_SHARED = """Algorithm: Y ← CappedLive(x | θ)
/* A causal language model whose soft-capped attention reads its embeddings as keys and values. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{T×V}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
1 E ← W_e[x]
2 S ← E E^⊺/√D
3 S ← 5 · tanh(S/5)
4 ∀t, t′, if t′ > t then S[t, t′] ← −∞
5 Z ← softmax(S) E
6 return Y = (E + Z) W_e^⊺
"""


def test_a_capped_attention_of_shared_keys_recomputes(tmp_path):
    """A soft-capped core keeps its literal steps, which read E by name: were E extended in
    place, the queries and the residual would read every position. The model recomputes."""
    model = _model(tmp_path, CAPPED_SHARED, "CappedLive", V=11, D=8).eval()
    assert not hasattr(model, "new_cache") and not hasattr(model, "generate")
    x = torch.randint(0, 11, (2, 7))
    e = model.W_e[x]
    s = 5 * torch.tanh(e @ e.mT / math.sqrt(8) / 5)
    t = torch.arange(7)
    s = s.masked_fill(t[None, :] > t[:, None], -math.inf)
    want = (e + torch.softmax(s, dim=-1) @ e) @ model.W_e.T
    torch.testing.assert_close(model(x), want)


COLUMN_SELF_SCORES = """Algorithm: Y ← ColSelfScores(x | θ)
/* A column-major card whose scores compare its embeddings with themselves. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{D×T}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{D×V}
1 for t ∈ [T] : E[:, t] ← W_e[:, x[t]]
2 S ← E^⊺ E/√D
3 return Y = E softmax(S)
"""


def test_column_major_scores_of_a_value_with_itself():
    """No product with a parameter says this card's layout: its map over positions does, so
    `E^⊺ E` compares positions (it transposed E twice while the layout was unknown)."""
    case = cardgen.Case(0, "ColSelfScores", COLUMN_SELF_SCORES, "/* No sub-cards. */\n", True,
                        "col")
    outcome = cardgen.run_case(case)  # the interpreter (oracle 4) gives the expected values
    assert outcome.kind == "agreed", outcome.detail


SHRINKABLE = """Algorithm: Y ← Shrunk(x | θ)
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{T×V}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
1 E ← W_e[x]
2 P ← σ(E) ⊙ E
3 Q ← P + E
4 return Y = (Q + P) W_e^⊺
"""
