"""A sparse mixture of experts written as the math says it: the set I ← argtop_k(r | k) of
a token's best-scored experts, sums Σ_{j ∈ I} over it, and Σ_{e ∈ I} c_e · Expert(x | θ^e)
over a family of experts θ^e inside the card's own bundle θ. Each card is checked, its
literal (every expert on every token) and fused (sparse dispatch) modules agree with the
reference interpreter in float64, values and gradients, and with the same math written here in
plain torch; misuse is refused where it is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cardc.build import checked
from cardc.diagnostics import CardError
from cardc.interpret.functions import argtop
from cardc.library import library_roots
from cardc.parser import parse
from cardc.render.text import render_card

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_reproducers import ATOL, RTOL, Built, _randn  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

MOE = """\
Algorithm: Y ← SparseMoE(X | θ)
/* Each token through the k of E experts its router scores highest. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, k ∈ ℕ
Parameters: θ consisting of:
    θ^moe, the router and the experts.
1 for t ∈ [T] : Y[t, :] ← Route(X[t, :] | θ^moe, k = k)
2 return Y

Algorithm: y ← Route(x | θ)
/* One token: the top-k set I of its router's scores, then the experts in I, weighed. */
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D, E, k ∈ ℕ
Parameters: θ consisting of:
    W_g ∈ ℝ^{D×E}, the router.
    For e ∈ [E]:
        θ^e, the parameters of expert e.
1 r ← x W_g
2 I ← argtop_k(r | k)
3 z ← Σ_{j ∈ I} exp(r[j])
4 return y = Σ_{e ∈ I} exp(r[e])/z · Expert(x | θ^e)

Algorithm: y ← Expert(x | φ)
/* A SwiGLU MLP. */
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D, D_f ∈ ℕ
Parameters: φ consisting of:
    W_1, W_3 ∈ ℝ^{D×D_f}, W_2 ∈ ℝ^{D_f×D}
