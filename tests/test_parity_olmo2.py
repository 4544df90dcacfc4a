"""Parity: the card-generated OLMo 2 equals Hugging Face's Olmo2ForCausalLM number for number.

A small randomly initialised Olmo2ForCausalLM (no download; grouped-query attention with 4 query
and 2 key/value heads, the RMSNorm of the whole query and key projections, and the RMSNorms after
each sub-layer, every gain randomised) is copied into the model `cards/olmo2.card` compiles to,
through the name table in `cards/olmo2.hf.json`. Logits and gradients must agree to fp32
rounding; the same weights with the query norm's gains left at one, or with the two post-norms
of a block exchanged, must not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from parity import (  # noqa: E402
    load_through_mapping,
    logits_diff,
    max_diff,
    next_token_grad_diffs,
    padding_row_grad_diff,
)

from cardc.build import build_model  # noqa: E402
from cardc.interop import load_mapping  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, H_KV, D_F, CTX, THETA, EPS = 101, 48, 2, 4, 2, 96, 64, 5e5, 1e-6
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
MAPPING = load_mapping(ROOT / "cards" / "olmo2.card")


def make_hf():
    config = transformers.Olmo2Config(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, intermediate_size=D_F, max_position_embeddings=CTX,
        rope_theta=THETA, rms_norm_eps=EPS, tie_word_embeddings=False, attention_dropout=0.0,
        pad_token_id=PAD, eos_token_id=None)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.Olmo2ForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(v_pad: int = PAD + 1):  # the card counts IDs from 1
    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, d=D // H, D_f=D_F, N=N, ctx=CTX, ε=EPS, θ_base=THETA,
                  v_pad=v_pad)
    model = build_model(str(ROOT / "cards" / "olmo2.card"), None, hypers,
                        library=str(ROOT / "cards"))
    return model.float().eval()


@pytest.fixture(scope="module")
def pair():
    hf, ours = make_hf(), make_ours()
    table = load_through_mapping(hf, ours, MAPPING, N, tied=False)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    return hf, ours, table, idx


def test_logits_match(pair):
    hf, ours, _, idx = pair
    diff = logits_diff(hf, ours, idx, (B, T, V))
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, table, idx = pair
    diffs = next_token_grad_diffs(hf, ours, table, idx)
    assert set(diffs) == {n for n, _ in hf.named_parameters()}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


@pytest.mark.parametrize("change", ["reset q_norm", "swap post-norms"])
def test_norms_are_where_the_card_puts_them(pair, change):
    """Negative controls: the query norm's gains and each post-norm's place matter."""
    hf, ours, _, idx = pair
    broken = make_ours()
    broken.load_state_dict(ours.state_dict(), strict=True)
    block = broken.block[0]
    with torch.no_grad():
        if change == "reset q_norm":
            block.attn.gamma_q.fill_(1.0)
        else:
            g1 = block.gamma1.clone()
            block.gamma1.copy_(block.gamma2)
            block.gamma2.copy_(g1)
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"{change} changed the logits by only {diff:.3e}"


def test_cardc_import_of_a_saved_olmo2_matches_its_logits(tmp_path):
    """`cardc import` reads a saved Olmo2ForCausalLM, its head width D/H by default."""
    from test_interop import cardc, logits_of_run

    hf = make_hf()
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/olmo2.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    with torch.no_grad():
        diff = max_diff(logits_of_run(tmp_path / "run", idx), hf(idx).logits)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_a_tiny_olmo2_trains_and_samples(tmp_path, cli):
    """`cardc train cards/olmo2.card` trains it (val loss falls); the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/olmo2.card", "--preset", "tiny", "--set", "D=32", "--set", "d=8",
              "--set", "D_f=64", "--set", "N=1", "--steps", "12", "--eval-every", "12",
              "--batch-size", "4", "--block-size", "16", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training OLMo2 (" in r.stdout  # whichever recipe trains it
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr


def test_a_card_without_the_padding_row_is_caught(pair):
    """A negative control: with v_pad = 0 the pad row takes a gradient transformers does not."""
    hf, ours, table, idx = pair
    diff = padding_row_grad_diff(hf, ours, make_ours(v_pad=0), table, idx)
    assert diff > 1e-3, "a card without the padding row matched its gradient"
