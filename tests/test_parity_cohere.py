"""Parity: the card-generated Cohere equals Hugging Face's CohereForCausalLM number for number.

A small randomly initialised CohereForCausalLM (no download; grouped-query attention with 4 query
and 2 key/value heads of width 16, attention and a SwiGLU MLP in parallel on one LayerNorm with a
gain and no bias, rotary on interleaved pairs, tied embeddings, logits scaled by a logit_scale of
0.25, a pad token the input holds) is copied into the model `cards/cohere.card` compiles to,
through `cards/cohere.hf.json`; with use_qk_norm, into its variant CohereQKNorm, whose every query
and key head has a LayerNorm with gains of its own (transformers' (heads, head_dim) q_norm and
k_norm, reshaped by the mapping). Every parameter is randomised, the norm gains included. Logits
and gradients must agree to fp32 rounding; the same weights with two query heads swapped, one
layer's query-head gains reset, the logit scale left out, the rotary pairs read as halves or a
padding row transformers does not have must not. Chunks decoded through the cache equal the whole
sequence at once, and greedy decoding through it picks what transformers' `generate` picks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from parity import logits_diff, max_diff, swap_columns  # noqa: E402

from cardc.build import build_model  # noqa: E402
from cardc.interop import from_card_state, load_mapping, to_card_state  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, H_KV, D_F, CTX, THETA, EPS, SCALE = 101, 64, 2, 4, 2, 96, 64, 1e4, 1e-5, 0.25
HEAD = D // H
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
NAMES = {False: "Cohere", True: "CohereQKNorm"}
SIZES = dict(H=H, H_kv=H_KV, D=D)  # what the mapping's reshape of q_norm and k_norm reads


def make_hf(qk_norm: bool):
    config = transformers.CohereConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, intermediate_size=D_F, max_position_embeddings=CTX,
        rope_theta=THETA, layer_norm_eps=EPS, logit_scale=SCALE, use_qk_norm=qk_norm,
        tie_word_embeddings=True, attention_dropout=0.0, pad_token_id=PAD, bos_token_id=None,
        eos_token_id=None)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.CohereForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the LayerNorm and head-norm gains included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(qk_norm: bool, v_pad: int = PAD + 1, alpha: float = SCALE):  # IDs count from 1
    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, D_f=D_F, N=N, ctx=CTX, ε=EPS, θ_base=THETA, α=alpha,
                  v_pad=v_pad)
    model = build_model(str(ROOT / "cards" / "cohere.card"), None, hypers,
                        library=str(ROOT / "cards"), name=NAMES[qk_norm])
    return model.float().eval()


def mapping(qk_norm: bool):
    return load_mapping(ROOT / "cards" / "cohere.card", NAMES[qk_norm])


def load(hf, ours, qk_norm: bool) -> None:
    """The HF weights into ours through the mapping file, strictly: none left over or missing."""
    state = to_card_state(mapping(qk_norm), hf.state_dict(), ours.state_dict(), N, SIZES)
    ours.load_state_dict(state, strict=True)


def copy_of(ours, qk_norm: bool, **changes):
    twin = make_ours(qk_norm, **changes)
    twin.load_state_dict(ours.state_dict(), strict=True)
    return twin


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "qk_norm"])
def pair(request):
    qk_norm = request.param
    hf, ours = make_hf(qk_norm), make_ours(qk_norm)
    load(hf, ours, qk_norm)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    return hf, ours, idx, qk_norm


def grad_diffs(hf, ours, idx, qk_norm: bool) -> dict[str, float]:
    """HF name → max |gradient difference| of the next-token loss, our gradients put back into
    Hugging Face's names and shapes by the mapping file."""
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    hf(idx, labels=idx).loss.backward()
    ours(idx[:, :-1], idx[:, 1:])[1].backward()
    grads = from_card_state(mapping(qk_norm), {n: p.grad for n, p in ours.named_parameters()},
                            N, SIZES)
    theirs = dict(hf.named_parameters())  # lm_head is embed_tokens: one tensor, one gradient
    assert set(grads) == set(theirs), (set(grads) ^ set(theirs))
    return {name: max_diff(grads[name], p.grad) for name, p in theirs.items()}


def test_logits_match(pair):
    hf, ours, idx, _ = pair
    diff = logits_diff(hf, ours, idx, (B, T, V))
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, idx, qk_norm = pair
    diffs = grad_diffs(hf, ours, idx, qk_norm)
    assert "model.embed_tokens.weight" in diffs  # the pad row's gradient included
    assert any("q_norm" in n for n in diffs) is qk_norm
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


def test_swapped_query_heads_are_caught(pair):
    """A negative control: two query heads of one layer exchanged must break parity."""
    hf, ours, idx, qk_norm = pair
    broken = copy_of(ours, qk_norm)
    with torch.no_grad():
        swap_columns(broken.block[0].attn.W_q, 0, HEAD)
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"swapping query heads changed the logits by only {diff:.3e}"


def test_the_logit_scale_is_applied(pair):
    """A negative control: the same weights with α = 1 (logits unscaled) must not match."""
    hf, ours, idx, qk_norm = pair
    with torch.no_grad():
        diff = max_diff(copy_of(ours, qk_norm, alpha=1.0)(idx), hf(idx).logits)
    assert diff > 1e-3, f"leaving the logit scale out changed the logits by only {diff:.3e}"


