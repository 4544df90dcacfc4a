"""A step too long for its line breaks at its loosest operators, keeping its one number: in the
LaTeX rendering (compiled by pdflatex, read back with pdftotext) and in the HTML one (laid out by
Chromium in a docs page); a step that fits is rendered as it always was.

pdflatex, pdftotext (poppler-utils), Chromium (Debian's, /usr/bin/chromium) and playwright are
installed by .ci/run; where one is missing its tests skip, except under CARDC_REQUIRE_TOOLS=1
(CI), where they fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from tools import missing

from cardc import syntax as s
from cardc.checker import Checker, check
from cardc.library import load
from cardc.parser import parse
from cardc.render.breaks import BREAK, Break, choose, pieces, width
from cardc.render.html import algorithm_html, split_rows
from cardc.render.latex import STEP, broken_math, render_latex
from cardc.render.text import TEXT

ROOT = Path(__file__).resolve().parent.parent
GEMMA2 = "cards/gemma2.card"
MARGIN = 72.27 / 2.54 * 2  # the standalone document's margins, 2cm, in PDF points


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        missing(name)
    assert found is not None
    return found


def _card(tmp_path: Path, steps: str) -> tuple[s.CardFile, Checker]:
    """A small card of `steps`, loaded and checked."""
    path = tmp_path / "small.card"
    path.write_text("Algorithm: y ← Small(x | W)\nInput: x ∈ ℝ^{d}\nOutput: y ∈ ℝ^{d}\n"
                    "Hyperparameters: d ∈ ℕ\nParameters: W ∈ ℝ^{d×d}\n" + steps,
                    encoding="utf-8")
    lib, _ = load([str(path)], root=str(tmp_path))
    checker, diags = check(lib)
    assert not diags.errors, diags.errors
    return next(f for f in lib.files if Path(f.path) == path), checker


def _stmt(text: str) -> s.Stmt:
    """A step's statement, from a card holding it."""
    card = parse("Algorithm: y ← F(x)\nInput: x ∈ ℝ^{d}\nOutput: y ∈ ℝ^{d}\n1 " + text + "\n")
    return card.algorithms[0].steps[0].stmt


def _lines(stmt_pieces: list, chosen: frozenset) -> list[str]:
    """The text of each line `chosen` breaks `stmt_pieces` into."""
    out = [""]
    for p in stmt_pieces:
        if isinstance(p, Break):
            out += [""] if p.key in chosen else []
        else:
            out[-1] += p
    return [line.strip() for line in out]


# ------------------------------------------------------------------ where a step breaks

def test_a_step_that_fits_is_not_broken():
    stmt = _stmt("y ← x + W x")
    assert choose(pieces(stmt), STEP, 4) == frozenset()


def test_the_loosest_points_that_suffice_are_chosen():
    """A sum breaks at its top-level `+` before any comma within its calls; where that is not
    enough, the commas of the outermost call come next, each line filled as far as it goes."""
    call = "f(" + ", ".join(f"a_{i} + b_{i}" for i in range(4)) + ")"
    stmt = _stmt(f"y ← {call} + {call}")
    lines = _lines(pieces(stmt), choose(pieces(stmt), 44, 4))
    assert lines == [f"y ← {call} +", call]
    lines = _lines(pieces(stmt), choose(pieces(stmt), 24, 4))
    assert lines == ["y ← f(a_0 + b_0, a_1 + b_1,", "a_2 + b_2, a_3 + b_3) +",
                     "f(a_0 + b_0, a_1 + b_1,", "a_2 + b_2, a_3 + b_3)"]
    assert all(width(line) <= 24 for line in lines)


def test_the_pieces_spell_the_statement():
    """Every step of the library: its pieces' text is the step's text, what the widths are
    counted on."""
    cards = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "cards").rglob("*.card"))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        lib, _ = load(cards, root="cards")
    steps = [n for f in lib.files for a in f.algorithms for n in s.nodes(a.steps)
             if isinstance(n, s.Step)]
    assert len(steps) > 300
    for step in steps:
        text = "".join(p for p in pieces(step.stmt) if isinstance(p, str))
        assert text == TEXT.text(step.stmt)


