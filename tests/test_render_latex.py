"""`cardc render --to latex`: the paper's typography (algorithm2e), ASCII only, prose escaped,
golden files for a few cards, and every card's LaTeX compiled by a real pdflatex.

The golden files are regenerated with

    CARDC_GOLDEN=update pytest tests/test_render_latex.py

pdflatex (Debian's texlive-latex-base, -latex-extra and -science, which has algorithm2e) and
pdftotext (poppler-utils) are installed by .ci/run; where they are missing the compile tests
skip, except under CARDC_REQUIRE_TOOLS=1 (CI), where they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cardc.render.latex import render_latex, standalone, text

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "latex"
CARDS = sorted(p.relative_to(ROOT) for folder in ("cards", "tests/cards/heads")
               for p in (ROOT / folder).rglob("*.card"))
GOLDEN_CARDS = ["cards/paper/attention.card", "cards/gpt2.card", "cards/mistral.card",
                "cards/mixtral.card", "cards/paper/dtraining.card", "cards/recipes/lm_training.card",
                "cards/vit.card"]


def _latex(path: str | Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cardc", "render", "--to", "latex", *flags,
                           str(path)], cwd=ROOT, capture_output=True, text=True)


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CARDC_REQUIRE_TOOLS"):
            pytest.fail(f"{name} is required here (CARDC_REQUIRE_TOOLS) and is not installed")
        pytest.skip(f"{name} is not installed")
    return found


def _compile(tex: str, folder: Path) -> Path:
    """The PDF pdflatex makes of `tex`; its log in the failure message."""
    (folder / "card.tex").write_text(tex, encoding="ascii")
    run = subprocess.run([_tool("pdflatex"), "-interaction=nonstopmode", "-halt-on-error",
                          "card.tex"], cwd=folder, capture_output=True, text=True, timeout=120)
    log = (folder / "card.log").read_text(encoding="latin-1") if (folder / "card.log").exists() \
        else run.stdout
    assert run.returncode == 0, "\n".join(line for line in log.splitlines() if line.startswith("!")
                                          ) or log[-2000:]
    return folder / "card.pdf"


@pytest.mark.parametrize("card", GOLDEN_CARDS)
def test_golden(card):
    run = _latex(card)
    assert run.returncode == 0, run.stderr
    golden = GOLDEN / (Path(card).stem + ".tex")
    if os.environ.get("CARDC_GOLDEN") == "update":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(run.stdout, encoding="ascii")
    assert run.stdout == golden.read_text(encoding="ascii")


def test_the_paper_typography():
    """Algorithm 4 as the paper sets it: numbered, captioned with its signature, vectors and
    matrices bold, names of functions upright, words in subscripts upright, ⊺ and √ as math,
    `return` bold, annotations in the right margin."""
    tex = _latex("cards/paper/attention.card").stdout
    assert r"\SetAlgoRefName{4}" in tex
    assert r"\caption{$\boldsymbol{\tilde{V}} \gets \mathrm{Attention}" in tex
    assert r"\boldsymbol{W}_{q} \, \boldsymbol{X}" in tex  # W_q X, both bold
    assert r"\mathrm{softmax}\left(\boldsymbol{S}/\sqrt{d_{\mathrm{attn}}}\right)" in tex
    assert r"{\boldsymbol{K}}^{\intercal}" in tex
    assert r"\KwRet{" in tex and r"\Note*[r]{$\mathrm{Query} \in \mathbb{R}^" in tex
    assert r"\KwIn{" in tex and r"\KwHyper{" in tex and r"\KwParams{" in tex
    assert tex.isascii()


def test_loops_have_vertical_rules_and_ends():
    tex = _latex("cards/gpt2.card").stdout
    assert r"\For{${\ell} = 1, \ldots, N$}{" in tex and tex.count("}\n") > 3
    preamble = _latex("cards/gpt2.card", "--standalone").stdout
    assert r"\usepackage[ruled,lined,linesnumbered]{algorithm2e}" in preamble


@pytest.fixture(scope="module")
def rendered() -> dict[Path, str]:
    """Every card's standalone LaTeX, rendered in this process as `cardc render` does."""
    from cardc.checker import check
    from cardc.library import load

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        lib, _ = load([str(c) for c in CARDS], root="cards")
        checker, _ = check(lib)
        files = {Path(f.path): f for f in lib.files}
        return {c: render_latex(files[c], checker, whole=True) for c in CARDS}


@pytest.mark.parametrize("card", CARDS, ids=str)
def test_every_card_renders_as_ascii(card, rendered):
    assert rendered[card].isascii() and r"\begin{algorithm}" in rendered[card]


def test_prose_cannot_break_the_document(tmp_path):
    """Comments and declarations holding every character TeX treats specially compile, and
    the PDF reads them back as written; the math among them (`x_i y^2`) is typeset."""
    nasty = r"costs 5% of $2 {a} #1 x_i y^2 a\b & c ~ d"
    card = tmp_path / "nasty.card"
    card.write_text(f"Algorithm: y ← Nasty(x)\n/* {nasty} */\n"
                    f"Input: x ∈ ℝ^{{d}}, {nasty}\nOutput: y ∈ ℝ^{{d}}\n"
                    "Hyperparameters: d ∈ ℕ\n1 return y = 2 x  ▷ " + nasty + "\n",
                    encoding="utf-8")
    run = _latex(card, "--standalone")
    assert run.returncode == 0, run.stderr
    pdf = _compile(run.stdout, tmp_path)
    words = subprocess.run([_tool("pdftotext"), str(pdf), "-"], capture_output=True,
                           text=True).stdout
    for piece in ("5%", "$2", "{a}", "#1", "a\\b", "& c", "~ d"):
        assert words.count(piece) >= 3, (piece, words)  # the comment, the input, the note
    assert run.stdout.count(r"\#1 $x_{i} \, y^{2}$ a\textbackslash{}b") == 3


