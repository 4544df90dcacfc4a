"""Parity: the card-generated StableLM 2 equals Hugging Face's StableLmForCausalLM number for number.

A small randomly initialised StableLmForCausalLM (no download; 4 query and 2 key/value heads of
width 16 with biased projections, rotary on the first quarter of each head, LayerNorms with
random gains and biases, a pad token the input holds) is copied into the model
`cards/stablelm2.card` compiles to, through the name table in `cards/stablelm2.hf.json`. Logits
and gradients must agree to fp32 rounding; the same weights with rotary on the whole head, or
with the padding row dropped, must not.
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
from cardc.runtime.errors import RuntimeInputError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, H_KV, D_F, CTX, FACTOR, THETA, EPS = 101, 64, 2, 4, 2, 96, 64, 0.25, 1e4, 1e-5
D_R = int(D // H * FACTOR)  # 4 of each head's 16 columns, rounded down as transformers does
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
MAPPING = load_mapping(ROOT / "cards" / "stablelm2.card")


def make_hf(factor: float = FACTOR):
    config = transformers.StableLmConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, intermediate_size=D_F, max_position_embeddings=CTX,
        rope_theta=THETA, partial_rotary_factor=factor, layer_norm_eps=EPS, use_qkv_bias=True,
        qk_layernorm=False, use_parallel_residual=False, tie_word_embeddings=False,
        attention_dropout=0.0, hidden_dropout=0.0, pad_token_id=PAD)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.StableLmForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the LayerNorm gains and biases included
        for name, p in hf.named_parameters():
            mean = 1.0 if "norm.weight" in name else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(d_r: int = D_R, v_pad: int = PAD + 1):  # the card counts token IDs from 1
    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, D_f=D_F, N=N, ctx=CTX, d_r=d_r, ε=EPS,
                  θ_base=THETA, v_pad=v_pad)
    model = build_model(str(ROOT / "cards" / "stablelm2.card"), None, hypers,
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


def test_rotary_on_the_whole_head_is_caught(pair):
    """A negative control: the same weights with rotary on every column of a head must not match."""
    hf, ours, _, idx = pair
    whole = make_ours(d_r=D // H)
    whole.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        diff = max_diff(whole(idx), hf(idx).logits)
    assert diff > 1e-3, f"rotary on the whole head changed the logits by only {diff:.3e}"


def test_a_card_without_the_padding_row_is_caught(pair):
    """A negative control: with v_pad = 0 the pad row takes a gradient transformers does not."""
    hf, ours, table, idx = pair
    diff = padding_row_grad_diff(hf, ours, make_ours(v_pad=0), table, idx)
    assert diff > 1e-3, "a card without the padding row matched its gradient"


def test_the_mapping_computes_the_rotary_width():
    """d_r = hidden_size / num_attention_heads × partial_rotary_factor, solved back on export."""
    from cardc.interop.config import config_for, preset_from_config
    from cardc.names import identifier

    config = make_hf().config.to_dict()
    hypers = preset_from_config(config, MAPPING)
    assert hypers["d_r"] == D_R and hypers["v_pad"] == PAD + 1
    stored = {identifier(k): v for k, v in hypers.items()}
    back = config_for(MAPPING, stored)
    assert back["rope_parameters"]["partial_rotary_factor"] == FACTOR
    whole = config_for(MAPPING, {**stored, "d_r": D // H})  # no column left unturned
    assert whole["rope_parameters"]["partial_rotary_factor"] == 1.0
    with pytest.raises(RuntimeInputError, match=r"maps only a card's d_r that is ≤ D / H"):
        config_for(MAPPING, {**stored, "d_r": D // H + 1})


def test_cardc_import_of_a_saved_stablelm2_matches_its_logits(tmp_path):
    from test_interop import cardc, logits_of_run

    hf = make_hf()
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/stablelm2.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD
    with torch.no_grad():
        diff = max_diff(logits_of_run(tmp_path / "run", idx), hf(idx).logits)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_rotary_on_the_whole_head_imports_matches_and_samples(tmp_path, cli):
    """partial_rotary_factor 1: d_r = d, the slice of the columns after d_r empty. The card
    takes it (was: 'd − d_r = 0 is not positive'), matches transformers and samples."""
    from test_interop import cardc, logits_of_run

    hf = make_hf(factor=1.0)
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/stablelm2.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD
    with torch.no_grad():
        got = logits_of_run(tmp_path / "run", idx)
        diff = max_diff(got, hf(idx).logits)
        partial = max_diff(got, make_hf()(idx).logits)  # the same weights, a quarter turned
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"
    assert partial > 1e-3, f"turning a quarter of each head changed the logits by {partial:.3e}"
    s = cli("sample", str(tmp_path / "run"), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr


def test_a_tiny_stablelm2_trains_and_samples(tmp_path, cli):
    """`cardc train cards/stablelm2.card` trains it (val loss falls) and the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/stablelm2.card", "--preset", "tiny", "--set", "D=32",
              "--set", "D_f=64", "--set", "N=1", "--set", "d_r=4", "--steps", "12",
              "--eval-every", "12", "--batch-size", "4", "--block-size", "16",
              "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training StableLM2 (" in r.stdout
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr


def test_the_stablelm_2_1_6b_preset_counts_what_transformers_counts():
    """`cardc info --preset stablelm-2-1_6b` equals StableLmForCausalLM's count on the meta device
    at stabilityai/stablelm-2-1_6b's config.json."""
    from test_interop import cardc

    cfg = transformers.StableLmConfig(
        vocab_size=100352, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
        rope_theta=10000, partial_rotary_factor=0.25, use_qkv_bias=True, layer_norm_eps=1e-5,
        tie_word_embeddings=False)
    with torch.device("meta"):
        hf = transformers.StableLmForCausalLM(cfg)
    theirs = sum(p.numel() for p in hf.parameters())
    assert theirs == 1_644_515_328
    r = cardc("info", "cards/stablelm2.card", "--preset", "stablelm-2-1_6b")
    assert r.returncode == 0, r.stderr
    assert f"parameters: {theirs:,}" in r.stdout