def test_rotary_pairs_read_as_halves_are_caught(pair):
    """A negative control: each query and key head's columns reordered from interleaved pairs
    (2i, 2i + 1) to halves (i, d/2 + i), as Llama's rotate-half lays a head out. Without RoPE
    the scores would not change (queries and keys permuted alike, the head norms' gains with
    them); with Cohere's interleaved rotary they must."""
    hf, ours, idx, qk_norm = pair
    order = torch.cat([torch.arange(0, HEAD, 2), torch.arange(1, HEAD, 2)])
    broken = copy_of(ours, qk_norm)
    attn = broken.block[0].attn
    with torch.no_grad():
        for w, heads in ((attn.W_q, H), (attn.W_k, H_KV)):
            w.copy_(w.unflatten(-1, (heads, HEAD))[..., order].flatten(-2))
        if qk_norm:
            for g, heads in ((attn.gamma_q, H), (attn.gamma_k, H_KV)):
                g.copy_(g.unflatten(-1, (heads, HEAD))[..., order].flatten(-2))
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"reading the rotary pairs as halves changed the logits by {diff:.3e}"


def test_query_head_gains_are_each_heads_own(pair):
    """A negative control for use_qk_norm: one layer's query-head gains reset to one, or the
    gains of its first two query heads exchanged (each head has gains of its own), must break
    parity."""
    hf, ours, idx, qk_norm = pair
    if not qk_norm:
        pytest.skip("the plain card has no head norms")
    with torch.no_grad():
        want = hf(idx).logits
        reset = copy_of(ours, qk_norm)
        reset.block[0].attn.gamma_q.fill_(1.0)
        swapped = copy_of(ours, qk_norm)
        g = swapped.block[0].attn.gamma_q
        g[:HEAD], g[HEAD:2 * HEAD] = g[HEAD:2 * HEAD].clone(), g[:HEAD].clone()
        diffs = max_diff(reset(idx), want), max_diff(swapped(idx), want)
    assert min(diffs) > 1e-3, f"changing the query-head gains changed the logits by {diffs}"


def test_a_card_without_the_padding_row_is_caught(pair):
    """A negative control: with v_pad = 0 the pad row takes a gradient transformers does not."""
    hf, ours, idx, qk_norm = pair
    diffs = grad_diffs(hf, copy_of(ours, qk_norm, v_pad=0), idx, qk_norm)
    assert diffs["model.embed_tokens.weight"] > 1e-3
    assert max(d for n, d in diffs.items() if n != "model.embed_tokens.weight") <= 1e-4


def test_kv_cache_decoding_equals_full_recomputation(pair):
    """Chunks fed through `new_cache()` give the logits of the whole sequence at once, and
    greedy decoding through the cache picks what transformers' cached `generate` picks."""
    hf, ours, idx, _ = pair
    with torch.no_grad():
        full = ours(idx)
        cache = ours.new_cache()
        chunks = [idx[:, :6], idx[:, 6:7], idx[:, 7:8], idx[:, 8:13], idx[:, 13:]]
        rows = torch.cat([ours(c, cache=cache) for c in chunks], dim=-2)
    assert cache.pos == T
    diff = max_diff(rows, full)
    assert diff <= 1e-5, f"cached decoding differs from recomputation by {diff:.3e}"

    prompt = idx[:1, :5]
    with torch.no_grad():
        want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                           do_sample=False, pad_token_id=PAD)  # the pad token is a token here
        cache, x, got = ours.new_cache(), prompt, prompt
        for _ in range(12):
            nxt = ours(x, cache=cache)[:, -1].argmax(-1, keepdim=True)
            got, x = torch.cat([got, nxt], dim=-1), nxt
    assert torch.equal(got, want)


def test_generated_forward_has_no_loop_over_heads():
    """The committed modules batch the heads (and the per-head norms) into one SDPA call: no
    Python loop in any forward but the stack of layers."""
    from test_heads import _loops

    for module in ("cohere.py", "cohereqknorm.py"):
        text = (ROOT / "generated" / module).read_text()
        assert _loops(text) == [], module
        assert "scaled_dot_product_attention" in text and "def new_cache" in text
        assert "rotate_pairs(" in text and "rotate_half(" not in text


@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
def test_cardc_import_of_a_saved_cohere_matches_its_logits(qk_norm, tmp_path):
    """`cardc import` picks the card by use_qk_norm and reads logit_scale; a checkpoint with
    attention biases, which the card does not compute, is refused by name."""
    import json

    from test_interop import cardc, logits_of_run

    from cardc.runtime.checkpoint import read_checkpoint

    hf = make_hf(qk_norm)
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/cohere.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    meta, _ = read_checkpoint(tmp_path / "run")
    assert meta["name"] == NAMES[qk_norm]
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD
    with torch.no_grad():
        diff = max_diff(logits_of_run(tmp_path / "run", idx), hf(idx).logits)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"

    config = tmp_path / "hf" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "attention_bias": True}))
    r = cardc("import", "cards/cohere.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run2"))
    assert r.returncode == 1 and "attention_bias = True" in r.stderr, r.stderr


def test_a_tiny_cohere_trains_and_samples(tmp_path, cli):
    """`cardc train cards/cohere.card` trains it (val loss falls); the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/cohere.card", "--preset", "tiny", "--set", "D=32",
              "--set", "D_f=64", "--set", "N=1", "--steps", "12", "--eval-every", "12",
              "--batch-size", "4", "--block-size", "16", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training Cohere (" in r.stdout  # whichever recipe trains it
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr
