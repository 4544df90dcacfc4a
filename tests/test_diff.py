"""`cardc diff`: two cards' architectures, step by step, with swapped sub-cards diffed in place."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cardc.cli import main

ROOT = Path(__file__).resolve().parent.parent

RMS_NORM = """\
Algorithm: ê ← RMSNorm(e | γ)
/* Root-mean-square normalisation. */
Input: e ∈ ℝ^{D}
Output: ê ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ, ε ∈ (0, ∞)
Parameters: γ ∈ ℝ^{D} = 1
1 m ← Σ_{i=1}^{D} e[i]²/D
2 return ê = e/√(m + ε) ⊙ γ
"""


@pytest.fixture
def library(tmp_path: Path) -> Path:
    """cards/ with a GPT-2 variant whose blocks normalise attention's input with RMSNorm."""
    lib = tmp_path / "cards"
    shutil.copytree(ROOT / "cards" / "nn", lib / "nn")
    shutil.copy(ROOT / "cards" / "gpt2.card", lib / "gpt2.card")
    (lib / "nn" / "rms_norm.card").write_text(RMS_NORM, encoding="utf-8")
    text = (ROOT / "cards" / "gpt2.card").read_text(encoding="utf-8")
    variant = (text.replace("GPT2Block", "RMSBlock").replace("GPT2(", "GPT2RMS(")
                .replace("LayerNorm(X | γ^1, β^1, ε = ε)", "RMSNorm(X | γ^1, ε = ε)")
                .replace("γ^1 ∈ ℝ^{D} = 1, β^1 ∈ ℝ^{D} = 0", "γ^1 ∈ ℝ^{D} = 1"))
    (lib / "variant.card").write_text(variant, encoding="utf-8")
    return lib


def _diff(capsys, *argv: str) -> tuple[int, list[str]]:
    code = main(["diff", *argv])
    return code, capsys.readouterr().out.splitlines()


def test_a_swapped_sub_card_is_named_and_diffed_where_it_is_called(library, capsys):
    code, lines = _diff(capsys, str(library / "gpt2.card"), str(library / "variant.card"))
    assert code == 0
    assert lines[:4] == [
        "GPT2 → GPT2RMS",
        "  step 3: GPT2Block → RMSBlock",
        "      parameters: − β^1",
        "      step 1: LayerNorm → RMSNorm",
    ]
    assert "          parameters: − β" in lines  # LayerNorm's β, which RMSNorm lacks
    assert "          + 2 return ê = e/√(m + ε) ⊙ γ" in lines
    assert "      + 1 X ← X + CausalSelfAttention(RMSNorm(X | γ^1, ε = ε) | θ^attn)" in lines
    assert not any("MLP" in line for line in lines)  # the unchanged step is not shown


def test_a_card_against_itself_has_no_difference(capsys):
    code, lines = _diff(capsys, "cards/gpt2.card", "cards/gpt2.card")
    assert (code, lines) == (0, ["GPT2 → GPT2", "  the same steps"])


def test_the_papers_decoder_against_gpt2_lists_its_own_steps(capsys):
    code, lines = _diff(capsys, "cards/gpt2.card", "cards/paper/dtransformer.card")
    assert code == 0 and lines[0] == "GPT2 → DTransformer"
    assert "  hyperparameters: − V, D, D_f, N, ctx, ε; + ℓ_max, L, d_e, d_mlp" in lines
    assert "  + 11 return P = softmax(W_u X)" in lines


def test_diff_of_a_missing_card_is_a_usage_error(capsys):
    assert main(["diff", "cards/gpt2.card", "no/such.card"]) == 2
    assert "no such card file" in capsys.readouterr().err
