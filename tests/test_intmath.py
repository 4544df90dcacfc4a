"""Integer and element-wise math: ⌊x⌋, ⌈x⌉, |x|, log₂ x, min and max entry by entry (a clamp is
min(max(x, a), b)), and a `∀` step that states its ranges and so defines a value. Each parses
in the paper's spelling and in ASCII alike, renders in the four renderers (golden files), types
as the math does, and runs: the generated module, fused and literal, equals the reference
interpreter and the same math written here in plain torch, in float64. The showcase is T5's
relative-position buckets (Raffel et al. 2020), `cards/nn/relative.card`.

The golden files are regenerated with

    CARDC_GOLDEN=update pytest tests/test_intmath.py
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch

from cardc.build import checked
from cardc.checker import check
from cardc.diagnostics import Diagnostics
from cardc.interpret import Program
from cardc.library import library_roots, load
from cardc.parser import parse
from cardc.render.html import render_html
from cardc.render.latex import render_latex
from cardc.render.markdown import render_markdown
from cardc.render.text import render_card

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_reproducers import B, Built  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "intmath"
NOTATION = ROOT / "tests" / "cards" / "intmath" / "notation.card"

ASCII = """\
Algorithm: Y <- Ops(X | w)
/* Integer and element-wise math. */
Input: X in R^{T x D}
Output: Y in R^{T x D}
Hyperparameters: D, H in NN
Parameters: w in R^{D}
1 k <- floor(log2(H))
2 c <- ceil(D/2) + abs(k - 3)
3 forall t in [T], t' in [T] : n[t, t'] <- t - t'
4 m <- min(max(abs(n), 1), c)
5 Z <- max(X, 0) + min(X, -X) + floor(X) (.) log2(abs(X) + 1) + ceil(X/2)
6 return Y = Z (.) w + m X + max(w, 1 - w)
"""


def _parse(text: str) -> tuple:
    diags = Diagnostics()
    return parse(text, "card.card", diags), diags


def test_ascii_spellings_read_as_the_papers_notation():
    """floor(x), ceil(x), abs(x), log2(x) and `forall t in [T]` are ⌊x⌋, ⌈x⌉, |x|, log₂ x and
    ∀t ∈ [T]: the same tree, and `cardc fmt` writes the paper's notation, which reads back
    as that tree."""
    tree, diags = _parse(ASCII)
    assert not diags.errors
    canonical = render_card(tree)
    assert "1 k ← ⌊log₂ H⌋\n" in canonical
    assert "2 c ← ⌈D/2⌉ + |k − 3|\n" in canonical
    assert "3 ∀t ∈ [T], t′ ∈ [T]: n[t, t′] ← t − t′\n" in canonical
    assert "4 m ← min(max(|n|, 1), c)\n" in canonical
    assert "Z ← max(X, 0) + min(X, −X) + ⌊X⌋ ⊙ log₂(|X| + 1) + ⌈X/2⌉\n" in canonical
    again, diags = _parse(canonical)
    assert not diags.errors and again == tree
    assert render_card(again) == canonical


def test_bars_around_an_operand_are_abs_and_a_bar_that_stands_apart_binds_parameters():
    """`|x|` hugs its operand; the bar of `f(x | θ)` has a space on each side."""
    tree, diags = _parse(ASCII.replace("abs(k - 3)", "|k - 3| |k|"))
    assert not diags.errors
    text = render_card(tree)
    assert "|k − 3| |k|" in text
    call = "Algorithm: y ← F(x | θ)\nInput: x ∈ ℝ^{D}\nOutput: y ∈ ℝ^{D}\n" \
           "Parameters: θ, the weights.\n1 return y = G(|x| | θ)\n"
    tree, diags = _parse(call)
    assert not diags.errors
    ((step,),) = [[st.stmt for st in alg.steps] for alg in tree.algorithms]
    value = step.value
    assert (value.func, value.args[0].func, len(value.params)) == ("G", "abs", 1)
    assert render_card(tree).endswith("1 return y = G(|x| | θ)\n")


@pytest.mark.parametrize("written", [
    "G(x |θ) + |x|", "G(x|θ) + |x|", "G(x |θ, ε = 1) + |x|", "G(x|θ, ε = 1) + |x|"])
def test_a_bar_against_a_calls_parameters_ends_its_arguments(written):
    """`f(x |θ)`, the bar hugging the parameters, once read `|θ` as an absolute value left
    open: a bar whose partner is not ahead on the line, before the call closes, ends the call's
    arguments; `|x|` stays an absolute value; the canonical spelling puts a space each side."""
    card = "Algorithm: y ← F(x | θ)\nInput: x ∈ ℝ^{D}\nOutput: y ∈ ℝ^{D}\n" \
           "Parameters: θ, the weights.\n1 return y = {}\n"
    tree, diags = _parse(card.replace("{}", written))
    assert not diags.errors, diags.render()
    spaced = written.replace("x |θ", "x | θ").replace("x|θ", "x | θ")
    assert tree == _parse(card.replace("{}", spaced))[0]
    assert render_card(tree).endswith(f"1 return y = {spaced}\n")
    (alg,) = tree.algorithms
    value = alg.steps[0].stmt.value
    assert (value.left.func, value.left.args[0].id, value.right.func) == ("G", "x", "abs")


@pytest.mark.parametrize(("text", "where"), [
    ("1 k <- floor(log2(H)\n", "7:"),  # a call left open
    ("1 k ← ⌊log₂ H\n", "7:"),  # a floor left open
    ("1 k ← |H\n", "7:"),  # a bar left open
])
def test_an_unclosed_bracket_is_a_located_syntax_error(text, where):
    lines = ASCII.splitlines(keepends=True)
    _, diags = _parse("".join(lines[:6]) + text)
    assert diags.errors and str(diags.errors[0].span.line) + ":" == where


def _errors(tmp_path: Path, steps: str) -> list[str]:
    card = ("Algorithm: y ← Kinds(x | w)\n/* The kind of number each notation gives. */\n"
            "Input: x ∈ ℝ^{D}\nOutput: y ∈ ℝ\nHyperparameters: D, H ∈ ℕ\n"
            "Parameters: w ∈ ℝ^{D}\n" + steps)
    path = tmp_path / "card.card"
    path.write_text(card, encoding="utf-8")
    lib, _ = load([path], root=None)
    _, diags = check(lib)
    return [d.message for d in diags.errors]


@pytest.mark.parametrize(("value", "kind"), [
    ("⌊log₂ H⌋", None),  # ⌊·⌋ of a real is a whole number
    ("⌈H/3⌉", None),
    ("|H − 3|", None),  # |·| of a whole number is one
    ("⌊x[1]⌋", None),
    ("max(H − 1, 1)", None),  # of whole numbers, whole
    ("min(⌊x⌋, 2)[1]", None),
    ("log₂ H", "ℝ"),  # log₂ of anything is a real
    ("|x[1]|", "ℝ"),  # |·| of a real is a real
    ("H/2", "ℝ"),
    ("max(H, x[1])", "ℝ"),  # a real beside a whole number makes a real
    ("H mod 3 + 1", None),  # a remainder of whole numbers is whole
])
def test_each_notation_gives_the_kind_of_number_the_math_does(tmp_path, value, kind):
    """Whole numbers index; reals do not (the checker's one rule for integers and reals)."""
    errors = _errors(tmp_path, f"1 return y = w[{value}]\n")
    assert errors == ([] if kind is None else [f"an index must be a whole number, not {kind}"])


def test_min_and_max_of_tensors_are_entry_by_entry_and_shapes_must_broadcast(tmp_path):
    assert _errors(tmp_path, "1 return y = Σ_{i=1}^{D} min(max(x, −1), w)[i]\n") == []
    assert _errors(tmp_path, "1 return y = max(x)\n") == []  # one argument: the largest entry
    assert _errors(tmp_path, "1 v ← [x, x]\n2 return y = max(x, v)\n") == [
        "max(a, b) compares entry by entry; cannot compare ℝ^{D} with ℝ^{D×2}"]


@pytest.mark.parametrize("renderer", ["text", "latex", "html", "md"])
def test_rendered_golden(renderer, monkeypatch):
    monkeypatch.chdir(ROOT)  # the page names the card by its path from the repository's root
    card = str(NOTATION.relative_to(ROOT))
    lib, checker, _ = checked([card], library_roots([card], None))
    (card_file,) = [f for f in lib.files if Path(f.path).resolve() == NOTATION]
    out = {"text": lambda: render_card(card_file),
           "latex": lambda: render_latex(card_file, checker),
           "html": lambda: render_html(card_file, checker),
           "md": lambda: render_markdown(card_file, checker)}[renderer]()
    golden = GOLDEN / f"notation.{ {'text': 'card', 'latex': 'tex'}.get(renderer, renderer)}"
    if os.environ.get("CARDC_GOLDEN") == "update":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(out, encoding="utf-8")
    assert out == golden.read_text(encoding="utf-8")


def _x(T: int, D: int) -> torch.Tensor:
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(3),
                       dtype=torch.float64) * 3


