"""Parity: the card-generated Llama 4 equals Hugging Face's Llama4ForCausalLM number for number.

A small randomly initialised Llama4ForCausalLM (text; no download) of 4 layers: layers 1–3
turn queries and keys by RoPE on interleaved pairs, normalise them without gains and attend
within chunks of C = 5 positions, layer 4 attends without positions over the whole causal
context, its queries scaled by the temperature α log(⌊t/f⌋ + 1) + 1 (f = 3, so it changes
within the 17 positions). `Llama4Dense` (every layer a dense SwiGLU MLP, moe_layers empty) is
copied in through `cards/llama4.hf.json`; `Llama4` (every layer a mixture of 4 experts, each
token through one, its input scaled by the sigmoid of its router score, beside a shared expert)
is copied in here, since transformers stores a layer's experts stacked in one tensor that the
mapping language cannot cut into the card's experts. Logits and gradients must agree to fp32
rounding; the same weights with the temperature, the chunks, two query heads or two experts
changed must not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from decodecheck import check_incremental_decoding, check_static_decoding  # noqa: E402
from parity import (  # noqa: E402
    load_through_mapping,
    logits_diff,
    max_diff,
    next_token_grad_diffs,
    padding_row_grad_diff,
    swap_columns,
)

from cardc.build import build_model  # noqa: E402
from cardc.interop import load_mapping  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, H_KV, HEAD, D_F, D_M, CTX, THETA, EPS = 101, 48, 4, 4, 2, 16, 40, 96, 64, 5e5, 1e-5
E, CHUNK, FLOOR, ALPHA = 4, 5, 3, 0.5
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
MAPPING = load_mapping(ROOT / "cards" / "llama4.card")


def make_hf(dense: bool):
    config = transformers.Llama4TextConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, head_dim=HEAD, intermediate_size=D_F,
        intermediate_size_mlp=D_M, max_position_embeddings=CTX, rms_norm_eps=EPS,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        num_local_experts=E, num_experts_per_tok=1, moe_layers=[] if dense else None,
        interleave_moe_layer_step=1, attention_chunk_size=CHUNK, floor_scale=FLOOR,
        attn_scale=ALPHA, use_qk_norm=True, attn_temperature_tuning=True,
        tie_word_embeddings=False, attention_dropout=0.0, pad_token_id=PAD)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.Llama4ForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(dense: bool, v_pad: int = PAD + 1, **changed):  # the card counts IDs from 1
    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, d=HEAD, N=N, ctx=CTX, ε=EPS, θ_base=THETA,
                  C=CHUNK, f=FLOOR, α=ALPHA, v_pad=v_pad)
    hypers.update(dict(D_m=D_M) if dense else dict(E=E, D_f=D_F))
    hypers.update(changed)
    model = build_model(str(ROOT / "cards" / "llama4.card"), None, hypers,
                        library=str(ROOT / "cards"), name="Llama4Dense" if dense else "Llama4")
    return model.float().eval()


def moe_table() -> dict[str, tuple[str, bool]]:
    """HF name → (our name, transposed) for every tensor but the stacked experts."""
    table = {e.hf: (e.card, e.transpose) for e in MAPPING.entries(N)
             if ".feed_forward." not in e.hf}
    for i in range(N):
        hf, ours = f"model.layers.{i}.feed_forward.", f"block.{i}.moe."
        table[hf + "router.weight"] = (ours + "W_g", True)
        for w in ("gate", "up", "down"):
            table[f"{hf}shared_expert.{w}_proj.weight"] = (f"{ours}s.W_{w}", True)
    return table


def expert_tensors(i: int, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Layer i's stacked experts cut into the card's: gate_up_proj (E, D, 2 D_f) holds each
    expert's gate then its up projection side by side, down_proj (E, D_f, D) its down
    projection, both already in the card's (in, out) layout."""
    gate_up = tensors[f"model.layers.{i}.feed_forward.experts.gate_up_proj"]
    down = tensors[f"model.layers.{i}.feed_forward.experts.down_proj"]
    out = {}
    for j in range(E):
        out[f"block.{i}.moe.theta.{j}.W_gate"] = gate_up[j, :, :D_F]
        out[f"block.{i}.moe.theta.{j}.W_up"] = gate_up[j, :, D_F:]
        out[f"block.{i}.moe.theta.{j}.W_down"] = down[j]
    return out


def load_moe(hf, ours) -> dict[str, tuple[str, bool]]:
    table = moe_table()
    hf_params = {n: p.detach() for n, p in hf.named_parameters()}
    stacked = {n for n in hf_params if ".experts." in n}
    assert set(hf_params) == set(table) | stacked, set(hf_params) ^ (set(table) | stacked)
    state = {mine: (hf_params[n].T if t else hf_params[n]).clone()
             for n, (mine, t) in table.items()}
    for i in range(N):
        state.update({k: v.clone() for k, v in expert_tensors(i, hf_params).items()})
    ours.load_state_dict(state, strict=True)
    return table


