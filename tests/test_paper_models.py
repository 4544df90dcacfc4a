"""The paper's column-major model cards (Algorithms 8, 9, 10) as generated PyTorch: the fused
lowering against the cards' literal math, the masks each one promises, and the layouts agreeing:
the paper's DTransformer and the row-major GPT-2 card compute the same function."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from cardc.build import checked, instantiate, load_module, source

ROOT = Path(__file__).resolve().parent.parent
SIZES = {
    "DTransformer": dict(N_V=23, l_max=16, L=2, H=2, d_e=8, d_mlp=12, d_attn=4, d_mid=4),
    "ETransformer": dict(N_V=23, l_max=16, L=2, H=2, d_e=8, d_mlp=12, d_f=6, d_attn=4, d_mid=3),
    "EDTransformer": dict(N_V=23, l_max=16, L_enc=2, L_dec=2, H=2, d_e=8, d_mlp=12, d_attn=4,
                          d_mid=4),
}


@pytest.fixture(scope="module")
def paper():
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        lib, checker, _ = checked([f"cards/paper/{n.lower()}.card" for n in SIZES], "cards")
        yield lib, checker


def _models(paper, name: str):
    lib, checker = paper
    alg = lib.find(name)
    fused, _ = instantiate(checker, alg, SIZES[name], fuse=True)
    literal, _ = instantiate(checker, alg, SIZES[name], fuse=False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in fused.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    literal.load_state_dict(fused.state_dict())
    return fused, literal


def _inputs(name: str, seed: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 23, (3, 9), generator=g)
    if name == "EDTransformer":
        return torch.randint(0, 23, (3, 7), generator=g), x
    return (x,)


@pytest.mark.parametrize("name", list(SIZES))
def test_fused_equals_the_cards_literal_math_with_gradients(paper, name):
    fused, literal = _models(paper, name)
    inputs = _inputs(name)
    targets = torch.randint(0, 23, inputs[-1].shape, generator=torch.Generator().manual_seed(2))
    p_fused, loss_fused = fused(*inputs, targets)
    p_literal, loss_literal = literal(*inputs, targets)
    assert p_fused.shape == (*inputs[-1].shape, 23)  # (B, ℓ, N_V): column t is row t
    torch.testing.assert_close(p_fused.sum(-1), torch.ones(inputs[-1].shape))  # distributions
    torch.testing.assert_close(p_fused, p_literal, atol=1e-6, rtol=1e-5)
    loss_fused.backward()
    loss_literal.backward()
    literal_grads = dict(literal.named_parameters())
    for pname, p in fused.named_parameters():
        torch.testing.assert_close(p.grad, literal_grads[pname].grad, atol=1e-5, rtol=1e-4,
                                   msg=lambda m, n=pname: f"{n}: {m}")


def _changed(x: torch.Tensor, position: int) -> torch.Tensor:
    y = x.clone()
    y[:, position] = (y[:, position] + 1) % 23
    return y


@torch.no_grad()
def test_dtransformer_is_causal_and_etransformer_sees_everything(paper):
    decoder, _ = _models(paper, "DTransformer")
    encoder, _ = _models(paper, "ETransformer")
    (x,) = _inputs("DTransformer")
    for model, causal in ((decoder, True), (encoder, False)):
        before, after = model(x), model(_changed(x, 5))
        earlier = (before[:, :5] - after[:, :5]).abs().max().item()
        assert (earlier == 0.0) == causal
        assert (before[:, 5:] - after[:, 5:]).abs().max() > 0


@torch.no_grad()
def test_edtransformer_decoder_is_causal_and_reads_the_whole_source(paper):
    model, _ = _models(paper, "EDTransformer")
    z, x = _inputs("EDTransformer")
    before = model(z, x)
    assert (model(z, _changed(x, 4))[:, :4] - before[:, :4]).abs().max() == 0
    assert (model(_changed(z, 6), x)[:, 0] - before[:, 0]).abs().max() > 0  # cross-attention


def test_paper_attention_lowers_to_sdpa_and_linear(paper):
    lib, checker = paper
    text = source(checker, lib.find("DTransformer"))
    assert "F.scaled_dot_product_attention(Q, K, V, attn_mask=Mask)" in text
    assert "for h in range" not in text  # heads are batched, not looped
    assert "F.linear(X, self.W_q, self.b_q)" in text  # W_q X + b_q 1^⊺, nn.Linear's layout


# ------------------------------------------------------------------ layouts agree


def _gpt2_exact_gelu(tmp_path: Path):
    """The GPT-2 card with the paper's exact GELU in its MLP: the one way the two cards'
    functions differ, besides ε (set to 0, as the paper has none) and the tied unembedding."""
    lib_dir = tmp_path / "cards"
    shutil.copytree(ROOT / "cards", lib_dir)
    mlp = lib_dir / "nn" / "mlp.card"
    mlp.write_text(mlp.read_text(encoding="utf-8").replace("GELU_tanh", "GELU"), encoding="utf-8")
    lib, checker, _ = checked([str(lib_dir / "gpt2.card")], str(lib_dir))
    gpt2 = lib.find("GPT2")
    return load_module(source(checker, gpt2), "gpt2_exact_gelu")


def test_paper_dtransformer_equals_the_row_major_gpt2_card(paper, tmp_path):
    V, D, H, F_, N, ctx = 29, 16, 4, 24, 2, 12
    gpt2 = _gpt2_exact_gelu(tmp_path).GPT2(V=V, D=D, H=H, D_f=F_, N=N, ctx=ctx, eps=0.0)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in gpt2.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    lib, checker = paper
    dt, _ = instantiate(checker, lib.find("DTransformer"),
                        dict(N_V=V, l_max=ctx, L=N, H=H, d_e=D, d_mlp=F_, d_attn=D // H,
                             d_mid=D // H))
    # The paper's matrices act from the left (W X): each is the transpose of GPT-2's X W.
    # W_qkv holds the q, k, v projections side by side, heads in order within each.
    mine = {}
    gp = dict(gpt2.named_parameters())
    mine["W_e"] = gp["W_e"].T
    mine["W_u"] = gp["W_e"]
    mine["W_p"] = gp["W_p"].T
    mine["gamma"], mine["beta"] = gp["gamma_f"], gp["beta_f"]
    for name in ("gamma1", "beta1", "gamma2", "beta2"):
        mine[name] = torch.stack([gp[f"block.{i}.{name}"] for i in range(N)])
    for name, theirs in (("W_mlp1", "W_1"), ("W_mlp2", "W_2")):
        mine[name] = torch.stack([gp[f"block.{i}.mlp.{theirs}"].T for i in range(N)])
    for name, theirs in (("b_mlp1", "b_1"), ("b_mlp2", "b_2")):
        mine[name] = torch.stack([gp[f"block.{i}.mlp.{theirs}"] for i in range(N)])
    for i in range(N):
        w = gp[f"block.{i}.attn.W_qkv"].T.split(D)  # (3D, D) → three (D, D), rows by head
        b = gp[f"block.{i}.attn.b_qkv"].split(D)
        for k, role in enumerate("qkv"):
            mine[f"W.{i}.W_{role}"], mine[f"W.{i}.b_{role}"] = w[k], b[k]
        mine[f"W.{i}.W_o"] = gp[f"block.{i}.attn.W_o"].T
        mine[f"W.{i}.b_o"] = gp[f"block.{i}.attn.b_o"]
    assert set(mine) == set(dict(dt.named_parameters()))
    dt.load_state_dict({k: v.detach().clone() for k, v in mine.items()})

    x = torch.randint(0, V, (2, ctx), generator=g)
    targets = torch.randint(0, V, (2, ctx), generator=g)
    logits, loss_gpt2 = gpt2(x, targets)
    P, loss_paper = dt(x, targets)
    torch.testing.assert_close(P, torch.softmax(logits, dim=-1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(loss_paper, loss_gpt2, atol=1e-6, rtol=1e-6)
    # a negative control: the test can fail — swap two heads' query rows
    with torch.no_grad():
        dt.W[0].W_q[[0, D // H]] = dt.W[0].W_q[[D // H, 0]]
    assert (dt(x) - P).abs().max() > 1e-3


# ------------------------------------------------------------------ Algorithms 1, 2, 3 and 7


@pytest.fixture(scope="module")
def titled():
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        names = ["token_embedding", "positional_embedding", "single_query_attention",
                 "unembedding"]
        lib, checker, _ = checked([f"cards/paper/{n}.card" for n in names], "cards")
        yield {a.label: (checker, a) for f in lib.files for a in f.algorithms if a.title}


def _titled(titled, label: str, **sizes):
    checker, alg = titled[label]
    model, _ = instantiate(checker, alg, sizes)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


@torch.no_grad()
def test_token_and_positional_embeddings_pick_columns(titled):
    tok = _titled(titled, "TokenEmbedding", d_e=5, N_V=9)
    v = torch.tensor([0, 8, 3])  # token IDs, 0-based
    torch.testing.assert_close(tok(v), tok.W_e[:, v].T)
    pos = _titled(titled, "PositionalEmbedding", d_e=5, l_max=7)
    position = torch.tensor([1, 7])  # positions, 1-based as the card writes them
    torch.testing.assert_close(pos(position), pos.W_p[:, position - 1].T)


@torch.no_grad()
def test_unembedding_is_a_distribution(titled):
    un = _titled(titled, "Unembedding", N_V=9, d_e=5)
    e = torch.randn(4, 5)
    torch.testing.assert_close(un(e), torch.softmax(e @ un.W_u.T, dim=-1))


@torch.no_grad()
def test_single_query_attention_matches_its_definition(titled):
    att = _titled(titled, "BasicSingleQueryAttention", d_in=6, d_out=3, d_attn=4)
    e, context = torch.randn(2, 6), torch.randn(2, 5, 6)  # one token, five context tokens each
    q = e @ att.W_q.T + att.b_q
    k = context @ att.W_k.T + att.b_k
    v = context @ att.W_v.T + att.b_v
    alpha = torch.softmax((k @ q[..., None])[..., 0] / 2.0, dim=-1)  # √d_attn = 2
    torch.testing.assert_close(att(e, context), (alpha[..., None] * v).sum(-2))


def test_a_map_that_reads_another_column_is_refused(tmp_path):
    """`for t ∈ [ℓ] : X̃[:, t] ← X[:, t − 1]` ties iterations together: a located error, not
    wrong code."""
    from cardc.diagnostics import CardError

    text = (ROOT / "cards/paper/dtransformer.card").read_text(encoding="utf-8")
    lib_dir = tmp_path / "cards"
    shutil.copytree(ROOT / "cards" / "paper", lib_dir / "paper")
    card = lib_dir / "paper" / "dtransformer.card"
    card.write_text(text.replace("layer_norm(X[:, t] | γ^1_l, β^1_l)",
                                 "layer_norm(X[:, t − 1] | γ^1_l, β^1_l)"), encoding="utf-8")
    lib, checker, _ = checked([str(card)], str(lib_dir))
    with pytest.raises(CardError, match="a map over 't' reads a value at 't', and a parameter"):
        source(checker, lib.find("DTransformer", lib.files[0]))
