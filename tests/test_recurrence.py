"""Recurrences over positions (cardc.lower.recurrence): a sequential loop
`for t = 1, …, T do h ← a ⊙ h + b; Y[t, :] ← … end` generates a module, a scan where the state
enters linearly (no Python loop over positions in the fused forward) and a Python loop where it
does not; fused and literal modules compute what the reference interpreter says the card
means, values and gradients, in float64; `linear_scan` equals the loop it replaces."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from cardc.build import checked, instantiate, model_cards, source
from cardc.diagnostics import CardError
from cardc.interpret import Program
from cardc.library import library_roots
from cardc.names import identifier
from cardc.runtime.modelkit import linear_scan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cardparams import card_params  # noqa: E402

RTOL, ATOL = 1e-9, 1e-10  # float64: the lowerings and the interpreter differ by rounding alone
B = 2


class Built:
    """A card's model, its literal and fused modules holding the same random weights."""

    def __init__(self, tmp_path: Path, text: str, **sizes: float):
        path = tmp_path / "card.card"
        path.write_text(text, encoding="utf-8")
        lib, checker, _ = checked([str(path)], library_roots([str(path)], None))
        (alg,) = model_cards(lib, checker, [str(path)])
        self.program = Program.of(lib, checker, alg)
        self.env = self.program.hyperparameters(None, **sizes)
        values = {identifier(k): v for k, v in self.env.items()}
        self.literal = instantiate(checker, alg, values, fuse=False)[0].double()
        self.fused = instantiate(checker, alg, values, fuse=True)[0].double()
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in self.literal.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
        self.fused.load_state_dict(self.literal.state_dict())
        self.params = card_params(checker, alg, self.literal)
        self.sources = {fuse: source(checker, alg, fuse=fuse) for fuse in (True, False)}

    def agree(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Both modules equal the interpreter on `inputs`, values and gradients with respect
        to every parameter; returns the interpreter's values."""
        want = torch.stack([self.program(*(x[b] for x in inputs), params=self.params,
                                         hypers=self.env) for b in range(B)])
        weights = torch.linspace(-1, 1, want.numel(), dtype=torch.float64).reshape(want.shape)
        self.literal.zero_grad()  # the interpreter's parameters are the literal's: a
        (want * weights).sum().backward()  # grad left by an earlier call would add in
        grads = {n: p.grad.clone() for n, p in self.literal.named_parameters()}
        for module in (self.literal, self.fused):
            module.zero_grad()
            got = module(*inputs)
            torch.testing.assert_close(got, want.detach(), rtol=RTOL, atol=ATOL)
            (got * weights).sum().backward()
            for n, p in module.named_parameters():
                torch.testing.assert_close(p.grad, grads[n], rtol=RTOL, atol=ATOL, msg=n)
        return want.detach()


def loops_in_forward(text: str) -> int:
    """The `for` and `while` statements of the forward methods of a generated module."""
    classes = [n for n in ast.parse(text).body if isinstance(n, ast.ClassDef)]
    return sum(isinstance(n, ast.For | ast.While) for c in classes for f in c.body
               if isinstance(f, ast.FunctionDef) and f.name == "forward" for n in ast.walk(f))


def _randn(*shape: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, *shape, generator=g, dtype=torch.float64)


GATED = """\
Algorithm: Y ← GatedRecurrence(X | W)
/* A diagonal linear recurrence whose decay is a gate computed from the input. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, D_h ∈ ℕ
Parameters: W consisting of:
    W_a, W_B ∈ ℝ^{D×D_h}
    W_C ∈ ℝ^{D_h×D}
1 A ← σ(X W_a)
2 h ← 0
3 for t = 1, …, T do
4     h ← A[t, :] ⊙ h + X[t, :] W_B
5     Y[t, :] ← h W_C
6 end
7 return Y
"""


def test_a_gated_linear_recurrence_is_a_scan_that_equals_the_loop(tmp_path):
    built = Built(tmp_path, GATED, D=3, D_h=4)
    X = _randn(6, 3)
    want = built.agree(X)
    assert loops_in_forward(built.sources[True]) == 0
    assert loops_in_forward(built.sources[False]) == 1
    w = built.literal  # the card's math, position by position
    A, h, rows = torch.sigmoid(X @ w.W_a), torch.zeros(B, 4, dtype=torch.float64), []
    for t in range(6):
        h = A[:, t] * h + X[:, t] @ w.W_B
        rows.append(h @ w.W_C)
    torch.testing.assert_close(want, torch.stack(rows, 1).detach(), rtol=RTOL, atol=ATOL)


FINAL_STATE = """\
Algorithm: y ← FinalState(X | W)
/* A recurrence with a decay and a start of its own, whose output is the last state. */
Input: X ∈ ℝ^{T×D}
Output: y ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ
Parameters: W consisting of:
    a, h_0 ∈ ℝ^{D}
    W_B ∈ ℝ^{D×D}
1 h ← h_0
2 for t = 1, …, T do
3     u ← X[t, :] W_B
4     h ← h ⊙ a + u
5 end
6 return y = h ⊙ u
"""


def test_a_decay_and_start_of_its_own_and_values_read_after_the_loop(tmp_path):
    """A parameter as the decay (the same at every position), a parameter as the start, a
    value the loop's steps compute per position (u) and the state, both read after the loop
    as the last position left them."""
    built = Built(tmp_path, FINAL_STATE, D=3)
    X = _randn(5, 3)
    want = built.agree(X)
    assert loops_in_forward(built.sources[True]) == 0
    w = built.literal
    h = w.h_0
    for t in range(5):
        u = X[:, t] @ w.W_B
        h = h * w.a + u
    torch.testing.assert_close(want, (h * u).detach(), rtol=RTOL, atol=ATOL)


ELMAN = """\
Algorithm: Y ← Elman(X | W)
/* A recurrence whose state enters non-linearly. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: W consisting of:
    W_h, W_x ∈ ℝ^{D×D}, h_0 ∈ ℝ^{D}
1 h ← h_0
2 for t = 1, …, T do
3     h ← σ(h W_h + X[t, :] W_x)
4     Y[t, :] ← h
5 end
6 return Y
"""


def test_a_state_that_enters_non_linearly_keeps_its_loop_and_says_so(tmp_path):
    built = Built(tmp_path, ELMAN, D=3)
    built.agree(_randn(5, 3))
    fused = built.sources[True]
    assert loops_in_forward(fused) == 1
    assert "no scan, the state enters non-linearly: one position at a time" in fused
    assert "linear_scan" not in fused


COLUMNS = """\
Algorithm: Y ← ColumnScan(X | W)
/* The paper's layout: one column per position. */
Input: X ∈ ℝ^{d×ℓ}
Output: Y ∈ ℝ^{d×ℓ}
Hyperparameters: d ∈ ℕ
Parameters: W consisting of:
    W_a, W_b ∈ ℝ^{d×d}
1 h ← 0
2 for t = 1, …, ℓ do
3     h ← σ(W_a X[:, t]) ⊙ h + W_b X[:, t]
4     Y[:, t] ← W_a h
5 end
6 return Y
"""


def test_the_papers_layout_writes_its_output_column_by_column(tmp_path):
    built = Built(tmp_path, COLUMNS, d=3)
    X = _randn(3, 5)  # the card's d×ℓ; the module takes positions first
    want = torch.stack([built.program(X[b], params=built.params, hypers=built.env)
                        for b in range(B)])
    for module in (built.literal, built.fused):
        got = module(X.mT)
        torch.testing.assert_close(got.mT, want, rtol=RTOL, atol=ATOL)
        got.sum().backward()
    for n, p in built.fused.named_parameters():
        torch.testing.assert_close(p.grad, dict(built.literal.named_parameters())[n].grad,
                                   rtol=RTOL, atol=ATOL)
    assert loops_in_forward(built.sources[True]) == 0


def _loop(a: torch.Tensor, b: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    out = []
    for t in range(b.shape[-2]):
        h = a[..., t, :] * h + b[..., t, :]
        out.append(h)
    return torch.stack(out, -2)


@pytest.mark.parametrize("T", [1, 2, 3, 7, 8, 33])
def test_linear_scan_equals_the_loop_for_any_gate(T):
    """Gates of either sign, zeros among them, in float64: the scan is the loop."""
    g = torch.Generator().manual_seed(T)
    a = torch.rand(2, T, 5, generator=g, dtype=torch.float64) * 2 - 1
    a[:, ::3, 1] = 0
    b = torch.randn(2, T, 5, generator=g, dtype=torch.float64)
    h = torch.randn(2, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(linear_scan(a, b, h, -2), _loop(a, b, h), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(linear_scan(a, b, 0, -2), _loop(a, b, torch.zeros(5)),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(linear_scan(-0.5, b, h, -2), _loop(torch.full_like(a, -0.5), b, h),
                               rtol=1e-12, atol=1e-12)


def test_linear_scan_stays_as_accurate_as_the_loop_over_long_sequences():
    """4096 positions in float32, decays near 1 (long memory) and near 0: both within 1e-5
    of the float64 loop, relative to the states' size; no overflow, no NaN."""
    g = torch.Generator().manual_seed(0)
    a = torch.cat([1 - torch.rand(1, 4096, 3, generator=g) * 1e-3,
                   torch.rand(1, 4096, 3, generator=g) * 1e-3], -1).double()
    b = torch.randn(1, 4096, 6, generator=g, dtype=torch.float64)
    exact = _loop(a, b, torch.zeros(6, dtype=torch.float64))
    scale = exact.abs().max().item()
    got = linear_scan(a.float(), b.float(), 0, -2).double()
    plain = _loop(a.float(), b.float(), torch.zeros(6)).double()
    assert torch.isfinite(got).all()
    assert (got - exact).abs().max().item() <= 1e-5 * scale
    assert (plain - exact).abs().max().item() <= 1e-5 * scale


COUNTING_LM = """\
Algorithm: P ← CountingLM(x | θ)
/* A language model whose recurrence reads its position t as a number. */
Input: x ∈ {1..V}^{T}
Output: P ∈ ℝ^{T×V}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}, a ∈ ℝ^{D}
1 X ← W_e[x]
2 h ← 0
3 for t = 1, …, T do
4     h ← a ⊙ h + X[t, :]/t
5     Y[t, :] ← h
6 end
7 return P = Y W_e^⊺
"""


def test_a_recurrence_that_reads_its_position_as_a_number_decodes_by_recomputing(tmp_path):
    """Causal, but its new tokens' positions are not 1, 2, …: no cache is offered, and the
    scan still equals the loop and the interpreter."""
    built = Built(tmp_path, COUNTING_LM, V=7, D=3)
    x = torch.randint(0, 7, (B, 5), generator=torch.Generator().manual_seed(2))
    want = torch.stack([built.program(x[b] + 1, params=built.params, hypers=built.env)
                        for b in range(B)])
    for module in (built.literal, built.fused):
        torch.testing.assert_close(module(x), want, rtol=RTOL, atol=ATOL)
    assert built.fused.analysis.causal and not built.fused.analysis.decodes
    assert not hasattr(built.fused, "new_cache")
    plain = COUNTING_LM.replace("X[t, :]/t", "X[t, :]")  # its input at position t only
    assert Built(tmp_path, plain, V=7, D=3).fused.analysis.decodes


FEATURE_LM = """\
Algorithm: P ← FeatureLM(x | θ)
/* A language model whose recurrence runs over the features of each token, not over positions. */
Input: x ∈ {1..V}^{T}
Output: P ∈ ℝ^{T×V}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
1 X ← W_e[x]
2 Y ← Cumulative(X)
3 return P = Y W_e^⊺

Algorithm: y ← Cumulative(e)
/* A running sum over the entries of one vector, halving at each. */
Input: e ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ
1 s ← 0
2 for i = 1, …, D do
3     s ← 0.5 · s + e[i]
4     y[i] ← s
5 end
6 return y
"""


def test_a_loop_over_a_vectors_entries_runs_within_each_token_and_carries_nothing(tmp_path):
    """The loop of a card on vectors, applied to each token's row alone, is no recurrence
    over positions: the model gets no cache that would carry its state from one token to the
    next, and computes what the interpreter does."""
    built = Built(tmp_path, FEATURE_LM, V=7, D=4)
    x = torch.randint(0, 7, (B, 5), generator=torch.Generator().manual_seed(4))
    want = torch.stack([built.program(x[b] + 1, params=built.params, hypers=built.env)
                        for b in range(B)])
    for module in (built.literal, built.fused):
        torch.testing.assert_close(module(x), want, rtol=RTOL, atol=ATOL)
    assert not hasattr(built.fused, "new_cache") and "cache" not in built.sources[True]
    assert "linear_scan(0.5, e, s, -1)" in built.sources[True]  # `0.5 · s`: a number decays it


READS_OUTPUT = """\
Algorithm: Y ← ReadsOutput(X | W)
/* Reads the output it writes. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: W consisting of:
    a ∈ ℝ^{D}
1 Y ← X
2 h ← 0
3 for t = 1, …, T do
4     h ← a ⊙ h + X[t, :]
5     Y[t, :] ← h + Y[1, :]
6 end
7 return Y
"""


def test_a_loop_that_reads_the_output_it_writes_row_by_row_is_refused_where_it_reads(tmp_path):
    """Row 1 of Y is X's before the first position and h's after it: the rows collected
    while the loop runs are not Y until it ends, so the read is refused, located."""
    with pytest.raises(CardError, match=r"card\.card:12:21: error: code generation writes "
                                        r"'Y' position by position and reads it only after"):
        Built(tmp_path, READS_OUTPUT, D=3)


TWO_STATES = """\
Algorithm: Y ← WeightedMean(X | W)
/* Two states with one decay: a decayed sum of weighted values and of the weights, their ratio read at every position. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: W consisting of:
    W_k, W_v ∈ ℝ^{D×D}, w ∈ ℝ^{D}
1 K ← exp(X W_k)
2 V ← X W_v
3 n ← 0
4 d ← 0
5 for t = 1, …, T do
6     n ← w ⊙ n + K[t, :] ⊙ V[t, :]
7     d ← w ⊙ d + K[t, :]
8     Y[t, :] ← n/d
9 end
10 return Y
"""


def test_two_states_each_updated_linearly_are_two_scans(tmp_path):
    built = Built(tmp_path, TWO_STATES, D=3)
    with torch.no_grad():  # decays in (0, 1); the interpreter reads the same tensors
        built.literal.w.copy_(torch.tensor([0.9, 0.5, 0.1], dtype=torch.float64))
        built.fused.w.copy_(built.literal.w)
    built.agree(_randn(6, 3))
    fused = built.sources[True]
    assert loops_in_forward(fused) == 0 and fused.count("linear_scan(") == 3  # two, and its def


ROW_BY_ROW = """\
Algorithm: Y ← RowByRow(X | W)
/* A loop that carries nothing: each row on its own. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: W consisting of:
    W_1 ∈ ℝ^{D×D}
1 for t = 1, …, T do
2     u ← X[t, :] W_1
3     Y[t, :] ← u ⊙ X[t, :]
4 end
5 return Y
"""


def test_a_sequential_loop_that_carries_nothing_is_a_map(tmp_path):
    built = Built(tmp_path, ROW_BY_ROW, D=3)
    X = _randn(4, 3)
    want = built.agree(X)
    assert loops_in_forward(built.sources[True]) == 0
    w = built.literal
    torch.testing.assert_close(want, (X @ w.W_1 * X).detach(), rtol=RTOL, atol=ATOL)


READS_BEFORE = """\
Algorithm: Y ← ReadsBefore(X | W)
/* The output at t reads the state before position t's update. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: W consisting of:
    W_a, W_B, W_C ∈ ℝ^{D×D}, h_0 ∈ ℝ^{D}
1 h ← h_0
2 for t = 1, …, T do
3     Y[t, :] ← h W_C + X[t, :]
4     h ← σ(X[t, :] W_a) ⊙ h + X[t, :] W_B
5 end
6 return Y
"""


def test_a_step_that_reads_the_state_before_its_update_reads_the_previous_states(tmp_path):
    """Y at t reads h_{t−1} (h_0 at the first position): the scan's states shifted by one."""
    built = Built(tmp_path, READS_BEFORE, D=3)
    X = _randn(5, 3)
    want = built.agree(X)
    assert loops_in_forward(built.sources[True]) == 0
    w = built.literal
    h, rows = w.h_0.expand(B, 3), []
    for t in range(5):
        rows.append(h @ w.W_C + X[:, t])
        h = torch.sigmoid(X[:, t] @ w.W_a) * h + X[:, t] @ w.W_B
    torch.testing.assert_close(want, torch.stack(rows, 1).detach(), rtol=RTOL, atol=ATOL)


FEEDS_UPDATE = READS_BEFORE.replace("""3     Y[t, :] ← h W_C + X[t, :]
4     h ← σ(X[t, :] W_a) ⊙ h + X[t, :] W_B""", """3     u ← h W_C
4     h ← σ(X[t, :] W_a) ⊙ h + u ⊙ (X[t, :] W_B)
5     Y[t, :] ← u""").replace("5 end\n6 return", "6 end\n7 return")


def test_a_state_read_before_its_update_that_feeds_the_update_keeps_the_loop(tmp_path):
    """h_t = σ(…) ⊙ h_{t−1} + (h_{t−1} W_C) ⊙ (…) is linear in h but not diagonal: no scan."""
    built = Built(tmp_path, FEEDS_UPDATE, D=3)
    built.agree(_randn(5, 3))
    assert "no scan, a state read before its update feeds the update" in built.sources[True]


def test_a_recurrence_that_reads_another_position_is_refused_where_it_reads(tmp_path):
    """`X[t + 1, :]` at the last position is past X's rows (the module raised IndexError),
    and `X[t − 1, :]` at the first would read row 0, Python's last: refused, located."""
    card = GATED.replace("X[t, :] W_B", "X[t + 1, :] W_B")
    with pytest.raises(CardError, match=r"card\.card:12:27: error: code generation reads "
                                        r"position 't' itself in a loop over positions"):
        Built(tmp_path, card, D=3, D_h=4)
