"""A stack of layers whose hyperparameters depend on the layer: `Gemma2Block(E | θ^block_ℓ,
w = w + [[p ⌊ℓ/p⌋ = ℓ]] (ctx − w))` builds each layer with the window and rotary base its index
gives (tests/interpret/layer_hypers.card; tests/test_interpret.py compares the module with the
reference interpreter, values and gradients). `[[a = b]]` is Iverson's bracket of an equality."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from decodecheck import check_incremental_decoding, check_static_decoding, token_inputs, walk_models

import cardc
from cardc import syntax as s
from cardc.cli import main
from cardc.parser import parse

ROOT = Path(__file__).resolve().parent.parent
CARD = ROOT / "tests" / "interpret" / "layer_hypers.card"


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _model(**sizes):
    return cardc.model(str(CARD), preset="tiny", **sizes).eval()


def test_each_layer_is_built_with_the_sizes_its_index_gives():
    """Every p-th layer (p = 2) is global: the context as its window, θ_global as its base."""
    model = _model(N=5)
    assert [(b.w, b.theta_base) for b in model.block] == \
        [(3, 1e4), (32, 1e6), (3, 1e4), (32, 1e6), (3, 1e4)]
    assert [b.w for b in _model(N=4, p=3).block] == [3, 3, 32, 3]


def test_the_layers_differ_in_what_they_compute():
    """Against the same weights with every layer local, the global layers change the logits:
    the window of a global layer is not silently the local one."""
    torch.manual_seed(0)
    mixed, local = _model(N=2), _model(N=2, p=3)
    local.load_state_dict(mixed.state_dict())
    x = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        assert (mixed(x) - local(x)).abs().max() > 1e-3


def test_cached_decoding_equals_recomputation():
    model = next(m for name, m, *_ in walk_models([str(CARD.relative_to(ROOT))])
                 if name == "LayerHypers")
    assert [b.w for b in model.block] == [3, 32, 3, 32]
    inputs = token_inputs(model, 14, seed=2)
    check_incremental_decoding(model, inputs)
    check_static_decoding(model, inputs)


def test_an_iverson_bracket_of_an_equality_parses_and_round_trips(tmp_path, capsys):
    text = CARD.read_text(encoding="utf-8")
    assert main(["fmt", "--check", str(CARD)]) == 0
    card = parse(text)
    brackets = [n for n in s.nodes(card) if isinstance(n, s.Iverson)]
    assert {b.cond.op for b in brackets} == {"=", "≠"}


@pytest.mark.parametrize(("value", "message"), [
    ("w = ctx/2", "a whole number's value divides only inside ⌊·⌋ or ⌈·⌉"),
    ("w = ⌊ctx/2⌋ + g", "'g' is a value of the steps: a hyperparameter a call hands its callee "
                        "is computed from hyperparameters"),
])
def test_a_value_build_cannot_make_is_refused_where_it_is_written(tmp_path, capsys, value, message):
    """A whole number divided outside ⌊·⌋, and a value of the steps (g), are located errors."""
    text = CARD.read_text(encoding="utf-8").replace("w = w + [[p ⌊ℓ/p⌋ = ℓ]] (ctx − w)", value)
    if "g" in value:  # g ← 1 as a step of its own, before the loop
        text = re.sub(r"^(\d) ", lambda m: f"{int(m[1]) + 1} ", text, flags=re.M)
        text = text.replace("3 for ℓ", "2 g ← 1\n3 for ℓ")
    card = tmp_path / "bad.card"
    card.write_text(text, encoding="utf-8")
    assert main(["build", str(card), "--library", "cards", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"error: {message}" in err and err.startswith(f"{card}:")
    assert not (tmp_path / "out").exists()


SCALED = """Algorithm: P ← Scaled(x | θ)
/* Blocks each scaled by a number its layer's index gives; nothing else needs the math module. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: P ∈ ℝ^{T×V}
Hyperparameters: V, D, N ∈ ℕ; layer ∈ ℕ = 0, a name the generated code must not shadow
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}
    For ℓ ∈ [N]:
        θ^block_ℓ, the parameters of block ℓ.
1 E ← W_e[x]
2 for ℓ = 1, …, N do
3     E ← Scale(E | θ^block_ℓ, κ = ⌈ℓ/2⌉/N + layer)
4 end
5 return P = E W_e^⊺

Algorithm: X ← Scale(X | θ)
/* X plus κ times a product. */
Input: X ∈ ℝ^{T×D}
Output: X ∈ ℝ^{T×D}
Hyperparameters: D ∈ ℕ; κ ∈ (0, ∞)
Parameters: θ consisting of:
    W ∈ ℝ^{D×D}
1 return X + κ · X W
"""


def test_a_layers_value_may_need_the_math_module_alone(tmp_path):
    """⌈ℓ/2⌉ is `math.ceil`: the module imports math for it, though nothing else reads it; the
    layer the generator counts shadows no name of the card (`layer`)."""
    card = tmp_path / "scaled.card"
    card.write_text(SCALED, encoding="utf-8")
    model = cardc.model(str(card), V=11, D=4, N=3, layer=1)
    assert [b.kappa for b in model.block] == [1 + 1 / 3, 1 + 1 / 3, 1 + 2 / 3]
    assert model(torch.randint(0, 11, (2, 5))).shape == (2, 5, 11)
