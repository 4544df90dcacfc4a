"""Whether a generated model decodes through its KV cache as full recomputation does: a check
any test can call on any model (the walk over model cards in tests/test_decoding.py, a
generator of random cards), and the walk's own helpers.

`check_incremental_decoding(model, inputs)` feeds the last input in chunks through
`model.new_cache()` and compares the logits with one forward over the whole input, then
continues a prompt greedily through the cache and compares each token with the argmax of the
logits recomputed without a cache, and checks that gradients flow through the cache as
through full recomputation (`check_cached_gradients`). It raises AssertionError saying what
differs.
"""

from __future__ import annotations

import copy

import torch

from cardc.build import checked, instantiate, model_cards, source
from cardc.info import preset_values
from cardc.lower.cards import Lowering
from cardc.lower.values import local_name

# the sizes of a model card without a `tiny` preset (each card takes those it declares)
SIZES = dict(V=61, D=32, H=4, N=2, D_f=40, H_kv=2, ctx=24, w=3, D_c=8, d_r=4)


def check_incremental_decoding(model, inputs: list[torch.Tensor],
                               chunks: tuple[int, ...] = (5, 1, 1, 4), tokens: int = 6,
                               tolerance: float = 1e-5) -> None:
    """`model(*inputs)`, its last input fed in chunks of these sizes (the rest last) through
    `model.new_cache()`, gives the same logits, within `tolerance` of their largest magnitude
    (float32 rounding grows with the logits); and `tokens` greedy tokens after the first
    chunk, drawn through the cache, are those recomputation draws. The other inputs (an
    encoder's source) are given whole at each call."""
    *prefix, x = inputs
    with torch.no_grad():
        full = model(*prefix, x)
        cache = model.new_cache()
        rows = _decoded(model, prefix, x, chunks, cache)
        assert cache.pos == x.shape[-1], f"the cache counts {cache.pos} of {x.shape[-1]} tokens"
        worst = (rows - full).abs().max().item()
        assert worst <= tolerance * max(1.0, full.abs().max().item()), \
            f"incremental logits are {worst:.3g} away from full recomputation"
        cached, plain = _greedy(model, prefix, x[..., :chunks[0]], tokens)
    assert torch.equal(cached, plain), \
        f"greedy tokens through the cache {cached.tolist()} != recomputed {plain.tolist()}"
    # gradients in float64: one that cancels to almost nothing (a key bias's under softmax,
    # 0 in exact arithmetic) is, in float32, the rounding of terms far larger than itself; a
    # cache that drops or misroutes gradients is off by their own size in any format
    check_cached_gradients(copy.deepcopy(model).double(), inputs, chunks, tolerance)


def check_static_decoding(model, inputs: list[torch.Tensor],
                          chunks: tuple[int, ...] = (5, 1, 1, 4),
                          tolerance: float = 1e-5) -> None:
    """Through `model.new_cache(length=…)`, a static cache of 3 positions more than the last
    input holds (at most the model's context), fed in chunks as check_incremental_decoding
    does: the same logits as one forward over the whole input."""
    *prefix, x = inputs
    with torch.no_grad():
        full = model(*prefix, x)
        cache = model.new_cache(length=min(x.shape[-1] + 3, getattr(model, "max_seq_len",
                                                                     x.shape[-1] + 3)))
        rows = _decoded(model, prefix, x, chunks, cache)
    assert int(cache.pos) == x.shape[-1], f"the static cache counts {int(cache.pos)} tokens"
    worst = (rows - full).abs().max().item()
    assert worst <= tolerance * max(1.0, full.abs().max().item()), \
        f"logits through a static cache are {worst:.3g} away from full recomputation"