def test_the_notations_run_as_the_interpreter_and_plain_torch_say(tmp_path):
    """Hyperparameters (⌊log₂ H⌋ at construction), integer tensors (|t − t′| from a ∀ step
    with ranges) and reals, fused and literal, values and gradients."""
    T, D, H = 6, 4, 12
    built = Built(tmp_path, _parse_ascii_canonical(), T=T, D=D, H=H)
    X = _x(T, D)
    got = built.agree(X)
    w = built.literal.w.detach()
    k = math.floor(math.log2(H))  # 3
    c = math.ceil(D / 2) + abs(k - 3)  # 2
    t = torch.arange(1, T + 1)
    n = t[:, None] - t[None, :]
    m = n.abs().clamp(min=1).clamp(max=c)
    Z = X.clamp(min=0) + torch.minimum(X, -X) + X.floor() * torch.log2(X.abs() + 1) + \
        torch.ceil(X / 2)
    want = Z * w + m.double() @ X + torch.maximum(w, 1 - w)  # an integer matrix times reals
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def _parse_ascii_canonical() -> str:
    tree, _ = _parse(ASCII)
    return render_card(tree)


FORALL = """\
Algorithm: Y ← Pairs(X | w)
/* A matrix defined entry by entry by a ∀ step that states its ranges. */
Input: X ∈ ℝ^{T×T}
Output: Y ∈ ℝ^{T×T}
Hyperparameters: T ∈ ℕ
Parameters: w ∈ ℝ^{T}
1 ∀t ∈ [T], t′ ∈ [T] : n[t, t′] ← t − t′
2 return Y = X ⊙ n + w
"""