1 return y = (SiLU(x W_1) ⊙ (x W_3)) W_2
"""
# the softmax over all E first, then the top-k, renormalised over I (Mixtral's order)
BEFORE = MOE.replace("""3 z ← Σ_{j ∈ I} exp(r[j])
4 return y = Σ_{e ∈ I} exp(r[e])/z · Expert(x | θ^e)""", """3 g ← softmax(r)
4 z ← Σ_{j ∈ I} g[j]
5 return y = Σ_{e ∈ I} g[e]/z · Expert(x | θ^e)""")
# the softmax over all E, not renormalised (Qwen2-MoE's without norm_topk_prob)
UNNORMALISED = MOE.replace("""3 z ← Σ_{j ∈ I} exp(r[j])
4 return y = Σ_{e ∈ I} exp(r[e])/z · Expert(x | θ^e)""", """3 g ← softmax(r)
4 return y = Σ_{e ∈ I} g[e] · Expert(x | θ^e)""")
# the experts in I, unweighted
PLAIN = MOE.replace("exp(r[e])/z · Expert(x | θ^e)", "Expert(x | θ^e)")
SIZES = {"D": 4, "E": 4, "D_f": 5, "k": 2}


def _by_hand(m: torch.nn.Module, X: torch.Tensor, weights) -> torch.Tensor:
    """The mixture in plain torch, token by token: `weights(r, I)` the weight of each of I."""
    out = torch.zeros_like(X)
    route = m.moe
    for b in range(X.shape[0]):
        for t in range(X.shape[1]):
            x = X[b, t]
            r = x @ route.W_g
            chosen = torch.topk(r, 2).indices.tolist()
            for e, w in zip(chosen, weights(r, chosen), strict=True):
                ex = route.theta[e]
                out[b, t] += w * ((torch.nn.functional.silu(x @ ex.W_1) * (x @ ex.W_3)) @ ex.W_2)
    return out


@pytest.mark.parametrize("card, weights", [
    (MOE, lambda r, i: torch.softmax(r[i], -1)),
    (BEFORE, lambda r, i: torch.softmax(r, -1)[i] / torch.softmax(r, -1)[i].sum()),
    (UNNORMALISED, lambda r, i: torch.softmax(r, -1)[i]),
], ids=["softmax-after", "softmax-before", "unnormalised"])
def test_a_mixture_of_the_top_k_experts(tmp_path, card, weights):
    built = Built(tmp_path, card, **SIZES)
    X = _randn(6, 4)
    want = built.agree(X)
    expected = _by_hand(built.literal, X, weights)
    torch.testing.assert_close(want, expected.detach(), rtol=RTOL, atol=ATOL)


def test_unweighted_experts_agree_and_leave_the_router_without_a_gradient(tmp_path):
    built = Built(tmp_path, PLAIN, **SIZES)
    X = _randn(6, 4)
    want = built.interpreted(X)
    expected = _by_hand(built.literal, X, lambda r, i: torch.ones(len(i), dtype=r.dtype))
    for module in (built.literal, built.fused):
        got = module(X)
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)
        got.sum().backward()
        assert module.moe.W_g.grad is None  # the choice of experts has no gradient


def test_the_fused_module_dispatches_and_the_literal_computes_every_expert(tmp_path):
    path = tmp_path / "moe.card"
    path.write_text(MOE, encoding="utf-8")
    out = tmp_path / "out"
    for fuse in ("", "literal"):
        run = subprocess.run([sys.executable, "-m", "cardc", "build", "--out", str(out / fuse),
                              str(path)], cwd=ROOT, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
    fused = (out / "sparsemoe.py").read_text(encoding="utf-8")
    assert "route(x, I, " in fused and "route_dense" not in fused
    assert "for " not in fused.split("def route(")[0].split("class SparseMoE")[0].split(
        "def forward")[-1]  # no loop in the module: the helper's loop is over experts


def test_every_expert_runs_once_on_the_tokens_that_chose_it(tmp_path):
    built = Built(tmp_path, PLAIN, **SIZES)
    seen = []
    for expert in built.fused.moe.theta:
        expert.register_forward_hook(lambda mod, args, out: seen.append(args[0]))
    X = _randn(6, 4)
    built.fused(X)
    tokens = X.reshape(-1, 4)
    chosen = torch.topk(tokens @ built.fused.moe.W_g, 2).indices
    assert len(seen) == 4
    for e, run in enumerate(seen):
        mine = tokens[(chosen == e).any(-1)]  # the tokens that chose e, in their order
        n = mine.shape[0]
        assert run.shape[0] == n + -n % 16  # padded to a multiple of 16 rows
        assert torch.equal(run[:n], mine)
    assert sum(int((chosen == e).any(-1).sum()) for e in range(4)) == 2 * 6 * 2  # k = 2 each


def test_a_decoded_token_calls_only_the_experts_it_chose(tmp_path):
    # was: every expert was called at one token, the unchosen ones on no rows (E calls a
    # layer where k do the work); under autograd they still are, for their zero gradients
    built = Built(tmp_path, PLAIN, **SIZES)
    calls = []
    for e, expert in enumerate(built.fused.moe.theta):
        expert.register_forward_hook(
            lambda mod, args, out, e=e: calls.append((e, args[0].shape[0])))
    X = _randn(1, 4)[:1]
    with torch.no_grad():
        got = built.fused(X)
    r = X[0, 0] @ built.fused.moe.W_g
    chosen = sorted(torch.topk(r, 2).indices.tolist())
    assert calls == [(e, 1) for e in chosen]  # each on its token's one row, unpadded
    torch.testing.assert_close(got, built.literal(X), rtol=RTOL, atol=ATOL)
    calls.clear()
    built.fused(X).sum().backward()
    assert [e for e, _ in calls] == [0, 1, 2, 3]
    assert all(built.fused.moe.theta[e].W_1.grad is not None for e in range(4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_few_routed_tokens_give_the_bits_of_the_same_tokens_among_many(dtype):
    """route lays out a few tokens' runs in Python and many tokens' with tensor operations:
    each token's output is the same to the bit either way, among 3 others or among 40. A lone
    token's experts run on its one row: the same output but for rounding."""
    from cardc.runtime import experts as runtime

    torch.manual_seed(0)
    E, D = 6, 24
    layers = [torch.nn.Sequential(torch.nn.Linear(D, 40), torch.nn.SiLU(), torch.nn.Linear(40, D))
              for _ in range(E)]
    modules = torch.nn.ModuleList(layers).to(dtype)
    x = torch.randn(2, 20, D, dtype=dtype)
    scores = torch.randn(2, 20, E, dtype=dtype)
    chosen = runtime.top_mask(scores, 2)
    weight = torch.softmax(scores, -1)
    with torch.no_grad():
        many = runtime.route(x, chosen, weight, modules)  # 80 pairs: the tensor layout
        for b in range(2):
            for t in range(0, 20, 2):
                few = runtime.route(x[b, t:t + 2], chosen[b, t:t + 2], weight[b, t:t + 2],
                                    modules)
                assert torch.equal(few, many[b, t:t + 2])
                alone = runtime.route(x[b, t], chosen[b, t], weight[b, t], modules)
                torch.testing.assert_close(alone, many[b, t])  # dtype's own tolerances
        assert len(chosen[0, :3].nonzero()) <= runtime.FEW
        assert torch.equal(runtime.route(x[0, :3], chosen[0, :3], weight[0, :3], modules),
                           many[0, :3])
    by_hand = sum(torch.where(chosen[..., e, None], weight[..., e, None], 0) * modules[e](x)
                  for e in range(E))
    torch.testing.assert_close(many, by_hand.detach())


