"""KV-cache decoding: the generated causal decoders, fed a few tokens at a time through a
cache, give the logits of full recomputation; the sampling cards decode through it."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from unittest import mock

import pytest
import torch
from decodecheck import (
    check_cached_gradients,
    check_incremental_decoding,
    check_static_decoding,
    is_causal,
    token_inputs,
    walk_models,
)
from torch import nn

import cardc
from cardc import build
from cardc.runtime.sample import generate

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(V=97, D=32, H=4, D_f=48, N=2, ctx=24)
FAMILIES = {
    "gpt2": SMALL,
    "llama": {**SMALL, "H_kv": 2, "D_f": 40},
    "qwen2": {**SMALL, "H_kv": 1, "D_f": 40},
}


def small(card: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = cardc.model(f"cards/{card}.card", **FAMILIES[card]).eval()
    with torch.no_grad():
        for p in model.parameters():  # biases and gains too, so none hides a mistake
            p.add_(0.1 * torch.randn_like(p))
    return model


def sampler_for(card: str):
    """The library's generic sampling card, its model bound to the family's card."""
    lib, checker, _ = build.checked([f"cards/{card}.card"], "cards")
    model = build.find_card(lib, checker, f"cards/{card}.card", None)
    return checker, build.recipe_for(lib, checker, model, training=False)


class Uncached(nn.Module):
    """The same model without `new_cache`: samplers recompute every position."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.max_seq_len = model, model.max_seq_len if hasattr(
            model, "max_seq_len") else None

    def forward(self, x):
        return self.model(x)


@pytest.mark.parametrize("card", list(FAMILIES))
def test_incremental_decoding_equals_full_recomputation(card):
    model = small(card)
    x = torch.randint(0, 97, (3, 24))
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        chunks = [x[:, :7], *(x[:, t:t + 1] for t in range(7, 15)), x[:, 15:20], x[:, 20:]]
        rows = torch.cat([model(chunk, cache=cache) for chunk in chunks], dim=1)
    assert cache.pos == 24
    assert (rows - full).abs().max().item() < 1e-5


