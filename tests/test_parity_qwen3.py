"""Parity: the card-generated Qwen3 equals Hugging Face's Qwen3ForCausalLM number for number.

A small randomly initialised Qwen3ForCausalLM (no download; grouped-query attention with 4 query
and 2 key/value heads of width head_dim = 16, not hidden_size/heads = 12, and the RMSNorm of every
query and key head, its gains randomised too) is copied into the model `cards/qwen3.card`
compiles to, through the name table in `cards/qwen3.hf.json`. Logits and gradients must agree to
fp32 rounding, tied (`Qwen3`) and untied (`Qwen3Untied`); the same weights with the query norm's
gains left at one, or with two query heads swapped, must not.
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
    swap_columns,
)

from cardc.build import build_model  # noqa: E402
from cardc.interop import load_mapping  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, H_KV, HEAD, D_F, CTX, THETA, EPS = 101, 48, 2, 4, 2, 16, 96, 64, 1e6, 1e-6
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
MAPPING = load_mapping(ROOT / "cards" / "qwen3.card")


def make_hf(tied: bool):
    config = transformers.Qwen3Config(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, head_dim=HEAD, intermediate_size=D_F,
        max_position_embeddings=CTX, rope_theta=THETA, rms_norm_eps=EPS,
        tie_word_embeddings=tied, attention_dropout=0.0, pad_token_id=PAD)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(tied: bool, v_pad: int = PAD + 1):  # the card counts IDs from 1
    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, d=HEAD, D_f=D_F, N=N, ctx=CTX, ε=EPS, θ_base=THETA,
                  v_pad=v_pad)
    model = build_model(str(ROOT / "cards" / "qwen3.card"), None, hypers,
                        library=str(ROOT / "cards"), name=None if tied else "Qwen3Untied")
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
    assert {n for n in diffs if "q_norm" in n or "k_norm" in n}, "the head norms are compared"
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


def test_query_norm_gains_are_used(pair):
    """A negative control: resetting one layer's query-head gains must break parity."""
    hf, ours, _, idx, tied = pair
    broken = make_ours(tied)
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        broken.block[0].attn.gamma_q.fill_(1.0)
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"resetting q_norm changed the logits by only {diff:.3e}"


def test_swapped_query_heads_are_caught(pair):
    hf, ours, _, idx, tied = pair
    broken = make_ours(tied)
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        swap_columns(broken.block[0].attn.W_q, 0, HEAD)
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"swapping query heads changed the logits by only {diff:.3e}"


def test_cardc_import_of_a_saved_qwen3_matches_its_logits(tmp_path):
    """`cardc import` reads head_dim from a saved Qwen3ForCausalLM and refuses one that slides
    a window, which the card does not compute."""
    import json

    from test_interop import cardc, logits_of_run

    hf = make_hf(tied=True)
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/qwen3.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    with torch.no_grad():
        diff = max_diff(logits_of_run(tmp_path / "run", idx), hf(idx).logits)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"

    config = tmp_path / "hf" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "use_sliding_window": True}))
    r = cardc("import", "cards/qwen3.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run2"))
    assert r.returncode == 1 and "use_sliding_window = True" in r.stderr, r.stderr


def test_a_tiny_qwen3_trains_and_samples(tmp_path, cli):
    """`cardc train cards/qwen3.card` trains it (val loss falls); the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/qwen3.card", "--preset", "tiny", "--set", "D=32", "--set", "d=8",
              "--set", "D_f=64", "--set", "N=1", "--steps", "12", "--eval-every", "12",
              "--batch-size", "4", "--block-size", "16", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training Qwen3 (" in r.stdout  # whichever recipe trains it
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr


def test_a_config_without_head_dim_reads_as_transformers_reads_it():
    """Qwen3Config's head_dim defaults to 128, not hidden_size/heads: so must the import's."""
    from cardc.interop import preset_from_config

    config = {"vocab_size": V, "hidden_size": D, "num_attention_heads": H,
              "intermediate_size": D_F, "num_hidden_layers": N, "max_position_embeddings": CTX,
              "rms_norm_eps": EPS, "rope_theta": THETA}
    want = transformers.Qwen3Config(**config).head_dim
    assert want != D // H
    assert preset_from_config(config, MAPPING)["d"] == want


def test_a_card_without_the_padding_row_is_caught(pair):
    """A negative control: with v_pad = 0 the pad row takes a gradient transformers does not."""
    hf, ours, table, idx, tied = pair
    diff = padding_row_grad_diff(hf, ours, make_ours(tied, v_pad=0), table, idx)
    assert diff > 1e-3, "a card without the padding row matched its gradient"
