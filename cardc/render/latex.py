"""A card as LaTeX in the paper's own typography: algorithm2e, as arXiv:2207.09238 is typeset.

Each algorithm is an `algorithm` environment: its signature as the caption (`Algorithm 4:` when
the card is numbered), the `/* … */` comments, `Input:`, `Output:`, `Hyperparameters:` and
`Parameters:` blocks (bundles and families as indented lists), then numbered steps; loops are
`for … do … end` and `while … do … end` with vertical rules, annotations and notes sit in the
right margin after ▷, and `return` is bold.

Typography follows the paper: a name the checker types as a vector or matrix is bold, in one
weight wherever it is set (`bold_names`: its declared type, else its types in the steps), names
of cards and functions are upright (`softmax`, `LayerNorm`) but a function the card defines is
its letter (`P(θ)`), a subscript or superscript that is a word is upright (`W_attn`), ℝ and ℕ
are blackboard bold, and ⊙, ⊺, √ are math. Without a checker (a card that does not check),
names keep the letters' own style. Math written in prose (comments, declarations' words,
notes, `where`: `Q K^⊺/√s`) is found by cardc.render.prose and set as the steps' math. The
output is ASCII: every symbol becomes a macro, and the rest of the prose is escaped so that no
card text can break the document. `--standalone` wraps it in a document; a snippet needs
`PREAMBLE` in the including document's preamble.

A step wider than its line (counted in characters of its text: `STEP`, cardc.render.breaks)
breaks at its loosest operators, its continuation lines hung by 2em; they stay within
algorithm2e's one line (`\\newline`), so the step keeps its one number. Each line is a
formula of its own, its `\\left`s and `\\right`s paired with `\\left.` and `\\right.`.

Expressions dispatch on the node's class as the text renderer's do (`text_<Kind>`), sharing
its precedence table; they return math-mode LaTeX.
"""

from __future__ import annotations

import re
import unicodedata

from .. import syntax as s
from ..builtins import UPRIGHT
from ..checker import CardInfo, Checker, split_name
from ..types import BundleTy, FamilyTy, Ty
from .breaks import BREAK, choose, pieces
from .prose import Formula, Vocabulary, vocabulary
from .prose import pieces as prose_pieces
from .text import COND, CONJ, POSTFIX, PRODUCT, SUM, TEXT, TIGHT, Renderer, notation

PREAMBLE = r"""\usepackage{amsmath,amssymb}
\usepackage[ruled,lined,linesnumbered]{algorithm2e}
\SetKwInput{KwHyper}{Hyperparameters}
\SetKwInput{KwParams}{Parameters}
\SetKwComment{Note}{$\triangleright$\ }{}
\SetNoFillComment
\SetKw{KwSample}{sample}
\DontPrintSemicolon
\SetAlgoSkip{medskip}"""

# math-mode spellings of the symbols a card writes
MATH = {
    "α": r"\alpha", "β": r"\beta", "γ": r"\gamma", "δ": r"\delta", "ε": r"\varepsilon",
    "ϵ": r"\epsilon", "ζ": r"\zeta", "η": r"\eta", "θ": r"\theta", "ϑ": r"\vartheta",
    "ι": r"\iota", "κ": r"\kappa", "λ": r"\lambda", "μ": r"\mu", "ν": r"\nu", "ξ": r"\xi",
    "π": r"\pi", "ρ": r"\rho", "σ": r"\sigma", "τ": r"\tau", "υ": r"\upsilon", "φ": r"\phi",
    "ϕ": r"\phi", "χ": r"\chi", "ψ": r"\psi", "ω": r"\omega", "Γ": r"\Gamma", "Δ": r"\Delta",
    "Θ": r"\Theta", "Λ": r"\Lambda", "Ξ": r"\Xi", "Π": r"\Pi", "Σ": r"\Sigma", "Φ": r"\Phi",
    "Ψ": r"\Psi", "Ω": r"\Omega", "ℓ": r"\ell", "𝒩": r"\mathcal{N}", "ℝ": r"\mathbb{R}",
    "ℕ": r"\mathbb{N}", "∞": r"\infty", "…": r"\ldots", "⋯": r"\cdots", "·": r"\cdot",
    "×": r"\times", "⊙": r"\odot", "⊺": r"\intercal", "∈": r"\in", "←": r"\gets",
    "→": r"\to", "∀": r"\forall", "¬": r"\neg", "≤": r"\le", "≥": r"\ge", "≠": r"\ne",
    "∧": r"\land", "∨": r"\lor", "∝": r"\propto", "≅": r"\cong", "∇": r"\nabla",
    "▷": r"\triangleright", "−": "-", "′": "'", "∼": r"\sim", "~": r"\sim", "√": r"\surd",
    "∅": r"\emptyset", "⊂": r"\subset", "∪": r"\cup", "∩": r"\cap", "±": r"\pm",
    "²": "^{2}", "³": "^{3}", "°": r"^{\circ}", "∑": r"\sum", "∏": r"\prod", "∘": r"\circ",
    "↑": r"\uparrow", "↓": r"\downarrow", "⇒": r"\Rightarrow", "⇔": r"\Leftrightarrow",
    "↦": r"\mapsto", "≈": r"\approx", "∂": r"\partial", "∗": "*", "‖": r"\|", "⟨": r"\langle",
    "⟩": r"\rangle", "∣": r"\mid", "⊤": r"\top", "⌈": r"\lceil", "⌉": r"\rceil",
    "⌊": r"\lfloor", "⌋": r"\rfloor", "⊗": r"\otimes", "⊕": r"\oplus", "≡": r"\equiv",
    "≪": r"\ll", "≫": r"\gg", "∉": r"\notin", "⊆": r"\subseteq", "∃": r"\exists",
    "ℤ": r"\mathbb{Z}", "ℚ": r"\mathbb{Q}", "𝔼": r"\mathbb{E}", "ℙ": r"\mathbb{P}",
    "𝟏": r"\mathbf{1}", "•": r"\bullet", "†": r"\dagger", "∎": r"\blacksquare",
}
ACCENTS = {"\u0302": r"\hat", "\u0303": r"\tilde", "\u0304": r"\bar", "\u0307": r"\dot",
           "\u0308": r"\ddot", "\u20d7": r"\vec"}