@pytest.mark.parametrize("card", list(FAMILIES))
def test_cache_gradients_flow_like_full_recomputation(card):
    """Decoding with a cache is differentiable: the loss of the last chunk has the gradients of
    the same loss computed on the whole sequence."""
    model = small(card).train()
    x = torch.randint(0, 97, (2, 12))
    full = model(x)[:, 8:].logsumexp(-1).sum()
    grads = torch.autograd.grad(full, list(model.parameters()), allow_unused=True)
    cache = model.new_cache()
    model(x[:, :8], cache=cache)
    part = model(x[:, 8:], cache=cache).logsumexp(-1).sum()
    mine = torch.autograd.grad(part, list(model.parameters()), allow_unused=True)
    for a, b in zip(grads, mine, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert (a - b).abs().max().item() < 1e-5


def test_the_gradient_check_catches_a_cache_that_cuts_the_graph():
    """check_cached_gradients (which the walk below runs on every cached model): a cache that
    held its keys and values detached, as one written in place or under no_grad would, gives
    later chunks no gradient through earlier ones, and the check says so."""
    model = small("gpt2")
    x = torch.randint(0, 97, (2, 12))
    check_cached_gradients(model, [x])
    made = model.new_cache

    def detaching():
        cache = made()
        extend = cache.extend

        def extend_detached(layer, K, V, keep=None):
            out = extend(layer, K, V, keep)
            cache.kv = {k: (a.detach(), b.detach()) for k, (a, b) in cache.kv.items()}
            return out

        cache.extend = extend_detached
        return cache

    model.new_cache = detaching
    with pytest.raises(AssertionError, match="through the cache is .* away from full"):
        check_cached_gradients(model, [x])


def test_encoder_decoder_decodes_its_target_incrementally():
    """BART: the source is encoded once per cache; the target's causal self-attention is
    cached and its positions (BART's table, offset by 2) continue where the cache left off."""
    torch.manual_seed(1)
    model = cardc.model("cards/bart.card", V=97, D=32, H=4, D_f=48, N=2, ctx=24).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        z, x = torch.randint(0, 97, (2, 9)), torch.randint(0, 97, (2, 16))
        full = model(z, x)
        cache = model.new_cache()
        rows = torch.cat([model(z, x[:, :5], cache=cache),
                          *(model(z, x[:, t:t + 1], cache=cache) for t in range(5, 16))], dim=1)
    assert (rows - full).abs().max().item() < 1e-5


@pytest.mark.parametrize("card, sizes", [
    ("cards/bart.card", dict(V=97, D=32, H=4, D_f=48, N=2, ctx=24)),
    ("cards/t5.card", dict(V=97, D=32, H=4, d=8, D_f=48, N=2, N_b=8, d_max=12)),
])
def test_an_encoder_decoder_encodes_its_source_once_per_cache(card, sizes):
    """Through a cache, an encoder–decoder's encoder runs at the first call only, and so do
    the steps of its decoder that read the source alone (each layer's cross-attention keys and
    values): the tokens decoded after read what the cache keeps (was: the source encoded whole
    each call, every layer again per decoded token). generate(source, start, n) decodes
    through it."""
    torch.manual_seed(1)
    model = cardc.model(card, **sizes).eval()
    runs = []
    for block in model.enc:
        block.register_forward_hook(lambda *_: runs.append(1))
    z, x = torch.randint(0, 97, (2, 9)), torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        full = model(z, x)
        cache = model.new_cache()
        runs.clear()
        rows = torch.cat([model(z, x[:, :5], cache=cache),
                          *(model(z, x[:, t:t + 1], cache=cache) for t in range(5, 12))], dim=1)
        assert len(runs) == len(model.enc)  # once, for 8 calls
        assert (rows - full).abs().max().item() < 1e-5
        # each decoder layer's cross-attention keys and values of the source, made once
        assert len(cache.context) == len(model.dec)
        assert [k.shape[-2] for k, _ in cache.context] == [9] * len(model.dec)
        runs.clear()
        got = model.generate(z, x[:, :2], 6, temperature=0)
        assert len(runs) == len(model.enc)
        plain = x[:, :2]
        for _ in range(6):
            plain = torch.cat([plain, model(z, plain)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(got, plain)


def test_a_cache_that_decoded_after_one_source_refuses_another():
    """The tokens a cache holds were decoded after its source: given another source it
    refuses, with a message, rather than decode the new source's target after the old one's
    (which reading the encoding it keeps would do). An empty cache, or one that started over
    (KVCache.new), takes any source, and encodes it."""
    torch.manual_seed(1)
    model = cardc.model("cards/bart.card", V=97, D=32, H=4, D_f=48, N=2, ctx=24).eval()
    z, other, x = (torch.randint(0, 97, (2, 9)) for _ in range(3))
    with torch.no_grad():
        cache = model.new_cache()
        model(z, x[:, :4], cache=cache)
        with pytest.raises(ValueError, match="decoded after another source: decode this one "
                                             r"through a new cache \(new_cache\(\)\)"):
            model(other, x[:, 4:5], cache=cache)
        fresh = model.new_cache()
        assert torch.allclose(model(other, x[:, :4], cache=fresh), model(other, x[:, :4]),
                              atol=1e-6)
        cache.new(x[:, 1:3])  # not an extension of the tokens held: it starts over
        assert torch.allclose(model(other, x[:, 1:3], cache=cache), model(other, x[:, 1:3]),
                              atol=1e-6)
        source = z.clone()
        held = model.new_cache()
        model(z, x[:, :4], cache=held)
        z[0, 0] = (z[0, 0] + 1) % 97  # written into by its caller: another source now
        with pytest.raises(ValueError, match="decoded after another source"):
            model(z, x[:, 4:5], cache=held)
        assert torch.allclose(model(source, x[:, 4:5], cache=held),  # its own source goes on
                              model(source, x[:, :5])[:, -1:], atol=1e-6)


def test_grouped_query_cache_holds_the_key_value_heads():
    """The cache stores keys and values as the card's attention holds them: H_kv heads, not
    their copies for each of the G query heads of a group."""
    model = small("llama")
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 97, (2, 5)), cache=cache)
    assert len(cache.kv) == 2  # one entry per layer
    for k, v in cache.kv.values():
        assert k.shape == v.shape == (2, 2, 5, 8)  # (B, H_kv, positions, d)


def test_rotate_half_computes_its_angle_tables_once():
    """RoPE lowered by structure (rotate_half) computes one angle table per width and base,
    shared by every layer, by queries and keys and by decoding steps, which slice it."""
    model = cardc.model("cards/qwen3.card", V=97, D=32, H=4, H_kv=2, d=8, D_f=48, N=2,
                        ctx=64).eval()
    names = type(model).forward.__globals__  # the generated file's
    angles, tables = names["ANGLES"], names["TABLES"]
    angles.clear()
    tables.clear()
    calls = []
    real = torch.Tensor.cos
    cache = model.new_cache()
    with torch.no_grad(), mock.patch.object(torch.Tensor, "cos", lambda x: calls.append(1) or
                                            real(x)):
        model(torch.randint(0, 97, (1, 5)), cache=cache)
        for _ in range(3):
            model(torch.randint(0, 97, (1, 1)), cache=cache)
    assert len(calls) == 1  # two layers, queries and keys, four steps: one table
    (pairs, d, width, base, _, dtype, inference), = tables  # made outside inference mode
    assert inference is False
    assert (pairs, d, width, base, dtype) == (False, 8, 8, model.theta_base, torch.float32)
    cos, sin, *_ = angles[pairs, 0, 5, d, None, model.theta_base, torch.device("cpu"), dtype,
                            False]
    phi = torch.arange(5, dtype=torch.float32)[:, None] * base ** -(
        torch.arange(0, d, 2, dtype=torch.float32) / d)
    assert torch.allclose(cos, phi.cos().repeat(1, 2))
    assert torch.allclose(sin, torch.cat([-phi.sin(), phi.sin()], dim=-1))
    cos, *_ = angles[pairs, 7, 1, d, None, model.theta_base, torch.device("cpu"), dtype,
                        False]
    phi = 7 * base ** -(torch.arange(0, d, 2, dtype=torch.float32) / d)  # the 8th position
    assert torch.allclose(cos[0], phi.cos().repeat(2))


def _generated(path: str):
    lib, checker, _ = build.checked([path], "cards")
    text = build.source(checker, build.find_card(lib, checker, path, None))
    return text, build.load_module(text, Path(path).stem)


@pytest.mark.parametrize("path, helper", [("cards/stablelm2.card", "rotate_half"),
                                          ("tests/cards/heads/interleaved_rotary.card",
                                           "rotate_pairs")])
def test_rotary_on_the_first_columns_turns_those_only(path, helper):
    """`[RoPE(X[:, 1 : r]), X[:, r + 1 : d]]` is one rotation whose tables leave the columns
    after r unturned (StableLM 2's card): it equals turning the first r columns and passing
    the rest through, in either convention."""
    text, mod = _generated(path)
    if helper == "rotate_half":
        body = text.split("def PartialRoPE")[1].split("\ndef ")[0]
        assert "width=d_r" in body and "torch.cat" not in body
    rotate = getattr(mod, helper)
    x = torch.randn(2, 3, 5, 12)
    turned = rotate(x, 100.0, past=4, width=8)
    assert torch.equal(turned[..., 8:], x[..., 8:])
    torch.testing.assert_close(turned[..., :8], rotate(x[..., :8], 100.0, past=4),
                               rtol=0, atol=1e-6)
    assert not torch.allclose(turned[..., :8], x[..., :8])


def test_a_window_mask_is_made_once_per_sizes():
    """A mask rule other than causality (Mistral's window) is made once per query and key
    counts and window, shared by every layer and by decoding steps of the same sizes; it is
    the rule's: position t sees t − w < t′ ≤ t."""
    model = cardc.model("cards/mistral.card", V=97, D=32, H=4, H_kv=2, d=8, D_f=48, N=3,
                        ctx=64, w=3).eval()
    values = type(model).forward.__globals__["VALUES"]  # the generated file's made-once values
    values.clear()

    def masks():  # a mask site's values: counted negative
        return {key: made for key, (made, _) in values.items() if key[0] < 0}

    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 5)), cache=cache)
        assert len(masks()) == 1  # three layers, one mask
        (site, inference, queries, keys, _, dtype, w, first), = masks()
        # SDPA's boolean; the first query at position 0 of the keys
        assert (inference, queries, keys, dtype, w, first) == (False, 5, 5, None, 3, 0)
        t = torch.arange(5)
        assert torch.equal(masks()[site, False, 5, 5, torch.device("cpu"), None, 3, 0],
                           (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - 3))
        for _ in range(3):  # each step: one new query against the w − 1 kept keys and itself,
            model(torch.randint(0, 97, (1, 1)), cache=cache)  # all visible: no mask at all
        assert len(masks()) == 1  # not even looked up
        model(torch.randint(0, 97, (1, 2)), cache=cache)  # two queries: the first misses one
        assert masks()[site, False, 2, 4, torch.device("cpu"), None, 3, 2].tolist() == [
            [True, True, True, False], [False, True, True, True]]


