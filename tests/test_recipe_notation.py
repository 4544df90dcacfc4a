"""The notation training recipes need, each checked against its torch equivalent: the norm ‖·‖
and clipping a gradient by its global norm (torch.nn.utils.clip_grad_norm_), a gradient summed
over micro-batches (one step on the whole minibatch), dropout (F.dropout in training, nothing
in evaluation), and a warm-up bounded by the run (`N_warmup ∈ {0..N_steps}`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from cardc.build import bind_recipe, build_model, checked, load_module, recipe_for, source
from cardc.cli import main
from cardc.diagnostics import CardError
from cardc.parser import parse
from cardc.render.text import render_card

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "tests" / "cards" / "recipes"
SMALL = {"V": 50, "D": 16, "H": 2, "D_f": 32, "N": 1, "ctx": 16}

NORMS = """Algorithm: y ← Unit(x | γ)
/* x scaled to length 1, then by γ: a norm over a vector's entries, row by row on a matrix. */
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ
Parameters: γ ∈ ℝ^{D} = 1
1 return y = x/‖x‖ ⊙ γ

Algorithm: Y ← Frobenius(X | W)
/* X W divided by its Frobenius norm, the norm of all its entries. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ
Parameters: W ∈ ℝ^{D×D}
Preset tiny: D = 4
1 Z ← X W
2 return Y = Z/‖Z‖
"""


@pytest.fixture(autouse=True)
def _root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _recipe(path: Path | str, name: str = "GPT2"):
    """The generic training card at `path`, bound to the GPT-2 card: its generated function."""
    lib, checker, _ = checked([str(path), "cards/gpt2.card"], "cards")
    alg = next(a for f in lib.files if Path(f.path).resolve() == Path(path).resolve()
               for a in f.algorithms)
    bind_recipe(checker, alg, lib.find(name))
    return source(checker, alg), load_module(source(checker, alg), alg.name.lower())


def _data(count: int, length: int = 9) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, SMALL["V"], (length,), generator=g) for _ in range(count)]


def _model():
    torch.manual_seed(0)
    model = build_model("cards/gpt2.card", None, SMALL)
    return model, copy.deepcopy(model)


def _mean_loss(model, rows: list[torch.Tensor]) -> torch.Tensor:
    x = torch.stack(rows)
    return F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())


# ------------------------------------------------------------------ the notation


def test_the_norm_is_written_with_double_bars_or_ascii_pipes():
    unicode = parse("Algorithm: y ← F(x)\n1 return y = x · min(1, c/‖x‖)\n")
    ascii_ = parse("Algorithm: y <- F(x)\n1 return y = x * min(1, c/||x||)\n")
    assert unicode == ascii_
    text = "Algorithm: y ← F(x, z)\n1 return y = ‖x‖ ‖W z‖ + ‖‖x‖ z‖² + (‖x‖)[1]\n"
    assert render_card(parse(text)) == text  # juxtaposed, nested, squared, indexed: canonical


def test_the_recipe_round_trips_and_renders_its_norm(capsys):
    card = ROOT / "cards" / "recipes" / "lm_training.card"
    text = card.read_text(encoding="utf-8")
    assert render_card(parse(text)) == text
    assert "5     g ← g · min(1, c/‖g‖)" in text
    assert main(["render", "--to", "latex", str(card)]) == 0
    assert r"\mathrm{min}\left(1, c/\lVert g \rVert\right)" in capsys.readouterr().out
    assert main(["render", "--to", "md", str(card)]) == 0
    assert r"\lVert g \rVert" in capsys.readouterr().out
    assert main(["render", "--to", "html", str(card)]) == 0
    html = capsys.readouterr().out
    assert '<mo stretchy="false">‖</mo><mi>g</mi><mo stretchy="false">‖</mo>' in html


def test_the_norm_is_checked(tmp_path, capsys):
    card = tmp_path / "bad.card"
    card.write_text("Algorithm: y ← F(M)\nInput: M ∈ {0,1}^{T×T}\nOutput: y ∈ ℝ\n"
                    "1 return y = ‖M‖\n", encoding="utf-8")
    assert main(["check", str(card)]) == 1
    err = capsys.readouterr().err
    assert f"{card}:4:14: error: ‖·‖ measures numbers, not {{0,1}}^{{T×T}}" in err
    assert "4 | 1 return y = ‖M‖\n  |              ^^^" in err


def test_the_norm_of_a_vector_and_of_a_matrix(tmp_path):
    card = tmp_path / "cards" / "norms.card"
    card.parent.mkdir()
    card.write_text(NORMS, encoding="utf-8")
    torch.manual_seed(0)
    unit = build_model(str(card), None, {"D": 5}, ["cards"], "Unit")
    x = torch.randn(2, 3, 5)
    torch.testing.assert_close(unit(x), x / torch.linalg.vector_norm(x, dim=-1, keepdim=True))
    frob = build_model(str(card), "tiny", None, ["cards"], "Frobenius")
    z = x[..., :4] @ frob.W
    expected = z / torch.linalg.vector_norm(z, dim=(-2, -1), keepdim=True)
    torch.testing.assert_close(frob(x[..., :4]), expected)


# ------------------------------------------------------------------ clipping


def test_clipping_equals_clip_grad_norm(tmp_path):
    """tests/cards/recipes/clip_sgd.card: `g ← ∇loss(θ)`, `g ← g · min(1, c/‖g‖)`,
    `θ ← θ − η · g`. torch's clip_grad_norm_ scales by c/(‖g‖ + 10⁻⁶), the card by c/‖g‖:
    the clipped gradients agree to a relative 10⁻⁶/‖g‖ (below 10⁻⁵ here, ‖g‖ > c = 0.1),
    beside the float32 rounding of two models' backward passes, which an element that sums
    to near 0 carries whole (10⁻⁶ of the tensor's largest element)."""
    code, module = _recipe(RECIPES / "clip_sgd.card")
    assert "torch.clamp(c / torch.nn.utils.get_total_norm(g), max=1)" in code  # no host sync
    model, reference = _model()
    data = _data(6)
    seen = []
    module.ClippedSGD(data, model, N_steps=2, B=3, l=9, eta=0.5, c=0.1,
                      report=lambda loss, lr: seen.append(
                          (loss, [p.grad.clone() for p in model.parameters()])))
    opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for i, (loss, grads) in enumerate(seen):
        opt.zero_grad()
        expected = _mean_loss(reference, data[3 * i:3 * i + 3])
        expected.backward()
        norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.1)
        assert norm > 0.1  # clipping is active
        opt.step()
        torch.testing.assert_close(loss, expected.detach())
        for g, p in zip(grads, reference.parameters(), strict=True):
            torch.testing.assert_close(g, p.grad, rtol=1e-5,
                                       atol=1e-6 * p.grad.abs().max().item())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


def test_a_gradient_under_the_bound_is_left_as_it_is(tmp_path):
    """min(1, c/‖g‖) = 1 exactly: the updates are bit for bit those of the card without the
    clipping step (`θ ← θ − η · ∇loss(θ)`, the paper's form)."""
    _, clipped = _recipe(RECIPES / "clip_sgd.card")
    text = (RECIPES / "clip_sgd.card").read_text(encoding="utf-8")
    plain = tmp_path / "plain.card"
    plain.write_text(text.replace("3     g ← ∇loss(θ)\n4     g ← g · min(1, c/‖g‖)\n"
                                  "5     θ ← θ − η · g", "3     θ ← θ − η · ∇loss(θ)"),
                     encoding="utf-8")
    _, unclipped = _recipe(plain)
    model, reference = _model()
    data = _data(6)
    clipped.ClippedSGD(data, model, N_steps=2, B=3, l=9, eta=0.5, c=1e6)
    unclipped.ClippedSGD(data, reference, N_steps=2, B=3, l=9, eta=0.5, c=1e6)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)


def test_the_recipe_names_its_gradient_and_still_steps_once():
    lib, checker, _ = checked(["cards/gpt2.card"], "cards")
    code = source(checker, recipe_for(lib, checker, lib.find("GPT2"), training=True))
    body = code[code.index("    for i in range(N_steps)"):]
    assert body.count("theta.zero_grad()") == 1 and body.count(".backward()") == 1
    assert body.count("optimizer.step()") == 1 and "optimizer.zero_grad()" not in body
    assert "skip = start(optimizer)" in code  # still resumable


# ------------------------------------------------------------------ micro-batches


def test_micro_batches_sum_to_one_step_on_the_minibatch():
    """tests/cards/recipes/accumulate.card: K micro-batches of b sequences, each loss scaled by
    1/(K·b·(ℓ − 1)), their gradients summed in θ's .grad, one clipped AdamW step: the whole
    minibatch's gradient and step, up to float rounding of the sum."""
    code, module = _recipe(RECIPES / "accumulate.card")
    loop = code[code.index("        for k in range(K)"):code.index("optimizer.step()")]
    assert loop.count(".backward()") == 1 and "zero_grad" not in loop
    model, reference = _model()
    data = _data(12)
    seen = []
    module.AccumulatedLMTraining(data, model, N_steps=2, K=2, b=3, l=9, eta=1e-2, c=0.5,
                                 report=lambda loss, lr: seen.append(
                                     (loss, [p.grad.clone() for p in model.parameters()])))
    matrices = [p for p in reference.parameters() if p.ndim >= 2]
    others = [p for p in reference.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": matrices}, {"params": others, "weight_decay": 0.0}],
                            lr=1e-2)
    for i, (loss, grads) in enumerate(seen):
        opt.zero_grad()
        expected = _mean_loss(reference, data[6 * i:6 * i + 6])  # the whole minibatch
        expected.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        opt.step()
        torch.testing.assert_close(loss, expected.detach())
        for g, p in zip(grads, reference.parameters(), strict=True):
            torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-8)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if name.endswith("attn.b_qkv"):  # the key bias's gradient is rounding noise, which
            p, q = torch.cat([p[:16], p[32:]]), torch.cat([q[:16], q[32:]])  # AdamW makes ±η
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)


def _card(tmp_path: Path, steps: str) -> Path:
    text = (RECIPES / "clip_sgd.card").read_text(encoding="utf-8")
    head, _, _ = text.partition("\n1 for")
    card = tmp_path / "steps.card"
    card.write_text(head + "\n" + steps, encoding="utf-8")
    return card


def test_a_gradient_replaced_before_it_is_used_is_refused(tmp_path):
    card = _card(tmp_path, "1 for i = 1, 2, …, N_steps do\n"
                 "2     loss(θ) = −1/(B · (ℓ − 1)) · Σ_{n=(i − 1) · B + 1}^{i · B} "
                 "Σ_{t=1}^{ℓ − 1} log softmax(M(x_n | θ)[t, :])[x_n[t + 1]]\n"
                 "3     g ← ∇loss(θ)\n4     h ← ∇loss(θ)\n5     θ ← θ − η · g\n6 end\n"
                 "7 return θ̂ = θ\n")
    with pytest.raises(CardError) as err:
        _recipe(card)
    text = err.value.diagnostics.render()
    assert "steps.card:12:19: error: 'g' was replaced by another gradient of 'θ' at line 11" \
        in text


def test_a_sum_must_start_from_a_gradient_or_zero(tmp_path, capsys):
    card = _card(tmp_path, "1 for i = 1, 2, …, N_steps do\n"
                 "2     loss(θ) = −1/(B · (ℓ − 1)) · Σ_{n=(i − 1) · B + 1}^{i · B} "
                 "Σ_{t=1}^{ℓ − 1} log softmax(M(x_n | θ)[t, :])[x_n[t + 1]]\n"
                 "3     g ← 1\n4     g ← g + ∇loss(θ)\n5     θ ← θ − η · g\n6 end\n"
                 "7 return θ̂ = θ\n")
    assert main(["check", str(card), "--library", "cards"]) == 1
    assert "steps.card:11:11: error: cannot add ℕ and a parameter bundle" in \
        capsys.readouterr().err


# ------------------------------------------------------------------ dropout


def test_dropout_acts_in_training_only():
    card = "tests/cards/dropout/dropout_mlp.card"
    torch.manual_seed(0)
    model = build_model(card, "tiny", None, ["cards"], "DropoutMLP")
    x = torch.randn(2, 5, 8)
    hidden = F.gelu(x @ model.W_1 + model.b_1, approximate="tanh") @ model.W_2 + model.b_2
    torch.testing.assert_close(model.eval()(x), hidden)  # evaluation: the identity
    model.train()
    torch.manual_seed(7)
    got = model(x)
    torch.manual_seed(7)
    torch.testing.assert_close(got, F.dropout(hidden, 0.1, True))  # training: F.dropout's
    assert (got == 0).any()


def test_dropout_is_checked(tmp_path, capsys):
    card = tmp_path / "bad.card"
    card.write_text("Algorithm: Y ← F(X)\nInput: X ∈ ℝ^{T×D}\nOutput: Y ∈ ℝ^{T×D}\n"
                    "1 return Y = dropout(X | 1.5)\n", encoding="utf-8")
    assert main(["check", str(card)]) == 1
    err = capsys.readouterr().err
    assert f"{card}:4:26: error: the probability of dropout lies in [0, 1), not 1.5" in err


# ------------------------------------------------------------------ a warm-up within the run


SHORT = ["--set", "D=16", "--set", "H=2", "--set", "D_f=32", "--set", "N=1", "--set", "ctx=16",
         "--batch-size", "2", "--block-size", "9"]


def test_a_warm_up_longer_than_the_run_is_scaled_with_it(tmp_path, capsys):
    """N_warmup ∈ {0..N_steps}: --steps 4 makes the tiny preset's 50-update warm-up 1 update
    (its share, 50 of 1000), and says so; the last update's rate is the cosine's end."""
    out = tmp_path / "run"
    code = main(["train", "cards/gpt2.card", "--preset", "tiny", *SHORT, "--steps", "4",
                 "--eval-every", "4", "--out", str(out)])
    assert code == 0
    said = capsys.readouterr().out.splitlines()[0]
    assert said == ("note: --steps 4 makes N_steps = 4 < N_warmup = 50, which the card bounds "
                    "by N_steps (N_warmup ∈ {0..N_steps}): N_warmup is scaled with it, from 50 "
                    "of 1000 to 1 of 4; set it with --set N_warmup=VALUE")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["lr"] == pytest.approx(1e-4)  # η_min: the warm-up took one update


def test_a_warm_up_set_longer_than_the_run_is_an_error(tmp_path, capsys):
    code = main(["train", "cards/gpt2.card", "--preset", "tiny", *SHORT, "--steps", "40",
                 "--set", "N_warmup=50", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("cardc: error: --set N_warmup=50: 'N_warmup' = 50 lies outside "
                          "[0, 40] ({0..N_steps}), where the card declares it")
    assert not (tmp_path / "run").exists()


def test_a_preset_whose_warm_up_outlasts_its_run_does_not_check(tmp_path, capsys):
    card = tmp_path / "lm.card"
    text = (ROOT / "cards" / "recipes" / "lm_training.card").read_text(encoding="utf-8")
    card.write_text(text.replace("N_steps = 1000,", "N_steps = 10,"), encoding="utf-8")
    assert main(["check", str(card), "--library", "cards"]) == 1
    err = capsys.readouterr().err
    assert "error: 'N_warmup' = 50 lies outside [0, 10] ({0..N_steps})" in err


# ------------------------------------------------------------------ an initial scale


INIT = """Algorithm: Y ← Scaled(X | W)
/* A product whose matrix is drawn with a scale the card takes as a hyperparameter. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ; σ ∈ (0, ∞) = 0.02, the initial weights' standard deviation
Parameters: W ∈ ℝ^{D×D} ~ 𝒩(0, σ²)
Preset wide: D = 256, σ = 0.5
1 return Y = X W
"""


def test_an_initial_scale_is_a_hyperparameter(tmp_path, capsys):
    card = tmp_path / "cards" / "scaled.card"
    card.parent.mkdir()
    card.write_text(INIT, encoding="utf-8")
    for preset, overrides, std in (("wide", None, 0.5), ("wide", {"σ": 0.1}, 0.1),
                                   (None, {"D": 256}, 0.02)):
        torch.manual_seed(0)
        model = build_model(str(card), preset, overrides, ["cards"])
        assert model.W.std().item() == pytest.approx(std, rel=0.02)
    card.write_text(INIT.replace("𝒩(0, σ²)", "𝒩(0, ζ²)"), encoding="utf-8")
    assert main(["check", str(card)]) == 1
    err = capsys.readouterr().err
    assert f"{card}:6:32: error: the initial distribution names 'ζ', which is not a scalar " \
           "hyperparameter of this card" in err