_TEXT_ACCENTS = {"\u0301": "'", "\u0300": "`", "\u0302": "^", "\u0308": '"', "\u0303": "~",
                 "\u0304": "=", "\u0327": "c ", "\u030c": "v "}
_TEXT = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "%": r"\%",
         "#": r"\#", "&": r"\&", "_": r"\_", "^": r"\textasciicircum{}",
         "~": r"\textasciitilde{}", "<": r"\textless{}", ">": r"\textgreater{}",
         "|": r"\textbar{}", "—": "---", "–": "--", "‘": "`", "’": "'", "“": "``", "”": "''",
         "\u00a0": "~"}
_OPS = {"+": "+", "−": "-", "·": r"\cdot", "⊙": r"\odot", "/": "/", " ": r"\,", "=": "=", "mod": r"\bmod",
        "≤": r"\le", "≥": r"\ge", "<": "<", ">": ">", "≠": r"\ne", "∈": r"\in", "∧": r"\land"}
_WORD = re.compile(r"[A-Za-z]{2,}")
SCRIPT_WORD = re.compile(r"[A-Za-z]{2,}[0-9]*")  # a subscript set upright: attn, mlp1
LINE = 64  # characters of card text a line of the rendered blocks holds
STEP = 84  # characters of card text a step's line holds, its number and margin aside
LEVEL = 4  # the characters a loop's body is indented by
HANG = 4  # the characters a step's continuation line is indented by
_HANG = r"\newline\hspace*{1.5em}"  # algorithm2e hangs a line 0.5em of its own


def text(prose: str) -> str:
    """Prose as LaTeX text: special characters escaped, symbols as inline math, accented
    letters as accent macros; anything else outside ASCII becomes `?`."""
    out = []
    for ch, marks in _graphemes(prose):
        if not marks and ch in _TEXT:
            out.append(_TEXT[ch])
        elif not marks and ch.isascii():
            out.append(ch)
        elif ch.isascii() and ch.isalpha() and all(m in _TEXT_ACCENTS for m in marks):
            for m in marks:
                ch = f"\\{_TEXT_ACCENTS[m]}{{{ch}}}"
            out.append("{" + ch + "}")
        elif (ch in MATH or ch.isascii()) and all(m in ACCENTS for m in marks):
            math = MATH.get(ch, ch)
            for m in marks:
                math = f"{ACCENTS[m]}{{{math}}}"
            out.append(f"${math}$")
        else:
            out.append("?")
    return "".join(out)


def _graphemes(prose: str) -> list[tuple[str, list[str]]]:
    """Each character of `prose` (decomposed) with the combining marks that follow it."""
    out: list[tuple[str, list[str]]] = []
    for ch in unicodedata.normalize("NFC", prose):
        if unicodedata.combining(ch) and out:
            out[-1][1].append(ch)
        elif ch.isascii() or ch in MATH or ch in _TEXT:  # ≠ is a symbol, not = with a stroke
            out.append((ch, []))
        else:
            base, *marks = unicodedata.normalize("NFD", ch)
            out.append((base, marks))
    return out


def snake_words(name: str) -> list[str] | None:
    """The words of a function's name written in snake case (`layer_norm`, `GELU_tanh`), which
    the paper sets as one upright name, not a name with a subscript; None for any other."""
    base, decor = split_name(name)
    if decor and _WORD.fullmatch(base) and all(k == "_" and _WORD.fullmatch(p) for k, p in decor):
        return [base, *(p for _, p in decor)]
    return None


def symbol(name: str, bold: bool = False) -> str:
    """A name's base and its subscripts and superscripts: `θ^block_ℓ` → θ^{block}_{ℓ},
    words upright, the base bold for a vector or matrix."""
    base, decor = split_name(name)
    return _decorated(_base(base, bold), decor)


def _decorated(out: str, decor: list[tuple[str, str]]) -> str:
    """`out` with its subscripts and superscripts; a second of a kind groups what is before."""
    used: set[str] = set()
    for kind, part in decor:
        if kind in used:
            out, used = "{" + out + "}", set()
        out += kind + "{" + _decoration(part) + "}"
        used.add(kind)
    return out