def test_a_capped_core_adds_its_mask_as_a_bias_in_the_scores_type():
    """Soft-capped attention (Gemma 2) masks its scores by adding a bias made once per sizes
    and type, 0 where the window shows a key and −∞ where it hides one; its queries carry the
    scale and the cap's division, so the scores are scaled once."""
    model = cardc.model("cards/gemma2.card", V=97, D=32, H=4, H_kv=2, d=8, D_f=48, N=2,
                        ctx=64, w=3, s=8, c_attn=50.0, c_f=30.0).eval()
    source = inspect.getsource(type(model).forward.__globals__["SoftCappedHead"])
    assert "S = (Q / (math.sqrt(s) * c_attn)) @ K.transpose(-2, -1)" in source
    assert "masked_fill" not in source
    values = type(model).forward.__globals__["VALUES"]
    values.clear()
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 5)))
    biases = {key: bias for key, (bias, _) in values.items() if key[0] < 0 and bias is not None}
    assert {key[5] for key in biases} == {torch.float32} and len(biases) == 2  # local, global
    t = torch.arange(5)
    window = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - 3)
    assert any(torch.equal(bias, torch.zeros(5, 5).masked_fill(~window, -math.inf))
               for bias in biases.values())


def test_cache_refuses_to_run_past_the_context():
    model = small("gpt2")
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 20)), cache=cache)
        with pytest.raises(ValueError, match="sequence length 25 exceeds the model's 24"):
            model(torch.randint(0, 97, (1, 5)), cache=cache)


def test_cache_new_feeds_only_unseen_tokens_and_restarts_when_the_window_moves():
    model = small("gpt2")
    cache = model.new_cache()
    x = torch.arange(10)[None]
    assert torch.equal(cache.new(x[:, :4]), x[:, :4])
    cache.pos = 4
    assert torch.equal(cache.new(x[:, :6]), x[:, 4:6])  # the two tokens after the cached four
    cache.pos = 6
    assert torch.equal(cache.new(x[:, 1:7]), x[:, 1:7])  # the window moved: start over
    assert cache.pos == 0 and not cache.kv


@pytest.mark.parametrize("card", list(FAMILIES))
def test_cached_sampling_equals_recomputation_past_the_context(card):
    """The built-in sampler, greedy, 30 tokens after a 10-token prompt with a 24-token context:
    the window slides, the cache starts over each step, the tokens are the same."""
    model = small(card)
    prompt = torch.randint(0, 97, (2, 10))
    cached = generate(model, prompt, 30, temperature=0)
    plain = generate(Uncached(model), prompt, 30, temperature=0)
    assert torch.equal(cached, plain)
    # the model's own generate, through a static cache of its context: each start-over a
    # prefill of the whole context into it
    assert torch.equal(model.generate(prompt, 30, temperature=0, static=True), plain)


@pytest.mark.parametrize("card", list(FAMILIES))
def test_sampling_card_decodes_with_the_cache(card):
    """The sampling card, bound to the family's card, lowers `P ← M(x[s : ℓ + i − 1] | θ̂)`,
    of which it reads the last row only, to cached decoding; its greedy continuation equals
    recomputation."""
    checker, alg = sampler_for(card)
    text = build.source(checker, alg)
    assert ".new_cache()" in text and "cache=cache" in text
    sampler = build.procedure_function(checker, alg)
    model = small(card)
    prompt = torch.randint(0, 97, (1, 6))
    with torch.no_grad():
        out = sampler(prompt, model, l_gen=12, tau=0, k=97, p=1.0, T_max=24)
    plain = generate(Uncached(model), prompt, 12, temperature=0)[:, 6:]
    assert torch.equal(out, plain)


@pytest.mark.parametrize("card", list(FAMILIES))
def test_generated_generate_is_greedy_argmax_without_the_cache(card):
    """model.generate at temperature 0, 30 tokens after a 4-token prompt (past GPT-2's
    24-token context): each token is the argmax of the model's logits recomputed without a
    cache over the tokens it reads; top_k=1 and a tiny top_p at any temperature are greedy."""
    model = small(card)
    prompt = torch.randint(0, 97, (2, 4))
    out = model.generate(prompt, 30, temperature=0)
    window = getattr(model, "max_seq_len", None) or out.shape[1]
    expected = prompt
    with torch.no_grad():
        for _ in range(30):
            step = model(expected[:, -window:])[:, -1].argmax(-1, keepdim=True)
            expected = torch.cat([expected, step], dim=1)
    assert torch.equal(out, expected)
    assert torch.equal(model.generate(prompt, 30, temperature=3.0, top_k=1), out)
    assert torch.equal(model.generate(prompt, 30, temperature=3.0, top_p=1e-6), out)


def test_generated_generate_samples_reproducibly_and_top_p_one_changes_nothing():
    model = small("gpt2")
    prompt = torch.randint(0, 97, (3, 2))

    def draw(**options) -> torch.Tensor:
        return model.generate(prompt, 10, generator=torch.Generator().manual_seed(7), **options)

    assert torch.equal(draw(top_p=1.0), draw())
    assert torch.equal(draw(top_k=5, top_p=0.9), draw(top_k=5, top_p=0.9))
    assert draw().shape == (3, 12) and torch.equal(draw()[:, :2], prompt)


def test_every_generated_decoder_has_generate_and_imports_only_torch():
    """generate() and the token picking it copies from cardc.runtime.logits are in every
    generated model with a cache: an encoder–decoder's takes its source first."""
    import ast

    sources = {"bart": "z", "t5": "z"}
    for path in sorted(Path("generated").glob("*.py")):
        text = path.read_text()
        if "def new_cache" not in text:
            continue
        source = f"{sources[path.stem]}, " if path.stem in sources else ""
        assert f"def generate(self, {source}idx, max_new_tokens" in text, path
        assert "def pick_token(" in text and "def filter_logits(" in text
        imported = {n.names[0].name.split(".")[0] if isinstance(n, ast.Import) else
                    (n.module or "").split(".")[0]
                    for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Import | ast.ImportFrom)}
        assert imported <= {"torch", "math"}, (path, imported)


@pytest.mark.parametrize("k, p", [(1, 1.0), (5, 0.8), (97, 1.0), (97, 0.3), (200, 1e-6)])
def test_the_sampling_cards_filters_draw_as_the_built_in_sampler(k, p):
    """LMSampling's `q ∝ top_p(top_k(exp(z/τ) | k) | p)`, lowered, draws the tokens
    cardc.runtime.sample.generate draws with the same top_k, top_p and seed: one filter."""
    checker, alg = sampler_for("gpt2")
    sampler = build.procedure_function(checker, alg)
    model = small("gpt2")
    prompt = torch.randint(0, 97, (2, 5))
    torch.manual_seed(3)
    with torch.no_grad():
        card = sampler(prompt, model, l_gen=10, tau=0.9, k=k, p=p, T_max=24)
    torch.manual_seed(3)
    built_in = generate(model, prompt, 10, temperature=0.9, top_k=k, top_p=p)[:, 5:]
    assert torch.equal(card, built_in)


def test_a_sampling_cards_loop_ends_when_its_caller_says_stop():
    """The generated sampler tells `stop` each token it draws, (B,), and ends its loop when
    `stop` says so (cardc sample --stop)."""
    checker, alg = sampler_for("gpt2")
    sampler = build.procedure_function(checker, alg)
    model = small("gpt2")
    prompt = torch.randint(0, 97, (2, 3))
    told = []

    def stop(y: torch.Tensor) -> bool:
        told.append(y.clone())
        return len(told) == 4

    with torch.no_grad():
        full = sampler(prompt, model, l_gen=10, tau=0, k=97, p=1.0, T_max=24)
        cut = sampler(prompt, model, l_gen=10, tau=0, k=97, p=1.0, T_max=24, stop=stop)
    assert torch.equal(cut, full[:, :4]) and torch.equal(torch.stack(told, dim=1), full[:, :4])


def _held(free: torch.Tensor, stops: set[int]) -> torch.Tensor:
    """Greedy rows `free` (B, n) as they read with stop tokens: each row as drawn up to its
    first stop token, that token from then on; cut after the step where every row has one."""
    out, ends = free.clone(), []
    for row in range(free.shape[0]):
        hits = [t for t in range(free.shape[1]) if int(free[row, t]) in stops]
        if hits:
            out[row, hits[0]:] = free[row, hits[0]]
        ends.append(hits[0] + 1 if hits else free.shape[1])
    return out[:, :max(ends)]


@pytest.mark.parametrize("card", list(FAMILIES))
def test_generate_holds_a_row_at_its_stop_token_and_ends_when_every_row_has(card):
    """generate(…, stop_tokens=S), generated and built in alike: a row that draws a token of S
    repeats it; generation ends once every row has drawn one (here sooner than asked)."""
    model = small(card)
    prompt = torch.randint(0, 97, (3, 4))
    free = model.generate(prompt, 12, temperature=0)[:, 4:]
    for stops in ({int(free[0, 2])}, {int(t) for t in free[:, 3]}):
        want = torch.cat([prompt, _held(free, stops)], dim=1)
        assert torch.equal(model.generate(prompt, 12, temperature=0, stop_tokens=stops), want)
        assert torch.equal(generate(model, prompt, 12, temperature=0, stop_tokens=stops), want)
    assert model.generate(prompt, 12, temperature=0, stop_tokens={int(t) for t in free[:, 3]}
                          ).shape[1] <= 4 + 4
    assert torch.equal(model.generate(prompt, 12, temperature=0, stop_tokens=set()),
                       torch.cat([prompt, free], dim=1))


# ------------------------------------------------------------------ every model card

