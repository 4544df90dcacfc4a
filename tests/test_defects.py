"""Cards `check` accepted that then failed to build, or built and computed something else: each
now builds and computes what the reference interpreter (and plain torch, written here) says the
card means, or is refused at the step that is wrong, with a located message."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

from cardc import syntax as s
from cardc.checker import check
from cardc.diagnostics import Diagnostics
from cardc.library import library_roots, load
from cardc.parser import parse
from cardc.render.html import render_html
from cardc.render.latex import render_latex
from cardc.render.markdown import render_markdown
from cardc.render.text import render_card

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_reproducers import Built, _randn  # noqa: E402

DEFAULTED_SIZE = """\
Algorithm: Y ← Model(X | θ)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×2}
Hyperparameters: D ∈ ℕ
Parameters: θ consisting of:
    W ∈ ℝ^{D×D}
1 A ← Pick(X W)  ▷ A ∈ ℝ^{T×3}
2 B ← Pick(X W | n = 2)
3 return Y = A[:, 2:3] + B

Algorithm: Y ← Pick(X)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×n}
Hyperparameters: D ∈ ℕ, n ∈ ℕ = 3
1 return Y = n X[:, 1:n]
"""


def test_a_defaulted_size_of_a_function_card_takes_its_default(tmp_path):
    """`n ∈ ℕ = 3` where the call does not give n: the callee's shapes and values read 3
    (it once had no value in generated code)."""
    built = Built(tmp_path, DEFAULTED_SIZE, D=4)
    X = _randn(5, 4)
    want = built.agree(X)
    W = built.literal.W.detach()
    XW = X @ W
    torch.testing.assert_close(want, 3 * XW[..., 1:3] + 2 * XW[..., 0:2])


POWER_SHAPE = """\
Algorithm: Y ← Model(X | W)
Input: X ∈ ℝ^{T×C p²}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: C, p, D ∈ ℕ
Parameters: W ∈ ℝ^{C p²×D}
1 return Y = X W
"""


def test_a_power_in_a_shape_is_a_product_of_sizes(tmp_path):
    """`ℝ^{C p²×D}` was refused ("expected a dimension"): p² is p p, in the checker's
    sizes, the module's parameter and what it computes; the card formats to itself and
    renders the power in every renderer."""
    built = Built(tmp_path, POWER_SHAPE, C=3, p=2, D=5)
    assert built.literal.W.shape == (12, 5)
    X = _randn(4, 12)
    torch.testing.assert_close(built.agree(X), X @ built.literal.W.detach())
    tree = parse(POWER_SHAPE, "card.card", Diagnostics())
    assert render_card(tree) == POWER_SHAPE
    assert r"\mathbb{R}^{C \, {p}^{2} \times D}" in render_latex(tree)
    assert r"\mathbb{R}^{C \, {p}^{2} \times D}" in render_markdown(tree)
    assert "p</mi><mn>2</mn></msup>" in render_html(tree, None)


NUMBER_STATE = """\
Algorithm: Y ← RNN(X | W)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: W consisting of:
    W_h ∈ ℝ^{D×D}, W_x ∈ ℝ^{D×D}
