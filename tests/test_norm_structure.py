"""Norms recognised by their structure: LayerNorm or RMSNorm with gains or without, gains stored
less one (1 + γ, as Gemma writes) or not, offsets or without (LayerNorm without β, as Cohere),
lower to the fused op (F.layer_norm, rms_normalize, offset_rms_norm), and the module, fused and
literal, computes what the reference interpreter says the card means (float64, values and
gradients) and what the math written out here in plain torch gives."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from cardc.build import checked, model_cards, source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_reproducers import ATOL, RTOL, Built, _randn  # noqa: E402

MODEL = """\
Algorithm: Y ← Model(X | W{more})
/* A projection, then the norm. */
Input: X ∈ ℝ^{{T×D}}
Output: Y ∈ ℝ^{{T×D}}
Hyperparameters: D ∈ ℕ, ε ∈ (0, ∞) = 0.01
Parameters: W ∈ ℝ^{{D×D}}{decls}
1 return Y = Norm(X W | {args}ε = ε)

Algorithm: ê ← Norm(e{bar})
/* A normalisation written as a stranger would. */
Input: e ∈ ℝ^{{D}}
Output: ê ∈ ℝ^{{D}}
Hyperparameters: D ∈ ℕ, ε ∈ (0, ∞)
{own}{steps}
"""
LAYER = "1 m ← Σ_{i=1}^{D} e[i]/D\n2 v ← Σ_{i=1}^{D} (e[i] − m)²/D\n3 return ê = (e − m)/√(v + ε)"
RMS = "1 s ← Σ_{i=1}^{D} e[i]²/D\n2 return ê = e/√(s + ε)"


def _card(steps: str, tail: str, params: list[str]) -> str:
    names = ", ".join(params)
    decls = ", ".join(f"{p} ∈ ℝ^{{D}}" for p in params)
    return MODEL.format(more=f", {names}" if params else "", decls=f", {decls}" if params else "",
                        args=f"{names}, " if params else "", bar=f" | {names}" if params else "",
                        own=f"Parameters: {decls}\n" if params else "", steps=steps + tail)


def _layer(x, eps):
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)


def _rms(x, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


CASES = [  # (core, return's tail, parameters, fused op, the math in torch)
    (LAYER, " ⊙ γ", ["γ"], "F.layer_norm(", lambda n, m: n * m.gamma),  # Cohere: no β
    (LAYER, "", [], "F.layer_norm(", lambda n, m: n),
    (LAYER, " + β", ["β"], "F.layer_norm(", lambda n, m: n + m.beta),
    (RMS, " ⊙ (1 + γ)", ["γ"], "offset_rms_norm(", lambda n, m: n * (1 + m.gamma)),  # Gemma
    (RMS, "", [], "rms_normalize(", lambda n, m: n),
    (RMS, " ⊙ γ + β", ["γ", "β"], "rms_normalize(", lambda n, m: n * m.gamma + m.beta),
]


@pytest.mark.parametrize("core, tail, params, op, math", CASES,
                         ids=["layer-gain", "layer-bare", "layer-offset", "rms-one-plus-gain",
                              "rms-bare", "rms-gain-offset"])
def test_a_norm_with_or_without_gains_and_offsets_is_the_fused_op(core, tail, params, op, math,
                                                                 tmp_path):
    built = Built(tmp_path, _card(core, tail, params), D=5)
    X = _randn(4, 5)
    want = built.agree(X)
    m = built.literal
    norm = _layer if core is LAYER else _rms
    torch.testing.assert_close(want, math(norm(X @ m.W, 0.01), m).detach(), rtol=RTOL, atol=ATOL)
    path = tmp_path / "card.card"
    lib, checker, _ = checked([str(path)], None)
    (alg,) = model_cards(lib, checker, [str(path)])
    fused, literal = source(checker, alg, fuse=True), source(checker, alg, fuse=False)
    assert op in fused and "def Norm(" not in fused and op not in literal


@pytest.mark.parametrize("tail, params", [
    (" ⊙ γ ⊙ β", ["γ", "β"]),  # two gains: not a norm's
    (" ⊙ (2 + γ)", ["γ"]),  # gains stored less two: no fused op
])
def test_what_is_not_a_norms_gain_or_offset_stays_the_cards_steps(tail, params, tmp_path):
    built = Built(tmp_path, _card(LAYER, tail, params), D=5)
    built.agree(_randn(4, 5))
    path = tmp_path / "card.card"
    lib, checker, _ = checked([str(path)], None)
    (alg,) = model_cards(lib, checker, [str(path)])
    assert "def Norm(" in source(checker, alg, fuse=True)