def _base(base: str, bold: bool) -> str:
    chars = unicodedata.normalize("NFD", base)
    letters = re.sub(r"[\u0300-\u036f\u20d0-\u20ff]", "", chars)
    marks = [c for c in chars if c in ACCENTS]
    primes = letters.count("′") + letters.count("'")
    letters = letters.replace("′", "").replace("'", "")
    if _WORD.fullmatch(letters):
        core = rf"\mathit{{{letters}}}"
    else:
        core = "".join(_math_char(c) for c in letters)
    for mark in marks:
        core = f"{ACCENTS[mark]}{{{core}}}"
    if bold:
        core = rf"\boldsymbol{{{core}}}"
    return core + "'" * primes


def _decoration(part: str) -> str:
    """A subscript or superscript: a word upright, names within it (`1:N_data`) as names."""
    if SCRIPT_WORD.fullmatch(part):
        return rf"\mathrm{{{part}}}"
    if "_" in part or "^" in part:
        return "".join(symbol(tok) if re.match(r"[^\s:,;+\-*/()]", tok) else tok
                       for tok in re.split(r"([\s:,;+\-*/()]+)", part) if tok)
    return "".join(_math_char(c) for c in unicodedata.normalize("NFD", part)
                   if c not in "{}")


def _math_char(c: str) -> str:
    if c.isascii():
        return {"\\": r"{\backslash}", "{": r"\{", "}": r"\}", "$": r"\$", "%": r"\%",
                "#": r"\#", "&": r"\&", "~": r"{\sim}", "^": r"\hat{}", "_": r"\_"}.get(c, c)
    if c in MATH:  # a macro ending in a letter is braced: {\ell}_x, not \ell_x run on
        return "{" + MATH[c] + "}" if MATH[c][-1].isalpha() else MATH[c]
    if c in ACCENTS:
        return ""
    return r"\text{?}"


# ⌊x⌋, ⌈x⌉, |x|: the builtin → its delimiters' macros
_BRACKETS = {"floor": ("lfloor", "rfloor"), "ceil": ("lceil", "rceil"), "abs": ("lvert", "rvert")}


