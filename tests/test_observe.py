"""`cardc.run_with_cache` and `cardc.run_with_hooks`: every value a card names, read and replaced
by its key (cardc.runtime.observe, cardc.lower.observe).

Every shipped model card's observed twin computes what its fast model computes; keys follow the
card (module path, function card, name, step where a name is written at several); hooks replace
values for the steps after them; gradients reach the model's own parameters; a key that names
nothing is an error that suggests the keys near it. The comparison with TransformerLens is
tests/test_observe_lens.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import cardc
from cardc import run_with_cache, run_with_hooks
from cardc.build import checked, find_card, library_roots
from cardc.runtime.observe import observed, observing

ROOT = Path(__file__).resolve().parent.parent
MODELS = sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("cards/*.card"),
                                                      *ROOT.glob("cards/paper/*transformer.card")]
                if re.search(r"^Preset tiny", p.read_text(encoding="utf-8"), re.M))


def _inputs(card: str, model) -> list[torch.Tensor]:
    """Random inputs of the card's own kinds: token IDs from its vocabulary, or real tensors."""
    lib, checker, _ = checked([card], library_roots([card], None), lazy=True)
    sig = checker.info(find_card(lib, checker, card, None)).sig
    hypers = model.card_meta["hyperparameters"]
    g = torch.Generator().manual_seed(0)
    out = []
    for _, ty in sig.inputs:
        if ty.elem == "ℝ":
            out.append(torch.randn(2, *(int(d.evaluate(hypers)) for d in ty.shape), generator=g))
        else:
            out.append(torch.randint(0, int(ty.vocab.evaluate(hypers)), (2, 9), generator=g))
    return out


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("card", MODELS)
def test_observed_model_computes_what_the_model_does(card, monkeypatch):
    monkeypatch.chdir(ROOT)
    model = cardc.model(card, "tiny").eval()
    with torch.no_grad():  # far from the initial values: γ = 1 and zero biases hide nothing
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
        xs = _inputs(card, model)
        want = _first(model(*xs))
        got, cache = run_with_cache(model, *xs)
    got = _first(got)
    scale = max(1.0, want.abs().max().item())
    assert (got - want).abs().max().item() <= 2e-5 * scale, card
    assert len(cache) > 10
    for key in cache:
        assert re.fullmatch(r"[\w.]+\.card:\d+", cache.line(key)), (key, cache.line(key))


@pytest.fixture(scope="module")
def gpt2():
    model = cardc.model(str(ROOT / "cards" / "gpt2.card"), None, V=50, D=24, H=3, D_f=32,
                        N=2, ctx=16).eval()
    tokens = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    return model, tokens


def test_keys_follow_the_card(gpt2):
    model, x = gpt2
    _, cache = run_with_cache(model, x)
    shapes = {k: tuple(cache[k].shape) for k in cache}
    # GPT2Block writes X at steps 1 and 2; on entry it is X@0
    assert shapes["block.1.X@0"] == shapes["block.1.X@1"] == shapes["block.1.X@2"] == (2, 7, 24)
    # the heads on the axis after the batch; S before (step 4) and after (step 5) the mask
    assert shapes["block.0.attn.AttentionHead.S@4"] == (2, 3, 7, 7)
    assert shapes["block.0.attn.AttentionHead.Q"] == (2, 3, 7, 8)
    assert shapes["block.0.attn.Y_h"] == (2, 3, 7, 8)
    # LayerNorm is called at two steps of the block: each its own
    assert shapes["block.0.LayerNorm@1.v"] == shapes["block.0.LayerNorm@2.v"] == (2, 7)
    assert shapes["LayerNorm.e_hat"] == (2, 7, 24)  # the final norm, at one step of GPT2
    # E ← GPT2Block(E) runs once per layer: numbered from 1
    assert torch.equal(cache["E@3[2]"], cache["block.1.X@2"])
    assert cache.line("block.0.X@1") == "gpt2.card:31"
    masked = cache["block.0.attn.AttentionHead.S@5"]
    assert masked.triu(1).isneginf()[..., 0, 1:].all() and not masked.tril().isinf().any()
    with pytest.raises(KeyError, match=r"computed 2 times in this forward: ask for E@3\[1\]"):
        cache["E@3"]
    with pytest.raises(KeyError, match=r"did you mean block\.0\.attn\.AttentionHead\.S@4"):
        cache["block.0.attn.S"]