# ------------------------------------------------------------------ LaTeX

def test_a_short_step_renders_as_before(tmp_path):
    card, checker = _card(tmp_path, "1 z ← W x + x\n2 return y = 2 z\n")
    tex = render_latex(card, checker)
    assert r"$\boldsymbol{z} \gets \boldsymbol{W} \, \boldsymbol{x} + \boldsymbol{x}$\;" in tex
    assert r"\KwRet{$\boldsymbol{y} = 2 \, \boldsymbol{z}$}\;" in tex
    assert BREAK not in tex and r"\right." not in tex


def test_a_long_step_breaks_into_math_of_its_own():
    """Each piece of a broken step's math pairs its own \\left and \\right."""
    line = r"$a \gets f\left(b, " + BREAK + r"c\left(d, " + BREAK + r"e\right)\right)$\;"
    out = broken_math(line)
    assert out == (r"$a \gets f\left(b, \right.$\newline\hspace*{1.5em}"
                   r"$\left.c\left(d, \right.\right.$\newline\hspace*{1.5em}"
                   r"$\left.\left.e\right)\right)$\;")
    for math in re.findall(r"\$(.*?)\$", out):
        assert len(re.findall(r"\\left(?![a-z])", math)) == len(re.findall(r"\\right(?![a-z])",
                                                                             math))


