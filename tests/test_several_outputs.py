"""Cards of several outputs: a header `P, r ← M(x | θ)` names them, `Output:` declares each,
`return P, r` gives them in the header's order and a caller names each, `P, r ← M(x | θ)`; and
indicator(I), the vector of 0s and 1s that marks the members of a set argtop_k chose (a
router's choices, as a load-balancing loss counts them). Both parse in the paper's spelling
and in ASCII alike, render in the four renderers (golden files), check with a located message
for each misuse, and run: the generated module, fused and literal, returns the tuple the
reference interpreter computes, values and gradients in float64, and what the same math
written here in plain torch gives.

The golden files are regenerated with

    CARDC_GOLDEN=update pytest tests/test_several_outputs.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from cardc.build import checked
from cardc.checker import check
from cardc.diagnostics import Diagnostics
from cardc.library import library_roots, load
from cardc.parser import parse
from cardc.render.html import render_html
from cardc.render.latex import render_latex
from cardc.render.markdown import render_markdown
from cardc.render.text import render_card

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_reproducers import ATOL, RTOL, B, Built  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "several"
NOTATION = ROOT / "tests" / "cards" / "several" / "notation.card"


def _parse(text: str) -> tuple:
    diags = Diagnostics()
    return parse(text, "card.card", diags), diags


def test_ascii_spellings_read_as_the_papers_notation():
    """`Y, C <- Mix(…)` and `return Y, mean(C^T)` are the paper's `Y, C ← Mix(…)` and
    `return Y, mean(C^⊺)`; `cardc fmt` writes the paper's notation, which reads back as the
    same tree."""
    text = NOTATION.read_text(encoding="utf-8")
    tree, diags = _parse(text)
    assert not diags.errors
    ascii_text = text.replace("Y, C ← Mix", "Y, C <- Mix").replace("C^⊺", "C^T")
    assert ascii_text != text
    again, diags = _parse(ascii_text)
    assert not diags.errors and again == tree
    assert render_card(again) == render_card(tree)
    assert "1 Y, C ← Mix(X | θ^mix, k = k)" in render_card(tree)
    assert "2 return Y, mean(C^⊺)\n" in render_card(tree)


def test_a_declaration_list_is_still_a_declaration_and_prose_is_still_prose():
    """The names before `←` are targets, never the prose of a declaration before them."""
    tree, diags = _parse("Algorithm: y ← F(x | θ)\nInput: x ∈ ℝ^{D}, one token, as given.\n"
                         "Output: y ∈ ℝ^{D}\nParameters: θ, the weights.\n"
                         "1 a, b ← G(x | θ)\n2 return y = a\n")
    assert not diags.errors
    (alg,) = tree.algorithms
    (decl,) = [d for blk in alg.blocks if blk.kind == "Input" for d in blk.items]
    assert decl.prose == "one token, as given."
    target = alg.steps[0].stmt.target
    assert [n.id for n in target.items] == ["a", "b"]


def _errors(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "card.card"
    path.write_text(text, encoding="utf-8")
    lib, _ = load([path], root=None)
    _, diags = check(lib)
    return [f"{d.span.line}:{d.span.col}: {d.message}" for d in diags.errors]


PAIR = """\
Algorithm: y, m ← Pair(x | W)
/* A token's scores and which of them are the k largest. */
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{E}, m ∈ ℝ^{E}
Hyperparameters: D, E, k ∈ ℕ
Parameters: W ∈ ℝ^{D×E}
1 g ← x W
2 return g, indicator(argtop_k(g | k))