class LatexRenderer(Renderer):
    """Card AST → LaTeX; `bold` holds the names set in bold (`typography` finds them from the
    checker's types), `vectors` the numbers typed as vectors.

    Bold has one rule, `bolded`, wherever a name is set: in steps, declarations, the caption,
    prose and tips alike."""

    def __init__(self, bold: frozenset[str] = frozenset(), vectors: frozenset[int] = frozenset()):
        self.bold = bold
        self.vectors = vectors  # ids of numbers typed as vectors: 1 of 1^⊺ is the ones vector
        self.breaks: frozenset[tuple[int, int]] = frozenset()  # the step's (breaks.Break.key)
        self.at: dict[int, Ty] = {}  # a name's (or a call's) type where it is written
        self.named: dict[str, Ty] = {}  # a name's declared (or first inferred) type
        self.vocab = Vocabulary()  # what the card's prose is read against (cardc.render.prose)

    def bolded(self, name: str) -> bool:
        """Whether a name of the card is set in bold, wherever it is (`bold_names`)."""
        return name in self.bold

    def name_math(self, name: str, node: object = None) -> str:
        """A name of the card, in the weight `bolded` gives it (`node`: where it is written)."""
        return self.symbol(name, self.bolded(name), node)

    def symbol(self, name: str, bold: bool = False, node: object = None) -> str:
        """A name in the weight `bold` says (a renderer may show its type at `node`)."""
        return symbol(name, bold)

    def mark(self, node: object, item: int) -> str:
        """BREAK where the step being rendered breaks before item `item` of `node`."""
        return BREAK if (id(node), item) in self.breaks else ""

    def marked(self, node: object, items: list[str], first: int = 0) -> list[str]:
        """`items` (item `first` on of `node`'s), each but the first after its break where
        there is one: the first's comes before what holds them all."""
        return [self.mark(node, first + k) + item if k else item for k, item in enumerate(items)]

    indent = r"\hspace*{1.5em}"  # one level of a block's lists

    def math(self, tex: str) -> str:
        """Math inline in the output's text."""
        return f"${tex}$"

    def prose(self, words: str) -> str:
        """A card's prose as the output's text, the math in it (cardc.render.prose) as math."""
        return "".join(self.words(p) if isinstance(p, str) else self.math(self.formula(p))
                       for p in prose_pieces(words, self.vocab))

    def words(self, prose: str) -> str:
        """Prose that holds no math, escaped."""
        return text(prose)

    def formula(self, f: Formula) -> str:
        """Math found in prose, set as the steps set theirs."""
        if isinstance(f.parts[0], s.Decl):
            return self.decl_math(f.parts[0], label=True)
        out = self.text(f.parts[0])
        for rel, part in zip(f.relations, f.parts[1:], strict=True):
            out += f" {self.relation(rel)} {self.text(part)}"
        return out

    def relation(self, op: str) -> str:
        return MATH.get(op, _math_char(op))

    def sub(self, node: object, min_prec: int, tail: bool = True) -> str:
        if self.precedence(node) < min_prec or (not tail and isinstance(node, s.Sum)):
            return rf"\left({self.text(node)}\right)"
        return self.text(node, tail)

    # ------------------------------------------------------------------ expressions

    def text_Name(self, node: s.Name, tail: bool) -> str:
        if node.id in UPRIGHT and not self.bolded(node.id):  # log, exp: upright
            return self.function(node.id)
        return self.name_math(node.id, node)

    def text_Num(self, node: s.Num, tail: bool) -> str:
        t = node.text
        if id(node) in self.vectors:
            return rf"\mathbf{{{t}}}"
        if t == "∞":
            return r"\infty"
        m = re.fullmatch(r"(\d+(?:\.\d+)?)[eE]([-+]?\d+)", t)
        if m:
            mant, exp = m.group(1), int(m.group(2))
            power = f"10^{{{exp}}}"
            return power if mant in ("1", "1.0") else rf"{mant} \cdot {power}"
        return "".join(_math_char(c) for c in t)

    def text_BinOp(self, node: s.BinOp, tail: bool) -> str:
        prec = self.precedence(node)
        op = _OPS.get(node.op, "".join(_math_char(c) for c in node.op))
        if prec == CONJ:
            return f"{self.sub(node.left, CONJ)} \\land {self.sub(node.right, COND, tail)}"
        if prec == COND:
            return f"{self.sub(node.left, SUM)} {op} {self.sub(node.right, SUM, tail)}"
        left = self.sub(node.left, self.left_min(node), tail=prec == SUM)
        right = self.sub(node.right, self.right_min(node.op), tail)
        if node.op == "/":
            return f"{left}/{right}"
        return f"{left} {op} {self.mark(node, 1)}{right}"

    def text_Unary(self, node: s.Unary, tail: bool) -> str:
        if node.op == "−":
            return "-" + self.sub(node.operand, self.negand_min(), tail)
        if node.op == "¬":
            return r"\neg " + self.sub(node.operand, COND, tail)
        if node.op == "√":
            return rf"\sqrt{{{self.text(node.operand)}}}"
        return MATH.get(node.op, r"\text{?}") + " " + self.sub(node.operand, TIGHT, tail)

    def text_Power(self, node: s.Power, tail: bool) -> str:
        return f"{{{self.sub(node.base, POSTFIX)}}}^{{{self.text(node.exponent)}}}"

    def text_Transpose(self, node: s.Transpose, tail: bool) -> str:
        return f"{{{self.sub(node.operand, POSTFIX)}}}^{{\\intercal}}"

    def text_Index(self, node: s.Index, tail: bool) -> str:
        items = ", ".join(self.sub(i, SUM) for i in node.items)
        return f"{self.sub(node.base, POSTFIX)}[{items}]"

    def text_Slice(self, node: s.Slice, tail: bool) -> str:
        lo = "" if node.lo is None else self.sub(node.lo, SUM)
        hi = "" if node.hi is None else self.sub(node.hi, SUM)
        return f"{lo} : {hi}" if lo and hi else f"{lo}{{:}}{hi}"

    def text_Progression(self, node: s.Progression, tail: bool) -> str:
        return f"{self.sub(node.first, SUM)}, {self.sub(node.second, SUM)}, \\ldots, " \
               f"{self.sub(node.last, SUM)}"

    def text_Arg(self, node: s.Arg, tail: bool) -> str:
        op = _OPS.get(node.op) or "".join(_math_char(c) for c in node.op)
        return f"{self.sub(node.target, POSTFIX)} {op} {self.text(node.value)}"

    def text_Call(self, node: s.Call, tail: bool) -> str:
        written = notation(node)
        if written in _BRACKETS:  # ⌊x⌋, ⌈x⌉, |x|
            left, right = _BRACKETS[written]
            return rf"\{left} {self.text(node.args[0])} \{right}"
        if written == "log2":
            return r"\log_2 " + self.sub(node.args[0], TIGHT, tail)
        args = ", ".join(self.marked(node, [self.text(a) for a in node.args]))
        if node.params or node.bar:
            params = ", ".join(self.marked(node, [self.text(p) for p in node.params],
                                           len(node.args)))
            args = f"{args} \\mid {self.mark(node, len(node.args))}{params}" if args else \
                f"\\mid {params}"
        head = self.name_math(node.func, node) if self.lettered(node.func) else \
            self.function(node.func)
        return f"{head}\\left({args}\\right)"

    def lettered(self, func: str) -> bool:
        """Whether a call's function is set as a name, not upright: one letter (with its
        accents and scripts) that the card defines as a function of its parameters (P(θ) ← …)
        or that names nothing the card knows (prose's P̂_θ(x)); never a builtin or a card."""
        base = re.sub(r"[\u0300-\u036f′']", "", split_name(func)[0])
        if len(base) != 1 or func in UPRIGHT or func in MATH:
            return False
        vocab = self.vocab
        return func in vocab.defined or (func not in vocab.names and func not in vocab.functions)

    def function(self, name: str) -> str:
        """A card's or a function's name, upright; σ stays the letter."""
        if name in MATH:
            return MATH[name]
        words = snake_words(name)
        if words:  # layer_norm, as the paper sets it
            return r"\mathrm{" + r"\_".join(words) + "}"
        base, decor = split_name(name)
        out = r"\mathrm{" + "".join(
            c if c.isascii() and c.isalnum() else _math_char(c) for c in base) + "}"
        return _decorated(out, decor)

    def text_Ellipsis(self, node: s.Ellipsis_, tail: bool) -> str:
        return r"\ldots"

    def text_Concat(self, node: s.Concat, tail: bool) -> str:
        sep = ";" if node.sep == ";" else ","
        items = self.marked(node, [self.sub(i, SUM) for i in node.items])
        return r"\left[" + f"{sep} ".join(items) + r"\right]"

    def text_Iverson(self, node: s.Iverson, tail: bool) -> str:
        return rf"[\![{self.text(node.cond)}]\!]"

    def text_Norm(self, node: s.Norm, tail: bool) -> str:
        return rf"\lVert {self.text(node.operand)} \rVert"

    def text_Sum(self, node: s.Sum, tail: bool) -> str:
        index = self.name_math(node.index)
        if node.over is not None:
            head = rf"\sum_{{{index} \in {self.sub(node.over, SUM)}}}"
        elif node.lo is None and node.hi is None:
            head = rf"\sum_{{{index}}}"
        else:
            lo = "" if node.lo is None else self.sub(node.lo, SUM)
            hi = "" if node.hi is None else self.sub(node.hi, SUM)
            head = rf"\sum_{{{index}={lo}}}^{{{hi}}}"
        return f"{head} {self.sub(node.body, PRODUCT, tail)}"

    def text_Choice(self, node: s.Choice, tail: bool) -> str:
        options = r" \text{ or } ".join(self.sub(x, SUM) for x in node.options)
        probs = r" \text{ or } ".join(self.sub(x, SUM) for x in node.probs)
        return rf"{options} \text{{ randomly with probability }} {self.mark(node, 1)}{probs}"

    def text_Several(self, node: s.Several, tail: bool) -> str:
        return ", ".join(self.marked(node, [self.sub(i, SUM) for i in node.items]))

    def text_SetBuilder(self, node: s.SetBuilder, tail: bool) -> str:
        return rf"\{{{self.name_math(node.var)} \in {self.sub(node.domain, SUM)} : " \
               rf"{self.sub(node.cond, COND)}\}}"

    def text_Range(self, node: s.Range, tail: bool) -> str:
        return ", ".join([*(self.text(x) for x in node.first), r"\ldots", self.text(node.last)])

    # ------------------------------------------------------------------ types

    def text_Scalar(self, node: s.Scalar, tail: bool) -> str:
        return MATH.get(node.set, r"\text{?}")

    def text_Interval(self, node: s.Interval, tail: bool) -> str:
        lo, hi = "[" if node.lo_closed else "(", "]" if node.hi_closed else ")"
        return f"{lo}{self.text(node.lo)}, {self.text(node.hi)}{hi}"

    def text_Bits(self, node: s.Bits, tail: bool) -> str:
        return r"\{0, 1\}"

    def text_IntRange(self, node: s.IntRange, tail: bool) -> str:
        return rf"\{{{self.text(node.lo)}, \ldots, {self.text(node.hi)}\}}"

    def text_Formats(self, node: s.Formats, tail: bool) -> str:
        names = ", ".join(r"\mathtt{" + n + "}" for n in node.names)
        return rf"\{{{names}\}}"

    def text_Finite(self, node: s.Finite, tail: bool) -> str:
        return f"[{self.text(node.size)}]"

    def text_Sequences(self, node: s.Sequences, tail: bool) -> str:
        return f"{self.name_math(node.of)}^{{*}}"

    def text_Iso(self, node: s.Iso, tail: bool) -> str:
        return rf"{self.name_math(node.name)} \cong {self.text(node.of)}"

    def text_Simplex(self, node: s.Simplex, tail: bool) -> str:
        return rf"\Delta\left({self.name_math(node.over)}\right)"

    def text_Tensor(self, node: s.Tensor, tail: bool) -> str:
        dims = r" \times ".join(self.dim_text(node, d) for d in node.dims)
        return f"{self.text(node.elem)}^{{{dims}}}"

    def dim_text(self, node: s.Tensor, d: s.Expr) -> str:
        sum_ = isinstance(d, s.BinOp) and d.op in ("+", "−") and len(node.dims) > 1
        return rf"\left({self.text(d)}\right)" if sum_ else self.text(d)

    def text_CardType(self, node: s.CardType, tail: bool) -> str:
        window = ""
        if node.window:
            window = rf" \text{{ for }} {self.name_math(node.length or '')} \le " \
                     rf"{self.name_math(node.window)}"
        return rf"{self.text(node.input)} \to {self.text(node.output)}{window}"

    # ------------------------------------------------------------------ declarations

    def decl_math(self, node: s.Decl, label: bool = False) -> str:
        """`names ∈ type = value ~ init`; in a `label` (a step's annotation, prose) a word
        that names nothing of the card's is upright (`Query`)."""
        names = [rf"\mathrm{{{n}}}" if label and self.unknown_word(n) else self.name_math(n)
                 for n in node.names]
        out = ", ".join(names)
        if node.type is not None:
            out += rf" \in {self.text(node.type)}"
        if isinstance(node.type, s.Formats) and isinstance(node.value, s.Name):
            out += rf" = \mathtt{{{node.value.id}}}"  # a format's name, as its set shows it
        elif node.value is not None:
            out += f" = {self.text(node.value)}"
        if node.init is not None:
            init = node.init
            if isinstance(init, s.Call):
                args = ", ".join(self.text(a) for a in init.args)
                out += rf" \sim {self.function(init.func)}\left({args}\right)"
            else:
                out += rf" \sim {self.text(init)}"
        return out

    def unknown_word(self, name: str) -> bool:
        """A word (`Query`) that the card has no type for."""
        return _WORD.fullmatch(name) is not None and name not in self.named

    def decl_tex(self, node: s.Decl) -> str:
        out = self.math(self.decl_math(node))
        if node.pad is not None:
            out += f", padding row {self.math(self.name_math(node.pad))}"
        if node.seed:
            out += ", seed of every random draw"
        if node.format_of is not None:
            out += f", number format of {self.math(self.name_math(node.format_of))}"
        if node.prose is not None:
            out += ", " + self.prose(node.prose)
        return out + self.prose(node.end)

    def items_tex(self, items: tuple[s.Item, ...], depth: int) -> list[str]:
        """The lines of a block's items: declarations filled into lines as the text renderer
        fills them (to a page's width), lists indented a level."""
        out: list[str] = []
        run: list[str] = []  # the current line's declarations, with their separators
        width, prev = 0, None
        indent = self.indent * depth

        def flush() -> None:
            nonlocal run, width, prev
            if run:
                out.append(indent + "".join(run))
            run, width, prev = [], 0, None

        for item in items:
            if not isinstance(item, s.Decl):
                flush()
                out += self.item_tex(item, depth)
                continue
            size = len(TEXT.text_Decl(item, True))  # prose runs on: it wraps
            if run and width + size > LINE - 4 * depth:
                flush()
            if run:
                run.append(", " if prev is not None and prev.type and item.type else "; ")
            run.append(self.decl_tex(item))
            width, prev = width + size + 2, item
            if item.prose is not None or item.end:
                flush()
        flush()
        return out

    def item_tex(self, item: s.Item, depth: int) -> list[str]:
        indent = self.indent * depth
        if isinstance(item, s.Bundle):
            head = f"{self.math(self.name_math(item.name))} {self.prose(item.intro)}:"
            if item.prose is not None:
                head += " " + self.prose(item.prose)
            return [indent + head, *self.items_tex(item.items, depth + 1)]
        if isinstance(item, s.Family):
            binder = "=" if isinstance(item.over, s.Range) else r"\in"
            index = self.name_math(item.index)
            head = f"For {self.math(f'{index} {binder} {self.text(item.over)}')}:"
            return [indent + head, *self.items_tex(item.items, depth + 1)]
        if isinstance(item, s.Dataset):
            elems = ", ".join(self.name_math(e) for e in item.elems)
            if len(item.elems) > 1:
                elems = rf"\left({elems}\right)"
            line = self.math(rf"\{{{elems}\}}_{{{self.name_math(item.index)}={self.text(item.lo)}}}"
                             rf"^{{{self.text(item.hi)}}}")
            return [indent + line + ("" if item.prose is None else ", " +
                                     self.prose(item.prose))]
        if isinstance(item, s.Sentence):
            return [indent + self.prose(item.text)]
        return []

    # ------------------------------------------------------------------ statements

    def stmt_tex(self, node: s.Stmt) -> str:
        """One statement as a line of the algorithm (text mode, math inside $…$)."""
        if isinstance(node, s.Assign):
            op = r"\gets" if node.op == "←" else "="
            return f"${self.sub(node.target, POSTFIX)} {op} {self.mark(node, 1)}" \
                   f"{self.text(node.value)}$"
        if isinstance(node, s.Return):
            name = "" if node.name is None else \
                f"{self.name_math(node.name)} = {self.mark(node, 1)}"
            return rf"\KwRet{{${name}{self.text(node.value)}$}}"
        if isinstance(node, s.Sample):
            return rf"\KwSample{{}} a token ${self.name_math(node.var)}$ from " \
                   rf"${self.name_math(node.dist)} " \
                   rf"\propto {self.weights_text(node.weights)}$"
        if isinstance(node, s.ForAll):
            return rf"$\forall {self.quantified(node)}$, {self.stmt_tex(node.body)}"
        if isinstance(node, s.If):
            return rf"\textbf{{if}} ${self.sub(node.cond, CONJ)}$ \textbf{{then}} " \
                   f"{self.stmt_tex(node.then)}"
        if isinstance(node, s.For):  # a map: `for h ∈ [H] : step`
            body = " ".join(self.stmt_tex(step.stmt) for step in node.body)
            return rf"\textbf{{for}} ${self.loop_head(node)}$ : {body}"
        raise TypeError(f"cannot render {type(node).__name__} as a line")

    def weights_text(self, node: s.Expr) -> str:
        return self.text(node)

    def quantified(self, node: s.ForAll) -> str:
        """The variables of `∀`, each with its range where the card states one."""
        over = node.over or (None,) * len(node.vars)
        return ", ".join(self.name_math(v) if o is None else
                         rf"{self.name_math(v)} \in {self.text(o)}"
                         for v, o in zip(node.vars, over, strict=True))

    def loop_head(self, node: s.For) -> str:
        binder = {"∈": r"\in", "=": "=", "←": r"\gets"}.get(node.binder, node.binder)
        return f"{self.name_math(node.var)} {binder} {self.text(node.over)}"

    def step_tex(self, node: s.Step, depth: int) -> list[str]:
        pad = "  " * depth
        out = [pad + rf"\tcc{{{self.prose(c)}}}" for c in node.comments]
        stmt = node.stmt
        margin = ""
        if node.annotation is not None:
            margin = f"${self.decl_math(node.annotation, label=True)}$"
        if node.note is not None:
            margin = (margin + " " if margin else "") + self.prose(node.note)
        side = rf"\hfill$\triangleright$\ {margin}" if margin else ""  # in a loop's head
        where = "" if node.where is None else ", where " + self.prose(node.where)
        if isinstance(stmt, s.For) and stmt.style != "map":
            out.append(pad + rf"\For{{${self.loop_head(stmt)}${side}}}{{")
            out += [line for step in stmt.body for line in self.step_tex(step, depth + 1)]
            out.append(pad + "}")
        elif isinstance(stmt, s.While):
            out.append(pad + rf"\While{{${self.sub(stmt.cond, CONJ)}${side}}}{{")
            out += [line for step in stmt.body for line in self.step_tex(step, depth + 1)]
            out.append(pad + "}")
        else:  # a side note ends the line itself
            end = rf"\Note*[r]{{{margin}}}" if margin else r"\;"
            out.append(pad + self.broken(stmt, depth) + where + end)
        return out

    def broken(self, stmt: s.Stmt, depth: int) -> str:
        """`stmt` as stmt_tex sets it, broken into lines where it is wider than a step's line
        at loop depth `depth` (1: outside any loop): one line of algorithm2e, one number."""
        self.breaks = choose(pieces(stmt), STEP - LEVEL * (depth - 1), HANG)
        try:
            line = self.stmt_tex(stmt)
        finally:
            self.breaks = frozenset()
        return broken_math(line)

    # ------------------------------------------------------------------ algorithms

    def caption(self, node: s.Algorithm) -> str:
        if node.name is None:
            return self.prose(node.title or "")
        outs = ", ".join(self.name_math(o) for o in node.outputs)
        args = ", ".join(self.name_math(a) for a in node.args)
        if node.params:
            params = ", ".join(self.name_math(p) for p in node.params)
            args = f"{args} \\mid {params}" if args else f"\\mid {params}"
        return rf"${outs} \gets {self.function(node.name)}\left({args}\right)$"

    def algorithm_tex(self, node: s.Algorithm) -> list[str]:
        out = [r"\begin{algorithm}[htbp]"]
        if node.number is not None:
            out.append(rf"\SetAlgoRefName{{{text(node.number)}}}")
        out.append(rf"\caption{{{self.caption(node)}}}")
        out += [rf"\tcc{{{self.prose(c)}}}" for c in node.comments]
        macro = {"Input": r"\KwIn", "Output": r"\KwOut", "Hyperparameters": r"\KwHyper",
                 "Parameters": r"\KwParams"}
        for block in node.blocks:
            lines = self.items_tex(block.items, 0)
            body = " \\newline ".join(lines) if lines else ""
            out.append(macro.get(block.kind, r"\KwData") + "{" + body + "}")
        for step in node.steps:
            out += self.step_tex(step, 1)
        out.append(r"\end{algorithm}")
        return out


