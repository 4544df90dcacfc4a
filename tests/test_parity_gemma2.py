"""Parity: the card-generated Gemma 2 equals Hugging Face's Gemma2ForCausalLM number for number.

A small randomly initialised Gemma2ForCausalLM (no download; 4 layers alternating a sliding window
of 5 positions and the whole context over sequences of 17, grouped-query attention with heads of
width 16 scaled by query_pre_attn_scalar = 20, soft caps small enough to bite, every RMSNorm gain
randomised) is copied into the model `cards/gemma2.card` compiles to. Logits and gradients must
agree to fp32 rounding; the same weights without the window or without the caps must not.

The weights move through cards/gemma2.hf.json: the card stacks its layers in pairs (θ^local_ℓ,
θ^global_ℓ), which the mapping names as Hugging Face's layers {2i} and {2i+1}.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from parity import load_through_mapping, max_diff, next_token_grad_diffs, padding_row_grad_diff  # noqa: E402

from cardc.build import build_model  # noqa: E402
from cardc.interop import load_mapping  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, H_KV, HEAD, D_F, CTX, WINDOW, THETA, EPS = 101, 48, 4, 4, 2, 16, 96, 64, 5, 1e4, 1e-6
SCALAR, CAP_ATTN, CAP_FINAL = 20, 2.0, 3.0
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
MAPPING = load_mapping(ROOT / "cards" / "gemma2.card")


def make_hf():
    config = transformers.Gemma2Config(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, head_dim=HEAD, intermediate_size=D_F,
        max_position_embeddings=CTX, sliding_window=WINDOW, query_pre_attn_scalar=SCALAR,
        attn_logit_softcapping=CAP_ATTN, final_logit_softcapping=CAP_FINAL, rope_theta=THETA,
        rms_norm_eps=EPS, tie_word_embeddings=True, attention_dropout=0.0,
        pad_token_id=PAD)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.Gemma2ForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains (stored less one) included
        for _, p in hf.named_parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(window: int = WINDOW, cap_attn: float = CAP_ATTN, cap_final: float = CAP_FINAL,
              v_pad: int = PAD + 1):  # the card counts token IDs from 1
    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, d=HEAD, D_f=D_F, N=N, ctx=CTX, w=window, s=SCALAR,
                  c_attn=cap_attn, c_f=cap_final, ε=EPS, θ_base=THETA, v_pad=v_pad)
    model = build_model(str(ROOT / "cards" / "gemma2.card"), None, hypers,
                        library=str(ROOT / "cards"))
    return model.float().eval()


@pytest.fixture(scope="module")
def pair():
    hf, ours = make_hf(), make_ours()
    table = load_through_mapping(hf, ours, MAPPING, MAPPING.layer_count({"N": N}), tied=True)
    assert table["model.layers.3.mlp.up_proj.weight"] == ("global_.1.mlp.W_up", True)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    return hf, ours, table, idx


def test_logits_match(pair):
    hf, ours, _, idx = pair
    with torch.no_grad():
        want = hf(idx).logits
        got = ours(idx)
    assert got.shape == want.shape == (B, T, V)
    assert want.abs().max() > CAP_FINAL / 2, "the final cap bites"
    diff = max_diff(got, want)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, table, idx = pair
    diffs = next_token_grad_diffs(hf, ours, table, idx)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


@pytest.mark.parametrize("change", [dict(window=CTX), dict(cap_attn=1e9), dict(cap_final=1e9)],
                         ids=["no window", "no attention cap", "no logit cap"])
def test_what_makes_it_gemma2_matters(pair, change):
    """Negative controls: every layer global, or a cap removed, must break parity."""
    hf, ours, _, idx = pair
    broken = make_ours(**change)
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"{change} changed the logits by only {diff:.3e}"


def test_a_tiny_gemma2_trains_and_samples(tmp_path, cli):
    """`cardc train cards/gemma2.card` trains it (val loss falls); the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/gemma2.card", "--preset", "tiny", "--set", "D=32", "--set", "d=8",
              "--set", "s=8", "--set", "D_f=64", "--set", "N=2", "--set", "w=6", "--steps", "12",
              "--eval-every", "12", "--batch-size", "4", "--block-size", "16",
              "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training Gemma2 (" in r.stdout  # whichever recipe trains it
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr


def test_a_card_without_the_padding_row_is_caught(pair):
    """A negative control: with v_pad = 0 the pad row takes a gradient transformers does not."""
    hf, ours, table, idx = pair
    diff = padding_row_grad_diff(hf, ours, make_ours(v_pad=0), table, idx)
    assert diff > 1e-3, "a card without the padding row matched its gradient"
