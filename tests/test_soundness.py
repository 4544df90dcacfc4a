"""What `check` and `build` accept runs and computes what the card says: small cards whose
generated module, fused and literal, is compared with the card's math written out here in plain
torch (1-based indices, inclusive slices, `[[·]]` as 0/1), or that are refused with one located
message."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from cardc.build import build_model, checked
from cardc.checker import check
from cardc.diagnostics import CardError
from cardc.interpret import Program
from cardc.library import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cardparams import card_params  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOWERINGS = [pytest.param(True, id="fused"), pytest.param(False, id="literal")]


def _build(tmp_path: Path, text: str, fuse: bool, **values: float):
    """The model of the card `text`, generated with or without fusion, in float64."""
    path = tmp_path / "card.card"
    path.write_text(text, encoding="utf-8")
    torch.manual_seed(0)
    return build_model(str(path), overrides=values, fuse=fuse).double().eval()


PICK = """\
Algorithm: y ← Pick(w)
/* The entries of w at computed positions. */
Input: w ∈ ℝ^{T}
Output: y ∈ ℝ^{n}
Hyperparameters: T, n ∈ ℕ
1 for i ∈ [n] : p[i] ← VALUE
2 return y = w[p]
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
@pytest.mark.parametrize(("value", "n", "positions"), [
    ("i", 5, [1, 2, 3, 4, 5]),  # the identity: y = w
    ("i", 3, [1, 2, 3]),  # a prefix: shifted by one it would silently read w[2 : 4]
    ("n + 1 − i", 3, [3, 2, 1]),
])
def test_a_computed_index_is_1_based(tmp_path, fuse, value, n, positions):
    model = _build(tmp_path, PICK.replace("VALUE", value), fuse, T=5, n=n)
    w = torch.randn(2, 5, dtype=torch.float64)
    expected = torch.stack([w[:, k - 1] for k in positions], dim=-1)
    torch.testing.assert_close(model(w), expected, rtol=0, atol=0)


THRESHOLDS = """\
Algorithm: y ← Reached(x)
/* Each entry of x where it reaches the thresholds 1, …, m, weighed by w. */
Input: x ∈ ℝ^{T}
Output: y ∈ ℝ^{T}
Hyperparameters: T, m ∈ ℕ
Parameters: w ∈ ℝ^{m}
1 for j ∈ [m] : C[:, j] ← x ⊙ [[x ≥ j]]  ▷ C ∈ ℝ^{T×m}
2 return y = RESULT
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
@pytest.mark.parametrize("result", ["Σ_{j=1}^{m} C[:, j] ⊙ w[j]", "C w"])
def test_a_map_over_columns_keeps_its_rows_and_columns(tmp_path, fuse, result):
    model = _build(tmp_path, THRESHOLDS.replace("RESULT", result), fuse, T=5, m=3)
    x = torch.tensor([[0.0, 1.0, 2.5, 3.0, 7.0], [3.0, 2.0, 1.0, 0.0, -1.0]], dtype=torch.float64)
    reached = torch.stack([x * (x >= j) for j in (1, 2, 3)], dim=-1)  # C[t, j]: (B, T, m)
    torch.testing.assert_close(model(x), reached @ model.w.detach())


CONDITIONS = """\
Algorithm: y ← Counted(x)
/* Conditions counted as the numbers 0 and 1. */
Input: x ∈ ℝ^{T}
Output: y ∈ ℝ^{T}
Hyperparameters: T ∈ ℕ
1 return y = RESULT
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
@pytest.mark.parametrize(("result", "expected"), [
    ("[[x > 0]] − [[x < 0]]", lambda x: torch.sign(x)),
    ("−[[x > 0]]", lambda x: -(x > 0).double()),
    ("[[x > 0]] + [[x > 1]]", lambda x: (x > 0).double() + (x > 1).double()),  # not `or`
    ("([[x > 0]] − [[x > 1]])/2", lambda x: ((x > 0).double() - (x > 1).double()) / 2),
    ("x ⊙ [[x > 0]] − 1", lambda x: x * (x > 0).double() - 1),
])
def test_a_condition_counts_as_0_or_1(tmp_path, fuse, result, expected):
    model = _build(tmp_path, CONDITIONS.replace("RESULT", result), fuse, T=5)
    x = torch.tensor([[-2.0, 0.0, 0.5, 1.0, 3.0], [1.5, -0.5, 0.0, 2.0, -3.0]], dtype=torch.float64)
    torch.testing.assert_close(model(x).double(), expected(x), rtol=0, atol=0)