def typography(checker: Checker | None, alg: s.Algorithm,
               kind: type[LatexRenderer] | None = None) -> LatexRenderer:
    """A renderer for `alg` (of class `kind`, LatexRenderer by default) holding what the
    checker found: each name's type where it is written and as declared (bold follows them),
    the numbers typed as vectors, and the names and functions its prose is read against."""
    kind = kind or LatexRenderer
    info = checker.infos.get(id(alg)) if checker is not None else None
    if info is None:
        r = kind()
        r.vocab = vocabulary(alg)
        return r
    at, named, declared = types(info, alg)
    bold = bold_names(alg, at, named, declared)
    vectors = {id(n) for n in s.nodes(alg.steps) if isinstance(n, s.Num) and
               isinstance(info.types.get(id(n)), Ty) and info.types[id(n)].shape}
    vectors |= {id(n.operand) for n in s.nodes(alg.steps)  # 1^⊺: the ones vector, transposed
                if isinstance(n, s.Transpose) and isinstance(n.operand, s.Num) and
                isinstance(info.types.get(id(n)), Ty) and info.types[id(n)].shape}
    r = kind(bold, frozenset(vectors))
    r.at, r.named = at, named
    called = {c.callee.name for c in info.calls.values()
              if isinstance(c.callee, s.Algorithm) and c.callee.name}
    r.vocab = vocabulary(alg, frozenset(called))
    return r


