"""The card lexer (cardc/highlight.py): every shipped card highlights, token for token, and
Pygments finds the lexer by its entry point, by name and by file name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pygments.lexers import get_lexer_by_name, get_lexer_for_filename
from pygments.token import (
    Comment,
    Error,
    Generic,
    Keyword,
    Name,
    Number,
    Operator,
    Punctuation,
    Text,
    Whitespace,
)
from pygments.token import _TokenType as TokenType

from cardc.diagnostics import Diagnostics
from cardc.highlight import CardLexer, card_stylesheet, highlight_card_html
from cardc.parser import normalize, parse

ROOT = Path(__file__).resolve().parent.parent
CARDS = sorted(path for path in ROOT.glob("**/*.card")
               if not {".venv", "node_modules"} & set(path.relative_to(ROOT).parts))


def _tokens(text: str) -> list[tuple[TokenType, str]]:
    """Each token of `text` but whitespace, as (type, text)."""
    return [(kind, value) for _, kind, value in CardLexer().get_tokens_unprocessed(text)
            if kind not in Whitespace and value.strip()]


def _kind(text: str, line: int, value: str) -> TokenType:
    """The type of the first token on line `line` of `text` (lexed whole) that reads `value`."""
    found = [(kind, token) for at, kind, token in CardLexer().get_tokens_unprocessed(text)
             if text.count("\n", 0, at) + 1 == line]
    kinds = [kind for kind, token in found if token == value]
    assert kinds, f"no token {value!r} in {found}"
    return kinds[0]


def _parses(text: str) -> bool:
    diags = Diagnostics()
    parse(text, "<card>", diags)
    return not diags.errors


def test_the_shipped_cards_are_all_found() -> None:
    folders = {path.relative_to(ROOT).parts[0] for path in CARDS}
    assert {"cards", "tests"} <= folders
    assert ROOT / "cards" / "gpt2.card" in CARDS


@pytest.mark.parametrize("path", CARDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_card_lexes_and_round_trips(path: Path) -> None:
    """The tokens give the text back; a card the parser reads has no error token, in the
    form written and the form the parser reads (NFD); a broken golden card lexes too."""
    text = path.read_text(encoding="utf-8")
    for form in (text, normalize(text)):
        tokens = list(CardLexer().get_tokens_unprocessed(form))
        assert "".join(value for _, _, value in tokens) == form
        if _parses(text):
            errors = [(form.count("\n", 0, i) + 1, v) for i, kind, v in tokens if kind in Error]
            assert not errors, f"{path}: error tokens at (line, text) {errors}"


def test_a_card_that_does_not_parse_gets_error_tokens_where_it_is_wrong() -> None:
    text = (ROOT / "tests" / "golden" / "ascii_spellings.card").read_text(encoding="utf-8")
    assert not _parses(text)
    errors = [value for kind, value in _tokens(text) if kind in Error]
    assert errors == ["@", "#"]  # another notation's matrix product and comment


def test_pygments_finds_the_lexer() -> None:
    assert isinstance(get_lexer_by_name("card"), CardLexer)
    assert isinstance(get_lexer_for_filename("gpt2.card"), CardLexer)


def test_pygmentize_colours_a_card() -> None:
    pygmentize = Path(sys.executable).with_name("pygmentize")
    command = [str(pygmentize)] if pygmentize.exists() else [sys.executable, "-m", "pygments"]
    done = subprocess.run([*command, "-l", "card", str(ROOT / "cards" / "gpt2.card")],
                          capture_output=True, text=True, encoding="utf-8", timeout=60)
    assert done.returncode == 0, done.stderr
    assert "\x1b[" in done.stdout  # ANSI colour codes
    assert "GPT2Block" in done.stdout


GPT2_HEAD = """\
Algorithm: P ← GPT2(x | θ)
/* GPT-2, a decoder-only transformer. */
Input: x ∈ {1..V}^{T}, token IDs.
Hyperparameters: V, D ∈ ℕ; ε = 1e-5
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}, token embeddings.
Preset tiny: V = 256, D = 128  ▷ trains on a laptop
1 E ← W_e[x]
2 for ℓ = 1, …, N do
3     E ← GPT2Block(E | θ^block_ℓ, ε = ε)  ▷ E ∈ ℝ^{T×D}
4 end
5 return P = softmax(E W_e^⊺)
"""


@pytest.mark.parametrize(("line", "value", "kind"), [
    (1, "Algorithm", Keyword), (1, "GPT2", Name.Function), (1, "←", Operator),
    (1, "x", Name.Variable), (1, "θ", Name.Attribute),
    (2, "/* GPT-2, a decoder-only transformer. */", Comment.Multiline),
    (3, "Input", Keyword), (3, "x", Name.Variable), (3, "∈", Operator), (3, "V", Name),
    (3, " token IDs.", Text),
    (4, "Hyperparameters", Keyword), (4, "V", Name.Constant), (4, "ε", Name.Constant),
    (4, "ℕ", Keyword.Type), (4, "1e-5", Number.Float),
    (5, "Parameters", Keyword), (5, "includes all of the following parameters:", Keyword),
    (6, "W_e", Name.Attribute), (6, "ℝ", Keyword.Type), (6, "×", Operator),
    (6, " token embeddings.", Text),
    (7, "Preset", Keyword), (7, "tiny", Name.Class), (7, "V", Name.Constant),
    (7, "256", Number.Integer), (7, "▷ trains on a laptop", Comment.Single),
    (8, "1", Name.Label), (8, "E", Name),
    (9, "for", Keyword), (9, "…", Punctuation), (9, "do", Keyword),
    (10, "GPT2Block", Name.Function), (10, "▷ E ∈ ℝ^{T×D}", Comment.Single),
    (11, "end", Keyword),
    (12, "return", Keyword), (12, "softmax", Name.Builtin), (12, "^⊺", Operator),
])
def test_each_kind_of_token(line: int, value: str, kind: TokenType) -> None:
    assert _kind(GPT2_HEAD, line, value) == kind


ASCII_CARD = """\
Algorithm: Y <- Gated(X | W, b)
Input: X in R^{T x D}
Output: Y in R^{T x D}
Hyperparameters: T, D in NN
Parameters: W in R^{D x D}, b in R^{D}
1 forall t, t' : Y[t, t'] <- X[t, t'] // a note
2 if not t <= 2 then Y <- sigma(X W^T + b) (.) X
3 while t != 0 do
4 end
5 return Y = sqrt(D) * Y
"""


@pytest.mark.parametrize(("line", "value", "kind"), [
    (1, "<-", Operator), (1, "Gated", Name.Function), (2, "in", Operator.Word),
    (2, "R", Keyword.Type), (2, "x", Operator), (4, "T", Name.Constant), (4, "NN", Keyword.Type),
    (5, "W", Name.Attribute), (6, "forall", Keyword), (6, "t'", Name),
    (6, "// a note", Comment.Single), (7, "if", Keyword), (7, "not", Operator.Word),
    (7, "<=", Operator), (7, "then", Keyword), (7, "sigma", Name.Builtin), (7, "^T", Operator),
    (7, "(.)", Operator), (8, "while", Keyword), (8, "!=", Operator),
    (10, "sqrt", Operator.Word), (10, "*", Operator),
])
def test_ascii_spellings_are_the_same_kinds(line: int, value: str, kind: TokenType) -> None:
    assert _kind(ASCII_CARD, line, value) == kind


def test_a_letter_builtin_is_a_builtin_only_where_it_is_called() -> None:
    text = "Hyperparameters: σ ∈ (0, ∞) = 0.02\n1 Y ← σ(X) + σ\n"
    assert [kind for kind, value in _tokens(text) if value == "σ"] == \
        [Name.Constant, Name.Builtin, Name]


def test_a_titled_card_and_a_sentence_block() -> None:
    text = "Algorithm 1: Token embedding.\nInput: Trained parameters θ̂ of M.\n"
    assert _kind(text, 1, "1") == Number.Integer
    assert _kind(text, 1, "Token embedding.") == Generic.Heading
    assert _kind(text, 2, "Trained parameters θ̂ of M.") == Text


def test_leading_blank_lines_are_kept() -> None:
    """Line n of the highlighted card is line n of the file."""
    text = "\n\nAlgorithm: Y ← F(X)\n"
    assert "".join(value for _, value in CardLexer().get_tokens(text)) == text


def test_highlight_card_html() -> None:
    html = highlight_card_html("Algorithm: Y <- F(X | W)\n1 Y <- X W  ▷ a <note> & more\n")
    assert html.startswith('<div class="card-source"><pre>')
    assert '<span class="k">Algorithm</span>' in html
    assert '<span class="nf">F</span>' in html
    assert '<span class="o">&lt;-</span>' in html
    assert '<span class="c1">▷ a &lt;note&gt; &amp; more</span>' in html
    assert ".card-source .k" in card_stylesheet()
    assert html.split("<pre>")[1].split("</pre>")[0].count("\n") == 2  # a line a line