@pytest.fixture(scope="module")
def gemma2():
    """Gemma 2's card file and the checker of it and the cards it calls."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        lib, _ = load([GEMMA2], root="cards")
        checker, _ = check(lib)
    return next(f for f in lib.files if f.path == GEMMA2), checker


def _numbers(card: s.CardFile) -> list[str]:
    """The numbers algorithm2e prints, in order: each step's, and each loop's `end`."""
    def walk(steps: tuple[s.Step, ...]) -> list[str]:
        out: list[str] = []
        for step in steps:
            out.append(step.number or "")
            stmt = step.stmt
            if isinstance(stmt, s.While) or isinstance(stmt, s.For) and stmt.style == "do":
                out += walk(stmt.body) + [stmt.end_number or ""]
        return out
    return [n for alg in card.algorithms for n in walk(alg.steps)]


def test_gemma2_stays_within_the_margins_in_pdflatex(gemma2, tmp_path):
    """The PDF of Gemma 2: no word past the right margin, every step number once, in order."""
    card, checker = gemma2
    tex = render_latex(card, checker, whole=True)
    assert tex.count(r"\newline\hspace*{1.5em}$") >= 3  # the blocks' steps and the maps
    (tmp_path / "g.tex").write_text(tex, encoding="ascii")
    run = subprocess.run([_tool("pdflatex"), "-interaction=nonstopmode", "-halt-on-error",
                          "g.tex"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:]
    subprocess.run([_tool("pdftotext"), "-bbox", "g.pdf", "g.html"], cwd=tmp_path, check=True)
    bbox = (tmp_path / "g.html").read_text(encoding="utf-8")
    numbers = []
    for width_, page in re.findall(r'<page width="([\d.]+)"[^>]*>(.*?)</page>', bbox, re.S):
        right = float(width_) - MARGIN
        words = [(float(x0), float(y0), float(x1), text) for x0, y0, x1, text in re.findall(
            r'<word xMin="([\d.]+)" yMin="([\d.]+)" xMax="([\d.]+)" yMax="[\d.]+">([^<]*)</word>',
            page)]
        past = [w for w in words if w[2] > right + 0.5]
        assert not past, f"past the right margin at {right:.1f}pt: {past}"
        numbers += [text for x, _, _, text in sorted(words, key=lambda w: w[1])
                    if x < MARGIN + 12 and text.isdigit()]
    assert numbers == _numbers(card)


# ------------------------------------------------------------------ HTML

def test_a_short_step_is_one_math_element(tmp_path):
    card, checker = _card(tmp_path, "1 z ← W x + x\n2 return y = 2 z\n")
    html = algorithm_html(card.algorithms[0], checker, lambda a: None)
    assert "lines" not in html and "<wbr>" not in html and ".lines" not in html
    assert html.count("<math>") == html.count("</math>") and BREAK not in html


def test_a_long_step_is_math_pieces_each_well_formed(gemma2):
    card, checker = gemma2
    block = next(a for a in card.algorithms if a.name == "Gemma2Block")
    html = algorithm_html(block, checker, lambda a: None)
    step = re.search(r'<div class="step" id="L38"[^>]*><span class="no">1</span>'
                     r'<span class="code lines">(.*?)</span></div>', html)
    assert step, "step 1 in pieces, beside its number"
    maths = step.group(1).split("<wbr>")
    assert len(maths) > 3 and BREAK not in html
    for math in maths:
        ET.fromstring(math)  # each piece well-formed on its own
    assert maths[0].endswith("<mo>←</mo></math>")  # the loosest point: after the arrow
    assert "<style>" in html and ".code.lines" in html


def test_split_rows_reopens_the_rows_open_at_a_break():
    markup = f"<mrow><mi>a</mi><mrow><mo>(</mo><mi>b</mi><mo>,</mo>{BREAK}<mi>c</mi>" \
             "<mo>)</mo></mrow></mrow>"
    assert split_rows(markup) == [
        "<mrow><mi>a</mi><mrow><mo>(</mo><mi>b</mi><mo>,</mo></mrow></mrow>",
        "<mrow><mrow><mi>c</mi><mo>)</mo></mrow></mrow>"]
    inside = f"<msub><mi>a</mi>{BREAK}<mi>b</mi></msub>"  # no break within a script
    assert split_rows(inside) == ["<msub><mi>a</mi><mi>b</mi></msub>"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    run = subprocess.run([sys.executable, "-m", "cardc", "docs", GEMMA2, "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return out


# every step of the page: how far it reaches past its figure, whether it scrolls, and whether
# its number sits on the first line of its code
_STEPS = """() => [...document.querySelectorAll('figure.algorithm .step')].map(step => {
    const pane = step.closest('figure').getBoundingClientRect();
    const code = step.querySelector('.code'), no = step.querySelector('.no');
    const first = code && code.querySelector('math');
    const line = first ? first.getBoundingClientRect() : null, at = no && no.getBoundingClientRect();
    return {id: step.id || step.textContent.slice(0, 20),
            past: Math.max(0, ...[...step.querySelectorAll('*')].map(
                e => e.getBoundingClientRect().right - pane.right)),
            scrolls: step.scrollWidth > step.clientWidth,
            wrapped: code !== null && code.classList.contains('lines'),
            height: code ? code.getBoundingClientRect().height : 0,
            numbered: !at || !line || (at.bottom > line.top && at.top < line.bottom)};
})"""


@pytest.mark.parametrize("viewport", [900, 1500])
def test_gemma2_steps_wrap_within_their_pane_in_chromium(site, browser, viewport):
    """At 900 px the page is one column; at 1500 px the card shares the page with its code."""
    tab = browser.new_page(viewport={"width": viewport, "height": 1000})
    try:
        wrapped = {}
        for path in sorted(site.glob("*.html")):
            if path.name in ("index.html",):
                continue
            tab.goto(path.as_uri())
            for step in tab.evaluate(_STEPS):
                where = f"{path.name} {step['id']}"
                assert step["past"] <= 0.5, f"{where} reaches {step['past']:.1f}px past its pane"
                assert not step["scrolls"], f"{where} overflows its row"
                assert step["numbered"], f"{where}: its number is not on its first line"
                wrapped[where] = step
        block = wrapped["cards-gemma2.Gemma2Block.html L38"]
        assert block["wrapped"] and block["height"] > 40  # step 1 of the block: two lines
    finally:
        tab.close()