def test_prose_math_compiles(tmp_path):
    """Math found in prose beside TeX's special characters, and in names that hold them
    (`x_{\\input}`), compiles: its names and operators are math, never commands."""
    prose = r"x_i\input{a} $x$ x_{<b>} x_{\input} W^⊺<i> 5% t − 1 < d, T × d/2 #1"
    card = tmp_path / "math.card"
    card.write_text(f"Algorithm: y ← Math(x | W)\n/* {prose} */\nInput: x ∈ ℝ^{{d}}, {prose}\n"
                    "Output: y ∈ ℝ^{d}\nHyperparameters: d ∈ ℕ\nParameters: W ∈ ℝ^{d×d}\n"
                    f"1 y ← W x  ▷ {prose}\n2 return y\n", encoding="utf-8")
    run = _latex(card, "--standalone")
    assert run.returncode == 0, run.stderr
    math = r"$x_{<b>} \, x_{{\backslash}input} \, {\boldsymbol{W}}^{\intercal} < i$"
    assert run.stdout.count(math) == 3
    assert _compile(run.stdout, tmp_path).stat().st_size > 1000


def test_text_escapes_and_keeps_ascii():
    assert text("θ̂ ≠ x, é") == r"$\hat{\theta}$ $\ne$ x, {\'{e}}"
    assert text("中") == "?"


@pytest.mark.parametrize("card", CARDS, ids=str)
def test_every_card_compiles_with_pdflatex(card, rendered, tmp_path):
    pdf = _compile(rendered[card], tmp_path)
    assert pdf.stat().st_size > 1000


def test_a_card_that_does_not_check_still_renders(tmp_path):
    card = tmp_path / "broken.card"
    card.write_text("Algorithm: y ← Broken(x)\nInput: x ∈ ℝ^{d}\nOutput: y ∈ ℝ^{d}\n"
                    "1 return y = x W\n", encoding="utf-8")
    run = _latex(card)
    assert run.returncode == 0, run.stderr
    assert r"\mathrm{Broken}" in run.stdout


def test_a_card_that_does_not_parse_is_refused(tmp_path):
    card = tmp_path / "bad.card"
    card.write_text("Algorithm: y ← (\n", encoding="utf-8")
    run = _latex(card)
    assert run.returncode != 0 and "bad.card:1" in run.stderr and run.stdout == ""
    assert "Traceback" not in run.stderr


def test_the_command_renders_what_the_fixture_does(rendered):
    run = _latex("cards/gpt2.card", "--standalone")
    assert run.returncode == 0 and run.stdout == rendered[Path("cards/gpt2.card")]
    assert standalone("X").startswith(r"\documentclass{article}")


# ------------------------------------------------------------------ Markdown

def _md(path: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cardc", "render", "--to", "md", str(path)],
                          cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("card", ["cards/paper/attention.card", "cards/gpt2.card",
                                  "cards/mixtral.card", "cards/vit.card"])
def test_markdown_golden(card):
    run = _md(card)
    assert run.returncode == 0, run.stderr
    golden = GOLDEN / (Path(card).stem + ".md")
    if os.environ.get("CARDC_GOLDEN") == "update":
        golden.write_text(run.stdout, encoding="utf-8")
    assert run.stdout == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("card", CARDS, ids=str)
def test_every_card_renders_as_markdown(card):
    """Each card's algorithms, their math delimited in pairs on every line (a `$` of prose is
    escaped, so it never opens math)."""
    from cardc.checker import check
    from cardc.library import load
    from cardc.render.markdown import render_markdown

    lib, _ = load([str(ROOT / card)], root=str(ROOT / "cards"), lazy=True)
    checker, _ = check(lib)
    file = next(f for f in lib.files if Path(f.path) == ROOT / card)
    md = render_markdown(file, checker)
    assert md.count("**Algorithm") == len(file.algorithms)
    for line in md.splitlines():
        assert line.replace("\\$", "").count("$") % 2 == 0, line


def test_markdown_keeps_the_layout_and_math():
    md = _md("cards/gpt2.card").stdout
    assert "**Algorithm:** $\\boldsymbol{P} \\gets \\mathrm{GPT2}" in md
    assert "2 **for** ${\\ell} = 1, \\ldots, N$ **do**  " in md
    assert "4 **end**  " in md and "\n---\n" in md  # a rule between the file's cards


def test_markdown_prose_is_text(tmp_path):
    """Prose that looks like links, HTML, emphasis or math stays text (markdown-it renders)."""
    from markdown_it import MarkdownIt

    nasty = "[link](http://x) <script>alert(1)</script> *em* __b__ `c` $x$ # h | t"
    card = tmp_path / "nasty.card"
    card.write_text(f"Algorithm: y ← Nasty(x)\n/* {nasty} */\nInput: x ∈ ℝ^{{d}}, {nasty}\n"
                    "Output: y ∈ ℝ^{d}\nHyperparameters: d ∈ ℕ\n1 return y = 2 x  ▷ "
                    f"{nasty}\n", encoding="utf-8")
    run = _md(card)
    assert run.returncode == 0, run.stderr
    html = MarkdownIt().render(run.stdout)
    assert "<script" not in html and "<a " not in html and "<code>" not in html
    assert html.count("[link](http://x)") == 3 and html.count("*em*") == 3
