"""Parity: the card-generated Granite equals Hugging Face's GraniteForCausalLM number for number.

A small randomly initialised GraniteForCausalLM (no download; grouped-query attention with 4
query and 2 key/value heads, every parameter random, the RMSNorm gains and, in the biased
variant, every projection's bias included) is copied into the model `cards/granite.card`
compiles to, through the name table in `cards/granite.hf.json`. Its four multipliers are set to
values that are neither 1 nor, for the attention scores, 1/√d, and not powers of two, so that
each is seen where it acts: embeddings times α_e, each sub-layer's output times α_r before the
residual sum, scores times α_s, logits over τ. Logits and gradients must agree to fp32 rounding
tied (`Granite`), untied (`GraniteUntied`) and biased (`GraniteBiased`); the same weights with
any one multiplier put back to its Llama value, two query heads swapped or one bias zeroed must
not. Decoding through the card's KV cache equals full recomputation and transformers' logits.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from decodecheck import check_incremental_decoding  # noqa: E402
from parity import (  # noqa: E402
    load_through_mapping,
    logits_diff,
    max_diff,
    next_token_grad_diffs,
    padding_row_grad_diff,
    swap_columns,
)

from cardc.build import build_model  # noqa: E402
from cardc.interop import load_mappings  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, H_KV, D_F, CTX, THETA, EPS = 101, 48, 2, 4, 2, 96, 64, 1e4, 1e-6
HEAD = D // H
# the multipliers: embeddings, residual branches, attention scores, logits (divided by)
MULT = dict(embedding_multiplier=3.7, residual_multiplier=0.6, attention_multiplier=0.09,
            logits_scaling=2.3)
HYPER = {"α_e": 3.7, "α_r": 0.6, "α_s": 0.09, "τ": 2.3}
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
CARDS = {"tied": "Granite", "untied": "GraniteUntied", "biased": "GraniteBiased"}
MAPPINGS = {m.card: m for m in load_mappings(ROOT / "cards" / "granite.card")}


def make_hf(kind: str):
    config = transformers.GraniteConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, intermediate_size=D_F, max_position_embeddings=CTX,
        rope_theta=THETA, rms_norm_eps=EPS, tie_word_embeddings=kind != "untied",
        attention_bias=kind == "biased", mlp_bias=kind == "biased", attention_dropout=0.0,
        pad_token_id=PAD, **MULT)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.GraniteForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains and the biases included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(kind: str, v_pad: int = PAD + 1, **changes):  # the card counts IDs from 1
    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, D_f=D_F, N=N, ctx=CTX, ε=EPS, θ_base=THETA,
                  v_pad=v_pad, **{**HYPER, **changes})
    model = build_model(str(ROOT / "cards" / "granite.card"), None, hypers,
                        library=str(ROOT / "cards"), name=CARDS[kind])
    return model.float().eval()


@pytest.fixture(scope="module", params=list(CARDS), ids=list(CARDS))
def pair(request):
    kind = request.param
    hf, ours = make_hf(kind), make_ours(kind)
    table = load_through_mapping(hf, ours, MAPPINGS[CARDS[kind]], N, kind != "untied")
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    return hf, ours, table, idx, kind


def test_logits_match(pair):
    hf, ours, _, idx, _ = pair
    diff = logits_diff(hf, ours, idx, (B, T, V))
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, table, idx, kind = pair
    diffs = next_token_grad_diffs(hf, ours, table, idx)
    if kind == "biased":
        assert {n for n in diffs if n.endswith("o_proj.bias")} and \
            {n for n in diffs if n.endswith("down_proj.bias")}, "the biases are compared"
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


@pytest.mark.parametrize("hyper, llama", [("α_e", 1.0), ("α_r", 1.0), ("α_s", 1 / math.sqrt(HEAD)),
                                          ("τ", 1.0)], ids=["embedding", "residual",
                                                             "attention", "logits"])
def test_each_multiplier_is_used(pair, hyper, llama):
    """A negative control: the same weights with one multiplier put back to what Llama
    computes (1, or the scores' 1/√d) must not match."""
    hf, ours, _, idx, kind = pair
    broken = make_ours(kind, **{hyper: llama})
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"{hyper} = {llama} changed the logits by only {diff:.3e}"


def test_swapped_query_heads_are_caught(pair):
    hf, ours, _, idx, kind = pair
    broken = make_ours(kind)
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        swap_columns(broken.block[0].attn.W_q, 0, HEAD)
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"swapping query heads changed the logits by only {diff:.3e}"


@pytest.mark.parametrize("bias", ["attn.b_o", "attn.b_k", "mlp.b_up", "mlp.b_down"])
def test_each_bias_is_used(bias):
    """A negative control of the biased card: one layer's bias zeroed must break parity
    (the key bias too, though a bias on every key is nearly lost under softmax: it is
    not, since RoPE turns it by each key's position)."""
    hf, ours = make_hf("biased"), make_ours("biased")
    load_through_mapping(hf, ours, MAPPINGS["GraniteBiased"], N, True)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        module, name = bias.split(".")
        getattr(getattr(ours.block[0], module), name).zero_()
        diff = max_diff(ours(idx), hf(idx).logits)
    assert diff > 1e-3, f"zeroing {bias} changed the logits by only {diff:.3e}"


def test_a_card_without_the_padding_row_is_caught(pair):
    """A negative control: with v_pad = 0 the pad row takes a gradient transformers does not."""
    hf, ours, table, idx, kind = pair
    diff = padding_row_grad_diff(hf, ours, make_ours(kind, v_pad=0), table, idx)
    assert diff > 1e-3, "a card without the padding row matched its gradient"


def test_cached_decoding_equals_recomputation(pair):
    """Through new_cache(), fed in chunks: the logits of one full forward and the same greedy
    tokens; and the cache's logits are transformers' too."""
    hf, ours, _, idx, _ = pair
    assert hasattr(ours, "new_cache")
    check_incremental_decoding(ours, [idx])
    with torch.no_grad():
        cache = ours.new_cache()
        rows = torch.cat([ours(idx[:, a:b], cache=cache) for a, b in ((0, 7), (7, 8), (8, T))], 1)
        diff = max_diff(rows, hf(idx).logits)
    assert diff <= 1e-4, f"max |cached logits diff| = {diff:.3e}"


@pytest.mark.parametrize("kind", list(CARDS))
def test_cardc_import_of_a_saved_granite_matches_its_logits(kind, tmp_path):
    """`cardc import` chooses the card by tie_word_embeddings and the biases, reads the four
    multipliers, and computes the checkpoint's logits."""
    from test_interop import cardc, logits_of_run

    from cardc.runtime.checkpoint import read_checkpoint

    hf = make_hf(kind)
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/granite.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    meta, _ = read_checkpoint(tmp_path / "run")
    assert meta["name"] == CARDS[kind]
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD
    with torch.no_grad():
        diff = max_diff(logits_of_run(tmp_path / "run", idx), hf(idx).logits)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_a_checkpoint_with_only_attention_biases_is_refused(tmp_path):
    """attention_bias without mlp_bias is a model no card of the file computes: refused."""
    import json

    from test_interop import cardc

    make_hf("biased").save_pretrained(tmp_path / "hf")
    config = tmp_path / "hf" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "mlp_bias": False}))
    r = cardc("import", "cards/granite.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 1 and "mlp_bias" in r.stderr, r.stderr
