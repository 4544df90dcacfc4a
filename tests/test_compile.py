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
    loss a few rows at a time, make the updates eager makes."""
    import json

    monkeypatch.chdir(tmp_path)
    losses = {}
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
