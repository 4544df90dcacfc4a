"""`cardc train --compile`: the generated models trace whole under torch.compile (no graph
break: `fullgraph=True` raises at the first one), and the traced graph gives eager's loss and
gradients. The `aot_eager` backend traces forward and backward as inductor would, without its
minute of C++ compilation per model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import cardc

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(V=97, D=32, H=4, D_f=48, N=2, ctx=24)
FAMILIES = {"gpt2": SMALL, "llama": {**SMALL, "H_kv": 2}, "bert": {**SMALL, "types": 2}}


@pytest.mark.parametrize("card", FAMILIES)
def test_generated_model_compiles_without_graph_breaks(card):
    torch.manual_seed(0)
    model = cardc.model(f"cards/{card}.card", **FAMILIES[card])
    x = torch.randint(0, 97, (2, 16))
    inputs = (x, torch.zeros_like(x)) if card == "bert" else (x,)  # BERT: token types

    def loss_and_grads(m):
        out = m(*inputs)
        loss = out[0].square().mean() if isinstance(out, tuple) else out.square().mean()
        grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
        return loss, grads

    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    loss_c, grads_c = loss_and_grads(compiled)
    loss_e, grads_e = loss_and_grads(model)
    assert torch.allclose(loss_c, loss_e, rtol=0, atol=1e-6)
    for gc, ge in zip(grads_c, grads_e, strict=True):
        assert (gc is None) == (ge is None)
        if gc is not None:
            assert torch.allclose(gc, ge, rtol=0, atol=1e-6)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_loss_a_few_rows_at_a_time_compiles(backend):
    """forward(x, nll=…) (cardc.lower.likelihood) traces whole, its chunks' checkpoints too,
    and gives eager's log-likelihood and gradients."""
    torch.manual_seed(0)
    model = cardc.model("cards/gpt2.card", **SMALL)
    type(model).forward.__globals__["LOGITS_AT_ONCE"] = 2 * 97 * 4  # chunks of 4 rows
    x = torch.randint(0, 97, (2, 16))
    nll = (torch.arange(15), x[:, 1:])

    def loss_and_grads(m):
        loss = m(x, nll=nll).sum()
        return loss, torch.autograd.grad(loss, list(model.parameters()))

    loss_c, grads_c = loss_and_grads(torch.compile(model, backend=backend, fullgraph=True))
    loss_e, grads_e = loss_and_grads(model)
    assert torch.allclose(loss_c, loss_e, rtol=0, atol=1e-5)
    for gc, ge in zip(grads_c, grads_e, strict=True):
        assert torch.allclose(gc, ge, rtol=0, atol=1e-5)


def test_a_compiled_training_run_gives_eagers_losses(tmp_path, monkeypatch):
    """`cardc train --compile` (inductor): the recipe's steps through the compiled model, its
    loss a few rows at a time, make the updates eager makes, from one graph."""
    import json

    monkeypatch.chdir(tmp_path)
    losses = {}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    for compile in (False, True):
        cardc.train(str(ROOT / "cards" / "gpt2.card"), preset="tiny",
                    overrides={"D": 32, "N": 2, "D_f": 64}, steps=4, batch_size=2,
                    block_size=32, eval_every=2, out=f"run{int(compile)}", device="cpu",
                    compile=compile)
        with open(f"run{int(compile)}/metrics.jsonl", encoding="utf-8") as f:
            losses[compile] = [json.loads(line)["train_loss"] for line in f
                               if "train_loss" in json.loads(line)]
    assert len(losses[True]) == 3
    assert max(abs(a - b) for a, b in zip(losses[True], losses[False], strict=True)) < 1e-5
    # every step one graph, forward and loss, traced once: no break, no recompilation
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["graph_break"]


DECODERS = {"gpt2": {**SMALL, "ctx": 64}, "llama": {**SMALL, "H_kv": 2, "ctx": 64},
            "bloom": dict(V=97, D=32, H=4, N=2),  # ALiBi: its slopes and biases made once
            "mistral": dict(V=97, w=6), "gemma2": dict(V=97, w=6),  # sliding windows
            "recurrent": dict(V=97)}  # a recurrence's state carried from token to token
TINY = {"mistral", "gemma2", "recurrent"}  # built at their tiny presets