@pytest.mark.parametrize("fuse", LOWERINGS)
def test_a_matrix_of_conditions_multiplies_as_numbers(tmp_path, fuse):
    card = THRESHOLDS.replace("C[:, j] ← x ⊙ [[x ≥ j]]", "C[:, j] ← [[x ≥ j]]")
    model = _build(tmp_path, card.replace("RESULT", "C w"), fuse, T=5, m=3)
    x = torch.tensor([[0.0, 1.0, 2.5, 3.0, 7.0], [3.0, 2.0, 1.0, 0.0, -1.0]], dtype=torch.float64)
    reached = torch.stack([(x >= j).double() for j in (1, 2, 3)], dim=-1)
    torch.testing.assert_close(model(x), reached @ model.w.detach())


SCALED = """\
Algorithm: y ← Scaled(x)
/* x scaled by numbers computed from hyperparameters. */
Input: x ∈ ℝ^{T}
Output: y ∈ ℝ^{T}
Hyperparameters: T ∈ ℕ; δ, μ ∈ (0, ∞)
1 return y = x · (RESULT)
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
@pytest.mark.parametrize(("result", "expected"), [
    ("log(δ/μ)", math.log(2.0 / 0.5)),
    ("log δ", math.log(2.0)),
    ("exp(μ) − tanh(δ)", math.exp(0.5) - math.tanh(2.0)),
    ("σ(δ)", 1 / (1 + math.exp(-2.0))),
    ("GELU(μ)", 0.5 * 0.5 * (1 + math.erf(0.5 / math.sqrt(2)))),
    ("ReLU(μ − δ)", 0.0),
])
def test_math_on_hyperparameters_is_math_on_numbers(tmp_path, fuse, result, expected):
    model = _build(tmp_path, SCALED.replace("RESULT", result), fuse, T=3, δ=2.0, μ=0.5)
    x = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(model(x), x * expected)


def _errors(tmp_path: Path, text: str) -> list[str]:
    """The card's errors, located: `line:col: message`."""
    path = tmp_path / "card.card"
    path.write_text(text, encoding="utf-8")
    lib, _ = load([path], root=str(ROOT / "cards"))
    _, diags = check(lib)
    return [f"{d.span.line}:{d.span.col}: {d.message}" for d in diags.errors]


def test_a_quantifier_without_a_range_defines_nothing_and_says_so(tmp_path):
    card = """\
Algorithm: Y ← Pairs(X)
/* A matrix defined entry by entry. */
Input: X ∈ ℝ^{T×T}
Output: Y ∈ ℝ^{T×T}
Hyperparameters: T ∈ ℕ
1 ∀t, t′ : n[t, t′] ← t − t′
2 return Y = X + n
"""
    assert _errors(tmp_path, card) == [
        "6:14: '∀t' gives 't' no range, so this step cannot define 'n'"]
    # with the ranges stated, as a map states them (tests/test_intmath.py runs it)
    assert _errors(tmp_path, card.replace("∀t, t′ :", "∀t ∈ [T], t′ ∈ [T] :")) == []
    assert _errors(tmp_path, card.replace("∀t, t′ :", "∀t ∈ [T], t′ :")) == [
        "6:23: '∀t′' gives 't′' no range, so this step cannot define 'n'"]


