"""Math written in prose is typeset as math (cardc.render.prose), and bold follows the checker's
types wherever a name is set: steps, declarations, the caption, prose, tips and preset tables,
in HTML and LaTeX alike."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from cardc import syntax as s
from cardc.render.html import HtmlRenderer, algorithm_html, assignments_html
from cardc.render.latex import LatexRenderer, typography
from cardc.render.markdown import render_markdown
from cardc.render.prose import Formula, Vocabulary, pieces
from cardc.render.text import TEXT

ROOT = Path(__file__).resolve().parent.parent
CARDS = sorted(p.relative_to(ROOT) for folder in ("cards", "tests/cards/heads")
               for p in (ROOT / folder).rglob("*.card"))
# the names RoPE's and Gemma 2's prose mention
VOCAB = Vocabulary(frozenset({"P", "x", "t", "θ_base", "X", "d", "i", "ω", "s", "H", "H_kv",
                              "G", "w", "Q", "K", "D", "c_attn", "γ", "ctx", "types", "A"}),
                   frozenset({"softmax", "length"}))


def _formulas(prose: str, vocab: Vocabulary = VOCAB) -> list[str]:
    return [p.text for p in pieces(prose, vocab) if isinstance(p, Formula)]


def _canonical(f: Formula) -> str:
    """A formula as the text renderer writes its parts."""
    parts = [TEXT.text(p) for p in f.parts]
    out = parts[0]
    for rel, part in zip(f.relations, parts[1:], strict=True):
        out += f" {rel} {part}"
    return out


# ------------------------------------------------------------------ finding math in prose


def test_the_shipped_cards_math_is_found():
    assert _formulas("where the t-th column of P represents P̂_θ(x[t+1] | x[1 : t]).") == \
        ["t", "P", "P̂_θ(x[t+1] | x[1 : t])"]
    assert _formulas("a query meets a key as Q K^⊺/√s") == ["Q K^⊺/√s"]
    assert _formulas("with frequencies ω_i = θ_base^{−2(i − 1)/d}.") == \
        ["ω_i = θ_base^{−2(i − 1)/d}"]
    assert _formulas("H_kv key/value heads each shared by G = H/H_kv consecutive heads") == \
        ["H_kv", "G = H/H_kv"]
    assert _formulas("the positions t′ with t − w < t′ ≤ t; the angles, T × d/2") == \
        ["t′", "t − w < t′ ≤ t", "T × d/2"]


def test_a_braced_superscript_of_a_known_name_is_a_power():
    """The grammar lexes `θ_base^{…}` as one name; the card knows θ_base, so it is a power."""
    (formula,) = [p for p in pieces("θ_base^{−2(i − 1)/d}", VOCAB) if isinstance(p, Formula)]
    (power,) = formula.parts
    assert isinstance(power, s.Power) and power.base == s.Name("θ_base")
    assert _canonical(formula) == "(θ_base)^{−2 (i − 1)/d}"


@pytest.mark.parametrize("prose", [
    "the softmax of the scores, layer-norm parameters, see (4)",
    "GELU's tanh approximation; e.g. a 2D grid, GPT-2 at fp32",
    "learned positions and token types, up to ctx positions",  # words the card names
    "A diagonal recurrence: A gate per channel",  # the article, though the card names A
    "layer_norm and mask_token, spelt as code",
    "http://x and #1 and $2",  # glued to what is not math
])
def test_english_stays_prose(prose):
    assert _formulas(prose) == []


def test_what_does_not_parse_stays_prose_and_nothing_is_lost():
    for prose in ["soft-capped at ±c_attn:", "x[1 : t", "Q K^⊺/ and ∈ ∈ x", "√", "P̂_θ(x",
                  "((((((((((((((((((((((((((((((((((((((((((((((((((x))))))))))))))))))))",
                  "x " + "(" * 5000, "(x)+" * 3000]:
        got = pieces(prose, VOCAB)
        text = "".join(p if isinstance(p, str) else p.text for p in got)
        assert text == unicodedata.normalize("NFD", prose)
    assert _formulas("soft-capped at ±c_attn:") == ["c_attn"]


def test_a_known_word_is_math_beside_a_mark():
    assert _formulas("ctx + 2 rows") == ["ctx + 2"]
    assert _formulas("the set A of the k largest") == ["A", "k"]  # a letter alone: a variable


def test_a_declaration_in_prose():
    formula = pieces("a row per token: C, R ∈ ℝ^{T×E}", Vocabulary(frozenset("CRTE")))[-1]
    assert isinstance(formula, Formula) and isinstance(formula.parts[0], s.Decl)


# ------------------------------------------------------------------ the renderers


@pytest.fixture(scope="module")
def checked():
    """Every card, loaded and checked as `cardc render` does."""
    from cardc.checker import check
    from cardc.library import load

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        lib, _ = load([str(c) for c in CARDS], root="cards")
        checker, _ = check(lib)
        return {Path(f.path): f for f in lib.files}, checker


def _alg(checked, path: str, name: str | None = None) -> s.Algorithm:
    files, _ = checked
    algs = files[Path(path)].algorithms
    return next(a for a in algs if name is None or a.name == name)


def _html(checked, path: str, name: str | None = None) -> str:
    return algorithm_html(_alg(checked, path, name), checked[1], lambda a: None)


def _latex(checked, path: str, name: str | None = None) -> str:
    alg = _alg(checked, path, name)
    return "\n".join(typography(checked[1], alg).algorithm_tex(alg))


def test_html_sets_prose_math_as_the_steps(checked):
    rope = _html(checked, "cards/nn/rope.card", "RoPE")
    comment = re.search(r'<div class="comment">(.*?)</div>', rope).group(1)
    assert "θ_base^" not in comment and "<msup>" in comment  # a superscript, not a name
    assert 'title="X ∈ ℝ^{T×d}, one row per position." mathvariant="bold-italic">𝑿</mi>' \
        in comment  # X as its steps set it, its shape on hover
    gemma = _html(checked, "cards/gemma2.card", "Gemma2")
    hyper = gemma[gemma.index("<b class=\"kw\">Hyperparameters:"):]
    assert "<msqrt>" in hyper.split("</div></div></div>")[0] and "<mo>⊺</mo>" in hyper
    dtrans = _html(checked, "cards/paper/dtransformer.card")
    out = re.sub(r' title="[^"]*"', "", dtrans[dtrans.index("Output:"):])  # titles: text
    out = out.split("</div></div></div>")[0]
    assert "P̂_θ(" not in out and '<mover accent="true"><mi>P</mi><mo>ˆ</mo></mover>' in out


def test_latex_sets_prose_math_as_the_steps(checked):
    rope = _latex(checked, "cards/nn/rope.card", "RoPE")
    assert r"{{\theta}_{\mathrm{base}}}^{-2 \, \left(i - 1\right)/d}" in rope
    gemma = _latex(checked, "cards/gemma2.card", "Gemma2")
    assert r"as $Q \, {K}^{\intercal}/\sqrt{s}$" in gemma  # Q, K: not Gemma2's names
    dtrans = _latex(checked, "cards/paper/dtransformer.card")
    assert r"the $t$-th column of $\boldsymbol{P}$ represents $\hat{P}_{{\theta}}\left(" \
           r"\boldsymbol{x}[t + 1] \mid \boldsymbol{x}[1 : t]\right)$." in dtrans


def test_markdown_sets_prose_math_as_math(checked):
    alg = _alg(checked, "cards/gemma2.card", "Gemma2")
    md = render_markdown(s.CardFile("g.card", (alg,)), checked[1])
    assert r"as $Q \, {K}^{\intercal}/\sqrt{s}$" in md


def _card(tmp_path: Path, prose: str) -> tuple[s.CardFile, object]:
    from cardc.checker import check
    from cardc.library import load

    path = tmp_path / "p.card"
    path.write_text(f"Algorithm: y ← P(x | W)\n/* {prose} */\nInput: x ∈ ℝ^{{d}}, {prose}\n"
                    "Output: y ∈ ℝ^{d}\nHyperparameters: d ∈ ℕ\nParameters: W ∈ ℝ^{d×d}\n"
                    f"1 y ← W x  ▷ {prose}\n2 return y\n", encoding="utf-8")
    lib, _ = load([str(path)], root=str(tmp_path))
    checker, _ = check(lib)
    return lib.files[0], checker


INJECTION = r"x_i\input{a} <script>x</script> $x$ x_{<b>} x_{\input} W^⊺<i>"


def test_prose_math_cannot_open_markup_or_commands(tmp_path):
    """Math found beside markup or TeX commands, or in names that hold them, is escaped
    (tests/test_render_latex.py compiles the LaTeX)."""
    card, checker = _card(tmp_path, INJECTION)
    from cardc.render.html import render_html
    from cardc.render.latex import render_latex

    html = render_html(card, checker)
    assert "<script" not in html and "<i>" not in html and "<b>" not in \
        html.replace("<b>Algorithm:</b>", "")
    assert html.count("&lt;script&gt;") >= 3 and "<msup>" in html
    assert "<mo>&lt;</mo><mi>b</mi><mo>&gt;</mo>" in html  # x_{<b>}: its subscript as math
    tex = render_latex(card, checker)
    assert r"\input" not in tex.replace(r"\textbackslash{}input", "")
    assert r"\textbackslash{}input\{a\}" in tex and r"x_{{\backslash}input}" in tex
    md = render_markdown(card, checker)
    assert not re.search(r"(?<!\\)<[a-z/]", md) and r"x_{\lt b\gt }" in md


# ------------------------------------------------------------------ one weight per name


_NAMED = re.compile(r'<(mi|msub|msup|msubsup|mover|mrow) class="(?:ic )?name (s\d+)[^"]*" '
                    r'title="([^"]*?) ∈ ([^"]*)"([^>]*)>([^<]*(?:<[^>]*>)?)')


def _weights(html: str) -> dict[str, set[tuple[bool, str]]]:
    """Each name a figure shows with its shape: the weights it is set in, with its types (a
    title is `name ∈ type` and the declaration's prose after a comma outside brackets)."""
    out: dict[str, set[tuple[bool, str]]] = {}
    for m in _NAMED.finditer(html):
        bold = "bold" in m.group(5) or "bold" in m.group(6)
        out.setdefault(m.group(3), set()).add((bold, _type(m.group(4))))
    return out


def _type(said: str) -> str:
    depth = 0
    for k, c in enumerate(said):
        depth += (c in "([{") - (c in ")]}")
        if depth == 0 and said.startswith(", ", k):
            return said[:k]
    return said


@pytest.mark.parametrize("card", CARDS, ids=str)
def test_a_name_has_one_weight_and_a_scalar_is_never_bold(card, checked):
    """In every card's figure a name is set in one weight in its declaration, its steps, its
    prose and its tip; a name the checker types only as a scalar is never bold."""
    files, checker = checked
    for alg in files[card].algorithms:
        html = algorithm_html(alg, checker, lambda a: None)
        for name, seen in _weights(html).items():
            assert len({b for b, _ in seen}) == 1, (alg.name, name, seen)
            if all("^" not in ty for _, ty in seen):
                assert not any(b for b, _ in seen), (alg.name, name, seen)
        for n, tip in re.findall(r'<div class="tip (s\d+)" role="tooltip"><math>(<[^>]*>'
                                 r'(?:<[^>]*>)?)', html):
            name = re.search(rf'class="(?:ic )?name {n}[" ][^>]*>(<[^>]*>)?', html)
            shown = name.group(0) if name else ""
            assert ("bold" in tip) == ("bold" in shown), (alg.name, n, tip, shown)


@pytest.mark.parametrize("card", CARDS, ids=str)
def test_latex_and_html_bold_the_same_names(card, checked):
    files, checker = checked
    for alg in files[card].algorithms:
        tex, html = typography(checker, alg), typography(checker, alg, HtmlRenderer)
        assert isinstance(tex, LatexRenderer) and isinstance(html, HtmlRenderer)
        for n in s.nodes(alg.steps):
            if isinstance(n, s.Name):
                assert (r"\boldsymbol" in tex.text(n)) == ("bold" in html.text(n)), n.id


def test_the_issues_names(checked):
    """x_n of DTraining is bold in its data set, its header (x_{1:N_data}) and its steps; e_t
    of DTransformer at its assignment and as e_1, …; P(θ) is the bold letter P, not an upright
    function name."""
    train = _html(checked, "cards/paper/dtraining.card")
    block = train[train.index("Input:"):train.index("Output:")]
    assert '<mi mathvariant="bold-italic">𝒙</mi><mi>n</mi>' in block
    assert '<mi mathvariant="normal">P</mi>' not in train
    assert train.count('mathvariant="bold-italic">𝑷</mi>') >= 2
    dtrans = _html(checked, "cards/paper/dtransformer.card")
    assert re.search(r'title="e_t ∈ [^"]*"><mi mathvariant="bold-italic">𝒆</mi><mi>t</mi>',
                     dtrans)
    assert re.search(r'title="e_1 ∈ [^"]*"><mi mathvariant="bold-italic">𝒆</mi><mn>1</mn>',
                     dtrans)
    caption = train[:train.index("</figcaption>")]  # x_{1:N_data}: the data set, as x_n
    assert '<msub><mi mathvariant="bold-italic">𝒙</mi><mrow><mn>1</mn>' in caption
    tex = _latex(checked, "cards/paper/dtraining.card")
    assert r"\KwIn{$\{\boldsymbol{x}_{n}\}" in tex
    assert r"\mathrm{DTraining}\left(\boldsymbol{x}_{1:N_{\mathrm{data}}}, {\theta}\right)" in tex
    assert r"\boldsymbol{P}\left({\theta}\right) \gets" in tex and r"\mathrm{P}" not in tex
    assert r"$\boldsymbol{e}_{t} \gets" in _latex(checked, "cards/paper/dtransformer.card")


def test_a_state_started_at_zero_is_one_vector(checked):
    """`h ← 0`, then `h ← A[t, :] ⊙ h + …`: h is bold throughout, as the paper sets a state."""
    html = _html(checked, "cards/recurrent.card", "GatedRecurrence")
    shown = re.findall(r'title="h ∈ ([^"]*)"([^>]*)>', html)
    assert len(shown) >= 4 and {ty for ty, _ in shown} == {"ℕ", "ℝ^{D_h}"}
    assert all("bold" in attrs for _, attrs in shown), shown


def test_without_a_checker_nothing_is_bold(checked):
    """No types, no bold: declarations, steps and prose alike."""
    alg = _alg(checked, "cards/paper/attention.card")
    assert "bold" not in algorithm_html(alg, None, lambda a: None)
    assert r"\boldsymbol" not in "\n".join(typography(None, alg).algorithm_tex(alg))


def test_preset_tables_set_names_as_math(checked):
    alg = _alg(checked, "cards/gemma2.card", "Gemma2")
    html = assignments_html(alg, checked[1], [("H_kv", "2"), ("D", "2304"), ("ε", "1e-06")])
    assert "<math><msub><mi>H</mi><mi>kv</mi></msub><mo>=</mo><mn>2</mn></math>, " in html
    assert "<msup><mn>10</mn>" in html and "bold" not in html and "title=" not in html
