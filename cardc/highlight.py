"""Highlighting of card source: a Pygments lexer for `*.card` files and the HTML a page shows.

The lexer reads a card line by line, as cardc's grammar does (cardc/grammar.lark), and tells
apart what a reader looks for: the headers, step numbers and control words (keywords), the
card named by a header or called by a step (functions) and the builtins, the names a card
declares (inputs and outputs, hyperparameters, parameters: each their own kind of name), the
prose a declaration ends with, numbers, operators and the notation's symbols, `▷` notes and
`/* … */` descriptions. Both spellings of every symbol are read (`←` and `<-`, `∈` and `in`).
It never fails on a broken card: what no rule reads becomes an error token, and a new line
starts afresh. Pygments finds it by the entry point in pyproject.toml (`pygmentize -l card`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import ClassVar

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import RegexLexer, bygroups, default, include, words
from pygments.token import (
    Comment,
    Generic,
    Keyword,
    Name,
    Number,
    Operator,
    Punctuation,
    Text,
    Whitespace,
)

from .builtins import BY_NAME, CONSTANTS, SPECIAL_TOKENS

# names as the grammar's NAME reads them: a letter run (precomposed letters such as ê and Ṽ
# too, as a card may hold them composed), hats and tildes, sub- and superscripts, primes
_LETTER = r"[A-Za-zα-ωΑ-ΓΕ-ΡΤ-Ωℓϵϑϕ𝒩\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]"
_ALNUM = r"[A-Za-z0-9α-ωΑ-ΓΕ-ΡΤ-Ωℓϵϑϕ\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]"
_END = r"(?![\w′'\u0302\u0303~^])"  # a word ends here: `end` is a keyword, `end_ℓ` a name
NAME = (
    rf"{_LETTER}{_ALNUM}*[\u0302\u0303~]*(?:\^(?=[\s,;)|=.:\]]|$))?"
    rf"(?:(?:_|\^(?!T(?![\w{{])))(?:\{{[^{{}}\n]*\}}|{_ALNUM}+)[\u0302\u0303]*)*[′']*"
)
_NAMES = rf"{NAME}(?:[ \t]*,[ \t]*{NAME})*"
# after a declaration's names: its type, value or bundle
_DECLARES = r"(?:∈|in\b|=(?!=)|consisting[ \t]+of\b|includes[ \t]+all\b)"
# `, a, b ∈ …` starts the next declaration; any other comma at the top of a declaration
# starts its prose
_NEXT_DECL = rf",(?=[ \t]*{_NAMES}[ \t]*{_DECLARES})"
# a block that is one sentence (`Input: Trained parameters θ̂ of M.`), as the grammar's SENTENCE
_SENTENCE = (
    r"(?![^\n]*(?:∈|consisting of|includes all of the following))"
    r"(?!(?:[Ff]or|return|while|if|sample)\b)"
    r"[A-Za-z][A-Za-z0-9-]*[ \t]+(?!in\b)[a-z][A-Za-z0-9-]+\b(?:[^\n▷/]|/(?![/*]))*"
)
_STEP_NUMBER = r"^[ \t]*\d+[:.]?(?=[ \t])"

# builtins with a word for a name are builtins wherever they stand (`log p`); a single
# letter (σ) only where it is called, as elsewhere it may be a card's own name
_WORD_BUILTINS = sorted({name for name in BY_NAME if len(name) > 1} | {"erf", "sigmoid"},
                        key=len, reverse=True)
_CALLED_BUILTINS = ("σ", "sigma", "𝒩")
_PSEUDO_BUILTINS = sorted({*CONSTANTS, *SPECIAL_TOKENS}, key=len, reverse=True)

# the kinds of declaration block and the token each gives the names it declares
DECLARED = {
    "io": Name.Variable,  # Input:, Output:
    "hyper": Name.Constant,  # Hyperparameters: (and a preset's values)
    "param": Name.Attribute,  # Parameters: attributes of the module, as the code has them
}


def _nothing(lexer: RegexLexer, match: re.Match) -> Iterator[tuple[int, object, str]]:
    """No token: a rule that only looks ahead to leave its state (a line's end)."""
    return iter(())


def _comments() -> list:
    """`▷ note` and `// note` run to the line's end; a `/* … */` description stays on its line."""
    return [
        (r"(▷|//)[^\n]*", Comment.Single),
        (r"/\*.*?\*/", Comment.Multiline),
    ]


def _symbols() -> list:
    """The notation's symbols and their ASCII spellings, longest spelling first."""
    return [
        (r"←|<-|→|->", Operator),
        (r"\^(?:⊺|T(?![\w{]))", Operator),  # transpose, before `^` as a superscript
        (r"∈", Operator),
        (r"in" + _END, Operator.Word),
        (r"ℝ|ℕ|RR\b|NN\b|Δ|Delta(?=\()", Keyword.Type),
        (r"∞|inf" + _END, Number),
        (r"∀|forall" + _END, Keyword),
        (r"¬|∧|∝|√|∇|Σ|∑|×|·|⊙|\(\.\)|²|‖|\|\||⌊|⌋|⌈|⌉|↑|±", Operator),
        (words(("not", "and", "or", "propto", "sqrt", "grad"), suffix=_END), Operator.Word),
        (r"sum(?=_\{)", Operator.Word),
        (r"log₂", Name.Builtin),
        (r"…|\.\.\.|\. \. \.", Punctuation),
        (r"\.\.", Operator),
        # ≠ decomposed (NFD, as the parser reads a card) is = and a combining slash
        (r"≡|==|≅|~=|≤|<=|≥|>=|≠|=\u0338|!=|<|>|=", Operator),
        (r"\+|−|–|-|\*|/|~", Operator),
        (r"[()\[\]{}|,;:._^]", Punctuation),
    ]


def _control() -> list:
    """The words of steps: loops, conditions, returns, sampling and where-clauses."""
    return [
        (r"(,)([ \t]*)(where\b)([^\n]*)", bygroups(Punctuation, Whitespace, Keyword, Text)),
        (r"sample[ \t]+a[ \t]+token\b|randomly[ \t]+with[ \t]+probability\b", Keyword),
        (words(("for", "For", "do", "end", "if", "then", "else", "while", "return", "from"),
               suffix=_END), Keyword),
    ]


def _names() -> list:
    """A call's card (or builtin) by the `(` that follows it with no space; builtins, numbers."""
    return [
        (words(_CALLED_BUILTINS, suffix=r"(?=\()"), Name.Builtin),
        (words(_WORD_BUILTINS, suffix=_END), Name.Builtin),
        (words(_PSEUDO_BUILTINS, suffix=_END), Name.Builtin.Pseudo),
        (NAME + r"(?=\()", Name.Function),
        (NAME, Name),
        (r"\d+(?:\.\d+)?[eE][-+]?\d+|\d+\.\d+", Number.Float),
        (r"\d+", Number.Integer),
    ]


def _declarations(kind: str) -> dict[str, list]:
    """The states of a block of declarations whose names are of `kind` (DECLARED's keys).

    `kind` holds the block across its indented continuation lines; `kind-start` reads the
    names a declaration starts with; `decl-type` what follows them (type, value, roles), and
    `prose` the free text a declaration may end with."""
    start = f"{kind}-start"
    return {
        kind: [
            (r"[ \t]*\n", Whitespace),
            (r"(?=" + _STEP_NUMBER + ")", _nothing, "#pop"),  # a numbered step ends the block
            (r"^[ \t]+(?=\S)", Whitespace, start),  # an indented line continues it
            default("#pop"),
        ],
        start: [
            (r"(?=\n)", _nothing, "#pop"),
            (r"[ \t]+", Whitespace),
            include("comments"),
            (_SENTENCE, Text),
            (rf"\{{(?=\(?{_NAMES}\)?\}}_)", Punctuation, "dataset"),
            (r"consisting[ \t]+of[ \t]*:?|includes[ \t]+all[ \t]+of[ \t]+the[ \t]+following"
             r"[ \t]+parameters[ \t]*:?", Keyword),
            (r"[Ff]or" + _END, Keyword, "decl-type"),  # a family: For ℓ ∈ [N], θ_ℓ …
            (r"∈|=", Operator, "decl-type"),
            (r"in" + _END, Operator.Word, "decl-type"),
            (NAME, DECLARED[kind]),
            (_NEXT_DECL, Punctuation),
            (r",[ \t]*(?=\n|$)", Punctuation),  # a list continued on the next line
            (r",", Punctuation, ("decl-type", "prose")),  # `θ^attn, the attention parameters`
            (r";", Punctuation),
            default("decl-type"),
        ],
    }


class CardLexer(RegexLexer):
    """Algorithm cards: transformer pseudocode in the notation of Phuong & Hutter."""

    name = "Card"
    aliases: ClassVar[list[str]] = ["card"]
    filenames: ClassVar[list[str]] = ["*.card"]
    mimetypes: ClassVar[list[str]] = ["text/x-card"]
    url = "https://arxiv.org/abs/2207.09238"

    def __init__(self, **options: object) -> None:
        # leading blank lines kept: a highlighted card's lines are numbered as the file's
        options.setdefault("stripnl", False)
        super().__init__(**options)

    tokens: ClassVar[dict[str, list]] = {
        "root": [
            (r"\n", Whitespace),
            # `Algorithm 1: Token embedding.`: a card titled rather than signed
            (r"^(Algorithm)(?:([ \t]+)(\d+))?([ \t]*:)([ \t]*)([^\n←<▷]+)(?=\n|\Z)",
             bygroups(Keyword, Whitespace, Number.Integer, Punctuation, Whitespace,
                      Generic.Heading)),
            (r"^(Algorithm)(?:([ \t]+)(\d+))?([ \t]*:)",
             bygroups(Keyword, Whitespace, Number.Integer, Punctuation), "header"),
            (r"^(Input|Output)([ \t]*:)", bygroups(Keyword, Punctuation), ("io", "io-start")),
            (r"^(Hyperparameters)([ \t]*:)", bygroups(Keyword, Punctuation),
             ("hyper", "hyper-start")),
            (r"^(Parameters)([ \t]*:)", bygroups(Keyword, Punctuation),
             ("param", "param-start")),
            (r"^(Preset)([ \t]+)([^\s:]+)([ \t]*:)",
             bygroups(Keyword, Whitespace, Name.Class, Punctuation), "preset"),
            (r"^([ \t]*)(\d+[:.]?)(?=[ \t])", bygroups(Whitespace, Name.Label)),  # step number
            include("expression"),
        ],
        # the signature: outputs ← Card(inputs | parameters)
        "header": [
            (r"(?=\n)", _nothing, "#pop"),
            (r"[ \t]+", Whitespace),
            include("comments"),
            (NAME + r"(?=\()", Name.Function),
            (r"\|", Punctuation, "header-parameters"),
            (NAME, Name.Variable),
            include("symbols"),
        ],
        "header-parameters": [
            (r"(?=\n)", _nothing, "#pop"),
            (r"[ \t]+", Whitespace),
            include("comments"),
            (NAME, Name.Attribute),
            include("symbols"),
        ],
        # `Preset tiny: V = 256, D = 128  ▷ …`: each value's name is a hyperparameter's
        "preset": [
            (r"(?=\n)", _nothing, "#pop"),
            (NAME + r"(?=[ \t]*=)", DECLARED["hyper"]),
            include("expression"),
        ],
        **_declarations("io"),
        **_declarations("hyper"),
        **_declarations("param"),
        # a dataset's examples, {x_n}_{n=1}^{N} or {(z_n, x_n)}_{n=1}^{N}: inputs by name
        "dataset": [
            (r"\}", Punctuation, "#pop"),
            (r"[(),]", Punctuation),
            (r"[ \t]+", Whitespace),
            (NAME, DECLARED["io"]),
            default("#pop"),
        ],
        "decl-type": [
            (r"(?=\n)", _nothing, "#pop"),
            (r"(,)([ \t]*)(padding[ \t]+row|seed[ \t]+of[ \t]+every[ \t]+random[ \t]+draw"
             r"|number[ \t]+format[ \t]+of)\b", bygroups(Punctuation, Whitespace, Keyword)),
            (_NEXT_DECL, Punctuation, "#pop"),
            (r";", Punctuation, "#pop"),
            (r",[ \t]*(?=\n|$)", Punctuation),
            (r"(,)([ \t]*)(where\b)", bygroups(Punctuation, Whitespace, Keyword), "prose"),
            (r",", Punctuation, "prose"),
            (r"R(?=\^)", Keyword.Type),  # R^{a x b}, ASCII ℝ^{a×b}, in a type only
            (r"(\^)(\{)", bygroups(Punctuation, Punctuation), "dims"),
            (r"[(\[{]", Punctuation, "group"),
            include("expression"),
        ],
        # inside brackets a comma separates (`(0, ∞)`, `{float32, bfloat16}`); brackets of
        # either kind close an interval, `[0, ∞)`
        "group": [
            (r"(?=\n)", _nothing, "#pop"),
            (r"[(\[{]", Punctuation, "#push"),
            (r"[)\]}]", Punctuation, "#pop"),
            (r"(\^)(\{)", bygroups(Punctuation, Punctuation), "dims"),
            include("expression"),
        ],
        # a shape's sizes, where ASCII `x` (spaced) is ×
        "dims": [
            (r"(?=\n)", _nothing, "#pop"),
            (r"\{", Punctuation, "#push"),
            (r"\}", Punctuation, "#pop"),
            (r"(?<=\s)x(?=\s)", Operator),
            include("expression"),
        ],
        # a declaration's closing words, to the next `;`, note or line's end
        "prose": [
            (r"(?=\n)", _nothing, "#pop:2"),
            include("comments"),
            # brackets balanced, as the grammar's PROSE reads them: `(0: none; no …)` is prose
            (r"\((?:[^()\n]|\([^()\n]*\))*\)|\[(?:[^\[\]\n]|\[[^\[\]\n]*\])*\]", Text),
            (r";", Punctuation, "#pop:2"),
            (r"[^;\n▷/()\[\]]+|[/()\[\]]", Text),
        ],
        "comments": _comments(),
        "symbols": _symbols(),
        "expression": [
            (r"[ \t]+", Whitespace),
            include("comments"),
            include("control"),
            include("symbols"),  # before names: `in`, `sqrt`, `RR` are words of the notation
            include("names"),
        ],
        "control": _control(),
        "names": _names(),
    }


CSS_CLASS = "card-source"


def highlight_card_html(source: str, css_class: str = CSS_CLASS) -> str:
    """`source`, a card's text, as `<div class="card-source"><pre>…</pre></div>`: each token a
    `<span>` of Pygments' short class (`k` keyword, `nf` a card's name, `c1` a note), escaped.
    `card_stylesheet` gives the colours, scoped to the same class."""
    return highlight(source, CardLexer(), HtmlFormatter(cssclass=css_class))


def card_stylesheet(css_class: str = CSS_CLASS, style: str = "friendly") -> str:
    """The CSS of `highlight_card_html`'s classes under `.card-source` (a Pygments style)."""
    return HtmlFormatter(style=style).get_style_defs(f".{css_class}")
