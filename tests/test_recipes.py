"""cards/recipes/lm_training.card, the recipe `cardc train cards/gpt2.card` runs, means what it says:
its minibatch loss is the mean next-token cross-entropy, its learning rate warms up linearly and
decays along a cosine, and AdamW's weight decay shrinks the weight matrices only."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from cardc.build import build_model, checked, load_module, recipe_for, source

SMALL = {"V": 50, "D": 16, "H": 2, "D_f": 32, "N": 1, "ctx": 16}
HYPERS = {"N_steps": 12, "B": 3, "l": 9, "eta": 1e-2, "eta_min": 1e-3, "N_warmup": 4,
          "beta_1": 0.9, "beta_2": 0.95, "lambda_": 0.0}


@pytest.fixture(scope="module")
def recipe():
    lib, checker, _ = checked(["cards/gpt2.card"], "cards")
    alg = recipe_for(lib, checker, lib.find("GPT2"), training=True)
    return load_module(source(checker, alg), "lmtraining").LMTraining


def _run(recipe, model, data, **hypers):
    seen: list[tuple[float, float]] = []
    recipe(data, model, **{**HYPERS, **hypers},
           report=lambda loss, lr: seen.append((loss.item(), lr)))
    return seen


def _data(count: int, length: int = 9) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, SMALL["V"], (length,), generator=g) for _ in range(count)]


def test_the_minibatch_loss_is_the_mean_next_token_cross_entropy(recipe):
    torch.manual_seed(0)
    model = build_model("cards/gpt2.card", None, SMALL)
    before = copy.deepcopy(model)
    data = _data(HYPERS["N_steps"] * HYPERS["B"])
    seen = _run(recipe, model, data)
    assert len(seen) == HYPERS["N_steps"]
    first = torch.stack(data[:3])  # the first update reads examples 1…B
    logits = before(first[:, :-1])
    expected = F.cross_entropy(logits.flatten(0, 1), first[:, 1:].flatten()).item()
    assert seen[0][0] == pytest.approx(expected, rel=1e-5)
    assert seen[-1][0] < seen[0][0]


def test_the_learning_rate_warms_up_then_follows_a_cosine(recipe):
    torch.manual_seed(0)
    model = build_model("cards/gpt2.card", None, SMALL)
    lrs = [lr for _, lr in _run(recipe, model, _data(36))]
    eta, low, warm, steps = HYPERS["eta"], HYPERS["eta_min"], HYPERS["N_warmup"], HYPERS["N_steps"]
    assert lrs[0] == pytest.approx(low + (eta - low) / warm)
    assert lrs[warm - 1] == pytest.approx(eta)  # the peak, at update N_warmup
    assert lrs[-1] == pytest.approx(low)  # the cosine's end, at update N_steps
    middle = warm + (steps - warm) // 2
    assert lrs[middle - 1] == pytest.approx(low + (eta - low) * (1 + math.cos(math.pi / 2)) / 2)
    assert all(a < b for a, b in zip(lrs[:warm - 1], lrs[1:warm], strict=True))
    assert all(a > b for a, b in zip(lrs[warm - 1:-1], lrs[warm:], strict=True))


def test_weight_decay_shrinks_matrices_not_gains_or_biases(recipe):
    """λ = 1/η: one update's decoupled decay (1 − η·λ) zeroes a decayed tensor, leaving only
    Adam's own step, at most about η per entry."""
    torch.manual_seed(0)
    model = build_model("cards/gpt2.card", None, SMALL)
    gains = {n: p.detach().clone() for n, p in model.named_parameters() if p.ndim < 2}
    _run(recipe, model, _data(3), N_steps=1, N_warmup=1, eta=1e-3, eta_min=1e-3,
         lambda_=1e3)
    for name, p in model.named_parameters():
        if p.ndim >= 2:
            assert p.abs().max() <= 1.5e-3, name
        else:
            assert torch.allclose(p, gains[name], atol=1.5e-3), name
    assert any(g.abs().max() >= 0.5 for g in gains.values())  # LayerNorm gains start at 1


@pytest.mark.parametrize("card, name, causal", [
    ("cards/gpt2.card", None, True),
    ("cards/paper/dtransformer.card", None, True),
    ("cards/paper/etransformer.card", "ETransformer", False),  # an encoder reads ahead
])
def test_the_harness_tells_a_causal_language_model(card, name, causal):
    """Held-out next-token loss means something only for a model that cannot see ahead."""
    from cardc.runtime.train import predicts_next_token

    model = build_model(card, "tiny", name=name)
    assert predicts_next_token(model) is causal
