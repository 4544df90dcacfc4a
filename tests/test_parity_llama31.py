"""Parity: Llama 3.1's rescaled rotary written in a card as its math reads
(tests/cards/llama31/llama31.card, with a mapping file beside it) equals transformers'
LlamaForCausalLM with `rope_parameters={"rope_type": "llama3", …}`, logits and gradients, through
the angle tables the compiler makes once from the card's frequency steps; `cardc import` of a
saved checkpoint reads the rescaling from its config. Sizes are chosen so that the frequencies
fall in all three of its bands (kept, blended, divided by the factor) within the test's
positions; a copy without the rescaling (cards/llama.card) must not match."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from parity import load_through_mapping, logits_diff, max_diff, next_token_grad_diffs  # noqa: E402

from cardc.build import build_model  # noqa: E402
from cardc.interop import load_mapping  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CARD = ROOT / "tests" / "cards" / "llama31" / "llama31.card"
V, D, N, H, H_KV, D_F, CTX, THETA, EPS = 101, 48, 2, 4, 2, 96, 256, 10000.0, 1e-5
# head width 12: frequencies 1, 0.22, 0.046, …; L ω/2π = 10, 2.2, 0.47, …: kept, blended, divided
SCALING = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=64)
B, T = 3, 17
MAPPING = load_mapping(CARD)


def make_hf():
    config = transformers.LlamaConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, intermediate_size=D_F, max_position_embeddings=CTX,
        rms_norm_eps=EPS, tie_word_embeddings=True, attention_dropout=0.0,
        rope_parameters={"rope_type": "llama3", "rope_theta": THETA, **SCALING})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours():
    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, D_f=D_F, N=N, ctx=CTX, ε=EPS, θ_base=THETA,
                  κ=SCALING["factor"], α=SCALING["low_freq_factor"],
                  β=SCALING["high_freq_factor"], L=SCALING["original_max_position_embeddings"])
    return build_model(str(CARD), None, hypers, library=str(ROOT / "cards")).float().eval()


@pytest.fixture(scope="module")
def pair():
    hf, ours = make_hf(), make_ours()
    table = load_through_mapping(hf, ours, MAPPING, N, True)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    return hf, ours, table, idx


def test_logits_match(pair):
    hf, ours, _, idx = pair
    diff = logits_diff(hf, ours, idx, (B, T, V))
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, table, idx = pair
    diffs = next_token_grad_diffs(hf, ours, table, idx)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


def test_the_card_lowers_to_the_angle_tables(pair):
    _, ours, _, _ = pair
    names = type(ours).forward.__globals__  # the generated file's
    assert "ScaledRoPE_frequencies" in names and "ScaledRoPE" not in names


def test_rotary_without_the_rescaling_is_caught(pair):
    """A negative control: plain Llama (no rescaling) with the same weights must not match."""
    hf, ours, _, idx = pair
    plain = build_model(str(ROOT / "cards" / "llama.card"), None,
                        dict(V=V, D=D, H=H, H_kv=H_KV, D_f=D_F, N=N, ctx=CTX, ε=EPS,
                             θ_base=THETA), library=str(ROOT / "cards")).float().eval()
    plain.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        diff = max_diff(plain(idx), hf(idx).logits)
    assert diff > 1e-3, f"dropping the rescaling changed the logits by only {diff:.3e}"


def test_cardc_import_of_a_saved_llama31_matches_its_logits(tmp_path):
    from test_interop import cardc, logits_of_run

    hf = make_hf()
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", str(CARD.relative_to(ROOT)), "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        diff = max_diff(logits_of_run(tmp_path / "run", idx), hf(idx).logits)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"