def test_a_quantifier_with_ranges_defines_a_value_as_a_map_does(tmp_path):
    T = 5
    built = Built(tmp_path, FORALL, T=T)
    X = _x(T, T)
    got = built.agree(X)
    t = torch.arange(1, T + 1, dtype=torch.float64)
    torch.testing.assert_close(got, X * (t[:, None] - t[None, :]) + built.literal.w.detach())
    nested = FORALL.replace("∀t ∈ [T], t′ ∈ [T] :", "for t ∈ [T] : for t′ ∈ [T] :")
    torch.testing.assert_close(Built(tmp_path, nested, T=T).agree(X), got)


# ------------------------------------------------------------------ T5's buckets


def t5_buckets(T: int, n_buckets: int, d_max: int, bidirectional: bool) -> torch.Tensor:
    """Raffel et al. (2020), section 2.1, from the formula: the bucket (counted from 1) of key
    position t′ seen from query position t, as entry [t, t′]. Bidirectional: half the buckets
    for keys after the query. In each half, distances below half its buckets exact, then
    logarithmic up to d_max, the last bucket from there on."""
    pos = torch.arange(T)
    rel = pos[None, :] - pos[:, None]  # key − query
    if bidirectional:
        half, offset, dist = n_buckets // 2, (rel > 0).long() * (n_buckets // 2), rel.abs()
    else:
        half, offset, dist = n_buckets, torch.zeros_like(rel), (-rel).clamp(min=0)
    exact = half // 2
    far = exact + torch.floor(torch.log(dist.clamp(min=1).double() / exact)
                              / math.log(d_max / exact) * (half - exact)).long()
    bucket = torch.where(dist < exact, dist, far.clamp(max=half - 1))
    return offset + bucket + 1