"""
CALLER = """\
Algorithm: Y ← Caller(X | θ)
/* Calls Pair. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×E}
Hyperparameters: D, E ∈ ℕ
Parameters: θ consisting of:
    W ∈ ℝ^{D×E}
"""


@pytest.mark.parametrize(("steps", "message"), [
    ("1 Y ← Pair(X | W, k = 2)\n2 return Y\n",
     "17:7: 'Pair' has 2 outputs, y, m: a step names each, 'y, m ← Pair(…)'"),
    ("1 A, B, C ← Pair(X | W, k = 2)\n2 return A\n", "17:3: 3 names, but 'Pair' has 2 outputs"),
    ("1 A, B ← X W\n2 return A\n",
     "17:10: 2 names take the outputs of a card of as many, not of this expression"),
    ("1 A, B ← Pair(X | W, k = 2)\n2 return A, B\n",
     "18:3: returns 2 values, but the header promises Y"),
    ("1 A, B ← Pair(X | W, k = 2)\n2 return A + B\n", None),
    ("1 A, B ← Caller(X | θ)\n2 return A\n", "17:3: 2 names, but 'Caller' has 1 output"),
    ("1 return Y = indicator(X W)\n",
     "17:24: indicator marks the members of a set of indices, not ℝ^{T×E}"),
])
def test_each_misuse_is_a_located_message(tmp_path, steps, message):
    errors = _errors(tmp_path, PAIR + CALLER + steps)
    assert errors == ([] if message is None else [message])


def test_every_output_is_declared_and_returned_as_declared(tmp_path):
    card = PAIR.replace("Output: y ∈ ℝ^{E}, m ∈ ℝ^{E}", "Output: y ∈ ℝ^{E}") \
        .replace("return g, indicator", "return g + g, g[1] · indicator")
    assert _errors(tmp_path, card) == ["1:1: output 'm' is not declared in Output"]
    card = PAIR.replace("return g, indicator(argtop_k(g | k))", "return g, x")
    assert _errors(tmp_path, card) == ["8:13: returns ℝ^{D} as 'm' but Output declares ℝ^{E}"]


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


def agree(built: Built, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Both modules return the interpreter's tuple on `inputs`, values and the gradients of a
    weighted sum of every output; the interpreter's values."""
    runs = [built.program(*(x[b] for x in inputs), params=built.params, hypers=built.env)
            for b in range(B)]
    want = tuple(torch.stack([r[k] for r in runs]) for k in range(len(runs[0])))
    weights = [torch.linspace(-1, 1, w.numel(), dtype=torch.float64).reshape(w.shape)
               for w in want]
    sum((w * v).sum() for w, v in zip(weights, want, strict=True)).backward()
    grads = {n: p.grad.clone() for n, p in built.literal.named_parameters()}
    for module in (built.literal, built.fused):
        module.zero_grad()
        got = module(*inputs)
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w.detach(), rtol=RTOL, atol=ATOL)
        sum((w * v).sum() for w, v in zip(weights, got, strict=True)).backward()
        for n, p in module.named_parameters():
            torch.testing.assert_close(p.grad, grads[n], rtol=RTOL, atol=ATOL, msg=n)
    return tuple(w.detach() for w in want)


def test_several_outputs_run_as_the_interpreter_and_plain_torch_say(tmp_path):
    """Mix, a card on one token, called on every row at once; its outputs named by the caller;
    the chosen experts counted by indicator(I), fused (a sparse dispatch) and literal."""
    T, D, E, k = 5, 4, 3, 2
    built = Built(tmp_path, NOTATION.read_text(encoding="utf-8"), T=T, D=D, E=E, k=k)
    X = torch.randn(B, T, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    Y, c = agree(built, X)
    mix = built.literal.mix
    g = torch.softmax(X @ mix.W_g.detach(), dim=-1)
    chosen = torch.zeros_like(g).scatter(-1, g.topk(k, dim=-1).indices, 1.0)
    experts = torch.stack([torch.relu(X @ ex.W_1.detach()) for ex in mix.theta], dim=-2)
    want = ((g * chosen)[..., None] * experts).sum(-2)
    torch.testing.assert_close(Y, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c, chosen.mean(-2), rtol=1e-12, atol=1e-12)
    assert torch.equal(c.sum(-1), torch.full((B,), float(k), dtype=torch.float64))
