"""Every renderer parenthesises where a reader would group otherwise than the parse.

The grammar reads ⊙, ·, / and juxtaposition alike, left to right; a person reads the products
(juxtaposition, ·) as binding tighter than ⊙ and / (cardc.render.text.Renderer.left_min). So
`(H ⊙ H) W` must keep its parentheses in the canonical text, LaTeX, Markdown and HTML (MathML),
though `H ⊙ H W` parses to the same tree. tests/golden/precedence/precedence.card writes each
mixed pair both ways, in canonical form; its renderings are golden files, regenerated with

    CARDC_GOLDEN=update pytest tests/test_render_precedence.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cardc import syntax as s
from cardc.diagnostics import Diagnostics
from cardc.parser import parse
from cardc.render.text import render_card, render_expr

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "precedence"
CARD = GOLDEN / "precedence.card"


def _value(expr: str) -> s.Expr:
    diags = Diagnostics()
    card = parse(f"Algorithm: Y ← F(X)\n1 Y ← {expr}\n", "<test>", diags)
    assert not diags.errors, diags.render()
    return card.algorithms[0].steps[0].stmt.value


@pytest.mark.parametrize("written, canonical", [
    ("H ⊙ H W", "(H ⊙ H) W"),  # the parse: (H ⊙ H) W; a reader: H ⊙ (H W)
    ("a/b c", "(a/b) c"),
    ("−1/N · x", "(−1/N) · x"),
    ("a ⊙ b · c", "(a ⊙ b) · c"),
    ("SiLU(X W_g) ⊙ (X W_u) W_d", "(SiLU(X W_g) ⊙ (X W_u)) W_d"),
    ("a ⊙ b c ⊙ d", "(a ⊙ b) c ⊙ d"),
    # where both tables agree, or either grouping has the same value, nothing is added
    ("a ⊙ (b c)", "a ⊙ (b c)"), ("a b ⊙ c", "a b ⊙ c"), ("a b/c", "a b/c"),
    ("a · b c", "a · b c"), ("a/b ⊙ c", "a/b ⊙ c"), ("−a b", "−a b"), ("a + b c", "a + b c"),
    ("Q K^⊺/√d", "Q K^⊺/√d"), ("(a + b) c", "(a + b) c"),
])
def test_canonical_text_keeps_the_parentheses_a_reader_needs(written, canonical):
    tree = _value(written)
    assert render_expr(tree) == canonical
    assert _value(canonical) == tree  # the same tree: the parentheses are for the reader


def test_published_glu_mlps_read_as_they_compute():
    """SwiGLU and GeGLU multiply the gated value, not the value alone, by W_down."""
    assert "(SiLU(X W_gate) ⊙ (X W_up)) W_down" in \
        (ROOT / "cards" / "nn" / "swiglu.card").read_text(encoding="utf-8")
    assert "(GELU_tanh(X W_gate) ⊙ (X W_up)) W_down" in \
        (ROOT / "cards" / "gemma2.card").read_text(encoding="utf-8")


def test_the_golden_card_is_canonical_and_round_trips():
    text = CARD.read_text(encoding="utf-8")
    diags = Diagnostics()
    card = parse(text, str(CARD), diags)
    assert not diags.errors
    assert render_card(card) == text
    assert parse(render_card(card), str(CARD)) == card


@pytest.mark.parametrize("to, suffix", [("text", ".txt"), ("latex", ".tex"), ("md", ".md"),
                                        ("html", ".html")])
def test_golden(to, suffix):
    run = subprocess.run([sys.executable, "-m", "cardc", "render", "--to", to,
                          str(CARD.relative_to(ROOT))], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    golden = GOLDEN / ("precedence" + suffix)
    if os.environ.get("CARDC_GOLDEN") == "update":
        golden.write_text(run.stdout, encoding="utf-8")
    assert run.stdout == golden.read_text(encoding="utf-8")
