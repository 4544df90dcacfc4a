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
          "beta_1": 0.9, "beta_2": 0.95, "lambda_": 0.0, "c": 1.0}


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


# ------------------------------------------------------------------ recipes for any card

from pathlib import Path  # noqa: E402

from cardc.build import bind_recipe, procedures_for  # noqa: E402
from cardc.checker import check  # noqa: E402
from cardc.diagnostics import CardError  # noqa: E402
from cardc.library import load  # noqa: E402
from cardc.parser import parse  # noqa: E402
from cardc.render.text import format_source, render_card  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLING = (ROOT / "cards" / "recipes" / "lm_sampling.card").read_text(encoding="utf-8")
DECL = "M ∈ {1..V}^{T} → ℝ^{T×V} for T ≤ T_max"


def test_a_card_type_renders_and_round_trips():
    """`M ∈ {1..V}^{T} → ℝ^{T×V} for T ≤ T_max`, typed in ASCII, formats to the canonical form,
    and parse → render → parse is the identity."""
    ascii_ = SAMPLING.replace(DECL, "M in {1..V}^{T} -> R^{T x V} for T <= T_max")
    assert ascii_ != SAMPLING
    pretty, diags = format_source(ascii_)
    assert not diags.errors and pretty == SAMPLING
    card = parse(SAMPLING)
    (decl,) = [d for d in card.algorithms[0].decls("Hyperparameters") if d.names == ("M",)]
    assert (decl.type.length, decl.type.window) == ("T", "T_max")
    assert parse(render_card(card)) == card


def _checked(tmp_path, text: str, *extra: str):
    path = tmp_path / "recipe.card"
    path.write_text(text, encoding="utf-8")
    lib, _ = load([str(path), *extra], root=None, shipped=False)
    checker, diags = check(lib)
    return lib, checker, [d for d in diags.errors if d.span.file == str(path)]


@pytest.mark.parametrize("change, message", [
    (("P ← M(x[s : ℓ + i − 1] | θ̂)", "P ← M(x[s : ℓ + i − 1], x | θ̂)"),
     "M takes one input, {1..V}^{T}; given 2"),
    (("P ← M(x[s : ℓ + i − 1] | θ̂)", "P ← M(x[s : ℓ + i − 1])"),
     "M takes its parameters after '|': write M(x | θ)"),
    (("for T ≤ T_max", "for T ≤ T_win"), "the window 'T_win' of M is not a hyperparameter of "
                                          "this card in ℕ"),
    (("for T ≤ T_max", "for V ≤ T_max"), "'V' is not the length of M's input {1..V}^{T}"),
    (("Hyperparameters: M ∈", "Input: M ∈"), "a card taken as a value belongs under "
                                             "Hyperparameters, not Input"),
])
def test_a_card_valued_hyperparameter_is_checked(tmp_path, change, message):
    _, _, errors = _checked(tmp_path, SAMPLING.replace(*change))
    assert [d.message for d in errors][:1] == [message], [d.message for d in errors]
    assert all(d.span.line > 0 for d in errors)


def test_a_generic_recipe_has_code_only_bound_to_a_model(tmp_path):
    lib, checker, errors = _checked(tmp_path, SAMPLING)
    assert errors == []
    alg = lib.files[0].algorithms[0]
    with pytest.raises(CardError) as err:
        source(checker, alg)
    (diag,) = err.value.diagnostics.items
    assert diag.message == "LMSampling has code only for a model card bound to M"
    assert diag.span.line == 6


def test_binding_a_card_of_another_signature_is_a_located_error(tmp_path):
    """The model must be a card {1..V}^{T} → ℝ^{T×V}: RMSNorm (ℝ^{D} → ℝ^{D}) is refused where
    it is declared, with a note at the recipe's M."""
    lib, checker, _ = _checked(tmp_path, SAMPLING, str(ROOT / "cards/nn/rms_norm.card"))
    recipe = next(a for f in lib.files for a in f.algorithms if a.name == "LMSampling")
    wrong = next(a for f in lib.files for a in f.algorithms if a.name == "RMSNorm")
    with pytest.raises(CardError) as err:
        bind_recipe(checker, recipe, wrong)
    (diag,) = err.value.diagnostics.items
    assert diag.span.file.endswith("rms_norm.card") and diag.span.line == 1
    assert diag.message == ("'RMSNorm' is not a card M of LMSampling can stand for: it maps "
                            "ℝ^{D} to ℝ^{D}, and LMSampling needs {1..V}^{T} → ℝ^{T×V}")
    assert diag.notes[0][0].line == 6 and diag.notes[0][1] == "M is declared here"


def test_the_generic_recipes_serve_every_causal_model_card():
    """GPT-2, Llama and Qwen2 have no recipes of their own: the library's serve them all."""
    lib, checker, _ = checked([str(ROOT / "cards")], str(ROOT / "cards"))
    for name in ("GPT2", "Llama", "LlamaUntied", "Qwen2", "DTransformer"):
        model = lib.find(name)
        found = [a.name for a in procedures_for(lib, checker, model, training=True)]
        sample = [a.name for a in procedures_for(lib, checker, model, training=False)]
        if name == "DTransformer":  # the paper's own DTraining calls it by name: it comes first
            assert found[0] == "DTraining"
        else:
            assert found == ["LMTraining"] and sample == ["LMSampling"]
    assert procedures_for(lib, checker, lib.find("BART"), training=True) == [] or \
        "LMTraining" not in [a.name for a in procedures_for(lib, checker, lib.find("BART"),
                                                             training=True)]