def check_cached_gradients(model, inputs: list[torch.Tensor],
                           chunks: tuple[int, ...] = (5, 1, 1, 4),
                           tolerance: float = 1e-5) -> None:
    """In training mode, with gradients: a loss over the logits of every position, the last
    input fed in chunks through `model.new_cache()`, has the gradients with respect to each
    parameter that the same loss has over one forward of the whole input, within `tolerance`
    of the largest of them. A later chunk reads the keys and values the earlier ones left in
    the cache, so their gradients reach the parameters only if the cache passes them on."""
    *prefix, x = inputs
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    mode = model.training
    model.train()
    try:
        with torch.enable_grad():
            full = model(*prefix, x)
            weight = torch.linspace(-1, 1, full.numel(), dtype=full.dtype).reshape(full.shape)
            want = torch.autograd.grad((full * weight).sum(), [p for _, p in params],
                                       allow_unused=True)
            rows = _decoded(model, prefix, x, chunks, model.new_cache())
            got = torch.autograd.grad((rows * weight).sum(), [p for _, p in params],
                                      allow_unused=True)
    finally:
        model.train(mode)
    for (name, _), a, b in zip(params, want, got, strict=True):
        assert (a is None) == (b is None), f"{name} has a gradient only one way"
        if a is not None:
            worst = (a - b).abs().max().item()
            assert worst <= tolerance * max(1.0, a.abs().max().item()), \
                f"the gradient of {name} through the cache is {worst:.3g} away from full " \
                f"recomputation's"


def _decoded(model, prefix: list[torch.Tensor], x: torch.Tensor, chunks: tuple[int, ...],
             cache) -> torch.Tensor:
    """The logits of x fed through `cache` in chunks of these sizes (the rest last)."""
    bounds = [0]
    for size in chunks:
        bounds.append(min(bounds[-1] + size, x.shape[-1]))
    bounds.append(x.shape[-1])
    return torch.cat([model(*prefix, x[..., a:b], cache=cache)
                      for a, b in zip(bounds, bounds[1:], strict=False) if b > a], dim=-2)


def _greedy(model, prefix: list[torch.Tensor], prompt: torch.Tensor, tokens: int):
    """`tokens` greedy continuations of `prompt`, through a cache and by recomputation."""
    cache = model.new_cache()
    logits = model(*prefix, prompt, cache=cache)
    seq, plain = prompt, prompt
    for _ in range(tokens):
        step = logits[..., -1, :].argmax(-1, keepdim=True)
        seq = torch.cat([seq, step], dim=-1)
        logits = model(*prefix, step, cache=cache)
        again = model(*prefix, plain)[..., -1, :].argmax(-1, keepdim=True)
        plain = torch.cat([plain, again], dim=-1)
    return seq, plain


def token_inputs(model, length: int, seed: int) -> list[torch.Tensor]:
    """Random tokens for each input of a walked model, from its own vocabulary."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, n, (2, length), generator=g) for n in model.vocabularies]


def is_causal(model) -> bool:
    """Whether the logits of a position ignore the tokens after it (of the last input): the
    model run twice, the second time with its last 4 tokens changed."""
    xs = token_inputs(model, 12, 1)
    ys = [*xs[:-1], xs[-1].clone()]
    ys[-1][:, 8:] = (ys[-1][:, 8:] + 1) % model.vocabularies[-1]
    with torch.no_grad():
        a, b = model(*xs), model(*ys)
    return torch.equal(a[:, :8], b[:, :8])


def walk_models(paths: list[str]) -> list[tuple[str, object, str, bool]]:
    """(name, an instance of its fused module, its source, whether its attention's mask is a
    tensor hyperparameter) of every language model card in `paths` (run from the repository's
    root), at its `tiny` preset (or SIZES), parameters moved far from their small initial
    values, as trained ones are: positions then matter."""
    lib, checker, _ = checked(paths, "cards")
    out = []
    for alg in model_cards(lib, checker):
        sig = checker.info(alg).sig
        if not Lowering.is_language_model(sig):
            continue
        values = dict(SIZES)
        if any(p.name == "tiny" for p in alg.presets):
            values = dict(preset_values(sig, "tiny", {}))
        torch.manual_seed(0)  # its initial weights whatever ran before it in this process
        model, _ = instantiate(checker, alg, {local_name(k): v for k, v in values.items()})
        model.vocabularies = [int(ty.vocab.evaluate(values)) for _, ty in sig.inputs]
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
        out.append((alg.name, model.eval(), source(checker, alg), _mask_argument(checker, alg)))
    return out


def _mask_argument(checker, alg) -> bool:
    """Whether a card the model calls takes its attention mask as a tensor hyperparameter
    (`Mask ∈ {0,1}^{T×T}`, built by its caller from a rule)."""
    seen, todo = set(), [alg]
    while todo:
        card = todo.pop()
        if id(card) in seen:
            continue
        seen.add(id(card))
        info = checker.info(card)
        if any(ty.shape for ty in info.sig.hypers.values()):
            return True
        todo += [call.callee for call in info.calls.values()]
    return False
