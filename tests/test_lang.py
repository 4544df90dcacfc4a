"""The card language says it naturally: card names kept as written, parameter lists continued
over lines, concatenation of parts of different widths, dimension arithmetic in normal form,
slice assignment, strided views and the padding row — each checked, rendered, round-tripped
and lowered to PyTorch that computes the right numbers."""

from __future__ import annotations

import re
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


# ------------------------------------------------------------------ parts of different widths

PARTIAL = """\
Algorithm: Y ← PartialRoPE(X | θ_base)
Input: X ∈ ℝ^{T×d}
Output: Y ∈ ℝ^{T×d}
Hyperparameters: d, d_r ∈ ℕ, θ_base ∈ (0, ∞) = 10000
1 return Y = [RoPE(X[:, 1 : d_r] | θ_base = θ_base), X[:, d_r + 1 : d]]
"""


def _rotate_half(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding, rotate-half convention, written directly in torch; its angles in
    float32, as the generated tables (and transformers') compute them, whatever x's type."""
    t, d = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(t, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def test_parts_of_different_widths_concatenate(tmp_path):
    assert _errors(PARTIAL, tmp_path) == []
    assert "[RoPE(X[:, 1 : d_r] | θ_base = θ_base), X[:, d_r + 1 : d]]" in _round_trips(
        PARTIAL.replace("θ", "theta").replace("ℝ", "R").replace("×", " x "))
    model = _model(PARTIAL, tmp_path, d=12, d_r=4, θ_base=500.0)
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    want = torch.cat([_rotate_half(x[..., :4], 500.0), x[..., 4:]], dim=-1)
    torch.testing.assert_close(model(x), want)


@pytest.mark.parametrize("parts, shape", [
    ("[X[:, 1 : a], X[:, a + 1 : d]]", None),
    ("[X, X[:, 1 : a], X]", "ℝ^{T×a + 2 d}"),
    ("[X[1 : a, :]; X]", "ℝ^{T + a×d}"),
])
def test_widths_add_up(parts, shape, tmp_path):
    card = ("Algorithm: Y ← F(X)\nInput: X ∈ ℝ^{T×d}\nOutput: Y ∈ ℝ^{T×d}\n"
            f"Hyperparameters: a, d ∈ ℕ\n1 return Y = {parts}\n")
    want = [] if shape is None else [f"5:14: returns {shape} but Output declares ℝ^{{T×d}}"]
    assert _errors(card, tmp_path) == want


def test_parts_side_by_side_must_agree_in_height(tmp_path):
    card = ("Algorithm: Y ← F(X)\nInput: X ∈ ℝ^{T×d}\nOutput: Y ∈ ℝ^{T×d}\n"
            "Hyperparameters: a, d ∈ ℕ\n1 return Y = [X[1 : a, :], X]\n")
    assert _errors(card, tmp_path) == ["5:28: cannot concatenate ℝ^{T×d} with ℝ^{a×d}"]


# ------------------------------------------------------------------ dimensions in normal form


@pytest.mark.parametrize("written", ["2·(d/2)", "d_r + (d − d_r)", "(3 d − d)/2", "d/3 + 2 d/3"])
def test_dimension_arithmetic_normalises(written, tmp_path):
    card = ("Algorithm: Y ← F(X)\nInput: X ∈ ℝ^{T×d}\n"
            f"Output: Y ∈ ℝ^{{T×{written}}}\nHyperparameters: d, d_r ∈ ℕ\n1 return Y = X\n")
    assert _errors(card, tmp_path) == []


THREE = """\
Algorithm: Y ← FirstThird(X)
Input: X ∈ ℝ^{T×3d}
Output: Y ∈ ℝ^{T×d}
1 return Y = X[:, 1 : d]

Algorithm: Y ← Heads(X | W)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×d}
Hyperparameters: D, H ∈ ℕ; d = D/H
Parameters: W ∈ ℝ^{D×3·D/H}
1 return Y = FirstThird(X W)
"""


def test_a_callee_width_of_3d_unifies_with_3_D_over_H(tmp_path):
    assert _errors(THREE, tmp_path) == []
    wrong = THREE.replace("Output: Y ∈ ℝ^{T×d}\nHyperparameters", "Output: Y ∈ ℝ^{T×D}\n"
                          "Hyperparameters")
    assert _errors(wrong, tmp_path) == ["11:14: returns ℝ^{T×D/H} but Output declares ℝ^{T×D}"]
    first, second = THREE.split("\n\n")
    model = _model(second + "\n\n" + first, tmp_path, D=8, H=2)
    x = torch.randn(3, 5, 8)
    torch.testing.assert_close(model(x), (x @ model.state_dict()["W"])[..., :4])


# ------------------------------------------------------------------ slice assignment


SLICE_ASSIGN = """\
Algorithm: Y ← PartialRoPE(X | θ_base)
Input: X ∈ ℝ^{T×d}
Output: Y ∈ ℝ^{T×d}
Hyperparameters: d, d_r ∈ ℕ, θ_base ∈ (0, ∞) = 10000
1 Y ← X ⊙ X
2 Y[:, 1 : d_r] ← RoPE(X[:, 1 : d_r] | θ_base = θ_base)
3 return Y
"""


def test_slice_assignment_generates_values_and_gradients(tmp_path):
    assert _errors(SLICE_ASSIGN, tmp_path) == []
    assert "2 Y[:, 1 : d_r] ← RoPE(X[:, 1 : d_r] | θ_base = θ_base)" in _round_trips(
        SLICE_ASSIGN.replace("←", "<-"))
    model = _model(SLICE_ASSIGN, tmp_path, d=10, d_r=6, θ_base=100.0)
    x = torch.randn(2, 5, 10, dtype=torch.float64, requires_grad=True)
    want_x = x.detach().clone().requires_grad_(True)
    want = torch.cat([_rotate_half(want_x[..., :6], 100.0), (want_x * want_x)[..., 6:]], dim=-1)
    got = model(x)
    torch.testing.assert_close(got, want)
    weights = torch.randn_like(want)
    (got * weights).sum().backward()
    (want * weights).sum().backward()
    torch.testing.assert_close(x.grad, want_x.grad)


def test_slice_assignment_of_a_scalar_broadcasts(tmp_path):
    card = ("Algorithm: Y ← Zeroed(X)\nInput: X ∈ ℝ^{T×d}\nOutput: Y ∈ ℝ^{T×d}\n"
            "Hyperparameters: d, a ∈ ℕ\n1 Y ← 2 X\n2 Y[:, a + 1 : d] ← 0\n3 return Y\n")
    assert _errors(card, tmp_path) == []
    x = torch.randn(3, 4, 6)
    want = 2 * x
    want[..., 2:] = 0
    torch.testing.assert_close(_model(card, tmp_path, d=6, a=2)(x), want)


def test_slice_assignment_of_the_wrong_width_is_one_error(tmp_path):
    card = SLICE_ASSIGN.replace("Y[:, 1 : d_r]", "Y[:, 2 : d_r]")
    assert _errors(card, tmp_path) == [
        "6:3: cannot store ℝ^{T×d_r} into ℝ^{T×d_r − 1}"]


# ------------------------------------------------------------------ strided views

PAIRS = ROOT / "tests" / "lang" / "rope_pairs.card"


def _meta_rotary(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding on interleaved pairs, as Meta's original Llama code computes it: the
    pairs as complex numbers, turned by unit complex numbers."""
    t, d = x.shape[-2], x.shape[-1]
    freqs = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    turns = torch.polar(torch.ones(t, d // 2, dtype=torch.float64),
                        torch.outer(torch.arange(t, dtype=torch.float64), freqs))
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(pairs * turns).flatten(-2)


def test_rotary_on_interleaved_pairs_without_a_loop(tmp_path):
    text = PAIRS.read_text(encoding="utf-8")
    assert _round_trips(text) == text
    ascii_text = "".join(  # the steps in ASCII spelling
        line.replace("…", "...").replace("−", "-").replace("←", "<-") if line[0].isdigit()
        else line for line in text.splitlines(keepends=True))
    assert "X[:, 2, 4, ..., d]" in ascii_text
    assert _round_trips(ascii_text) == text
    assert _errors(text, tmp_path) == []
    model = _model(text, tmp_path, d=8, θ_base=10000.0)
    x = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    want_x = x.detach().clone().requires_grad_(True)
    got, want = model(x), _meta_rotary(want_x, 10000.0)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(x.grad, want_x.grad)


def test_strided_views_lower_to_strided_slices(tmp_path):
    from cardc.build import checked, find_card, source

    path = tmp_path / "pairs.card"
    path.write_text(PAIRS.read_text(encoding="utf-8"), encoding="utf-8")
    lib, checker, _ = checked([str(path)], str(ROOT / "cards"))
    code = source(checker, find_card(lib, checker, str(path), None))
    assert "X_1 = X[..., :, ::2]" in code and "X_2 = X[..., :, 1::2]" in code
    assert not re.search(r"^\s*for .*:$", code.split("def forward")[1], re.M)  # no loop


@pytest.mark.parametrize("view, shape", [
    ("X[:, 1, 3, …, d − 1]", "ℝ^{T×d/2}"),
    ("X[:, 2, 4, …, d]", "ℝ^{T×d/2}"),
    ("X[:, 1, 4, …, d − 2]", "ℝ^{T×d/3}"),
    ("X[1, 3, …, T − 1, :]", "ℝ^{T/2×d}"),
])
def test_strided_views_are_typed(view, shape, tmp_path):
    card = ("Algorithm: Y ← F(X)\nInput: X ∈ ℝ^{T×d}\nOutput: Y ∈ ℝ^{T×d}\n"
            f"Hyperparameters: d ∈ ℕ\n1 return Y = {view}\n")
    assert _errors(card, tmp_path) == [f"5:14: returns {shape} but Output declares ℝ^{{T×d}}"]
    assert f"return Y = {view}" in _round_trips(card)


def test_strided_view_values(tmp_path):
    card = ("Algorithm: Y ← F(X)\nInput: X ∈ ℝ^{T×d}\nOutput: Y ∈ ℝ^{T×d/3}\n"
            "Hyperparameters: d ∈ ℕ\n1 return Y = X[:, 2, 5, …, d − 1]\n")
    x = torch.randn(2, 3, 9)
    torch.testing.assert_close(_model(card, tmp_path, d=9)(x), x[..., 1::3])


# ------------------------------------------------------------------ the padding row

EMBED = """\
Algorithm: E ← Embed(x | W_e)
Input: x ∈ {1..V}^{T}, token IDs.
Output: E ∈ ℝ^{T×D}
Hyperparameters: V, D ∈ ℕ, v_pad ∈ ℕ = 0, the padding token (0: none)
Parameters: W_e ∈ ℝ^{V×D}, padding row v_pad, token embeddings.
1 return E = W_e[x]
"""


def test_the_padding_row_is_a_clause_of_the_declaration():
    decl = next(d for d in s.nodes(_parse(EMBED)) if isinstance(d, s.Decl) and d.names == ("W_e",))
    assert (decl.pad, decl.prose) == ("v_pad", "token embeddings.")
    assert _round_trips(EMBED.replace("ℝ^{V×D}", "R^{V x D}")) == EMBED


@pytest.mark.parametrize("v_pad", [0, 1, 4, 7])
def test_the_padding_row_gets_no_gradient(v_pad, tmp_path):
    """Card token IDs count from 1: v_pad is nn.Embedding's padding_idx + 1, and 0 is none."""
    model = _model(EMBED, tmp_path, V=7, D=3, v_pad=v_pad)
    ref = torch.nn.Embedding(7, 3, padding_idx=v_pad - 1 if v_pad else None)
    with torch.no_grad():
        ref.weight.copy_(model.W_e)
    x = torch.tensor([[0, 3, 6, 3, 1], [6, 6, 2, 0, 5]])  # 0-based, as tensors hold tokens
    weights = torch.randn(2, 5, 3)
    (model(x) * weights).sum().backward()
    (ref(x) * weights).sum().backward()
    torch.testing.assert_close(model.W_e.grad, ref.weight.grad)
    if v_pad:
        assert not model.W_e.grad[v_pad - 1].any() and model.W_e.grad.abs().sum() > 0


def test_llama_and_qwen2_say_no_padding_row_by_default():
    from cardc.build import checked, find_card, source

    for card in ("llama", "qwen2"):
        path = str(ROOT / "cards" / f"{card}.card")
        lib, checker, _ = checked([path], str(ROOT / "cards"))
        alg = find_card(lib, checker, path, None)
        assert checker.info(alg).sig.defaults["v_pad"] == s.Num("0")
        assert "padding_idx=self.v_pad - 1 if self.v_pad > 0 else None" in source(checker, alg)


@pytest.mark.parametrize("change, message", [
    ("v_pad ∈ ℕ = 0, the padding token (0: none)", "5:13: the padding row 'w' is not a "
     "whole-number hyperparameter of this card"),
    ("v_pad ∈ (0, ∞) = 1", "5:13: the padding row 'w' is not a whole-number hyperparameter "
     "of this card"),
])
def test_a_padding_row_names_a_hyperparameter(change, message, tmp_path):
    card = EMBED.replace("padding row v_pad", "padding row w")
    card = card.replace("v_pad ∈ ℕ = 0, the padding token (0: none)",
                        change.replace("v_pad", "w") if "(0, ∞)" in change else change)
    assert _errors(card, tmp_path) == [message]


def test_a_padding_row_belongs_to_a_matrix_parameter(tmp_path):
    card = EMBED.replace("Output: E ∈ ℝ^{T×D}", "Output: E ∈ ℝ^{T×D}, padding row v_pad")
    assert _errors(card, tmp_path) == ["3:9: a padding row belongs to a parameter, not to Output"]
    card = EMBED.replace("W_e ∈ ℝ^{V×D}, padding", "b ∈ ℝ^{D}, padding row v_pad, W_e ∈ "
                         "ℝ^{V×D}, padding")
    assert _errors(card, tmp_path) == [
        "5:13: a padding row belongs to a matrix that tokens index"]


def test_a_padding_column_in_the_papers_layout(tmp_path):
    """The paper's W_e ∈ ℝ^{d_e×N_V} picks columns: the padding token's column gets no
    gradient."""
    card = """\
Algorithm: E ← EmbedColumns(x | W_e)
Input: x ∈ V*, token IDs.
Output: E ∈ ℝ^{d_e×length(x)}
Hyperparameters: v_pad ∈ ℕ = 0, the padding token (0: none)
Parameters: W_e ∈ ℝ^{d_e×N_V}, padding row v_pad, the token embedding matrix.
1 ℓ ← length(x)
2 for t ∈ [ℓ] : e_t ← W_e[:, x[t]]
3 return E = [e_1, e_2, …, e_ℓ]
"""
    assert _errors(card, tmp_path) == []
    model = _model(card, tmp_path, d_e=3, N_V=5, v_pad=2)
    x = torch.tensor([[1, 0, 1, 4]])
    out = model(x)
    torch.testing.assert_close(out, model.W_e.detach().T[x])
    out.sum().backward()
    assert not model.W_e.grad[:, 1].any()
    torch.testing.assert_close(model.W_e.grad[:, 0], torch.ones(3))
    torch.testing.assert_close(model.W_e.grad[:, 4], torch.ones(3))


def test_a_padding_token_past_the_vocabulary_is_refused(capsys, monkeypatch):
    """v_pad ∈ {0..V}: a value past V (a bad pad_token_id) is refused by name, before any
    model is built."""
    from cardc.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["info", "cards/llama.card", "--preset", "tiny", "--set", "v_pad=257"]) == 1
    assert "'v_pad' = 257 lies outside [0, 256]" in capsys.readouterr().err
    assert main(["info", "cards/qwen2.card", "--preset", "tiny", "--set", "v_pad=256"]) == 0
