"""Cards a researcher writes that `check` and `build` accepted and whose code then crashed:
each now builds, and its generated module, fused and literal, computes what the reference
interpreter (cardc.interpret) says the card means, values and gradients, in float64 (and, for
some, what the same math written out here in plain torch gives)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from cardc.build import checked, instantiate, model_cards
from cardc.diagnostics import CardError
from cardc.interpret import Program
from cardc.library import library_roots
from cardc.names import identifier

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cardparams import card_params  # noqa: E402

RTOL, ATOL = 1e-9, 1e-10  # float64: the two sides differ by rounding alone
B = 2  # examples through the module at once; the interpreter takes them one by one


class Built:
    """A card's model, checked, with its literal and fused modules holding the same weights."""

    def __init__(self, tmp_path: Path, text: str, **sizes: float):
        path = tmp_path / "card.card"
        path.write_text(text, encoding="utf-8")
        lib, checker, _ = checked([str(path)], library_roots([str(path)], None))
        (alg,) = model_cards(lib, checker, [str(path)])
        self.program = Program.of(lib, checker, alg)
        self.env = self.program.hyperparameters(None, **sizes)
        values = {identifier(k): v for k, v in self.env.items()}
        self.literal = instantiate(checker, alg, values, fuse=False)[0].double().eval()
        self.fused = instantiate(checker, alg, values, fuse=True)[0].double().eval()
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in self.literal.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
        self.fused.load_state_dict(self.literal.state_dict())
        self.params = card_params(checker, alg, self.literal)

    def interpreted(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The interpreter's output for each example of the batch `inputs`, stacked."""
        return torch.stack([self.program(*(x[b] for x in inputs), params=self.params,
                                         hypers=self.env) for b in range(B)])

    def agree(self, *inputs: torch.Tensor, tokens: bool = False) -> torch.Tensor:
        """Assert both modules equal the interpreter on `inputs` (0-based token IDs where
        `tokens`: the card's are 1-based), values and gradients with respect to every
        parameter; the interpreter's values."""
        want = self.interpreted(*(x + 1 for x in inputs) if tokens else inputs)
        weights = torch.linspace(-1, 1, want.numel(), dtype=torch.float64).reshape(want.shape)
        self.literal.zero_grad()  # the interpreter's parameters are the literal's: a
        (want * weights).sum().backward()  # grad left by an earlier call would add in
        grads = {n: p.grad.clone() for n, p in self.literal.named_parameters()}
        for module in (self.literal, self.fused):
            module.zero_grad()
            got = module(*inputs)
            got = got[0] if isinstance(got, tuple) else got
            torch.testing.assert_close(got, want.detach(), rtol=RTOL, atol=ATOL)
            (got * weights).sum().backward()
            for n, p in module.named_parameters():
                torch.testing.assert_close(p.grad, grads[n], rtol=RTOL, atol=ATOL, msg=n)
        return want.detach()


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(B, *shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


SHARED_KEY = """\
Algorithm: Y ← SharedKey(X | W)
/* Heads whose keys are their own columns of U beside a key K_r shared by every head. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, H, d_n, d_r ∈ ℕ; d = D/H
Parameters: W consisting of:
    W_q ∈ ℝ^{D×H (d_n + d_r)}, W_u ∈ ℝ^{D×H d_n}, W_r ∈ ℝ^{D×d_r}, W_v ∈ ℝ^{D×D}
1 Q ← X W_q
2 U ← X W_u
3 K_r ← X W_r
4 V ← X W_v
5 for h ∈ [H] : Y^h ← Head(Q[:, (h − 1)(d_n + d_r) + 1 : h (d_n + d_r)], U[:, (h − 1) d_n + 1 : h d_n], K_r, V[:, (h − 1) d + 1 : h d])
6 return Y = [Y^1, Y^2, …, Y^H]

Algorithm: Y ← Head(Q, U, K_r, V)
/* One head: its key is its own part of U beside the part K_r every head shares. */
Input: Q ∈ ℝ^{T×(d_n + d_r)}, U ∈ ℝ^{T×d_n}, K_r ∈ ℝ^{T×d_r}, V ∈ ℝ^{T×d}
Output: Y ∈ ℝ^{T×d}
1 K ← [U[:, 1 : d_n], K_r]
2 return Y = softmax(Q K^⊺/√(d_n + d_r)) V
"""


def test_a_key_shared_by_every_head_joins_each_heads_own(tmp_path):
    # was: torch.cat of U's heads (…, H, T, d_n) and K_r (…, 1, T, d_r): sizes must match
    built = Built(tmp_path, SHARED_KEY, D=6, H=2, d_n=2, d_r=3)
    X = _randn(5, 6)
    want = built.agree(X)
    w = built.literal
    Q, U, K_r, V = X @ w.W_q, X @ w.W_u, X @ w.W_r, X @ w.W_v
    heads = []
    for h in range(2):  # the card's math, head by head
        K = torch.cat([U[..., 2 * h:2 * h + 2], K_r], dim=-1)
        S = Q[..., 5 * h:5 * h + 5] @ K.mT / math.sqrt(5)
        heads.append(torch.softmax(S, dim=-1) @ V[..., 3 * h:3 * h + 3])
    torch.testing.assert_close(want, torch.cat(heads, dim=-1).detach(), rtol=RTOL, atol=ATOL)


ABSORBED = """\
Algorithm: Y ← Absorbed(X | W)
/* Heads whose queries are taken into a latent every head shares, through the transpose of each head's own key projection. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, H, D_c ∈ ℕ; d = D/H
Parameters: W includes all of the following parameters:
    W_c ∈ ℝ^{D×D_c}
    For h ∈ [H]:
        W^h_q ∈ ℝ^{D×d}, W^h_k ∈ ℝ^{D_c×d}
1 C ← X W_c
2 for h ∈ [H] : Y^h ← Head(X, C | W^h_q, W^h_k)
3 return Y = [Y^1, Y^2, …, Y^H]

Algorithm: Y ← Head(X, C | W_q, W_k)
/* One head attending in the latent space. */
Input: X ∈ ℝ^{T×D}, C ∈ ℝ^{T×D_c}
Output: Y ∈ ℝ^{T×d}
Hyperparameters: D, D_c, d ∈ ℕ
Parameters: W_q ∈ ℝ^{D×d}, W_k ∈ ℝ^{D_c×d}
1 Q ← X W_q W_k^⊺  ▷ Q ∈ ℝ^{T×D_c}
2 return Y = softmax(Q C^⊺/√d) C W_k
"""


def test_the_transpose_of_a_stacked_per_head_parameter_turns_its_last_two_axes(tmp_path):
    # was: `W_k.T` of the heads' stack (H, D_c, d) reversed all three axes, and d was read
    # from the stack's second axis (D)
    built = Built(tmp_path, ABSORBED, D=6, H=2, D_c=4)
    built.agree(_randn(5, 6))


MIXTURE = """\
Algorithm: y ← Mixture(x | θ)
/* One token through a mixture of experts, each expert's output weighed by its gate. */
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D, E, D_f ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_g ∈ ℝ^{D×E}, the gate.
    For e ∈ [E]:
        φ^e, the parameters of expert e.
1 g ← softmax(x W_g)
2 for e ∈ [E] : y^e ← Expert(x | φ^e)
3 return y = Σ_{e=1}^{E} g[e] · y^e

Algorithm: y ← Expert(x | φ)
/* A small MLP. */
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D, D_f ∈ ℕ
Parameters: φ consisting of:
    W_1 ∈ ℝ^{D×D_f}, W_2 ∈ ℝ^{D_f×D}
1 return y = ReLU(x W_1) W_2
"""


def test_a_map_over_a_family_of_experts_on_one_token(tmp_path):
    # was: the map over the experts' modules was taken for a stack of layers (y^e never
    # defined), and a sum over a map's family was refused
    built = Built(tmp_path, MIXTURE, D=4, E=3, D_f=5)
    x = _randn(4)
    want = built.agree(x)
    m = built.literal
    g = torch.softmax(x @ m.W_g, dim=-1)
    experts = [torch.relu(x @ m.phi[e].W_1) @ m.phi[e].W_2 for e in range(3)]
    expected = sum(g[:, e, None] * experts[e] for e in range(3))
    torch.testing.assert_close(want, expected.detach(), rtol=RTOL, atol=ATOL)


def test_a_map_over_experts_stacked_as_tensors_on_one_token(tmp_path):
    # was: the map vectorised over the experts broadcast the examples of x (B, 1, D) against
    # the experts' stack (E, D, D_f): a broadcast error, or a wrong product where B = E
    card = MIXTURE.replace("φ^e, the parameters of expert e.", "W^e_1 ∈ ℝ^{D×D_f}, "
                           "W^e_2 ∈ ℝ^{D_f×D}, expert e.").replace("| φ^e)", "| W^e_1, W^e_2)")
    card = card.replace("(x | φ)", "(x | W_1, W_2)").replace(
        "Parameters: φ consisting of:\n    W_1", "Parameters: W_1")
    for experts in (3, 2):  # E = B too
        built = Built(tmp_path, card, D=4, E=experts, D_f=5)
        built.agree(_randn(4))


def test_a_sum_over_part_of_a_family_is_refused_where_it_is_written(tmp_path):
    card = MIXTURE.replace("Σ_{e=1}^{E} g[e] · y^e", "Σ_{e=1}^{2} g[e] · y^e")
    with pytest.raises(CardError, match=r"card\.card:12:14: error: code generation sums a "
                                        r"family over all its members"):
        Built(tmp_path, card, D=4, E=3, D_f=5)


CHANNELS = """\
Algorithm: P ← Channels(x | θ)
/* Token embeddings, each channel scaled by a decay made from a parameter of its own. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: P ∈ ℝ^{T×V}
Hyperparameters: V, D ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}, λ ∈ ℝ^{D}
1 X ← W_e[x]
2 for n ∈ [D] : a[n] ← exp(−exp(λ[n]))
3 A ← a 1^⊺
4 return P = (X ⊙ A^⊺) W_e^⊺
"""


def test_a_map_over_channels_does_not_bound_the_sequence(tmp_path):
    # was: `self.max_seq_len = self.D`, and a sequence longer than D refused at run time
    built = Built(tmp_path, CHANNELS, V=7, D=3)
    assert not hasattr(built.fused, "max_seq_len")
    x = torch.randint(0, 7, (B, 6), generator=torch.Generator().manual_seed(1))
    want = built.agree(x, tokens=True)
    m = built.literal
    X = m.W_e[x] * torch.exp(-torch.exp(m.lambda_))
    torch.testing.assert_close(want, (X @ m.W_e.T).detach(), rtol=RTOL, atol=ATOL)


DECAY = """\
Algorithm: Y ← Decay(X | W_o)
/* Each channel summed over the past with weights α^{t − t′}: a linear recurrence in closed form. */
Input: X ∈ ℝ^{T×N}
Output: Y ∈ ℝ^{T×N}
Hyperparameters: N ∈ ℕ; α ∈ (0, 1) = 0.5
Parameters: W_o ∈ ℝ^{N×N}
1 for t ∈ [T] : for t′ ∈ [T] : G[t, t′] ← t − t′
2 A ← exp(log(α) · G)
3 ∀t, t′, if t′ > t then A[t, t′] ← 0
4 return Y = A X W_o
"""


@pytest.mark.parametrize("alpha", [0.5, 0.9])
def test_a_closed_form_recurrence_over_positions(tmp_path, alpha):
    # was: refused ("a map over positions holds assignments only"), and `log(α) · G` of the
    # integer G was float32 in a float64 model: "expected scalar type Float but found Double"
    built = Built(tmp_path, DECAY, N=3, α=alpha)
    X = _randn(5, 3)
    want = built.agree(X)
    h = torch.zeros(B, 3, dtype=torch.float64)
    rows = []
    for t in range(5):  # the recurrence h_t = α h_{t−1} + x_t, step by step
        h = alpha * h + X[:, t]
        rows.append(h)
    expected = torch.stack(rows, dim=1) @ built.literal.W_o
    torch.testing.assert_close(want, expected.detach(), rtol=RTOL, atol=ATOL)


PRODUCTS = """\
Algorithm: y ← Weighed(x | W)
/* One token through matrices made from it and from the gate's weights. */
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ
Parameters: W consisting of:
    W_1 ∈ ℝ^{D×D}, W_2 ∈ ℝ^{2×D}, W_g ∈ ℝ^{D×2}
1 M ← [x W_1, x]  ▷ M ∈ ℝ^{D×2}
2 g ← softmax(x W_g)
3 return y = (x M) W_2 + M g
"""


def test_a_token_times_a_matrix_computed_from_it_and_back(tmp_path):
    # was: `x @ M` of x (B, D) and M (B, D, 2) took the examples for the rows of one matrix
    # (silently (B, B, 2)), and `M @ g` of g (B, 2) failed
    built = Built(tmp_path, PRODUCTS, D=3)
    x = _randn(3)
    want = built.agree(x)
    w = built.literal
    M = torch.stack([x @ w.W_1, x], dim=-1)
    g = torch.softmax(x @ w.W_g, dim=-1)
    expected = torch.einsum("bd,bdk->bk", x, M) @ w.W_2 + torch.einsum("bdk,bk->bd", M, g)
    torch.testing.assert_close(want, expected.detach(), rtol=RTOL, atol=ATOL)


def test_a_matrix_of_positions_built_from_a_vector_of_them(tmp_path):
    # was: G = p 1^⊺ − (p 1^⊺)^⊺ of the integer positions p, typed real, stayed integer in the
    # code, and `log(α) · G` was float32 in a float64 model
    card = DECAY.replace("1 for t ∈ [T] : for t′ ∈ [T] : G[t, t′] ← t − t′\n2 A ← exp(log(α) · G)"
                         "\n3 ∀t, t′, if t′ > t then A[t, t′] ← 0\n4 return Y = A X W_o",
                         "1 for t ∈ [T] : p[t] ← t\n2 G ← p 1^⊺ − (p 1^⊺)^⊺\n"
                         "3 A ← exp(log(α) · G)\n4 ∀t, t′, if t′ > t then A[t, t′] ← 0\n"
                         "5 return Y = A X W_o")
    assert "p 1^⊺" in card
    built = Built(tmp_path, card, N=3, α=0.7)
    X = _randn(5, 3)
    want = built.agree(X)
    t = torch.arange(5, dtype=torch.float64)
    A = torch.tril(0.7 ** (t[:, None] - t[None, :]))
    torch.testing.assert_close(want, (A @ X @ built.literal.W_o).detach(), rtol=RTOL, atol=ATOL)