def test_names_keep_only_what_is_asked(gpt2):
    model, x = gpt2
    _, cache = run_with_cache(model, x, names="block.*.attn.AttentionHead.S@5")
    assert sorted(cache) == ["block.0.attn.AttentionHead.S@5", "block.1.attn.AttentionHead.S@5"]


def test_hooks_replace_values_for_the_steps_after(gpt2):
    model, x = gpt2
    with torch.no_grad():
        clean = model(x)
        same = run_with_hooks(model, x, hooks={"block.*.X@1": lambda v, site: None})
        torch.testing.assert_close(same, clean, atol=1e-5, rtol=1e-5)
        seen = []

        def silence(value, site):  # every head's output of the second layer: zero
            seen.append((site.key, site.line, site.occurrence))
            return torch.zeros_like(value)

        _, cache = run_with_cache(model, x, hooks={"block.1.attn.Y_h": silence})
        assert seen == [("block.1.attn.Y_h", "attention.card:24", 1)]
        assert not cache["block.1.attn.Y_h"].any()  # the cache holds what the steps read
        b = model.block[1].attn.b_o
        torch.testing.assert_close(cache["block.1.attn.Y@3"], b.expand(2, 7, 24))
        # E@3[1] only: the first time the layer loop's step runs
        first = run_with_hooks(model, x, hooks={"E@3[1]": lambda v, s: torch.zeros_like(v)})
        torch.testing.assert_close(first, run_with_hooks(
            model, x, hooks={"block.1.X@0": lambda v, s: torch.zeros_like(v)}))


def test_bad_hooks_are_refused_by_name(gpt2):
    model, x = gpt2
    with pytest.raises(KeyError, match=r"no value is keyed 'block\.0\.X'; did you mean "
                                       r"block\.0\.X@0, block\.0\.X@1, block\.0\.X@2"):
        run_with_hooks(model, x, hooks={"block.0.X": lambda v, s: v})
    with pytest.raises(ValueError, match=r"the hook on block\.0\.X@1 returned \(2, 7\); "
                                         r"the value is \(2, 7, 24\)"):
        run_with_hooks(model, x, hooks={"block.0.X@1": lambda v, s: v[..., 0]})


def test_gradients_reach_the_models_parameters(gpt2):
    model, x = gpt2
    model.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    out, _ = run_with_cache(model, x)
    out.square().mean().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], atol=1e-6, rtol=1e-4, msg=name)
    assert observed(model) is observed(model)  # made once, sharing the very tensors
    assert observed(model).W_e is model.W_e


def test_observing_needs_a_run_and_a_card():
    with pytest.raises(RuntimeError, match="only inside cardc.run_with_cache"):
        observing(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="only a model built from a card"):
        run_with_cache(torch.nn.Linear(2, 2), torch.zeros(2))


def test_a_trained_run_is_observed_from_its_checkpoint(tmp_path, monkeypatch):
    """`cardc.load` rebuilds a run's model from the cards its checkpoint records, and those
    cards are what its observed twin is lowered from: no card file is read from disk."""
    monkeypatch.chdir(tmp_path)
    card = tmp_path / "tiny.card"
    card.write_text((ROOT / "cards" / "gpt2.card").read_text(encoding="utf-8"), encoding="utf-8")
    cardc.train(str(card), preset="tiny", overrides={"D": 32, "N": 1, "D_f": 64}, steps=2,
                batch_size=2, block_size=16, eval_every=1, out="run", device="cpu")
    card.unlink()
    model = cardc.load("run")
    x = torch.tensor([list(b"The cat")])
    with torch.no_grad():
        logits, cache = run_with_cache(model, x)
        torch.testing.assert_close(logits, model(x), atol=1e-5, rtol=1e-5)
    assert cache["block.0.attn.AttentionHead.S@5"].shape == (1, 4, 7, 7)
