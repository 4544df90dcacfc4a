"""The card language says it naturally: card names kept as written, parameter lists continued
over lines, concatenation of parts of different widths, dimension arithmetic in normal form,
slice assignment, strided views and the padding row — each checked, rendered, round-tripped
and lowered to PyTorch that computes the right numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cardc import syntax as s
from cardc.build import build_model
from cardc.checker import check
from cardc.diagnostics import Diagnostics
from cardc.library import load
from cardc.parser import parse
from cardc.render.text import render_card

ROOT = Path(__file__).resolve().parent.parent


def _parse(text: str) -> s.CardFile:
    diags = Diagnostics()
    card = parse(text, "<test>", diags)
    assert not diags.errors, diags.render()
    return card


def _round_trips(text: str) -> str:
    """The canonical text of `text`, which parses back to the same AST."""
    card = _parse(text)
    canonical = render_card(card)
    assert _parse(canonical) == card
    assert render_card(_parse(canonical)) == canonical
    return canonical


def _errors(text: str, tmp_path: Path) -> list[str]:
    path = tmp_path / "t.card"
    path.write_text(text, encoding="utf-8")
    lib, _ = load([path], root=str(ROOT / "cards"))
    _, diags = check(lib)
    return [f"{d.span.line}:{d.span.col}: {d.message}" for d in diags.errors
            if d.span.file == str(path)]


def _model(text: str, tmp_path: Path, **values):
    path = tmp_path / "t.card"
    path.write_text(text, encoding="utf-8")
    return build_model(str(path), overrides=values, library=str(ROOT / "cards"))


# ------------------------------------------------------------------ card names are not respelled

PHI = """\
Algorithm: Y ← Phi(X | W)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Parameters: W ∈ ℝ^{D×D}
1 return Y = sigma(X W)

Algorithm: Y ← PhiTwice(X | W)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Parameters: W ∈ ℝ^{D×D}
1 return Y = Phi(Phi(X | W) | W)
"""


def test_a_card_named_phi_keeps_its_name(tmp_path):
    """Greek spelled out is a symbol (`sigma` → σ, `theta` → θ), never a card's name."""
    canonical = _round_trips(PHI)
    assert canonical.splitlines()[0] == "Algorithm: Y ← Phi(X | W)"
    assert "1 return Y = σ(X W)" in canonical
    assert "1 return Y = Phi(Phi(X | W) | W)" in canonical
    assert _errors(PHI, tmp_path) == []
    model = _model(PHI.split("\n\n")[1] + "\n" + PHI.split("\n\n")[0] + "\n", tmp_path, D=3)
    assert type(model).__name__ == "PhiTwice"
    x = torch.randn(2, 4, 3)
    w = model.state_dict()["W"]
    torch.testing.assert_close(model(x), torch.sigmoid(torch.sigmoid(x @ w) @ w))


# ------------------------------------------------------------------ lists continued over lines


def test_the_paper_prints_algorithm_5_with_a_comma_at_each_line_end(tmp_path):
    """cards/paper/mhattention.card is typed as printed; its text is canonical and its
    declarations are the same as those of the list written on one line."""
    text = (ROOT / "cards" / "paper" / "mhattention.card").read_text(encoding="utf-8")
    assert "b^h_q ∈ ℝ^{d_attn},\n" in text and "b^h_v ∈ ℝ^{d_mid}.\n" in text
    assert _round_trips(text) == text
    one_line = text.replace("ℝ^{d_attn},\n        W^h_k", "ℝ^{d_attn}, W^h_k")
    one_line = one_line.replace("ℝ^{d_attn},\n        W^h_v", "ℝ^{d_attn}, W^h_v")
    one_line = one_line.replace("}.\n", "}\n")
    decls = lambda card: [  # noqa: E731
        (d.names, d.type) for d in s.nodes(card) if isinstance(d, s.Decl)]
    assert decls(_parse(one_line)) == decls(_parse(text))
    ends = [d.end for d in s.nodes(_parse(text)) if isinstance(d, s.Decl) and d.end]
    assert ends == [",", ",", ".", "."]
    assert _errors(text, tmp_path) == []


@pytest.mark.parametrize("ascii_text, canonical", [
    ("Parameters: W_q in R^{D x D},\n    W_k in R^{D x D}.\n",
     "Parameters: W_q ∈ ℝ^{D×D},\n    W_k ∈ ℝ^{D×D}.\n"),
    ("Hyperparameters: D, H in NN,\n    eps in (0, inf) = 1e-5\n",
     "Hyperparameters: D, H ∈ ℕ,\n    ε ∈ (0, ∞) = 1e-5\n"),
])
def test_a_continued_list_in_ascii(ascii_text, canonical):
    head = "Algorithm: Y ← F(X | W_q, W_k)\nInput: X ∈ ℝ^{T×D}\nOutput: Y ∈ ℝ^{T×D}\n"
    steps = "1 return Y = X W_q W_k\n"
    assert _round_trips(head + ascii_text + steps) == head + canonical + steps


def test_a_comma_at_the_end_of_a_step_is_still_an_error():
    diags = Diagnostics()
    parse("Algorithm: Y ← F(X)\nInput: X ∈ ℝ^{T}\nOutput: Y ∈ ℝ^{T}\n1 Y ← X,\n2 return Y\n",
          "<t>", diags)
    assert [(d.span.line, d.message) for d in diags.errors] == [(4, "unexpected ','")]
