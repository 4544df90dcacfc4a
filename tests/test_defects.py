"""Cards `check` accepted that then failed to build, or built and computed something else: each
now builds and computes what the reference interpreter (and plain torch, written here) says the
card means, or is refused at the step that is wrong, with a located message."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from cardc.diagnostics import Diagnostics
from cardc.parser import parse
from cardc.render.html import render_html
from cardc.render.latex import render_latex
from cardc.render.markdown import render_markdown
from cardc.render.text import render_card

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_reproducers import Built, _randn  # noqa: E402

DEFAULTED_SIZE = """\
Algorithm: Y ← Model(X | θ)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×2}
Hyperparameters: D ∈ ℕ
Parameters: θ consisting of:
    W ∈ ℝ^{D×D}
1 A ← Pick(X W)  ▷ A ∈ ℝ^{T×3}
2 B ← Pick(X W | n = 2)
3 return Y = A[:, 2:3] + B

Algorithm: Y ← Pick(X)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×n}
Hyperparameters: D ∈ ℕ, n ∈ ℕ = 3
1 return Y = n X[:, 1:n]
"""


def test_a_defaulted_size_of_a_function_card_takes_its_default(tmp_path):
    """`n ∈ ℕ = 3` where the call does not give n: the callee's shapes and values read 3
    (it once had no value in generated code)."""
    built = Built(tmp_path, DEFAULTED_SIZE, D=4)
    X = _randn(5, 4)
    want = built.agree(X)
    W = built.literal.W.detach()
    XW = X @ W
    torch.testing.assert_close(want, 3 * XW[..., 1:3] + 2 * XW[..., 0:2])


POWER_SHAPE = """\
Algorithm: Y ← Model(X | W)
Input: X ∈ ℝ^{T×C p²}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: C, p, D ∈ ℕ
Parameters: W ∈ ℝ^{C p²×D}
1 return Y = X W
"""


def test_a_power_in_a_shape_is_a_product_of_sizes(tmp_path):
    """`ℝ^{C p²×D}` was refused ("expected a dimension"): p² is p p, in the checker's
    sizes, the module's parameter and what it computes; the card formats to itself and
    renders the power in every renderer."""
    built = Built(tmp_path, POWER_SHAPE, C=3, p=2, D=5)
    assert built.literal.W.shape == (12, 5)
    X = _randn(4, 12)
    torch.testing.assert_close(built.agree(X), X @ built.literal.W.detach())
    tree = parse(POWER_SHAPE, "card.card", Diagnostics())
    assert render_card(tree) == POWER_SHAPE
    assert r"\mathbb{R}^{C \, {p}^{2} \times D}" in render_latex(tree)
    assert r"\mathbb{R}^{C \, {p}^{2} \times D}" in render_markdown(tree)
    assert "p</mi><mn>2</mn></msup>" in render_html(tree, None)