SHRINK = """\
Algorithm: Y ← Shrink(X, x)
/* Rows divided by the size of the vocabulary of the tokens handed beside them. */
Input: X ∈ ℝ^{T×D}, one row per token.
Input: x ∈ V*, token IDs, V ≅ [N_V].
Output: Y ∈ ℝ^{T×D}
Hyperparameters: N_V ∈ ℕ
1 return Y = X/N_V

Algorithm: Y ← Model(x | θ)
/* Embeds tokens and divides them by the size of the vocabulary. */
Input: x ∈ V*, token IDs, V ≅ [N_V].
Output: Y ∈ ℝ^{length(x)×D}
Hyperparameters: N_V, D ∈ ℕ
Parameters: θ consisting of:
    W_e ∈ ℝ^{N_V×D}
1 E ← W_e[x]
2 return Y = Shrink(E, x)
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_a_card_taking_tokens_is_handed_the_size_of_their_vocabulary(tmp_path, fuse):
    model = _build(tmp_path, SHRINK, fuse, N_V=7, D=4)
    x = torch.tensor([[0, 3, 6], [6, 6, 1]])  # token IDs, 0-based in tensors
    torch.testing.assert_close(model(x), model.W_e.detach()[x] / 7)


BIASED = """\
Algorithm: Y ← Biased(X, A)
/* Scores of every pair of rows with a bias per key, attended. */
Input: X ∈ ℝ^{T×D}, one row per token.
Input: A ∈ ℝ^{T×1}, a bias per key.
Output: Y ∈ ℝ^{T×D}
Hyperparameters: T, D ∈ ℕ
Parameters: W ∈ ℝ^{D×D}
1 S ← X W X^⊺  ▷ S ∈ ℝ^{T×T}
2 ∀t, t′, if t′ ≤ t then S[t, t′] ← S[t, t′] + A[t′, 1]
3 return Y = softmax(S) X
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_an_input_read_at_a_quantified_variable_is_a_bias_per_key(tmp_path, fuse):
    model = _build(tmp_path, BIASED, fuse, T=3, D=4)
    torch.manual_seed(1)
    x, a = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(2, 3, 1, dtype=torch.float64)
    s = x @ model.W.detach() @ x.mT
    seen = torch.tensor([[k <= q for k in range(3)] for q in range(3)])  # t′ ≤ t
    s = torch.where(seen, s + a[:, None, :, 0], s)  # S[t, t′] + A[t′, 1]
    torch.testing.assert_close(model(x, a), torch.softmax(s, dim=-1) @ x)


QUANTIFIED = """\
Algorithm: Y ← Early(X)
/* The first w columns of each row, the rest zeroed: t′ of ∀ counts from 1. */
Input: X ∈ ℝ^{T×T}
Output: Y ∈ ℝ^{T×T}
Hyperparameters: T, w ∈ ℕ
Parameters: W ∈ ℝ^{T×T}
1 S ← X W
2 ∀t, t′, if t′ > w then S[t, t′] ← 0
3 return Y = S
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_a_quantified_variable_counts_from_1(tmp_path, fuse):
    model = _build(tmp_path, QUANTIFIED, fuse, T=4, w=2)
    x = torch.randn(2, 4, 4, dtype=torch.float64)
    expected = x @ model.W.detach()
    expected[..., 2:] = 0  # columns 3 and 4 of the card
    torch.testing.assert_close(model(x), expected)


PREFIX_SUM = """\
Algorithm: Y ← Scaled(X | γ)
/* Each row scaled by the size of its first K entries (found by the random-card generator). */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, K ∈ ℕ
Parameters: γ ∈ ℝ^{D}
1 for t ∈ [T] : Y[t, :] ← Row(X[t, :] | γ)
2 return Y

Algorithm: y ← Row(e | γ)
Input: e ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D, K ∈ ℕ
Parameters: γ ∈ ℝ^{D}
1 s ← Σ_{i=1}^{K} e[i]²
2 return y = e/√(s + 1) ⊙ γ
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_a_sum_over_a_prefix_reads_only_the_prefix(tmp_path, fuse):
    """Σ_{i=1}^{K} e[i]² of a D-vector sums its first K entries, not all D."""
    model = _build(tmp_path, PREFIX_SUM, fuse, D=6, K=2)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    s = (x[..., :2] ** 2).sum(-1, keepdim=True)
    torch.testing.assert_close(model(x), x / torch.sqrt(s + 1) * model.gamma)