def types(info: CardInfo, alg: s.Algorithm
          ) -> tuple[dict[int, Ty], dict[str, Ty], frozenset[str]]:
    """The type of each name (and call) node of `alg` where the checker typed it, an
    assignment's target typed by its value; each name's type as declared (its inputs,
    hyperparameters, outputs and parameters), else where it is first typed; and the names
    declared so."""
    at = {k: t for k, t in info.types.items() if isinstance(t, Ty)}
    for n in s.nodes(alg.steps):  # a target is typed by what it is given
        if isinstance(n, s.Assign) and isinstance(n.target, s.Name) and \
                isinstance(info.types.get(id(n.value)), Ty):
            at.setdefault(id(n.target), info.types[id(n.value)])
    sig = info.sig
    declared: list[tuple[str, object]] = [*sig.inputs, *sig.hypers.items()]
    outs = alg.outputs or tuple(n for d in alg.decls("Output") if isinstance(d, s.Decl)
                                for n in d.names)  # a titled card's one Output
    if sig.output is not None and (alg.outputs or len(outs) == 1):
        declared.append((outs[0], sig.output))
    declared += [(o, ty) for o, ty in zip(alg.outputs[1:], sig.more, strict=True) if ty]
    declared += _members(sig.tree)
    names = frozenset(name for name, ty in declared if isinstance(ty, Ty))
    declared += [(n.id, at[id(n)]) for n in s.nodes(alg.steps)
                 if isinstance(n, s.Name) and id(n) in at]
    named: dict[str, Ty] = {}
    for name, ty in declared:
        if isinstance(ty, Ty):
            named.setdefault(name, ty)
    return at, named, names