1 h ← 0
2 for t = 1, …, T do
3     h ← σ(h W_h + X[t, :] W_x)
4     Y[t, :] ← h
5 end
6 return Y
"""


def test_a_state_that_enters_a_loop_as_a_number_and_scales_a_matrix_is_refused_there(tmp_path):
    """`h ← 0` then `h ← σ(h W_h + …)`: on the first pass h W_h is 0 times the matrix, and h
    became ℝ^{D×D}, reported only at `return`; it is reported at the product that does it."""
    diags = _diagnostics(tmp_path, NUMBER_STATE)
    assert [d.message for d in diags.errors] == [
        "'h' enters this loop as a number (line 7), so on the first pass 'h W_h' scales a "
        "matrix, and 'h' would become ℝ^{D×D}"]
    (error,) = diags.errors
    assert (error.span.line, error.span.col) == (9, 13)


def test_a_state_that_enters_as_a_number_may_still_scale_and_grow(tmp_path):
    """What stays legal: a gate times the state (`a ⊙ h`), a matrix state grown by outer
    products from 0, and a number that stays a number while it scales a matrix."""
    ok = NUMBER_STATE.replace("σ(h W_h + X[t, :] W_x)", "σ(X[t, :] W_x) ⊙ h + X[t, :]")
    grown = NUMBER_STATE.replace("Output: Y ∈ ℝ^{T×D}", "Output: Y ∈ ℝ^{D×D}").replace(
        "h ← σ(h W_h + X[t, :] W_x)", "h ← h + X[t, :]^⊺ X[t, :] W_h").replace(
        "4     Y[t, :] ← h", "4     Z[t, :] ← X[t, :]").replace("6 return Y", "6 return Y = h")
    counted = NUMBER_STATE.replace("h ← σ(h W_h + X[t, :] W_x)", "h ← h + 1").replace(
        "Y[t, :] ← h", "Y[t, :] ← X[t, :] (h W_h)")
    for text in (ok, grown, counted):
        diags = _diagnostics(tmp_path, text)
        assert not diags.errors, diags.render()


def _diagnostics(tmp_path: Path, text: str) -> Diagnostics:
    """What checking `text`, a card file of its own, says."""
    path = tmp_path / "card.card"
    path.write_text(text, encoding="utf-8")
    lib, _ = load([path], root=library_roots([str(path)], None))
    return check(lib)[1]



def test_agreeing_twice_on_one_built_model_compares_fresh_gradients(tmp_path):
    """The interpreter's parameters are views of the literal module's: its gradients once
    added to what the module's backward left in `.grad` by an earlier call, so a second
    `agree` on the same object compared twice the gradient (both test helpers)."""
    from test_recurrence import GATED
    from test_recurrence import Built as RecurrenceBuilt

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    for built, X in ((Built(tmp_path / "a", DEFAULTED_SIZE, D=4), _randn(5, 4)),
                     (RecurrenceBuilt(tmp_path / "b", GATED, D=3, D_h=4), _randn(5, 3))):
        first = built.agree(X)
        torch.testing.assert_close(built.agree(X), first)


LOG_OF = """\
Algorithm: Y ← Model(X | W)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: W ∈ ℝ^{D×D}
1 Z ← X W
2 return Y = log(σ(Z)) + log softmax(Z)
"""


def test_the_log_of_a_sigmoid_or_a_softmax_is_a_number_where_they_round_to_0(tmp_path):
    """`log(σ(z))` at z ≈ −1000 was log(0) = −∞ in the module and in the interpreter (σ
    rounds to 0 below −745 in float64), and `log(softmax(z))` written as a call was not
    log_softmax: both are one function of z, log σ(z) = −log(1 + e^{−z}), as plain torch's
    logsigmoid and log_softmax compute them."""
    built = Built(tmp_path, LOG_OF, D=3)
    X = _randn(4, 3) * 1000
    want = built.agree(X)
    Z = X @ built.literal.W.detach()
    assert Z.min() < -800
    torch.testing.assert_close(want, torch.nn.functional.logsigmoid(Z) + Z.log_softmax(-1))


POSITION_SCALE = """\
Algorithm: Y ← Model(X | W)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: W ∈ ℝ^{D×D}
1 for t ∈ [T] : Y[t, :] ← (t / 3) X[t, :] W + exp(−t / 4) X[t, :]
2 return Y
"""


def test_reals_of_positions_meet_a_bfloat16_models_values_in_bfloat16(tmp_path):
    """`(t / 3) X[t, :] W` in a bfloat16 model: t / 3 is computed in float32 (bfloat16
    would round the positions past 256), and torch promoted X to float32, so the product with
    the bfloat16 W failed ("expected m1 and m2 to have the same dtype"). The position's real
    is cast where it meets the model's values; both lowerings run in bfloat16 and compute what
    the interpreter computes in float64 from the same (bfloat16) weights and inputs."""
    built = Built(tmp_path, POSITION_SCALE, D=4)
    with torch.no_grad():  # weights bfloat16 can hold: the two sides differ by arithmetic alone
        built.literal.W.copy_(built.literal.W.bfloat16().double())
    X = _randn(6, 4).bfloat16()
    want = built.interpreted(X.double())
    for module in (built.literal, built.fused):
        got = copy.deepcopy(module).to(torch.bfloat16)(X)
        assert got.dtype == torch.bfloat16
        # bfloat16 keeps 8 significant bits (a relative step of 2^−8 ≈ 0.004); each entry is a
        # sum of D = 4 products and a term, each rounded, of values up to about 10: a few steps
        torch.testing.assert_close(got.double(), want, rtol=0.03, atol=0.03)


BRACED_POWER = """\
Algorithm: Y ← Model(X | W)
Input: X ∈ ℝ^{T×C p^{3}}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: C, p, D ∈ ℕ
Parameters: W ∈ ℝ^{C p^{3}×D}
1 return Y = X^{2} W
"""


def test_a_whole_number_in_braces_after_a_name_is_a_power(tmp_path):
    """`p^{3}` read as a size named p^{3} (build then asked for a value of 'p_3'), and `X^{2}`
    in a step was an unknown name, though the hints offer 'x^{2}' as a power: a whole number
    in braces is the power, in shapes and steps alike; `γ^1` and `W^{e/d}` stay names. It
    parses as `p³` would, formats to `p^{3}` (and `X^{2}` to `X²`), and renders as a power."""
    built = Built(tmp_path, BRACED_POWER, C=2, p=2, D=5)
    assert built.literal.W.shape == (16, 5)
    X = _randn(4, 16)
    torch.testing.assert_close(built.agree(X), X ** 2 @ built.literal.W.detach())
    tree = parse(BRACED_POWER, "card.card", Diagnostics())
    squared = BRACED_POWER.replace("X^{2}", "X²")
    assert render_card(tree) == squared
    assert parse(squared, "card.card", Diagnostics()) == tree
    assert r"\mathbb{R}^{C \, {p}^{3} \times D}" in render_latex(tree)
    assert r"\mathbb{R}^{C \, {p}^{3} \times D}" in render_markdown(tree)
    assert "p</mi><mn>3</mn></msup>" in render_html(tree, None)
    named = parse(BRACED_POWER.replace("p^{3}", "p^3"), "card.card", Diagnostics())
    assert "p^3" in {n.id for n in s.nodes(named) if isinstance(n, s.Name)}


BRACED_NAMES = """\
Algorithm: y ← Twice(x | W)
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Parameters: W consisting of:
    W^{1} ∈ ℝ^{D×D}
    W^2 ∈ ℝ^{D×D}