COLUMN_SLICE_PRODUCT = """\
Algorithm: Y ← Head(x | θ)
/* A column-major card: the first K features of each token's embedding, projected. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{K×T}
Hyperparameters: V, D, K ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{D×V}
    W ∈ ℝ^{K×K}
1 for t ∈ [T] : E[:, t] ← W_e[:, x[t]]
2 return Y = W E[1 : K, :]
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_a_column_major_row_slice_reads_features(tmp_path, fuse):
    """E[1 : K, :] of a D×T value is its first K rows (features), whatever its storage;
    a column-major card's output is stored flipped, (B, T, K)."""
    model = _build(tmp_path, COLUMN_SLICE_PRODUCT, fuse, V=11, D=6, K=3)
    x = torch.randint(0, 11, (2, 5))
    e = model.W_e.detach().mT[x]  # (B, T, D): column t of E is x[t]'s embedding
    torch.testing.assert_close(model(x), e[..., :3] @ model.W.detach().mT)


COLUMN_CALLS_PLAIN = """\
Algorithm: Y ← Outer(x | θ)
/* A column-major card handing its D×T value to a card without products of its own. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{K×T}
Hyperparameters: V, D, K ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{D×V}
    W ∈ ℝ^{K×K}
1 for t ∈ [T] : E[:, t] ← W_e[:, x[t]]
2 return Y = W Top(E)

Algorithm: Z ← Top(X)
/* The first K rows of a D×T matrix, doubled. */
Input: X ∈ ℝ^{D×T}
Output: Z ∈ ℝ^{K×T}
Hyperparameters: D, K ∈ ℕ
1 return Z = 2 · X[1 : K, :]
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_a_card_without_a_layout_reads_its_input_as_declared(tmp_path, fuse):
    """Top has no products, so no column-major storage: its caller hands it X as declared."""
    model = _build(tmp_path, COLUMN_CALLS_PLAIN, fuse, V=11, D=6, K=3)
    x = torch.randint(0, 11, (2, 5))
    e = model.W_e.detach().mT[x]
    torch.testing.assert_close(model(x), 2 * e[..., :3] @ model.W.detach().mT)


POSITION_ROWS = """\
Algorithm: Y ← Positions(X | θ)
/* Each row gated by the row of a table of positions. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, L ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_p ∈ ℝ^{L×D}
1 for t ∈ [T] : Y[t, :] ← σ(W_p[t, :]) ⊙ X[t, :]
2 return Y
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_rows_of_a_parameter_in_a_map_over_positions(tmp_path, fuse):
    """W_p[t, :] for t ∈ [T] is W_p's first T rows, and L bounds T."""
    model = _build(tmp_path, POSITION_ROWS, fuse, D=4, L=6)
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    torch.testing.assert_close(model(x), torch.sigmoid(model.W_p.detach()[:5]) * x)
    with pytest.raises(ValueError, match="exceeds the model's 6 positions"):
        model(torch.randn(1, 7, 4, dtype=torch.float64))


TOKENS_AS_NUMBERS = """\
Algorithm: Y ← Counted(x | θ)
/* Token IDs compared and multiplied as the numbers 1 … V the card declares. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{T×D}
Hyperparameters: V, D, k ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
1 E ← W_e[x]
2 for t ∈ [T] : Y[t, :] ← E[t, :] · [[x[t] ≤ k]] + E[t, :] · x[t] − E[t, :] · [[x[t] ≠ k]]
3 return Y
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_token_ids_count_from_1_as_numbers(tmp_path, fuse):
    model = _build(tmp_path, TOKENS_AS_NUMBERS, fuse, V=5, D=3, k=2)
    x = torch.tensor([[0, 1, 2, 4], [1, 1, 3, 0]])  # 0-based in tensors: card tokens 1, 2, 3, 5
    e = model.W_e.detach()[x]
    card = (x + 1).to(torch.float64)[..., None]  # the card's token IDs
    want = e * (card <= 2) + e * card - e * (card != 2)
    torch.testing.assert_close(model(x), want)


INPUT_NAMED_LIKE_A_SIZE = """\
Algorithm: Y ← Outer(X, v | θ)
/* Hands a sub-card a vector that it names like the count of its rows. */
Input: X ∈ ℝ^{T×D}
Input: v ∈ ℝ^{D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, L ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_p ∈ ℝ^{L×D}
1 Z ← Gate(X, v | W_p)
2 return Y = Gate(Z, v | W_p)

Algorithm: Y ← Gate(X, T | W_p)
/* Rows gated by a position table and by an input named like their count. */
Input: X ∈ ℝ^{T×D}
Input: T ∈ ℝ^{D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, L ∈ ℕ
Parameters: W_p ∈ ℝ^{L×D}
1 for t ∈ [T] : Y[t, :] ← W_p[t, :] ⊙ X[t, :] ⊙ T
2 return Y
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_an_input_named_like_a_size_keeps_its_value(tmp_path, fuse):
    """The size T read off X is a local of its own: the input T stays the vector it is."""
    model = _build(tmp_path, INPUT_NAMED_LIKE_A_SIZE, fuse, D=4, L=6)
    x, v = torch.randn(2, 5, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    w = model.W_p.detach()[:5]
    z = w * x * v[:, None]
    torch.testing.assert_close(model(x, v), w * z * v[:, None])


MODEL_INPUT_NAMED_LIKE_A_SIZE = """\
Algorithm: Y ← Clash(X, T | θ)
/* A model card with an input named like the size another input gives. */
Input: X ∈ ℝ^{T×D}
Input: T ∈ ℝ^{D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, L ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_p ∈ ℝ^{L×D}
1 for t ∈ [T] : Y[t, :] ← W_p[t, :] ⊙ X[t, :] ⊙ T
2 return Y
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_a_model_input_named_like_a_size_keeps_its_value(tmp_path, fuse):
    model = _build(tmp_path, MODEL_INPUT_NAMED_LIKE_A_SIZE, fuse, D=4, L=6)
    x, v = torch.randn(2, 5, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    torch.testing.assert_close(model(x, v), model.W_p.detach()[:5] * x * v[:, None])


SUMMED = """\
Algorithm: Y ← Model(X | θ)
/* Rows through a vector card that sums. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: θ includes all of the following parameters:
    γ ∈ ℝ^{D}
1 for t ∈ [T] : Y[t, :] ← Vec(X[t, :] | γ)
2 return Y

Algorithm: y ← Vec(e | γ)
/* A sum. */
Input: e ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ
Parameters: γ ∈ ℝ^{D}
1 s ← SUM
2 return y = e · s ⊙ γ
"""


@pytest.mark.parametrize(("sum_", "where", "message"), [
    ("Σ_{i=1}^{D} i · e[i]", "17:19",
     "the sum's index 'i' is read as a number here: code generation reads it only as the "
     "index of a value, as 'e[i]'"),
    ("Σ_{i=1}^{D − 1} e[i + 1]", "17:25",
     "code generation sums a value read at the sum's index 'i' itself, not at an index "
     "computed from it"),
])
def test_a_sum_code_generation_cannot_take_says_why(tmp_path, sum_, where, message):
    """Each once read 'a sum index can only index the last axis here', which neither is."""
    with pytest.raises(CardError) as err:
        _build(tmp_path, SUMMED.replace("SUM", sum_), True, D=4)
    diags = err.value.diagnostics.errors
    assert [f"{d.span.line}:{d.span.col}: {d.message}" for d in diags] == [f"{where}: {message}"]


COLUMN_NORMS = """\
Algorithm: Y ← ColumnNorms(x | θ)
/* Column-major embeddings normalised column by column (no product says the layout). */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{D×T}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{D×V}
    γ, β ∈ ℝ^{D}
1 for t ∈ [T] : E[:, t] ← W_e[:, x[t]]
2 for t ∈ [T] : Y[:, t] ← LayerNorm(E[:, t] | γ, β)
3 return Y
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_maps_over_positions_make_a_card_column_major(tmp_path, fuse):
    """Column t of Y is position t: the module returns positions first, as for every
    column-major card (the interpreter's Y, transposed)."""
    model = _build(tmp_path, COLUMN_NORMS, fuse, V=11, D=8)
    x = torch.randint(0, 11, (2, 7))
    e = model.W_e.mT[x]  # (B, T, D): column x[t] of W_e at position t
    want = torch.nn.functional.layer_norm(e, (8,), model.gamma, model.beta, 1e-5)
    torch.testing.assert_close(model(x), want)
    card = tmp_path / "card.card"
    lib, checker, _ = checked([str(card)], [str(tmp_path)])
    assert checker.info(lib.find("ColumnNorms")).sig.layout == "column"


def _interpreted(tmp_path: Path, model, name: str, examples: list, **values: float):
    """The card `name` of tmp_path/card.card run by the reference interpreter on each example,
    with the module's own parameters (so gradients reach them), stacked as a batch."""
    lib, checker, _ = checked([str(tmp_path / "card.card")], [str(tmp_path)])
    alg = lib.find(name)
    program = Program.of(lib, checker, alg)
    params = card_params(checker, alg, model)
    hypers = program.hyperparameters(**values)
    return torch.stack([program(x, params=params, hypers=hypers) for x in examples])


GATED = """\
Algorithm: Z ← Gated(X | θ)
/* Each row of X gated by the same row of a gate computed once for every position. */
Input: X ∈ ℝ^{T×D}
Output: Z ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_p ∈ ℝ^{D×D}
1 for t ∈ [T] : Z[t, :] ← Gate(X | W_p)[t, :] ⊙ X[t, :]
2 return Z

Algorithm: G ← Gate(X | W)
/* A gate for every position. */
Input: X ∈ ℝ^{T×D}
Output: G ∈ ℝ^{T×D}
Parameters: W ∈ ℝ^{D×D}
1 return G = σ(X W)
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_row_t_of_a_call_of_whole_values_is_its_rows(tmp_path, fuse):
    """`Gate(X)[t, :]` in a map over t: the call reads all of X, once; its row t is position
    t's (it was taken for a value per position, and indexed again at every position)."""
    model = _build(tmp_path, GATED, fuse, D=3)
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    w = model.W_p.detach().clone().requires_grad_()
    want = torch.sigmoid(x @ w) * x
    got, card = model(x), _interpreted(tmp_path, model, "Gated", list(x), D=3)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(card, want)
    weights = torch.randn_like(want)
    expected = torch.autograd.grad((want * weights).sum(), (x, w))
    for out in (got, card):
        torch.testing.assert_close(
            torch.autograd.grad((out * weights).sum(), (x, model.W_p)), expected)


FIRST_TOKEN = """\
Algorithm: Y ← Firsts(x | θ)
/* Embeddings kept where the token differs from the sequence's first. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{T×D}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
1 E ← W_e[x]
2 for t ∈ [T] : Y[t, :] ← E[t, :] · [[x[t] ≠ x[1]]] + E[t, :] · x[1]
3 return Y
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_a_fixed_token_in_a_map_is_one_per_example(tmp_path, fuse):
    """`x[1]` beside `x[t]`: each example's first token, the same at every position of that
    example (it was compared with the batch as if it were the positions)."""
    model = _build(tmp_path, FIRST_TOKEN, fuse, V=5, D=3)
    x = torch.tensor([[0, 1, 0, 4], [1, 1, 3, 0], [4, 2, 2, 4]])  # card tokens 1 … 5, 0-based
    w = model.W_e.detach().clone().requires_grad_()
    e = w[x]
    first = x[:, :1, None]
    want = e * (x[..., None] != first) + e * (first + 1)
    got, card = model(x), _interpreted(tmp_path, model, "Firsts", list(x + 1), V=5, D=3)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(card, want)
    weights = torch.randn_like(want)
    expected = torch.autograd.grad((want * weights).sum(), w)
    for out in (got, card):
        torch.testing.assert_close(torch.autograd.grad((out * weights).sum(), model.W_e),
                                   expected)


FIRST_MAX = """\
Algorithm: Y ← FirstMax(x | θ)
/* Each position's embedding scaled by the larger of its token and the first. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{T×D}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
1 E ← W_e[x]
2 for t ∈ [T] : Y[t, :] ← E[t, :] · FUNC(x[t], x[1])
3 return Y
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
@pytest.mark.parametrize(("func", "pick"), [("max", torch.maximum), ("min", torch.minimum)])
def test_max_of_a_token_and_the_first_is_a_number_at_every_position(tmp_path, fuse, func, pick):
    """max(x[t], x[1]) of tokens 1 … V: one number per position (x[1] the same at each), on
    the card's 1-based token IDs."""
    model = _build(tmp_path, FIRST_MAX.replace("FUNC", func), fuse, V=11, D=4)
    x = torch.tensor([[3, 1, 7, 0], [0, 5, 2, 2]])  # 0-based: card tokens 4, 2, 8, 1 and 1, 6, 3, 3
    n = pick(x + 1, x[:, :1] + 1).double()
    torch.testing.assert_close(model(x), model.W_e[x] * n[..., None])


SHARE = """\
Algorithm: Y ← Share(x | W_e)
/* Each token's embedding scaled by its position over 3. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: Y ∈ ℝ^{T×D}
Hyperparameters: V, D ∈ ℕ
Parameters: W_e ∈ ℝ^{V×D}
1 for t ∈ [T] : Y[t, :] ← W_e[x[t], :] · (t / 3)
2 return Y
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_a_row_of_tokens_scaled_by_a_position(tmp_path, fuse):
    """Three silent defects of one line, each fixed: a row times a number made the card
    column-major (its output came back transposed); `W_e[x[t], :]` took the row before each
    token (x − 1: the last row for the first token); and `t / 3` was divided in float32 in a
    float64 model whose only input is tokens."""
    model = _build(tmp_path, SHARE, fuse, V=7, D=4)
    x = torch.tensor([[0, 6, 2, 2, 5], [3, 1, 0, 4, 6]])  # card tokens 1, 7, 3, 3, 6 and …
    share = torch.arange(1, 6, dtype=torch.float64) / 3
    want = model.W_e[x] * share[:, None]
    got = model(x)
    torch.testing.assert_close(got, want, rtol=1e-15, atol=0)
    card = _interpreted(tmp_path, model, "Share", list(x + 1), V=7, D=4)
    torch.testing.assert_close(card, want, rtol=1e-15, atol=0)


SAME_ROW = """\
Algorithm: y ← Squash(w)
/* A squashing of a vector. */
Input: w ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ
1 return y = tanh(w) · 2

Algorithm: Y ← SameRow(X | W)
/* The input plus one squashed parameter, the same at every position. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: W ∈ ℝ^{D}
1 for t ∈ [T] : R[t, :] ← Squash(W)
2 return Y = X + R
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
def test_a_map_step_that_reads_no_position(tmp_path, fuse):
    """`R[t, :] ← Squash(W)`: a call of parameters alone, the same row at every position
    (refused at build before: 'this value does not depend on t')."""
    model = _build(tmp_path, SAME_ROW, fuse, D=3)
    X = torch.randn(2, 5, 3, dtype=torch.float64)
    want = X + 2 * torch.tanh(model.W)
    torch.testing.assert_close(model(X), want, rtol=1e-15, atol=0)
    card = _interpreted(tmp_path, model, "SameRow", list(X), D=3)
    torch.testing.assert_close(card, want, rtol=1e-15, atol=0)
    g, = torch.autograd.grad(model(X).sum(), model.W)
    torch.testing.assert_close(g, 5 * 2 * 2 * (1 - torch.tanh(model.W) ** 2), rtol=1e-12,
                               atol=0)


SCALE = """\
Algorithm: y ← Scale(x | w)
/* A vector scaled by one learned number. */
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ
Parameters: w ∈ ℝINIT
1 return y = w x
"""


@pytest.mark.parametrize("fuse", LOWERINGS)
@pytest.mark.parametrize(("init", "value"), [("", 0.0), (" = 1", 1.0), (" = 0.5", 0.5)])
def test_a_parameter_that_is_one_number(tmp_path, fuse, init, value):
    """`w ∈ ℝ`: a 0-d parameter (its module called torch.zeros() and crashed)."""
    model = _build(tmp_path, SCALE.replace("INIT", init), fuse, D=3)
    assert model.w.shape == () and model.w.item() == value
    with torch.no_grad():
        model.w.fill_(1.5)
    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(model(x), 1.5 * x, rtol=0, atol=0)
    torch.testing.assert_close(_interpreted(tmp_path, model, "Scale", list(x), D=3), 1.5 * x)