def bold_names(alg: s.Algorithm, at: dict[int, Ty], named: dict[str, Ty],
               declared: frozenset[str]) -> frozenset[str]:
    """The names of `alg` set in bold, by the paper's rule from the checker's types: a vector
    or a matrix is bold, a scalar never is. A name the card declares goes by its declared
    type; any other (a step's, a function its steps define: P(θ) ← …) is bold where the checker
    types it as a vector or a matrix at any point: a state started as a broadcast zero
    (`h ← 0`, then `h ← a ⊙ h + u`) is one vector throughout. The weight belongs to the name,
    so it is the same in every place the name is set."""
    out = {name for name in declared if named[name].shape}
    for n in s.nodes(alg.steps):
        if isinstance(n, s.Name):
            name, ty = n.id, at.get(id(n))
        elif isinstance(n, s.Assign) and isinstance(n.target, s.Call):  # P(θ) ← …
            name, ty = n.target.func, at.get(id(n.target))
        elif isinstance(n, s.Return) and n.name:  # return P = …
            name, ty = n.name, at.get(id(n.value))
        else:
            continue
        if name not in declared and ty is not None and ty.shape:
            out.add(name)
    for d in s.nodes(alg.blocks):  # the header's x_{1:N_data} is the data set {x_n}: one weight
        if isinstance(d, s.Dataset):
            out |= {a for a in alg.args for e in d.elems if e in out and _whole(a, e, d.index)}
    return frozenset(out)


