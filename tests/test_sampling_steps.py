"""Top-k and top-p filtering as card steps: `top_k(w | k)` and `top_p(w | p)` parse, check (bad
uses are located diagnostics, tests/golden/sampling_filters.card), round-trip through
`cardc fmt`, render in every format, and lower to the filter of cardc/runtime/logits.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cardc import syntax as s
from cardc.build import checked, filter_bounds, load_module
from cardc.cli import main
from cardc.codegen import generate
from cardc.lower import Lowering
from cardc.parser import parse
from cardc.render.text import format_source, render_card
from cardc.runtime.logits import filter_logits

ROOT = Path(__file__).resolve().parent.parent
SAMPLING = ROOT / "cards" / "recipes" / "lm_sampling.card"
STEP = "sample a token y from q ∝ top_p(top_k(exp(z/τ) | k) | p)"
# the paper's DInference with both filters, its weights p^{1/τ} as the paper writes them
PAPER = """Algorithm 14: y ← DInference(x, θ̂)
/* Prompting a trained model and using it for prediction, among the most probable tokens. */
Input: Trained transformer parameters θ̂.
Input: x ∈ V*, a prompt.
Output: y ∈ V*, the transformer's continuation of the prompt.
Hyperparameters: ℓ_gen ∈ ℕ, τ ∈ (0, ∞), k ∈ ℕ, π_top ∈ (0, 1]
1 ℓ ← length(x)
2 for i = 1, 2, …, ℓ_gen do
3     P ← DTransformer(x | θ̂)
4     p ← P[:, ℓ + i − 1]
5     sample a token y from q ∝ top_p(top_k(p^{1/τ} | k) | π_top)
6     x ← [x, y]
7 end
8 return y = x[ℓ + 1 : ℓ + ℓ_gen]
"""
# scores z filtered, and a distribution r filtered top-p first: two orders of the filters
FILTERS = """Algorithm: q ← Filtered(z)
/* The distribution ∝ exp(z) on its k largest entries, then on the fewest whose mass reaches p. */
Input: z ∈ ℝ^{V}, scores.
Output: q ∈ ℝ^{V}, a distribution.
Hyperparameters: V, k ∈ ℕ, p ∈ (0, 1]
1 return q = top_p(top_k(exp(z) | k) | p)

Algorithm: q ← Refiltered(r)
/* A distribution r on the fewest most probable entries whose mass reaches p, then the k largest. */
Input: r ∈ ℝ^{V}, a distribution.
Output: q ∈ ℝ^{V}, a distribution.
Hyperparameters: V, k ∈ ℕ, p ∈ (0, 1]
1 q ← top_k(top_p(r | p) | k)
2 return q
"""


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _weights(card: s.CardFile) -> s.Expr:
    return next(n for n in s.nodes(card.algorithms[0].steps) if isinstance(n, s.Sample)).weights


def test_the_filters_parse_as_calls_around_the_sampled_weights():
    card = parse(SAMPLING.read_text(encoding="utf-8"))
    outer = _weights(card)
    assert isinstance(outer, s.Call) and (outer.func, outer.params) == ("top_p", (s.Name("p"),))
    inner = outer.args[0]
    assert isinstance(inner, s.Call) and (inner.func, inner.params) == ("top_k", (s.Name("k"),))
    assert isinstance(inner.args[0], s.Call) and inner.args[0].func == "exp"


def test_a_filters_weights_are_the_papers_power():
    """`top_k(p^{1/τ} | k)` in a sample step is p to the power 1/τ, as `q ∝ p^{1/τ}` is; a
    parenthesised `(W^{e/d})` stays the name."""
    power = _weights(parse(PAPER)).args[0].args[0]
    assert power == s.Power(s.Name("p"), s.BinOp("/", s.Num("1"), s.Name("τ")))
    name = _weights(parse(PAPER.replace("top_k(p^{1/τ} | k)", "top_k((W^{e/d}) | k)")))
    assert name.args[0].args[0] == s.Name("W^{e/d}")


@pytest.mark.parametrize("text", [SAMPLING.read_text(encoding="utf-8"), PAPER, FILTERS,
                                  PAPER.replace("top_k(p^{1/τ} | k)", "top_k((W^{e/d}) | k)")])
def test_the_filters_round_trip(text):
    card = parse(text)
    assert parse(render_card(card)) == card
    pretty, diags = format_source(text)
    assert not diags.errors and pretty == text


def test_the_ascii_spelling_formats_to_the_canonical_one():
    text = SAMPLING.read_text(encoding="utf-8")
    ascii_ = text.replace(STEP, "sample a token y from q propto top_p(top_k(exp(z/tau) | k) | p)")
    assert ascii_ != text
    pretty, diags = format_source(ascii_)
    assert not diags.errors and pretty == text


def test_the_library_card_checks_and_names_its_bounds():
    lib, checker, _ = checked([str(SAMPLING)], "cards")
    alg = next(a for f in lib.files for a in f.algorithms if a.name == "LMSampling")
    assert filter_bounds(checker, alg) == {"top_k": "k", "top_p": "p"}


@pytest.mark.parametrize("to, parts", [
    ("text", [STEP]),
    ("latex", [r"\mathrm{top}_{p}\left(\mathrm{top}_{k}\left(\mathrm{exp}\left(",
               r"\mid k\right) \mid p\right)"]),
    ("md", [r"q \propto \mathrm{top}_{p}\left(\mathrm{top}_{k}\left("]),
    ("html", ['<mo>∝</mo><mrow><msub><mi mathvariant="normal">top</mi><mi>p</mi></msub>',
              '<mo stretchy="false">∣</mo><mi class="name s4" title="k ∈ ℕ']),
])
def test_the_filters_render_in_every_format(capsys, to, parts):
    assert main(["render", "--to", to, str(SAMPLING.relative_to(ROOT))]) == 0
    out = capsys.readouterr().out
    for part in parts:
        assert part in out, part


def test_the_papers_form_renders_its_power_in_every_format(tmp_path, capsys):
    path = tmp_path / "dinference_top.card"
    path.write_text(PAPER, encoding="utf-8")
    for to, part in (("text", "q ∝ top_p(top_k(p^{1/τ} | k) | π_top)"),
                     ("latex", r"\mathrm{top}_{k}\left({\boldsymbol{p}}^{1/{\tau}} \mid k\right)"),
                     ("md", r"\mathrm{top}_{k}\left({\boldsymbol{p}}^{1/{\tau}} \mid k\right)")):
        assert main(["render", "--to", to, "--library", "cards", str(path)]) == 0
        assert part in capsys.readouterr().out, to


# ------------------------------------------------------------------ lowering


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """The generated functions of FILTERS' two cards."""
    path = tmp_path_factory.mktemp("filters") / "filters.card"
    path.write_text(FILTERS, encoding="utf-8")
    lib, checker, _ = checked([str(path)], None)
    lowering = Lowering(checker)
    for alg in lib.files[0].algorithms:
        lowering.function(alg)
    text = generate(lowering.program)
    assert "def filter_logits(" in text and "def pick_token(" not in text
    return load_module(text, "filters_card")


