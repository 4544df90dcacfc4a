"""`cardc render --to html`: a card as a page with its math as MathML, in the paper's typography,
shapes shown on hover and calls linked; golden files for a few cards, every card's page checked
for well-formed markup, and prose that cannot inject any.

The golden files are regenerated with

    CARDC_GOLDEN=update pytest tests/test_render_html.py

The browser test runs Chromium through playwright where both are installed, and skips otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from tools import CHROMIUM

from cardc import syntax as s
from cardc.render.html import CSS, HtmlRenderer, algorithm_html, link_step, page, render_html
from cardc.render.latex import LatexRenderer

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "html"
CARDS = sorted(p.relative_to(ROOT) for folder in ("cards", "tests/cards/heads")
               for p in (ROOT / folder).rglob("*.card"))
GOLDEN_CARDS = ["cards/paper/attention.card", "cards/gpt2.card", "cards/mistral.card",
                "cards/mixtral.card", "cards/paper/dtraining.card", "cards/recipes/lm_training.card",
                "cards/vit.card"]
# what MathML Core lays out, and the HTML link a call's name is
MATHML = {"math", "mi", "mo", "mn", "mrow", "msub", "msup", "msubsup", "msqrt", "mfrac",
          "munder", "munderover", "mover", "mtext", "mspace"}
VOID = {"meta", "br", "hr", "img", "input", "link", "wbr"}



def _html(path: str | Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cardc", "render", "--to", "html", *flags,
                           str(path)], cwd=ROOT, capture_output=True, text=True)


class _Balance(HTMLParser):
    """Every element closed, in order (void elements and `<x/>` aside); ids collected."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: list[str] = []
        self.hrefs: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._attrs(tag, attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._attrs(tag, attrs)

    def _attrs(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.ids += [v or "" for k, v in attrs if k == "id"]
        self.hrefs += [v or "" for k, v in attrs if k == "href"]

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()


def _check_page(html: str) -> _Balance:
    """The page's markup balanced, its ids unique, its anchors there, its math MathML Core."""
    parser = _Balance()
    parser.feed(html)
    parser.close()
    assert not parser.errors and not parser.stack, (parser.errors[:3], parser.stack)
    assert html.startswith("<!doctype html>") and '<meta charset="utf-8">' in html
    assert "<script" not in html.lower()
    assert len(parser.ids) == len(set(parser.ids)), "duplicate ids"
    for href in parser.hrefs:
        assert href.startswith("#") and href[1:] in parser.ids, href  # nothing fetched
    for fragment in re.findall(r"<math>.*?</math>", html, re.S):
        tree = ET.fromstring(fragment)  # well-formed XML, entities and all
        for el in tree.iter():
            assert el.tag in MATHML or el.tag == "a", el.tag
    prose = re.sub(r"<style>.*?</style>", "", html, flags=re.S)
    assert "\\" not in prose  # no LaTeX leaked from a method the renderer did not override
    return parser


@pytest.mark.parametrize("card", GOLDEN_CARDS)
def test_golden(card):
    run = _html(card)
    assert run.returncode == 0, run.stderr
    golden = GOLDEN / (Path(card).stem + ".html")
    if os.environ.get("CARDC_GOLDEN") == "update":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(run.stdout, encoding="utf-8")
    assert run.stdout == golden.read_text(encoding="utf-8")


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


@pytest.fixture(scope="module")
def rendered(checked) -> dict[Path, str]:
    files, checker = checked
    return {c: render_html(files[c], checker) for c in CARDS}


@pytest.mark.parametrize("card", CARDS, ids=str)
def test_every_card_renders_well_formed(card, rendered):
    parser = _check_page(rendered[card])
    assert "figure" in parser.tags and "math" in parser.tags


def test_the_paper_typography():
    """Algorithm 4 as the paper sets it: vectors and matrices bold, names of functions
    upright, words in subscripts upright, ℝ double-struck, ⊺ and √ as math, return bold."""
    html = _html("cards/paper/attention.card").stdout
    assert "<b>Algorithm 4:</b>" in html
    assert re.search(r'<mi [^>]*mathvariant="bold-italic">𝑿</mi>', html)  # X, bold
    assert re.search(r'<mi [^>]*mathvariant="bold-italic">𝑴𝒂𝒔𝒌</mi>', html)  # a word
    assert '<mi mathvariant="normal">softmax</mi>' in html
    assert '<mi mathvariant="normal">Attention</mi>' in html  # the card's own name
    assert "<msub><mi>W</mi><mi>qkv</mi></msub>" in html  # a bundle: not bold, qkv upright
    assert "<mi>d</mi><mi>attn</mi>" in html and "<mi>ℝ</mi>" in html
    assert "<mo>⊺</mo>" in html and "<msqrt>" in html
    assert '<b class="kw">return</b>' in html
    assert '<span class="note"><span class="tri">▷</span> <math><mi>Query</mi><mo>∈</mo>' in html
    gpt2 = _html("cards/gpt2.card").stdout  # ε = 1e-5 as 10^−5; loops with their end
    assert "<msup><mn>10</mn><mrow><mo>−</mo><mn>5</mn></mrow></msup>" in gpt2
    assert '<b class="kw">for</b>' in gpt2 and '<b class="kw">end</b>' in gpt2
    assert '<div class="body">' in gpt2


def test_steps_carry_their_source_lines():
    html = _html("cards/paper/attention.card").stdout
    assert '<div class="step" id="L9" data-line="9"><span class="no">1</span>' in html
    assert 'id="L14" data-line="14"><span class="no">6</span>' in html


def test_names_carry_their_shapes():
    """A typed name has a title and a class tying it to a hidden tip that a rule of the
    figure's own shows on hover; the tip typesets the shape and the declaration's prose."""
    html = _html("cards/paper/attention.card").stdout
    z = re.search(r'<mi class="name (s\d+)" title="Z ∈ ℝ\^\{d_z×ℓ_z\}, vector representations '
                  r'of primary and context sequence\." mathvariant="bold-italic">𝒁</mi>', html)
    assert z, "Z carries its shape"
    n = z.group(1)
    assert html.count(f'class="name {n}"') >= 4  # the caption, Input and steps 2 and 3
    tip = re.search(rf'<div class="tip {n}" role="tooltip">(.*?)</div>', html).group(1)
    assert "<mo>∈</mo>" in tip and "— vector representations" in tip
    assert f"#alg-Attention:has(.name.{n}:hover) .tip.{n}{{display:block}}" in html
    assert re.search(r'title="d_attn ∈ ℕ"', html)  # a hyperparameter
    assert 'title="Q ∈ ℝ^{d_attn×ℓ_x}"' in html  # a step's target, typed by its value


def test_without_a_checker_no_bold_and_no_tips(checked):
    files, _ = checked
    alg = files[Path("cards/paper/attention.card")].algorithms[0]
    html = algorithm_html(alg, None, lambda a: None)
    assert "tip" not in html and "title=" not in html and "<style>" not in html
    steps = html[html.index('<div class="steps">'):]  # a declared tensor is bold, as in LaTeX
    assert "bold" not in steps and "<mi>X</mi>" in steps
    assert '<mi mathvariant="normal">softmax</mi>' in steps


def test_calls_link_to_the_cards_on_the_page():
    """GPT2 calls its own file's GPT2Block and, through it, cards of cards/nn: each is on the
    page once, after a heading, and every call's link lands on a figure."""
    html = _html("cards/gpt2.card").stdout
    parser = _check_page(html)
    assert '<mtext class="call"><a href="#alg-GPT2Block">GPT2Block</a></mtext>' in html
    assert '<a href="#alg-CausalSelfAttention">' in html
    assert html.index("<h2>Cards it calls</h2>") < html.index('id="alg-CausalSelfAttention"')
    for name in ("GPT2Block", "LayerNorm", "CausalSelfAttention", "MLP", "AttentionHead"):
        assert parser.ids.count(f"alg-{name}") == 1
    assert all(f"alg-{h[5:]}" in parser.ids for h in parser.hrefs if h.startswith("#alg-"))
    callee = html[html.index("<h2>Cards it calls</h2>"):]
    assert 'id="L' not in callee and 'data-line="' in callee  # lines of other files: no ids


def test_a_link_function_decides_the_href(checked):
    files, checker = checked
    alg = files[Path("cards/gpt2.card")].algorithms[1]  # GPT2Block

    def link(callee: s.Algorithm) -> str | None:
        return f"{callee.name}.html#x&y" if callee.name == "MLP" else None

    html = algorithm_html(alg, checker, link)
    assert '<a href="MLP.html#x&amp;y">MLP</a>' in html
    assert '<mi mathvariant="normal">CausalSelfAttention</mi>' in html  # no link: plain


NASTY = '<script>alert("x")</script> & </math> "q" <b>'


def test_prose_cannot_inject_markup(tmp_path):
    """Comments, declarations, notes, bundles and `where` holding markup come out as text."""
    card = tmp_path / "nasty.card"
    card.write_text(f"Algorithm: y ← Nasty(x | W)  ▷ {NASTY}\n/* {NASTY} */\n"
                    f"Input: x ∈ ℝ^{{d}}, {NASTY}\nOutput: y ∈ ℝ^{{d}}\n"
                    f"Hyperparameters: d ∈ ℕ\nParameters: W consisting of, {NASTY}:\n"
                    f"    W_1 ∈ ℝ^{{d×d}}, {NASTY}\n"
                    f"1 z ← W_1 x  ▷ {NASTY}\n2 return y = 2 z, where {NASTY}\n",
                    encoding="utf-8")
    run = _html(card)
    assert run.returncode == 0, run.stderr
    _check_page(run.stdout)
    escaped = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;/math&gt; " \
              "&quot;q&quot; &lt;b&gt;"
    assert run.stdout.count(escaped) >= 5, run.stdout  # in the tips and titles too


def test_prose_math_is_well_formed_and_escaped(tmp_path):
    """Math found in prose beside markup, and in names that hold it, is MathML Core, its text
    escaped; names in it carry their shapes as the steps' do."""
    prose = "x_{<b>} W^⊺<i> </math> <script>x</script> t − 1 < d, d/2"
    card = tmp_path / "math.card"
    card.write_text(f"Algorithm: y ← Math(x | W)\n/* {prose} */\nInput: x ∈ ℝ^{{d}}, {prose}\n"
                    "Output: y ∈ ℝ^{d}\nHyperparameters: d ∈ ℕ\nParameters: W ∈ ℝ^{d×d}\n"
                    f"1 y ← W x  ▷ {prose}\n2 return y\n", encoding="utf-8")
    run = _html(card)
    assert run.returncode == 0, run.stderr
    parser = _check_page(run.stdout)
    assert "script" not in parser.tags and "i" not in parser.tags
    comment = re.search(r'<div class="comment">(.*?)</div>', run.stdout).group(1)
    assert comment.count("<math>") == 4 and "&lt;/math&gt; &lt;script&gt;<math>" in comment
    assert re.search(r'<msup><mi class="ic name s\d+" title="W ∈ ℝ\^\{d×d\}" '
                     r'mathvariant="bold-italic">𝑾</mi><mo>⊺</mo></msup>', comment)


def test_names_cannot_inject_markup():
    """Names and numbers reach the page escaped, whatever a parser would let through."""
    bad = '</math><script>"&'
    alg = s.Algorithm(name=bad, outputs=(bad,), args=("x",), steps=(
        s.Step(s.Return(s.BinOp("+", s.Name(bad), s.Num("1<2")), name=bad), number=bad),))
    html = page(bad, algorithm_html(alg, None, lambda a: None))
    _check_page(html)
    assert "&lt;/math&gt;&lt;script&gt;&quot;&amp;" in html


def test_every_latex_method_has_a_mathml_one():
    """HtmlRenderer inherits the LaTeX renderer's layout, never its math."""
    latex = {n for n, f in vars(LatexRenderer).items()
             if (n.startswith("text_") or n.endswith("_text")) and callable(f)}
    latex.discard("weights_text")  # it dispatches to self.text, whose methods are these
    assert latex and all(n in vars(HtmlRenderer) for n in latex), latex - set(vars(HtmlRenderer))
    assert isinstance(HtmlRenderer(), LatexRenderer)


def test_link_step_links_a_step_number(checked):
    files, checker = checked
    alg = files[Path("cards/gpt2.card")].algorithms[0]
    html = algorithm_html(alg, checker, lambda a: None)
    linked = link_step(html, 16, "#py-3")
    assert '<div class="step" id="L16" data-line="16" style="--depth: 1">' \
           '<a class="no" href="#py-3">3</a>' in linked
    assert link_step(html, 999, "#py-3") == html


def test_the_page_stands_alone():
    html = page("a <title>", "<p>x</p>\n")
    assert "<title>a &lt;title&gt;</title>" in html and CSS in html
    assert "http" not in CSS and "@import" not in CSS and "url(" not in CSS


def test_a_card_that_does_not_check_still_renders(tmp_path):
    card = tmp_path / "broken.card"
    card.write_text("Algorithm: y ← Broken(x)\nInput: x ∈ ℝ^{d}\nOutput: y ∈ ℝ^{d}\n"
                    "1 return y = x W\n", encoding="utf-8")
    run = _html(card)
    assert run.returncode == 0, run.stderr
    assert '<mi mathvariant="normal">Broken</mi>' in run.stdout
    _check_page(run.stdout)


def test_a_card_that_does_not_parse_is_refused(tmp_path):
    card = tmp_path / "bad.card"
    card.write_text("Algorithm: y ← (\n", encoding="utf-8")
    run = _html(card)
    assert run.returncode != 0 and "bad.card:1" in run.stderr and run.stdout == ""
    assert "Traceback" not in run.stderr


def test_the_command_renders_what_the_fixture_does(rendered):
    run = _html("cards/paper/dtraining.card")
    assert run.returncode == 0 and run.stdout == rendered[Path("cards/paper/dtraining.card")]


def test_in_a_browser(tmp_path):
    """Chromium lays the page out: hovering a name shows its tip, clicking a call follows it."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not shutil.which(CHROMIUM):
        pytest.skip("chromium is not installed")
    (tmp_path / "gpt2.html").write_text(_html("cards/gpt2.card").stdout, encoding="utf-8")
    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            tab = browser.new_page()
            tab.goto((tmp_path / "gpt2.html").as_uri())
            figure = tab.locator("#alg-GPT2")
            name = figure.locator("figcaption .name").first  # P, the output
            n = re.search(r"s\d+", name.get_attribute("class")).group(0)
            tip = figure.locator(f".tip.{n}")
            assert not tip.is_visible()
            name.hover()
            assert tip.is_visible() and "∈" in tip.inner_text()
            tab.click("#alg-GPT2 a[href='#alg-GPT2Block']")
            assert tab.url.endswith("#alg-GPT2Block")
            assert tab.evaluate("document.querySelector(':target').id") == "alg-GPT2Block"
        finally:
            browser.close()
