"""Parity: the card-generated GPT-2 equals Hugging Face's GPT2LMHeadModel number for number.

A small randomly initialised GPT2LMHeadModel (no download) is copied into the model that
`cards/gpt2.card` compiles to, through the table of parameter names in `cards/gpt2.hf.json`.
Logits, gradients and the language-modelling loss must then agree to fp32 rounding, and a
deliberately broken mapping (two query heads swapped) must not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from parity import max_diff, swap_columns  # noqa: E402

from cardc.build import build_model  # noqa: E402
from cardc.interop import load_mapping  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, CTX, D, N, H = 101, 32, 48, 2, 4
D_F = 4 * D
B, T = 3, 17

# HF GPT2LMHeadModel name -> our name, from the mapping file `cardc import` and `cardc export`
# read. HF's Conv1D weights are stored (in, out), the same layout as ours: nothing is transposed.
MAPPING = load_mapping(ROOT / "cards" / "gpt2.card")
TIED = MAPPING.tied  # lm_head.weight is the same tensor as wte


def name_map(n_layer: int) -> dict[str, str]:
    """Every HF parameter name of an `n_layer` GPT-2 and the name it has in our model."""
    entries = MAPPING.entries(n_layer)
    assert not any(e.transpose or e.chunk != (0, 1) for e in entries), "GPT-2 needs no reshaping"
    return {e.hf: e.card for e in entries}


def load_hf_into_ours(hf, ours) -> dict[str, str]:
    """Copy a GPT2LMHeadModel's weights into our GPT-2 (strictly); returns the name map used."""
    table = name_map(hf.config.n_layer)
    hf_params = dict(hf.named_parameters(remove_duplicate=False))
    used = set(table) | set(TIED)
    assert set(hf_params) == used, f"unmapped {set(hf_params) - used}, missing {used - set(hf_params)}"
    for alias, target in TIED.items():
        assert hf_params[alias] is hf_params[target], f"{alias} is not tied to {target}"
    assert len(set(table.values())) == len(table), "two HF parameters map to one of ours"
    state = {ours_name: hf_params[hf_name].detach().clone() for hf_name, ours_name in table.items()}
    ours.load_state_dict(state, strict=True)
    return table


def make_hf():
    config = transformers.GPT2Config(
        vocab_size=V, n_positions=CTX, n_embd=D, n_layer=N, n_head=H, n_inner=D_F,
        activation_function="gelu_new", layer_norm_epsilon=1e-5,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, biases and layer-norm gains included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours():
    hypers = dict(V=V, D=D, H=H, D_f=D_F, N=N, ctx=CTX)
    model = build_model(str(ROOT / "cards" / "gpt2.card"), None, hypers,
                        library=str(ROOT / "cards"))
    return model.float().eval()


@pytest.fixture(scope="module")
def pair():
    hf, ours = make_hf(), make_ours()
    table = load_hf_into_ours(hf, ours)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    return hf, ours, table, idx



def test_logits_match(pair):
    hf, ours, _, idx = pair
    with torch.no_grad():
        want = hf(idx).logits
        got = ours(idx)
    assert got.shape == want.shape == (B, T, V)
    diff = max_diff(got, want)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_match(pair):
    hf, ours, table, idx = pair
    weight = torch.randn(B, T, V, generator=torch.Generator().manual_seed(11))
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    (hf(idx).logits * weight).sum().backward()
    (ours(idx) * weight).sum().backward()
    hf_params = dict(hf.named_parameters())
    ours_params = dict(ours.named_parameters())
    diffs = {hf_name: max_diff(ours_params[ours_name].grad, hf_params[hf_name].grad)
             for hf_name, ours_name in table.items()}
    worst = max(diffs, key=diffs.get)
    scale = hf_params[worst].grad.abs().max().item()
    assert diffs[worst] <= 1e-4, (
        f"max |grad diff| = {diffs[worst]:.3e} at {worst} (max |grad| there {scale:.3g})")


def test_loss_matches(pair):
    hf, ours, _, idx = pair
    with torch.no_grad():
        want = hf(idx, labels=idx).loss  # HF shifts the labels itself
        _, got = ours(idx[:, :-1], idx[:, 1:])
    diff = abs(got.item() - want.item())
    assert diff <= 1e-5, f"|loss diff| = {diff:.3e} (ours {got.item():.6f}, HF {want.item():.6f})"


def test_swapped_query_heads_are_caught(pair):
    """A negative control: exchanging two heads' query columns must break parity."""
    hf, ours, _, idx = pair
    broken = make_ours()
    broken.load_state_dict(ours.state_dict(), strict=True)
    d = D // H
    with torch.no_grad():
        swap_columns(broken.block[0].attn.W_qkv, 0, d)
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"swapping query heads changed the logits by only {diff:.3e}"
