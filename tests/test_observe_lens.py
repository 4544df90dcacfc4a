"""Observability against TransformerLens: the values `cardc.run_with_cache` reads off the GPT-2
card by their card names equal those TransformerLens' HookedTransformer hooks, and patching a
value by its card name changes the logits as patching the same value in TransformerLens does.

One randomly initialised GPT2LMHeadModel (no download) is the source of both: copied into the
card's model through the card's mapping file (as the parity tests do), and into a
HookedTransformer by TransformerLens' own GPT-2 conversion, unprocessed (no folded layer norms,
no centred weights), so both compute the same function with the same numbers.
"""

from __future__ import annotations

import pytest
import torch
from test_parity_gpt2 import D_F, B, D, H, N, T, V, load_hf_into_ours, make_hf, make_ours

from cardc import run_with_cache, run_with_hooks

TOL = 1e-5


@pytest.fixture(scope="module")
def models():
    # imported here, not when tests are collected: it maps 1.4 GB of address space into the
    # process, which every process forked from it (tests/fuzz.py's workers) would inherit
    import transformer_lens as lens  # a test extra
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    hf = make_hf()
    ours = make_ours()
    load_hf_into_ours(hf, ours)
    cfg = lens.HookedTransformerConfig(
        n_layers=N, d_model=D, n_ctx=hf.config.n_positions, d_head=D // H, n_heads=H,
        d_mlp=D_F, d_vocab=V, act_fn="gelu_new", normalization_type="LN", eps=1e-5,
        positional_embedding_type="standard", default_prepend_bos=False)
    with pytest.warns(DeprecationWarning):  # HookedTransformer gives way to a bridge in 4.0
        hooked = lens.HookedTransformer(cfg)
    missing, unexpected = hooked.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    # left as built: the causal mask's buffers, and an unembedding bias GPT-2 has not (zeros)
    assert not unexpected and all(k.endswith((".mask", ".IGNORE", "b_U")) for k in missing)
    assert not hooked.unembed.b_U.any()
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    return ours, hooked.eval(), tokens


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, f"{what}: {tuple(a.shape)} against {tuple(b.shape)}"
    diff = (a - b).abs().max().item()
    assert diff <= TOL, f"{what}: max |difference| {diff:.2e}"


def test_values_agree_by_card_name(models):
    ours, hooked, tokens = models
    with torch.no_grad():
        P, cache = run_with_cache(ours, tokens)
        logits, lens_cache = hooked.run_with_cache(tokens)
    _close(P, logits, "logits")
    _close(cache["E@1"], lens_cache["hook_embed"] + lens_cache["hook_pos_embed"], "embeddings")
    for layer in range(N):
        at, tl = f"block.{layer}", f"blocks.{layer}"
        head = f"{at}.attn.AttentionHead"
        # the residual stream: the block's input, after the attention, after the MLP
        _close(cache[f"{at}.X@0"], lens_cache[f"{tl}.hook_resid_pre"], f"{at} input")
        _close(cache[f"{at}.X@1"], lens_cache[f"{tl}.hook_resid_mid"], f"{at} after attention")
        _close(cache[f"{at}.X@2"], lens_cache[f"{tl}.hook_resid_post"], f"{at} output")
        # every head at once, on the axis after the batch: (B, H, T, ·)
        _close(cache[f"{head}.Q"], lens_cache[f"{tl}.attn.hook_q"].transpose(1, 2), f"{head}.Q")
        _close(cache[f"{head}.K"], lens_cache[f"{tl}.attn.hook_k"].transpose(1, 2), f"{head}.K")
        _close(cache[f"{head}.V"], lens_cache[f"{tl}.attn.hook_v"].transpose(1, 2), f"{head}.V")
        scores, want = cache[f"{head}.S@5"], lens_cache[f"{tl}.attn.hook_attn_scores"]
        assert torch.equal(scores.isinf(), want.isinf()), f"{head}.S@5: masks differ"
        _close(scores.nan_to_num(neginf=0.0), want.nan_to_num(neginf=0.0), f"{head}.S@5")
        _close(scores.softmax(-1), lens_cache[f"{tl}.attn.hook_pattern"], f"{head} pattern")
        _close(cache[f"{at}.attn.Y_h"], lens_cache[f"{tl}.attn.hook_z"].transpose(1, 2),
               f"{at}.attn.Y_h")
        _close(cache[f"{at}.attn.Y@3"], lens_cache[f"{tl}.hook_attn_out"], f"{at}.attn.Y@3")
        _close(cache[f"{at}.mlp.Y"], lens_cache[f"{tl}.hook_mlp_out"], f"{at}.mlp.Y")
    assert cache.line(f"{head}.S@5") == "attention.card:12"  # `∀t, t′: if ¬Mask …`


def test_patching_agrees_by_card_name(models):
    """Activation patching: the residual stream after layer 0's attention, at one position,
    taken from a run on other tokens."""
    ours, hooked, tokens = models
    other = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(4))
    pos = T // 2
    with torch.no_grad():
        _, donor = run_with_cache(ours, other, names="block.0.X@1")
        _, lens_donor = hooked.run_with_cache(other, names_filter="blocks.0.hook_resid_mid")

        def patch(value, site):
            value = value.clone()
            value[:, pos] = donor[site.key][:, pos]
            return value

        def lens_patch(value, hook):
            value = value.clone()
            value[:, pos] = lens_donor[hook.name][:, pos]
            return value

        clean = run_with_hooks(ours, tokens, hooks={})
        patched = run_with_hooks(ours, tokens, hooks={"block.0.X@1": patch})
        want = hooked.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_mid", lens_patch)])
    _close(patched, want, "patched logits")
    assert torch.equal(patched[:, :pos], clean[:, :pos]), "a position before the patch moved"
    assert (patched[:, pos:] - clean[:, pos:]).abs().max() > 1e-2, "the patch changed nothing"