BIAS = """\
Algorithm: B ← T5Biases(X | w_b, w_c)
/* Two heads' score biases looked up by T5's buckets, one bidirectional, one causal. */
Input: X ∈ ℝ^{T×D}
Output: B ∈ ℝ^{T×T}
Hyperparameters: N_b ∈ ℕ, d_max ∈ ℕ
Parameters: w_b ∈ ℝ^{N_b}, w_c ∈ ℝ^{N_b}
1 β ← RelativeBuckets(X | N_b = N_b, d_max = d_max)
2 γ ← CausalRelativeBuckets(X | N_b = N_b, d_max = d_max)
3 return B = w_b[β] + w_c[γ]
"""


@pytest.mark.parametrize(("T", "n_buckets", "d_max"), [(12, 8, 6), (20, 16, 12), (9, 6, 4)])
def test_t5_buckets_as_the_formula_says(tmp_path, T, n_buckets, d_max):
    """The library's bucket cards, generated fused and literal and interpreted, equal the
    formula for every pair of positions, distances past d_max included (d_max lies past the
    exact buckets of a half, as T5 requires)."""
    built = Built(tmp_path, BIAS, T=T, D=3, N_b=n_buckets, d_max=d_max)
    X = _x(T, 3)
    lib, checker, _ = checked([str(tmp_path / "card.card")],
                              library_roots([str(tmp_path / "card.card")], None))
    for name, bidirectional in (("RelativeBuckets", True), ("CausalRelativeBuckets", False)):
        want = t5_buckets(T, n_buckets, d_max, bidirectional)
        assert int(want.min()) == 1 and int(want.max()) == n_buckets  # d_max < T: all used
        for module in (built.literal, built.fused):
            function = type(module).forward.__globals__[name]
            got = function(X, N_b=n_buckets, d_max=d_max)
            assert got.dtype == torch.long and torch.equal(got, want.expand(B, T, T)), name
        alg = lib.find(name)
        program = Program.of(lib, checker, alg)
        hypers = program.hyperparameters(None, N_b=n_buckets, d_max=d_max)
        got = program(X[0], params={}, hypers=hypers)
        assert torch.equal(got.long(), want), name


def test_a_bias_table_looked_up_by_buckets(tmp_path):
    """w_b[β]: row β of the table, β counted from 1 as the card counts; its gradient adds up
    over the pairs that fall in each bucket."""
    T, n_buckets, d_max = 12, 8, 6
    built = Built(tmp_path, BIAS, T=T, D=3, N_b=n_buckets, d_max=d_max)
    got = built.agree(_x(T, 3))
    w_b, w_c = built.literal.w_b.detach(), built.literal.w_c.detach()
    want = w_b[t5_buckets(T, n_buckets, d_max, True) - 1] + \
        w_c[t5_buckets(T, n_buckets, d_max, False) - 1]
    torch.testing.assert_close(got, want.expand(B, T, T))


def test_mod_takes_whole_numbers_and_renders_as_the_paper_would(tmp_path):
    """`ℓ mod p` (Gemma 3's every p-th layer) is the remainder of whole numbers; a real is
    refused where it is written; it reads back from each canonical form."""
    assert _errors(tmp_path, "1 return y = w[(H − 1) mod D + 1]\n") == []
    assert _errors(tmp_path, "1 return y = w[⌊x[1] mod 2⌋ + 1]\n") == [
        "'mod' takes whole numbers; this is ℝ"]
    assert _errors(tmp_path, "1 return y = w[H mod ⌊x⌋ + 1]\n") == [
        "'mod' divides by a whole number; this is ℕ^{D}"]
    card, diags = _parse("Algorithm: y ← F(x)\n/* r. */\nInput: x ∈ ℕ\nOutput: y ∈ ℕ\n"
                         "Hyperparameters: p ∈ ℕ\n1 return y = (2 x mod p) 3\n")
    assert not diags.errors
    assert "(2 x mod p) 3" in render_card(card)
    assert r"2 \, x \bmod p" in render_latex(card)
