"""Cards `check` accepted that then failed to build, or built and computed something else: each
now builds and computes what the reference interpreter (and plain torch, written here) says the
card means, or is refused at the step that is wrong, with a located message."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

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