def _kept(logits: torch.Tensor, k: int | None, p: float | None) -> torch.Tensor:
    """The filters as their definitions say, one row at a time: the entries ≥ the k-th largest,
    then the fewest largest whose share of the rest reaches p."""
    keep = torch.zeros_like(logits, dtype=torch.bool)
    for row, z in enumerate(logits):
        kth = z.sort(descending=True).values[min(k or len(z), len(z)) - 1]
        kept = [i for i in range(len(z)) if z[i] >= kth]
        probs = torch.softmax(z[kept], dim=-1).tolist()
        order = sorted(range(len(kept)), key=lambda i: -probs[i])
        mass, nucleus = 0.0, []
        for i in order:
            if p is not None and mass >= p:
                break
            nucleus.append(kept[i])
            mass += probs[i]
        keep[row, nucleus] = True
    return keep


SCORES = {
    "random": torch.randn(4, 11, generator=torch.Generator().manual_seed(0)) * 3,
    "ties": torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, -1.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]]),
}
BOUNDS = [(1, 1.0), (3, 1.0), (None, 0.5), (4, 0.7), (11, 1.0), (50, 1.0), (2, 1e-6),
          (6, 0.999)]


@pytest.mark.parametrize("scores", list(SCORES))
@pytest.mark.parametrize("k, p", BOUNDS)
def test_the_lowered_filters_equal_the_runtimes(lowered, scores, k, p):
    """`top_p(top_k(exp(z) | k) | p)` is softmax(filter_logits(z, k, p)), and keeps what the
    definitions keep: k = 1 the largest (ties with it too), k ≥ V and p = 1 everything, a tiny
    p the largest alone (its ties among the largest)."""
    z = SCORES[scores]
    k_ = k if k is not None else z.shape[-1]
    got = lowered.Filtered(z, k_, p)
    want = torch.softmax(filter_logits(z, top_k=k_, top_p=p), dim=-1)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    keep = _kept(z, k_, p)
    for row in range(z.shape[0]):  # the same values kept: which of tied entries is the sort's
        assert z[row][got[row] > 0].sort().values.tolist() == \
            z[row][keep[row]].sort().values.tolist()
    torch.testing.assert_close(got.sum(-1), torch.ones(z.shape[0]))


@pytest.mark.parametrize("k, p", BOUNDS)
def test_filters_of_a_distribution_compose_in_the_order_written(lowered, k, p):
    """`top_k(top_p(r | p) | k)` of a distribution r: the nucleus first, then its k largest."""
    r = torch.softmax(SCORES["random"], dim=-1)
    k_ = k if k is not None else r.shape[-1]
    got = lowered.Refiltered(r, k_, p)
    want = torch.softmax(filter_logits(filter_logits(r.log(), top_p=p), top_k=k_), dim=-1)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(lowered.Refiltered(r, r.shape[-1], 1.0), r)  # both off