# Causal language models among the cards that decode by recomputing every position, each for
# its reason: the lowering proves no cache for them (cardc.lower.analysis).
RECOMPUTING = {
    "DTransformer": "its heads' mask is a tensor hyperparameter (the paper's Algorithm 10)",
    "EDTransformer": "the same (the paper's Algorithm 8)",
    "ExplicitMask": "the same: a rule given to a hyperparameter `Mask` of its head",
    "LatentDecoder": "its scores sum two products: no rule recognises the attention",
}

# Models whose float32 rounding alone takes the cache's logits past the walk's tolerance: T5's
# scores and logits are not scaled, and its tiny preset (D 128) with the walk's weights gives
# logits up to 6.9, which chunks through the cache miss by 7.2e-5 in float32 (1.05e-5 of their
# size; a prefix recomputed alone, without a cache, by 1.4e-5) and by 6.8e-14 in float64. Their
# cache is checked in float64, against a tolerance far tighter than float32's.
FLOAT64_VALUES = {"T5"}


@pytest.fixture(scope="module")
def walked():
    paths = sorted(str(p.relative_to(ROOT)) for folder in ("cards", "tests/cards")
                   for p in (ROOT / folder).rglob("*.card"))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        return walk_models(paths)


def test_walk_every_model_with_a_cache_decodes_as_full_recomputation(walked):
    """Every language model card of the library and of the tests that gets `new_cache()`
    decodes in chunks through it as full recomputation does, logits and greedy tokens; every
    causal one that does not get it is listed as recomputing."""
    causal = {name for name, model, _, _ in walked if is_causal(model)}
    assert len(causal) >= 12
    cached = [(name, model) for name, model, _, _ in walked if hasattr(model, "new_cache")]
    assert {name for name, _ in cached} <= causal
    assert causal - {name for name, _ in cached} == set(RECOMPUTING)
    for name, model in cached:
        with torch.no_grad():
            g = torch.Generator().manual_seed(3)
            for p in model.parameters():  # far from the small initial weights, as trained ones
                p.add_(0.1 * torch.randn(p.shape, generator=g))  # are: positions then matter
        try:
            if name in FLOAT64_VALUES:
                model = model.double()
            inputs, tolerance = token_inputs(model, 14, 2), 1e-9 if name in FLOAT64_VALUES \
                else 1e-5
            check_incremental_decoding(model, inputs, tolerance=tolerance)
            check_static_decoding(model, inputs, tolerance=tolerance)  # every one takes it
        except AssertionError as err:
            raise AssertionError(f"{name}: {err}") from None


@pytest.mark.parametrize("card, sizes, inputs", [
    ("latent_attention", dict(V=50, D=32, H=4, D_c=8, d_r=4, N=2), 1),
    ("token_context", dict(V=50, D=32, H=4, N=2), 1),
])
def test_an_attention_no_rule_lowers_to_the_cache_leaves_the_model_recomputing(card, sizes,
                                                                                inputs):
    """A latent attention whose scores sum two products (DeepSeek-V2's rotary part beside the
    latent one) and T5-like scores with a bias by distance are softmaxes no rule recognises:
    they would read the new tokens' keys only. Other steps that read the cache (RoPE's
    positions in a function, joined projections) once gave these models `new_cache()`, which
    decoded 9.6 and 7.5 away from recomputation; they recompute, and say so in their analysis.
    So does a cross-attention whose keys are the decoder's own tokens (14.3 away, and called
    causal): only keys that depend on no decoded token (an encoder's) need no cache."""
    torch.manual_seed(0)
    model = cardc.model(f"tests/cards/decoding/{card}.card", **sizes).eval()
    assert not hasattr(model, "new_cache") and not hasattr(model, "generate")
    assert not model.analysis.decodes
    xs = [torch.randint(0, sizes["V"], (2, 12)) for _ in range(inputs)]
    with torch.no_grad():
        assert model(*xs).shape == (2, 12, sizes["V"])