Hyperparameters: D ∈ ℕ
1 return y = x W^2
"""


def test_a_name_a_step_would_read_as_a_power_is_refused_where_it_is_declared(tmp_path):
    """Once `W^{1}` in a step is W to the power 1, a card declaring a parameter `W^{1}` was
    told only, at its use, that 'W' is unknown: the declaration itself is refused, with the
    spellings a name may take; `W^2` beside it stays a name."""
    errors = _diagnostics(tmp_path, BRACED_NAMES).errors
    assert [(e.span.line, e.span.col) for e in errors] == [(5, 5)]
    assert errors[0].message == "'W^{1}' cannot be declared: a step reads it as W to the power 1"
    assert errors[0].hint == ("a name's superscript is bare or not a whole number: "
                              "write W^1 or W_1")


INTEGER_VALUE = """\
Algorithm: Y ← Model(X | W)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, H ∈ ℕ; c = 2^{⌊log₂ H⌋}
Parameters: W ∈ ℝ^{D×D}
1 return Y = c X W
"""


def test_integer_math_in_a_hyperparameters_value_says_where_it_is_computed(tmp_path):
    """`c = 2^{⌊log₂ H⌋}` was refused with "expected a number", which a reader takes to mean
    the power: the message names ⌊·⌋ and says to compute it in a step, which does."""
    (error,) = _diagnostics(tmp_path, INTEGER_VALUE).errors
    assert error.message == "⌊·⌋ is not computed in a hyperparameter's value"
    assert error.hint.endswith("compute it in a step of the card, as 'c ← 2^{⌊log₂ H⌋}'")
    assert (error.span.line, error.span.col) == (4, 35)
    stepped = INTEGER_VALUE.replace("; c = 2^{⌊log₂ H⌋}", "").replace(
        "1 return Y = c X W", "1 c ← 2^{⌊log₂ H⌋}\n2 return Y = c X W")
    built = Built(tmp_path, stepped, D=3, H=6)
    X = _randn(4, 3)
    torch.testing.assert_close(built.agree(X), 4 * X @ built.literal.W.detach())


def test_a_rotary_model_trains_after_an_inference_mode_forward():
    """RoPE's angle tables are made once and kept: one made under torch.inference_mode (a
    generation) was reused by the next training step, whose backward failed ("Inference
    tensors cannot be saved for backward"). Tables made under inference mode are kept apart;
    the training step's loss and gradients are those of a model that never generated."""
    from cardc.build import build_model

    root = Path(__file__).resolve().parent.parent
    x = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    grads = []
    for generated_first in (True, False):
        torch.manual_seed(0)
        model = build_model(str(root / "cards" / "llama.card"), "tiny",
                            {"N": 1, "D": 32, "V": 50}, library=str(root / "cards"))
        if generated_first:
            with torch.inference_mode():
                model(x)
        model(x).logsumexp(-1).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


STACK_FROM = """\
Algorithm: Y ← Stack(X | θ)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, N ∈ ℕ
Parameters: θ includes all of the following parameters:
    For ℓ ∈ [N]:
        θ^layer_ℓ, the parameters of layer ℓ.
1 for ℓ = RANGE do
2     X ← Layer(X | θ^layer_ℓ)
3 end
4 return Y = X

Algorithm: X ← Layer(X | θ)
Input: X ∈ ℝ^{T×D}
Output: X ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: θ consisting of:
    W ∈ ℝ^{D×D}
1 return X = X + tanh(X W)
"""


def test_a_loop_over_some_of_a_stacks_layers_runs_those(tmp_path):
    """`for ℓ = 2, …, N` or `1, …, N − 1` over a stack of N layers: those layers (the module
    once ran every layer, whatever the range said)."""
    ranges = (("2, …, N", slice(1, None)), ("1, …, N − 1", slice(None, -1)),
              ("1, …, N", slice(None)))
    for i, (written, kept) in enumerate(ranges):
        (tmp_path / str(i)).mkdir()
        built = Built(tmp_path / str(i), STACK_FROM.replace("RANGE", written), D=4, N=3)
        X = _randn(5, 4)
        want = X
        for layer in list(built.literal.layer)[kept]:
            want = want + torch.tanh(want @ layer.W.detach())
        with torch.no_grad():
            for got in (built.fused(X), built.literal(X), built.interpreted(X)):
                torch.testing.assert_close(got, want)


ROW_SUMS = """\
Algorithm: y ← RowSums(X | W)
/* The rows of a product summed, all of them and the first K, beside its columns summed. */
Input: X ∈ ℝ^{T×D}
Output: y ∈ ℝ^{D}
Hyperparameters: D, T, K ∈ ℕ
Parameters: W ∈ ℝ^{D×D}
1 C ← X W
2 a ← Σ_{t=1}^{T} C[t, :]
3 b ← Σ_{t=1}^{K} C[t, :]
4 c ← Σ_{j=1}^{D} C[:, j]
5 return y = a + 2 · b + c[1] · a
"""


def test_a_sum_over_the_rows_of_a_matrix(tmp_path):
    # was: "code generation sums a value's last axis" at build, after check had accepted it
    built = Built(tmp_path, ROW_SUMS, T=5, D=3, K=2)
    X = _randn(5, 3)
    got = built.agree(X)
    C = X @ built.literal.W.detach()
    a, b = C.sum(-2), C[:, :2].sum(-2)
    torch.testing.assert_close(got, a + 2 * b + C.sum(-1)[:, :1] * a)
