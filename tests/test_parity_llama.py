"""Parity: the card-generated Llama equals Hugging Face's LlamaForCausalLM number for number.

A small randomly initialised LlamaForCausalLM (no download; grouped-query attention with 4 query
and 2 key/value heads) is copied into the model `cards/llama.card` compiles to, through the name
table in `cards/llama.hf.json` (every nn.Linear weight transposed into the card's row-major
layout). Logits and gradients must agree to fp32 rounding, tied (`Llama`) and untied
(`LlamaUntied`), and two deliberately broken copies (swapped query heads, a missing transpose)
must not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from parity import load_through_mapping, logits_diff, max_diff, next_token_grad_diffs, swap_columns  # noqa: E402

from cardc.build import build_model  # noqa: E402
from cardc.interop import load_mapping  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, H_KV, D_F, CTX, THETA, EPS = 101, 48, 2, 4, 2, 96, 64, 10000.0, 1e-5
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
MAPPING = load_mapping(ROOT / "cards" / "llama.card")


def make_hf(tied: bool):
    config = transformers.LlamaConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, intermediate_size=D_F, max_position_embeddings=CTX,
        rope_theta=THETA, rms_norm_eps=EPS, tie_word_embeddings=tied, attention_dropout=0.0,
        pad_token_id=PAD)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(tied: bool):
    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, D_f=D_F, N=N, ctx=CTX, ε=EPS, θ_base=THETA,
                  v_pad=PAD + 1)  # the card counts token IDs from 1
    model = build_model(str(ROOT / "cards" / "llama.card"), None, hypers,
                        library=str(ROOT / "cards"), name=None if tied else "LlamaUntied")
    return model.float().eval()


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def pair(request):
    tied = request.param
    hf, ours = make_hf(tied), make_ours(tied)
    table = load_through_mapping(hf, ours, MAPPING, N, tied)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    return hf, ours, table, idx, tied


def test_logits_match(pair):
    hf, ours, _, idx, _ = pair
    diff = logits_diff(hf, ours, idx, (B, T, V))
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, table, idx, _ = pair
    diffs = next_token_grad_diffs(hf, ours, table, idx)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


def test_swapped_query_heads_are_caught(pair):
    """A negative control: exchanging two query heads' columns must break parity."""
    hf, ours, _, idx, tied = pair
    broken = make_ours(tied)
    broken.load_state_dict(ours.state_dict(), strict=True)
    d = D // H
    with torch.no_grad():
        swap_columns(broken.block[0].attn.W_q, 0, d)
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"swapping query heads changed the logits by only {diff:.3e}"


def test_untransposed_projection_is_caught(pair):
    """A wrong mapping (q_proj copied without its transpose) must not match either."""
    hf, ours, _, idx, tied = pair
    broken = make_ours(tied)
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        broken.block[1].attn.W_q.copy_(hf.model.layers[1].self_attn.q_proj.weight)
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"an untransposed q_proj changed the logits by only {diff:.3e}"


def test_cardc_import_of_a_saved_llama_matches_its_logits(tmp_path):
    """`cardc import` reads a saved LlamaForCausalLM (rope_theta where transformers puts it)."""
    from test_interop import cardc, logits_of_run

    hf = make_hf(tied=True)
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/llama.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        diff = max_diff(logits_of_run(tmp_path / "run", idx), hf(idx).logits)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_mapping_reads_the_pad_token_as_the_padding_row():
    """config.json's pad_token_id k is the card's v_pad = k + 1; none is 0; export inverts it."""
    from cardc.interop.config import config_for, preset_from_config
    from cardc.names import identifier

    config = make_hf(tied=True).config.to_dict()
    hypers = preset_from_config(config, MAPPING)
    assert hypers["v_pad"] == PAD + 1
    assert preset_from_config({**config, "pad_token_id": None}, MAPPING)["v_pad"] == 0
    stored = {identifier(k): v for k, v in hypers.items()}  # as a run records them
    assert config_for(MAPPING, stored)["pad_token_id"] == PAD
    assert config_for(MAPPING, {**stored, "v_pad": 0})["pad_token_id"] is None


def test_a_card_without_the_padding_row_is_caught(pair):
    """A negative control: with v_pad = 0 the pad row takes a gradient transformers does not."""
    hf, ours, table, idx, tied = pair
    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, D_f=D_F, N=N, ctx=CTX, ε=EPS, θ_base=THETA, v_pad=0)
    broken = build_model(str(ROOT / "cards" / "llama.card"), None, hypers, library=str(ROOT / "cards"),
                         name=None if tied else "LlamaUntied").float().eval()
    broken.load_state_dict(ours.state_dict(), strict=True)
    diffs = next_token_grad_diffs(hf, broken, table, idx)
    assert max(diffs.values()) > 1e-3, "a card without the padding row matched its gradient"