@pytest.mark.parametrize("card", DECODERS)
def test_cached_decoding_compiles_to_a_few_graphs(card):
    """A whole generation through the growing KV cache, traced: a prefill and decode steps make at most
    three graphs (the decode step's first, then one whose positions are symbols), however many
    tokens follow, and every step gives eager's logits. The position tables, masks and values
    made once are made in the graph instead of read from their memos (whose sizes would be
    guards), so no token recompiles."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    preset = "tiny" if card in TINY else None
    model = cardc.model(f"cards/{card}.card", preset, **DECODERS[card]).eval()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 97, (2, 9), generator=g)
    with torch.no_grad():
        eager_cache, traced_cache = model.new_cache(), model.new_cache()
        for _ in range(20):
            want, got = model(x, cache=eager_cache), compiled(x, cache=traced_cache)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            x = want[:, -1:].argmax(-1)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 3


@pytest.mark.parametrize("card", DECODERS)
def test_a_static_cache_decodes_in_two_graphs(card):
    """Through a static cache (`new_cache(length=…)`: keys and values written in place in
    buffers of every position, its position a tensor) a whole generation is two graphs, the
    prefill's and the decode step's, and every step gives the growing cache's eager logits:
    learned positions (GPT-2), RoPE (Llama), ALiBi (BLOOM), sliding windows (Mistral) and soft
    caps over windows (Gemma 2), past the window, and a recurrence's state (its copy held:
    a view of the prefill's rows would be another layout, another graph)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    preset = "tiny" if card in TINY else None
    model = cardc.model(f"cards/{card}.card", preset, **DECODERS[card]).eval()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager_cache, static_cache = model.new_cache(), model.new_cache(length=40)
        for _ in range(20):
            want, got = model(x, cache=eager_cache), compiled(x, cache=static_cache)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            x = want[:, -1:].argmax(-1)
    assert int(static_cache.pos) == 28
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


@pytest.mark.parametrize("card", ["t5", "bart"])
def test_an_encoder_decoder_decodes_in_two_graphs(card):
    """T5's and BART's decoding through a static cache, traced whole: the source encoded once
    (the trace knows it by identity, and asserts its values unchanged), two graphs, eager's
    logits; a source written over in place after it was encoded is an error, not a stale
    encoding."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = cardc.model(f"cards/{card}.card", "tiny").eval()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    g = torch.Generator().manual_seed(1)
    z, x = torch.randint(0, 50, (2, 11), generator=g), torch.randint(0, 50, (2, 5), generator=g)
    with torch.no_grad():
        eager_cache, static_cache = model.new_cache(), model.new_cache(length=24)
        for _ in range(12):
            want, got = model(z, x, cache=eager_cache), compiled(z, x, cache=static_cache)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            x = want[:, -1:].argmax(-1)
        z.add_(1)
        with pytest.raises(RuntimeError, match="the source was written over after this cache"):
            compiled(z, x, cache=static_cache)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


@pytest.mark.parametrize("static", [False, True])
def test_cached_decoding_compiles_with_inductor(static):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = cardc.model("cards/llama.card", **{**SMALL, "H_kv": 2, "ctx": 64}).eval()
    compiled = torch.compile(model, fullgraph=True)  # inductor
    x = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager_cache = model.new_cache()
        traced_cache = model.new_cache(length=32) if static else model.new_cache()
        for _ in range(12):
            want, got = model(x, cache=eager_cache), compiled(x, cache=traced_cache)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            x = want[:, -1:].argmax(-1)
    if static:
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


def test_generate_through_a_static_cache_traces_its_forward_twice():
    """`generate(…, static=True)` with its forward under torch.compile: the tokens eager
    greedy decoding gives, from two graphs."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = cardc.model("cards/llama.card", **{**SMALL, "H_kv": 2, "ctx": 64}).eval()
    prompt = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(2))
    want = model.generate(prompt, 16, temperature=0)
    model.forward = torch.compile(model.forward, backend="aot_eager", fullgraph=True)
    assert torch.equal(model.generate(prompt, 16, temperature=0, static=True), want)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


def test_a_static_cache_refuses_what_it_cannot_hold():
    """More positions than it holds, a length past the model's context, another batch (its
    keys would be lost), and gradients (its buffers are written over): each a message saying
    so."""
    model = cardc.model("cards/gpt2.card", **DECODERS["gpt2"]).eval()
    with pytest.raises(ValueError, match="a cache of 65 positions exceeds the model's 64"):
        model.new_cache(length=65)
    cache = model.new_cache(length=10)
    with torch.no_grad():
        model(torch.zeros(1, 9, dtype=torch.long), cache=cache)
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="this static cache holds 10 positions: 11 do not"):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
        cache = model.new_cache(length=10)
        model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match=r"holds keys for \(1, 4\), not \(2, 4\)"):
            model(torch.zeros(2, 1, dtype=torch.long), cache=cache)  # another batch
    with pytest.raises(ValueError, match="a static cache .* decodes without gradients"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=model.new_cache(length=8))