def _whole(name: str, elem: str, index: str) -> bool:
    """Whether `name` (x_{1:N}) names every example `elem` (x_n) of a data set over `index`."""
    (base, decor), (of, scripts) = split_name(name), split_name(elem)
    return base == of and bool(decor) and decor[:-1] == scripts[:-1] and \
        scripts[-1:] == [("_", index)] and decor[-1][0] == "_" and ":" in decor[-1][1]


def _members(bundle: BundleTy) -> list[tuple[str, object]]:
    """Every parameter of a bundle, nested bundles and families (`For h ∈ [H]: W^h_q …`, an
    entry per index) opened."""
    out: list[tuple[str, object]] = []
    for name, entry in bundle.members.items():
        while isinstance(entry, FamilyTy):
            entry = entry.entry
        out += _members(entry) if isinstance(entry, BundleTy) else [(name, entry)]
    return out


def render_latex(card: s.CardFile, checker: Checker | None = None,
                 whole: bool = False) -> str:
    """LaTeX of every algorithm of `card`; with `standalone`, a whole document."""
    body: list[str] = []
    for alg in card.algorithms:
        body += typography(checker, alg).algorithm_tex(alg)
        body.append("")
    out = "\n".join(body)
    return _ascii(standalone(out) if whole else out)


def broken_math(line: str) -> str:
    """`line` with each `$…$` that holds a BREAK split there: its pieces on lines of their
    own (algorithm2e's line goes on, its number once), hung by `_HANG`."""
    if BREAK not in line:
        return line
    parts = re.split(r"(?<!\\)\$", line)  # text, math, text, …: `\$` is prose's dollar
    for i in range(1, len(parts), 2):
        parts[i] = f"${_HANG}$".join(_balanced(parts[i].split(BREAK)))
    return "$".join(parts)


def _balanced(pieces_: list[str]) -> list[str]:
    """Math pieces, each closing with `\\right.` the fences it leaves open and opening with
    `\\left.` those it goes on inside: TeX pairs each `\\left` with a `\\right` in one formula."""
    out, held = [], 0
    for piece in pieces_:
        ends = held + len(_LEFT.findall(piece)) - len(_RIGHT.findall(piece))
        out.append(r"\left." * held + piece + r"\right." * ends)
        held = ends
    return out


_LEFT = re.compile(r"\\left(?![A-Za-z])")
_RIGHT = re.compile(r"\\right(?![A-Za-z])")


def _ascii(tex: str) -> str:
    """A last guard: a character outside ASCII that a rule above missed becomes `?` (valid in
    text and math alike), so that pdflatex never sees Unicode."""
    return tex if tex.isascii() else "".join(c if c.isascii() else "?" for c in tex)


def standalone(body: str) -> str:
    """A document around rendered algorithms, for pdflatex."""
    return "\n".join([r"\documentclass{article}", r"\usepackage[margin=2cm]{geometry}",
                      r"\usepackage[T1]{fontenc}", r"\usepackage{lmodern}", PREAMBLE,
                      r"\begin{document}", body, r"\end{document}", ""])
