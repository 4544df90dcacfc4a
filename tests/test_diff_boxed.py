"""A diff drawn on the pseudocode (cardc.docs.boxed): the steps cardc.diff aligns as changed are
boxed, the others are not; in a docs page and in `cardc diff --to html`, and in a real
headless Chromium the boxes show and no step leaves its pane."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from cardc.build import checked, find_card
from cardc.cli import main
from cardc.diff import REWRITTEN, SWAPPED, Changed, changes, swapped_cards
from cardc.docs.boxed import boxed_figure, legend

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r'<div class="step( end)?( boxed (\w+)")?[^>]*>(?:<span class="no">|'
                 r'<a class="no"[^>]*>)(\d+)<')


@pytest.fixture(scope="module")
def cards():
    """GPT-2, Llama and Qwen2, checked: Llama's blocks are GPT-2's rewritten, Qwen2's are
    Llama's calling another card."""
    paths = ["cards/gpt2.card", "cards/llama.card", "cards/qwen2.card"]
    lib, checker, _ = checked([str(ROOT / p) for p in paths], None)
    return checker, {p: find_card(lib, checker, str(ROOT / p), None) for p in paths}


def _rows(figure: str) -> dict[str, str | None]:
    """Each step row's number → the kind of box it has (None: none)."""
    return {m.group(4): m.group(3) for m in ROW.finditer(figure)}


def test_changes_are_the_diffs_alignment(cards):
    checker, algs = cards
    gpt2, llama = algs["cards/gpt2.card"], algs["cards/llama.card"]
    old, new = changes(checker, gpt2, llama)
    # steps 1 (no positions), 3 (LlamaBlock, given θ_base) and 5 (RMSNorm, no β_f) differ;
    # the loop (2), its end (4) and the tied unembedding (6) do not
    assert old.steps == new.steps == dict.fromkeys(("1", "3", "5"), REWRITTEN)
    assert (old.hypers, old.params) == ((), ("W_p", "β_f"))
    assert (new.hypers, new.params) == (("H_kv", "θ_base", "v_pad"), ())
    pairs = [(x.label, y.label) for x, y in swapped_cards(checker, gpt2, llama)]
    assert pairs == [("GPT2Block", "LlamaBlock"), ("CausalSelfAttention", "GroupedQueryAttention"),
                     ("LayerNorm", "RMSNorm"), ("MLP", "SwiGLU")]  # as `cardc diff` names them
    block_a, block_b = swapped_cards(checker, gpt2, llama)[0]
    old, new = changes(checker, block_a, block_b)
    assert old.steps == new.steps == {"1": REWRITTEN, "2": REWRITTEN}  # not 3, `return X`
    qwen2 = algs["cards/qwen2.card"]
    assert changes(checker, llama, qwen2)[1].steps == {"3": SWAPPED}  # Qwen2Block for LlamaBlock
    assert changes(checker, llama, llama) == (Changed(), Changed())


def test_exactly_the_changed_steps_are_boxed(cards):
    checker, algs = cards
    gpt2, llama = algs["cards/gpt2.card"], algs["cards/llama.card"]
    new = changes(checker, gpt2, llama)[1]
    figure = boxed_figure(llama, checker, new, "GPT2", lambda alg: None, "vs", "llama.html")
    assert _rows(figure) == {"1": REWRITTEN, "2": None, "3": REWRITTEN, "4": None, "5": REWRITTEN,
                             "6": None}
    assert ' id="L' not in figure and 'id="vs"' in figure  # the page's own figure has those
    assert 'href="llama.html#L15"' in figure  # step 1's number leads to its row on its page
    marked = re.findall(r'<mrow class="only"[^>]*>(.*?)</mrow>', figure)
    assert len(marked) >= 3 and all("W" not in m for m in marked)  # H_kv, θ_base, v_pad
    assert 'class="key"' in legend(new, "GPT2") and "swapped" not in legend(new, "GPT2")
    block_a, block_b = swapped_cards(checker, gpt2, llama)[0]
    figure = boxed_figure(block_b, checker, changes(checker, block_a, block_b)[1], "GPT2Block",
                          lambda alg: None, "vs")
    assert _rows(figure) == {"1": REWRITTEN, "2": REWRITTEN, "3": None}
    qwen2 = algs["cards/qwen2.card"]
    figure = boxed_figure(qwen2, checker, changes(checker, llama, qwen2)[1], "Llama",
                          lambda alg: None, "vs")
    assert _rows(figure) == {"1": None, "2": None, "3": SWAPPED, "4": None, "5": None, "6": None}


