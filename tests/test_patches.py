"""patches(X | p): an image cut into p×p blocks, one flattened block a row. Checked (the
block size divides the sides, or a located error), lowered fused (a view split and permuted)
and literal (every entry gathered through the notation's index), both equal to the reference
interpreter and to the same math written here with a convolution, values and gradients in
float64; an image the block size does not divide is refused at run time, named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_reproducers import B, Built  # noqa: E402

from cardc.interpret import InterpretError  # noqa: E402

EMBED = """\
Algorithm: E ← PatchEmbed(x | θ)
/* An image cut into p×p patches, each flattened and embedded. */
Input: x ∈ ℝ^{C×S×S}, an image of C channels.
Output: E ∈ ℝ^{n n×D}, one row per patch.
Hyperparameters: C, S, p, D ∈ ℕ; n = S/p
Parameters: θ consisting of:
    W ∈ ℝ^{C p p×D}, b ∈ ℝ^{D} = 0
1 return E = patches(x | p) W + b
"""

GREY = """\
Algorithm: E ← GreyPatches(x | θ)
/* A one-channel image, wider than high, cut into 2×2 blocks, then scaled entry by entry. */
Input: x ∈ ℝ^{4×6}
Output: E ∈ ℝ^{6×4}
Parameters: θ consisting of:
    A ∈ ℝ^{6×4} = 1
1 return E = patches(x | 2) ⊙ A
"""


def test_patch_embedding_is_a_strided_convolution(tmp_path):
    built = Built(tmp_path, EMBED, C=3, S=8, p=4, D=5)
    x = torch.randn(B, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = built.agree(x)
    W, b = built.literal.W, built.literal.b
    conv = F.conv2d(x, W.T.reshape(5, 3, 4, 4), b, stride=4)  # (B, D, 2, 2)
    torch.testing.assert_close(got, conv.flatten(2).transpose(1, 2).detach())


def test_blocks_of_a_one_channel_image_wider_than_high(tmp_path):
    built = Built(tmp_path, GREY)
    x = torch.arange(B * 24, dtype=torch.float64).reshape(B, 4, 6)
    built.agree(x)
    with torch.no_grad():
        built.literal.A.fill_(1)
    got = built.literal(x)
    assert got.shape == (B, 6, 4)
    # block (1, 2) of the first image: rows 1–2, columns 3–4, read row by row
    assert got[0, 1].tolist() == [2.0, 3.0, 8.0, 9.0]
    assert got[0, 3].tolist() == [12.0, 13.0, 18.0, 19.0]  # block (2, 1): three blocks across


FREE = """\
Algorithm: E ← AnySize(x | θ)
/* Images of any height and width that p divides, cut into patches and embedded. */
Input: x ∈ ℝ^{C×h×w}, an image of C channels.
Output: E ∈ ℝ^{h w/(p p)×D}, one row per patch.
Hyperparameters: C, p, D ∈ ℕ
Parameters: θ consisting of:
    W ∈ ℝ^{C p p×D}
1 return E = patches(x | p) W
"""


def test_an_image_the_block_does_not_divide_is_refused_when_run(tmp_path):
    built = Built(tmp_path, FREE, C=3, p=4, D=5)
    built.agree(torch.randn(B, 3, 8, 12, generator=torch.Generator().manual_seed(3),
                            dtype=torch.float64))
    x = torch.randn(B, 3, 9, 8, dtype=torch.float64)
    for module in (built.literal, built.fused):
        with pytest.raises(ValueError, match=r"an image of 9×8 pixels does not cut into 4×4 "
                                             r"patches"):
            module(x)
    with pytest.raises(InterpretError, match="an image of 9×8 does not cut into blocks of 4×4"):
        built.interpreted(x)


def test_an_image_of_another_size_than_the_card_fixes_is_refused_when_run(tmp_path):
    """An image the block divides but of another size than ℝ^{C×S×S}: named with the sizes the
    model takes (it failed later, adding the positions, or not at all)."""
    built = Built(tmp_path, EMBED, C=3, S=8, p=4, D=5)
    for module in (built.literal, built.fused):
        with pytest.raises(ValueError) as err:
            module(torch.randn(B, 3, 12, 12, dtype=torch.float64))
        assert str(err.value) == "x has sizes (3, 12, 12); the model takes ℝ^{C×S×S}, C = 3, " \
                                 "S = 8"


BAD = """\
Algorithm: E ← Undivided(x)
Input: x ∈ ℝ^{3×8×8}
Output: E ∈ ℝ^{4×27}
1 return E = patches(x | 3)

Algorithm: E ← Flat(x)
Input: x ∈ ℝ^{8}
Output: E ∈ ℝ^{4×27}
1 return E = patches(x | 4)

Algorithm: E ← Fractional(x)
Input: x ∈ ℝ^{3×8×8}
Output: E ∈ ℝ^{4×48}
1 return E = patches(x | 1.5)

Algorithm: E ← Unsized(x | θ)
Input: x ∈ ℝ^{C×S×S}
Output: E ∈ ℝ^{S S/(p p)×C p p}
Hyperparameters: C, S, p ∈ ℕ
Parameters: θ consisting of:
    W ∈ ℝ^{C}
Preset tiny: C = 3, S = 8, p = 3
1 return E = patches(x | p)
"""


def test_misused_patches_get_located_messages(tmp_path):
    path = tmp_path / "bad.card"
    path.write_text(BAD, encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "cardc", "check", str(path)],
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr + run.stdout
    out = run.stdout + run.stderr
    assert "bad.card:4:26: error: a block of 3 does not divide a side of 8" in out
    assert "bad.card:9:22: error: patches cuts an image ℝ^{C×H×W} or ℝ^{H×W}, not ℝ^{8}" in out
    assert "bad.card:14:26: error: the block size of patches is a whole number ≥ 1 (a " \
           "hyperparameter or a number), not ℝ" in out
    assert "bad.card:22:8: error: S^2/p^2 = 64/9 (S = 8, p = 3) is not a whole number" in out


CLASS_TOKEN = """\
Algorithm: E ← ClassFirst(X | θ)
/* A learned row put before the rows of an input, as ViT puts its class token first. */
Input: X ∈ ℝ^{T×D}
Output: E ∈ ℝ^{(T + 1)×D}
Hyperparameters: T, D ∈ ℕ
Parameters: θ consisting of:
    c ∈ ℝ^{1×D}, W ∈ ℝ^{D×D}
1 return E = [c; X W]
"""


def test_a_parameter_row_put_before_a_batched_matrix(tmp_path):
    """[c; X W] joined a parameter (1, D) with a batched (B, T, D) by torch.cat, which
    crashed: the parameter's row now stands before every example's rows."""
    built = Built(tmp_path, CLASS_TOKEN, T=3, D=4)
    X = torch.randn(B, 3, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = built.agree(X)
    want = torch.cat([built.literal.c.expand(B, 1, 4), X @ built.literal.W], dim=1)
    torch.testing.assert_close(got, want.detach())
