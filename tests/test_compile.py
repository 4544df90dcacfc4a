"""`cardc train --compile`: the generated models trace whole under torch.compile (no graph
break: `fullgraph=True` raises at the first one), and the traced graph gives eager's loss and
gradients. The `aot_eager` backend traces forward and backward as inductor would, without its
minute of C++ compilation per model."""

from __future__ import annotations

import pytest
import torch

import cardc

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