def test_diff_to_html_boxes_both_sides_and_the_cards_they_swap(capsys):
    assert main(["diff", "cards/gpt2.card", "cards/llama.card", "--to", "html"]) == 0
    page = capsys.readouterr().out
    assert page.startswith("<!doctype html>") and "<script" not in page
    figures = re.findall(r'<figure class="algorithm" id="(pair\d-[ab])">(.*?)</figure>', page,
                         re.S)
    assert [f for f, _ in figures] == [f"pair{n}-{s}" for n in range(5) for s in "ab"]
    rows = dict((f, _rows(body)) for f, body in figures)
    assert rows["pair0-a"] == rows["pair0-b"] == {"1": REWRITTEN, "2": None, "3": REWRITTEN,
                                                  "4": None, "5": REWRITTEN, "6": None}
    assert "<h2>GPT2Block → LlamaBlock</h2>" in page and "<h2>MLP → SwiGLU</h2>" in page
    assert "hyperparameters: + H_kv, θ_base, v_pad" in page  # the text diff, above
    assert 'href="#pair1-b"' in page  # Llama's call of LlamaBlock leads to its figure


# ------------------------------------------------------------------ in a real browser


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """The docs page of GPT2 (Llama the card compared with it) and the page `cardc diff --to
    html` writes for GPT-2 and Llama."""
    out = tmp_path_factory.mktemp("boxed")
    cmd = [sys.executable, "-m", "cardc"]
    site = subprocess.run([*cmd, "docs", "cards/gpt2.card", "cards/llama.card", "--out",
                           str(out / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert site.returncode == 0, site.stderr
    diff = subprocess.run([*cmd, "diff", "cards/gpt2.card", "cards/llama.card", "--to", "html"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert diff.returncode == 0, diff.stderr
    (out / "diff.html").write_text(diff.stdout, encoding="utf-8")
    return {"docs": out / "site" / "cards-gpt2.GPT2.html", "cli": out / "diff.html"}


# each step of the boxed figures: its box's border, how far it reaches past its figure on
# either side, and whether its row scrolls
_BOXES = """(scope) => [...document.querySelectorAll(scope + ' figure.algorithm .step')].map(s => {
    const pane = s.closest('figure.algorithm').getBoundingClientRect(), css = getComputedStyle(s);
    const parts = [s, ...s.querySelectorAll('*')].map(e => e.getBoundingClientRect())
        .filter(r => r.width > 0 || r.height > 0);  // not what is hidden
    return {text: s.textContent.slice(0, 24), boxed: s.classList.contains('boxed'),
            border: parseFloat(css.borderTopWidth), style: css.borderTopStyle,
            colour: css.borderTopColor, back: getComputedStyle(document.body).backgroundColor,
            right: Math.max(...parts.map(r => r.right)) - pane.right,
            left: pane.left - Math.min(...parts.map(r => r.left)),
            scrolls: s.scrollWidth > s.clientWidth};
})"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("viewport", [900, 1500])
def test_boxes_show_and_stay_in_their_pane_in_chromium(pages, browser, viewport, scheme):
    tab = browser.new_page(viewport={"width": viewport, "height": 1000}, color_scheme=scheme)
    try:
        for kind, scope in (("docs", "#related"), ("cli", "body")):
            tab.goto(pages[kind].as_uri())
            steps = tab.evaluate(_BOXES, scope)
            assert sum(s["boxed"] for s in steps) >= 2, (kind, steps)
            for step in steps:
                where = f"{kind} {step['text']!r}"
                if step["boxed"]:
                    assert step["border"] >= 1 and step["style"] in ("solid", "dashed"), where
                    assert step["colour"] != step["back"], where
                else:
                    assert step["border"] == 0, where
                assert step["right"] <= 0.5 and step["left"] <= 0.5, (where, step)
                assert not step["scrolls"], f"{where} overflows its row"
            if kind == "docs":  # Llama's steps 1, 3 and 5; not 2, its end (4), nor 6
                boxed = tab.locator("#related-1 .step.boxed")
                assert boxed.count() == 3 and boxed.first.is_visible()
                assert tab.locator("#related-1 .step:not(.boxed)").count() == 3
    finally:
        tab.close()
