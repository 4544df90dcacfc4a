"""The training loss a few positions at a time (cardc.lower.likelihood): forward(…, nll=(rows,
targets)) of every shipped decoder equals the log-likelihood its logits give, in value and in
every parameter's gradient, whether its logits fit at once or come in chunks; the recipe's loss
reads it; chunks hold less than the full logits for the backward pass; a head that may mix
positions keeps the plain loss."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import cardc
from cardc import ir
from cardc.build import bind_recipe, checked, find_card, library_roots, source
from cardc.lower.likelihood import LOGITS_AT_ONCE, likelihood_step
from cardc.runtime import modelkit

ROOT = Path(__file__).resolve().parent.parent
DECODERS = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("cards/*.card")
                  if re.search(r"^Preset tiny", p.read_text(encoding="utf-8"), re.M))


def _built(card: str):
    model = cardc.model(str(ROOT / card), "tiny")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def _inputs(model) -> list[torch.Tensor]:
    """Token inputs: a source and a target for an encoder–decoder, else the tokens."""
    names = [n for n in model.forward.__code__.co_varnames[1:model.forward.__code__.co_argcount]
             if n not in ("targets", "nll", "cache")]
    g = torch.Generator().manual_seed(1)
    vocab = int(model.card_meta["hyperparameters"].get("V", 256))
    return [torch.randint(0, vocab, (2, 11), generator=g) for _ in names]


def _plain(model, xs, rows, targets) -> torch.Tensor:
    logp = torch.log_softmax(model(*xs)[..., rows, :], dim=-1)
    return logp.gather(-1, targets[..., None])[..., 0].sum(-1)


@pytest.mark.parametrize("card", DECODERS)
@pytest.mark.parametrize("at_once", [LOGITS_AT_ONCE, 2 * 256 * 3])  # whole; chunks of 3 rows
def test_the_likelihood_equals_the_logits(card, at_once, monkeypatch):
    model = _built(card)
    if not model.analysis.likelihood:  # BERT's hidden states, ViT's classes: no vocabulary
        assert "targets" not in inspect.signature(model.forward).parameters
        return
    monkeypatch.setitem(type(model).forward.__globals__, "LOGITS_AT_ONCE", at_once)
    xs = _inputs(model)
    rows, targets = torch.arange(0, 10), xs[-1][..., 1:]
    want = _plain(model, xs, rows, targets)
    want.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    got = model(*xs, nll=(rows, targets))
    assert got.shape == (2,)
    _close(got, want, "the log-likelihood")
    got.sum().backward()
    for name, g in grads.items():
        _close(dict(model.named_parameters())[name].grad, g, name)


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Within fp32 rounding of sums taken in another order: 1e-5 of the largest entry."""
    gap, scale = (got - want).abs().max().item(), max(1.0, want.abs().max().item())
    assert gap <= 1e-5 * scale, f"{what}: max |difference| {gap:.2e} (largest entry {scale:.3g})"


def test_chunks_keep_less_than_the_logits_for_backward(monkeypatch):
    """What autograd saves of the logits (tensors over the vocabulary, V = 256) for the
    backward pass: with chunks, none of every position's (B·T·V)."""
    model = _built("cards/gpt2.card")
    x = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(2))
    rows, targets = torch.arange(0, 63), x[..., 1:]

    def largest(run) -> int:
        sizes = [0]

        def pack(t):
            if t.dim() >= 3 and t.shape[-1] == 256:  # (B, rows, V): logits or their kin
                sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run()
        return max(sizes)

    full = 2 * 63 * 256
    assert largest(lambda: _plain(model, [x], rows, targets)) >= full
    monkeypatch.setitem(type(model).forward.__globals__, "LOGITS_AT_ONCE", full // 8)
    assert largest(lambda: model(x, nll=(rows, targets))) < full // 4


def test_the_recipe_reads_the_models_likelihood():
    card, recipe = "cards/gpt2.card", "cards/recipes/lm_training.card"
    lib, checker, _ = checked([card, recipe], library_roots([card], None), lazy=True)
    training = find_card(lib, checker, recipe, None)
    bind_recipe(checker, training, find_card(lib, checker, card, None))
    text = source(checker, training)
    assert "theta(x_n, nll=(t - 1, x_n[..., t]))" in text
    assert "log_softmax" not in text  # no logits of every position


def test_the_helper_holds_what_the_compiler_says():
    """cardc info reads the compiler's figure (no torch there); the helper holds as many."""
    assert modelkit.LOGITS_AT_ONCE == LOGITS_AT_ONCE


@pytest.mark.parametrize("head", [
    ir.Bin("@", ir.Ref("self.W"), ir.Ref("E")),  # mixes the rows of E
    ir.Call(ir.Ref("torch.softmax"), (ir.Ref("E"),), (("dim", ir.Lit("-2")),)),  # over positions
    ir.Sub(ir.Ref("E"), (ir.SliceX(None, None, ir.Lit("-1")),)),  # rows reversed
    ir.Bin("+", ir.Ref("E"), ir.Ref("Z")),  # two values
    ir.Call(ir.Ref("torch.cumsum"), (ir.Ref("E"),), (("dim", ir.Lit("-1")),)),  # unknown
])
def test_a_head_that_may_mix_positions_keeps_the_plain_loss(head):
    assert likelihood_step(head, ir.Ref("self.V")) is None


def test_a_row_wise_head_is_scored_a_few_rows_at_a_time():
    capped = ir.Bin("*", ir.Ref("self.c"), ir.Call(ir.Ref("torch.tanh"), (
        ir.Bin("/", ir.Bin("@", ir.Ref("E"), ir.Attr(ir.Ref("self.W_e"), "T")), ir.Ref("self.c")),)))
    assert likelihood_step(capped, ir.Ref("self.V")) is not None