def test_a_sum_of_exponentials_over_a_vector(tmp_path):
    # was: "the sum over 'i' must index the last axis": exp(x[i]) under Σ_i lost the axis
    card = """\
Algorithm: y ← SumExp(x | W)
/* A vector scaled by the sum of its entries' exponentials. */
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ
Parameters: W ∈ ℝ^{D×D}
1 z ← Σ_{i=1}^{D} exp(x[i])
2 return y = x W / z
"""
    built = Built(tmp_path, card, D=3)
    x = _randn(3)
    want = built.agree(x)
    expected = x @ built.literal.W / torch.exp(x).sum(-1, keepdim=True)
    torch.testing.assert_close(want, expected.detach(), rtol=RTOL, atol=ATOL)


def test_experts_inside_a_bundle_named_theta_check(tmp_path):
    # was: "'θ^e' and 'θ' would both be 'theta' as attributes of the generated module", but
    # the card's own bundle θ is the module itself, no attribute of it
    path = tmp_path / "card.card"
    path.write_text(MOE, encoding="utf-8")
    checked([str(path)], library_roots([str(path)], None))


def test_argtop_keeps_the_first_of_equal_entries():
    x = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0])
    assert argtop(x, 2) == [2, 3]
    assert argtop(x, 9) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("old, new, message", [
    ("argtop_k(r | k)", "argtop_k(r)", r"card\.card:21:7: error: argtop_k takes one vector of "
                                       r"scores, then k after '\|'"),
    ("argtop_k(r | k)", "argtop_k(x W_g 1^⊺ | k)", r"card\.card:21:16: error: argtop_k ranks "
                                                   r"the entries of a vector of numbers"),
    ("argtop_k(r | k)", "argtop_k(r | 1.5)", r"card\.card:21:20: error: the k of argtop_k is "
                                              r"a whole number ≥ 1, not 1\.5"),
])
def test_misused_argtop_is_refused_where_it_is_written(tmp_path, old, new, message):
    path = tmp_path / "card.card"
    path.write_text(MOE.replace(old, new), encoding="utf-8")
    with pytest.raises(CardError, match=message):
        checked([str(path)], library_roots([str(path)], None))


def test_a_sum_over_a_set_argtop_did_not_make_is_refused_where_it_is_written(tmp_path):
    card = MOE.replace("Σ_{j ∈ I} exp(r[j])", "Σ_{j ∈ {i ∈ [E] : r[i] > 0}} exp(r[j])")
    with pytest.raises(CardError, match=r"card\.card:22:\d+: error: code generation sums over "
                                        r"\[n\], or over a set argtop_k makes"):
        Built(tmp_path, card, **SIZES)


def test_the_ascii_spelling_formats_to_the_canonical_card():
    ascii_text = MOE.replace("←", "<-").replace("Σ_{j ∈ I}", "sum_{j in I}").replace(
        "Σ_{e ∈ I}", "sum_{e in I}").replace("θ", "theta").replace("φ", "phi").replace(
        "ℝ^{D×E}", "R^{D x E}")
    assert "sum_{e in I}" in ascii_text and "argtop_k(r | k)" in ascii_text
    canonical = render_card(parse(ascii_text, "card.card"))
    assert parse(canonical, "card.card") == parse(MOE, "card.card")
    assert render_card(parse(canonical, "card.card")) == canonical
    assert "I ← argtop_k(r | k)" in canonical and "Σ_{e∈I} (exp(r[e])/z) · Expert(x | θ^e)" \
        in canonical


def test_info_counts_the_active_flops_of_k_of_e_experts():
    """Mixtral 8x7B: each token through 2 of 8 experts, ≈ 25.5 GFLOP a token forward, not the
    ≈ 93 of every expert; counted here by hand from its sizes."""
    run = subprocess.run([sys.executable, "-m", "cardc", "info", "cards/mixtral.card",
                          "--preset", "mixtral-8x7b-v0.1"], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    V, D, H, H_kv, d, D_f, N, E, k = 32000, 4096, 32, 8, 128, 14336, 32, 8, 2
    attention = 2 * D * (H * d + 2 * H_kv * d) + 2 * H * d * D
    experts = k * 2 * 3 * D * D_f
    forward = N * (attention + 2 * D * E + experts) + 2 * D * V
    assert f"forward {forward:,} + 524,288·T" in run.stdout, run.stdout
    assert "parameters: 46,702,792,704" in run.stdout  # transformers' count for the model