def tokens() -> torch.Tensor:
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    return idx


@pytest.fixture(scope="module", params=[True, False], ids=["dense", "moe"])
def pair(request):
    dense = request.param
    hf, ours = make_hf(dense), make_ours(dense)
    table = load_through_mapping(hf, ours, MAPPING, N, False) if dense else load_moe(hf, ours)
    return hf, ours, table, tokens(), dense


def test_the_layers_are_of_the_kinds_transformers_builds(pair):
    hf, ours, _, _, dense = pair
    assert hf.config.no_rope_layers == [1, 1, 1, 0]
    assert hf.config.moe_layers == ([] if dense else [0, 1, 2, 3])
    assert [b.attn.r for b in ours.block] == [1, 1, 1, 0]
    assert [b.attn.C for b in ours.block] == [CHUNK, CHUNK, CHUNK, CTX]
    assert [b.attn.alpha for b in ours.block] == [0, 0, 0, ALPHA]


def test_logits_match(pair):
    hf, ours, _, idx, _ = pair
    diff = logits_diff(hf, ours, idx, (B, T, V))
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, table, idx, dense = pair
    diffs = next_token_grad_diffs(hf, ours, table, idx)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"
    if not dense:  # the stacked experts too
        mine = dict(ours.named_parameters())
        theirs = {n: p.grad for n, p in hf.named_parameters() if ".experts." in n}
        for i in range(N):
            for name, g in expert_tensors(i, theirs).items():
                diff = max_diff(mine[name].grad, g)
                assert diff <= 1e-4, f"max |grad diff| = {diff:.3e} at {name}"


@pytest.mark.parametrize("changed", [dict(α=4 * ALPHA), dict(C=CTX), dict(f=CTX)],
                         ids=["other-temperature", "no-chunks", "other-floor"])
def test_changed_hyperparameters_are_caught(pair, changed):
    """Negative controls: the NoPE layer's temperature (α, and f, with which it grows), and
    the RoPE layers' chunks each change the logits."""
    hf, ours, _, idx, dense = pair
    broken = make_ours(dense, **changed)
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"{changed} changed the logits by only {diff:.3e}"


def test_swapped_query_heads_are_caught(pair):
    hf, ours, _, idx, dense = pair
    for layer in (0, 3):  # a RoPE layer and the NoPE layer
        broken = make_ours(dense)
        broken.load_state_dict(ours.state_dict(), strict=True)
        with torch.no_grad():
            swap_columns(broken.block[layer].attn.W_q, 0, HEAD)
            diff = max_diff(broken(idx), hf(idx).logits)
        assert diff > 1e-3, f"swapping query heads of layer {layer} changed the logits by only {diff:.3e}"


def test_swapped_experts_are_caught(pair):
    """A negative control: two experts of the NoPE layer exchanged (their router columns kept)."""
    hf, ours, _, idx, dense = pair
    if dense:
        pytest.skip("no experts")
    broken = make_ours(dense)
    state = dict(ours.state_dict())
    for w in ("W_gate", "W_up", "W_down"):
        a, b = f"block.3.moe.theta.0.{w}", f"block.3.moe.theta.1.{w}"
        state[a], state[b] = state[b], state[a]
    broken.load_state_dict(state, strict=True)
    with torch.no_grad():
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"swapping two experts changed the logits by only {diff:.3e}"


def test_a_card_without_the_padding_row_is_caught(pair):
    hf, ours, table, idx, dense = pair
    diff = padding_row_grad_diff(hf, ours, make_ours(dense, v_pad=0), table, idx)
    assert diff > 1e-3, "a card without the padding row matched its gradient"


def test_cached_decoding_equals_recomputation_and_transformers(pair):
    """The chunk rule `⌊(t − 1)/C⌋ ≠ ⌊(t′ − 1)/C⌋` and the NoPE layers' temperature read the
    positions themselves, not their distance: decoding a few tokens at a time through the
    cache (across chunk boundaries) gives full recomputation's logits, and transformers'."""
    hf, ours, _, idx, _ = pair
    check_incremental_decoding(ours, [idx], chunks=(4, 1, 1, 6))
    check_static_decoding(ours, [idx], chunks=(4, 1, 1, 6))
    with torch.no_grad():
        cache = ours.new_cache()
        rows = torch.cat([ours(idx[:, :6], cache=cache), ours(idx[:, 6:], cache=cache)], dim=-2)
    diff = max_diff(rows, hf(idx).logits)
    assert diff <= 1e-4, f"cached logits differ from transformers' by {diff:.3e}"
