"""Parity: the card-generated GraniteMoE equals Hugging Face's GraniteMoeForCausalLM number for
number.

A small randomly initialised GraniteMoeForCausalLM (no download; 4 experts a layer, each token
through 2, grouped-query attention with 4 query and 2 key/value heads, every parameter random,
the RMSNorm gains included; the four multipliers neither 1 nor, for the scores, 1/√d) is copied
into the model `cards/granitemoe.card` compiles to. transformers keeps each layer's experts
stacked, gate and value as (E, 2 D_f, D) and the projection back as (E, D, D_f); expert j of the
card is row j of each, in the same orientation (W_in x), so the copy is a split along the expert
axis, done here: the mapping language has no entry for a checkpoint tensor stacked over a
card's family of bundles (see the report that added this file), so there is no
granitemoe.hf.json. Logits and gradients must agree to fp32 rounding, decoding through the KV
cache must equal recomputation, and the same weights with two experts swapped, or with the
residual multiplier put back to 1, must not match.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from decodecheck import check_incremental_decoding  # noqa: E402
from parity import max_diff  # noqa: E402

from cardc.build import build_model  # noqa: E402
from cardc.interop import load_mapping  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, H_KV, D_F, CTX, E, K, THETA, EPS = 101, 48, 2, 4, 2, 40, 64, 4, 2, 1e4, 1e-6
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
MULT = dict(embedding_multiplier=3.7, residual_multiplier=0.6, attention_multiplier=0.09,
            logits_scaling=2.3)
HYPERS = dict(V=V, D=D, H=H, H_kv=H_KV, D_f=D_F, N=N, ctx=CTX, E=E, k=K, ε=EPS, θ_base=THETA,
              α_e=3.7, α_r=0.6, α_s=0.09, τ=2.3)
# the dense Granite's names, for every tensor but the experts and their router
GRANITE = {e.hf: (e.card, e.transpose) for e in load_mapping(ROOT / "cards" / "granite.card")
           .entries(N)}


def make_hf():
    config = transformers.GraniteMoeConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, intermediate_size=D_F, max_position_embeddings=CTX,
        num_local_experts=E, num_experts_per_tok=K, rope_theta=THETA, rms_norm_eps=EPS,
        tie_word_embeddings=True, attention_dropout=0.0, pad_token_id=PAD, **MULT)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.GraniteMoeForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(v_pad: int = PAD + 1, **changes):  # the card counts IDs from 1
    model = build_model(str(ROOT / "cards" / "granitemoe.card"), None,
                        {**HYPERS, "v_pad": v_pad, **changes}, library=str(ROOT / "cards"))
    return model.float().eval()


def ours_of(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """HF's tensor `name` as the card's tensors: the experts split along their first axis."""
    if name in GRANITE:
        card, t = GRANITE[name]
        return {card: tensor.T if t else tensor}
    i = name.split(".")[2]
    if name.endswith("block_sparse_moe.router.weight"):
        return {f"block.{i}.moe.W_g": tensor}
    member = {"gate_up_proj": "W_in", "down_proj": "W_out"}[name.rsplit(".", 1)[1]]
    return {f"block.{i}.moe.theta.{j}.{member}": tensor[j] for j in range(E)}


def load(hf, ours) -> None:
    state = {}
    for name, p in hf.named_parameters():
        state.update({k: v.detach().clone() for k, v in ours_of(name, p).items()})
    ours.load_state_dict(state, strict=True)


def grad_diffs(hf, ours, idx) -> dict[str, float]:
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    hf(idx, labels=idx).loss.backward()
    ours(idx[:, :-1], idx[:, 1:])[1].backward()
    mine = dict(ours.named_parameters())
    diffs = {}
    for name, p in hf.named_parameters():
        for card, g in ours_of(name, p.grad).items():
            diffs[card] = max_diff(mine[card].grad, g)
    return diffs


@pytest.fixture(scope="module")
def pair():
    hf, ours = make_hf(), make_ours()
    load(hf, ours)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    return hf, ours, idx


def test_logits_match(pair):
    hf, ours, idx = pair
    with torch.no_grad():
        want, got = hf(idx).logits, ours(idx)
    assert got.shape == want.shape == (B, T, V)
    diff = max_diff(got, want)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, idx = pair
    diffs = grad_diffs(hf, ours, idx)
    assert any(".theta." in n for n in diffs) and any("moe.W_g" in n for n in diffs)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


def test_swapped_experts_are_caught(pair):
    """A negative control: two experts of layer 0 exchanged (their router rows kept)."""
    hf, ours, idx = pair
    broken = make_ours()
    state = dict(ours.state_dict())
    for m in ("W_in", "W_out"):
        a, b = f"block.0.moe.theta.0.{m}", f"block.0.moe.theta.1.{m}"
        state[a], state[b] = state[b], state[a]
    broken.load_state_dict(state, strict=True)
    with torch.no_grad():
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"swapping experts changed the logits by only {diff:.3e}"


@pytest.mark.parametrize("hyper", ["α_r", "α_e", "τ"])
def test_the_multipliers_are_used(pair, hyper):
    hf, ours, idx = pair
    broken = make_ours(**{hyper: 1.0})
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"{hyper} = 1 changed the logits by only {diff:.3e}"


def test_a_card_without_the_padding_row_is_caught(pair):
    """A negative control: with v_pad = 0 the pad row takes a gradient transformers does not."""
    hf, ours, idx = pair
    broken = make_ours(v_pad=0)
    broken.load_state_dict(ours.state_dict(), strict=True)
    assert grad_diffs(hf, broken, idx)["W_e"] > 1e-3, "a card without the padding row matched"


def test_cached_decoding_equals_recomputation(pair):
    hf, ours, idx = pair
    assert hasattr(ours, "new_cache")
    check_incremental_decoding(ours, [idx])
    with torch.no_grad():
        cache = ours.new_cache()
        rows = torch.cat([ours(idx[:, a:b], cache=cache) for a, b in ((0, 7), (7, 8), (8, T))], 1)
        diff = max_diff(rows, hf(idx).logits)
    assert diff <= 1e-4, f"max |cached logits diff| = {diff:.3e}"
