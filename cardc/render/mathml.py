"""MathML Core markup for card symbols, numbers and shapes, typeset as the paper's LaTeX is.

The pieces HtmlRenderer (cardc.render.html) builds its math from: elements (`tag`, `mi`, `mo`,
`row`, `fenced`), a card name as its base letter with subscripts and superscripts (`symbol`), a
card's or function's name upright (`function`), a number (`number`: 1e-5 as 10^−5) and a
checker's type (`shape_math`: ℝ^{T×D}). Chromium lays out `mathvariant` only as "normal", so
bold and italic letters are the Unicode mathematical alphanumerics (𝑿, 𝑐𝑡𝑥), and an overhanging
italic letter gets the room TeX's italic correction would give it (`corrected`). All text is
escaped: a card's names and numbers cannot open markup.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from fractions import Fraction
from functools import cache
from html import escape

from ..checker import split_name
from ..dims import Dim
from ..spelling import display
from ..types import Ty
from .latex import _WORD, SCRIPT_WORD, snake_words

# accents over a name's letter (combining marks of the canonical spelling), as MathML writes them
_ACCENTS = {"\u0302": "\u02c6", "\u0303": "\u02dc", "\u0304": "\u00af", "\u0307": "\u02d9",
            "\u0308": "\u00a8", "\u20d7": "\u2192"}
# operators whose MathML character is not the card's: · is TeX's \cdot
_OPS = {"·": "⋅", "~": "∼", "-": "−", "*": "∗"}
# TeX's \phi is the straight phi, whatever the card wrote
_GLYPHS = {"φ": "ϕ"}
# the italic letters whose top right reaches past their box (TeX's largest italic corrections)
_OVERHANG = tuple(f"CAPITAL {c}" for c in "FPTUVWY") + ("SMALL F",)
_STYLES = {"bold": "BOLD", "italic": "ITALIC", "bold-italic": "BOLD ITALIC"}
THIN = '<mspace width="0.1667em"/>'  # TeX's \, : juxtaposition
_NBSP = "&#xA0;"
ELLIPSIS = '<mo lspace="0" rspace="0">…</mo>'  # TeX's \ldots: the commas space it
REL = "0.2778em"  # TeX's thick space, around a relation
_TALL = re.compile(r"<(mfrac|munder|munderover)\b")

# ---------------------------------------------------------------------- MathML primitives


def _attrs(attrs: dict[str, str | None]) -> str:
    """Attributes, escaped; `class_` is written `class`."""
    return "".join(f' {k.rstrip("_")}="{escape(v)}"' for k, v in attrs.items() if v is not None)


def tag(name: str, *children: str, **attrs: str | None) -> str:
    return f"<{name}{_attrs(attrs)}>{''.join(children)}</{name}>"


def row(*parts: str) -> str:
    """One element for `parts`: an `<mrow>` where there are several."""
    parts = tuple(p for p in parts if p)
    return parts[0] if len(parts) == 1 else tag("mrow", *parts)


def mo(op: str, **attrs: str | None) -> str:
    return tag("mo", escape(_OPS.get(op, op)), **attrs)


def mi(text: str, **attrs: str | None) -> str:
    return tag("mi", escape(text), **attrs)


def mtext(text: str) -> str:
    return f"<mtext>{_NBSP}{escape(text)}{_NBSP}</mtext>"


def fenced(inner: str, open_: str = "(", close: str = ")", stretchy: bool = True) -> str:
    """`inner` between fences: plain brackets, or (`stretchy`) as TeX's \\left( \\right),
    which grow only around something tall: a browser stretches a fence to any script's depth,
    where TeX lets a delimiter fall short of it."""
    if stretchy and _TALL.search(inner):  # to the content's height, not about the axis
        return tag("mrow", mo(open_, symmetric="false"), inner, mo(close, symmetric="false"))
    return tag("mrow", mo(open_, stretchy="false"), inner, mo(close, stretchy="false"))


def joined(parts: Iterable[str], sep: str = ",") -> str:
    """`parts` in a row, `sep` between them: an operator, or markup (`<mtext>…`)."""
    between = sep if sep.startswith("<") else mo(sep)
    out: list[str] = []
    for part in parts:
        out += [between, part] if out else [part]
    return row(*out)


def with_class(markup: str, cls: str, **attrs: str | None) -> str:
    """`markup` (one element) with a class (joining any it has) and attributes added to its
    outermost tag."""
    at = re.match(r"<([a-z]+)([^>]*)>", markup)  # values are escaped: no > within
    assert at is not None, markup
    name, old = at.groups()
    has = re.search(r' class="([^"]*)"', old)
    if has:
        old, cls = old[:has.start()] + old[has.end():], f"{cls} {has.group(1)}"
    return f"<{name}{_attrs({'class': cls, **attrs})}{old}>{markup[at.end():]}"


@cache
def styled(ch: str, style: str) -> str | None:
    """`ch` as a Unicode mathematical alphanumeric (`X`, "bold-italic" → 𝑿); None where Unicode
    has none. Chromium lays out `mathvariant` only as "normal", so the letters carry the style."""
    if style == "italic" and ch == "h":
        return "\u210e"  # the italic h is Planck's constant, a hole in the block
    try:
        name = unicodedata.name(ch)
    except ValueError:
        return None
    for word in ("LATIN ", "GREEK ", "LETTER ", "LUNATE "):
        name = name.replace(word, "")
    try:
        return unicodedata.lookup(f"MATHEMATICAL {_STYLES[style]} {name}")
    except KeyError:
        return None


def _letters(text: str, style: str) -> tuple[str, bool]:
    """`text` in `style`, and whether every character has that style in Unicode."""
    out = [styled(c, style) for c in text]
    return "".join(o or c for o, c in zip(out, text, strict=True)), all(out)


def _letter(ch: str, bold: bool) -> str:
    """One letter as TeX sets it: italic (MathML's default for one letter), capital Greek
    upright; `bold` as \\boldsymbol does."""
    ch = _GLYPHS.get(ch, ch)
    upright = "\u0391" <= ch <= "\u03a9" or ch.isdigit()
    if not bold:
        return tag("mn", escape(ch)) if ch.isdigit() else \
            mi(ch, mathvariant="normal" if upright else None)
    style = "bold" if upright else "bold-italic"
    text, ok = _letters(ch, style)
    return tag("mn" if ch.isdigit() else "mi", escape(text), mathvariant=style,
               class_=None if ok else "b")


# ---------------------------------------------------------------------- names


def _base(base: str, bold: bool) -> str:
    """A name's base as latex._base sets it: a word italic, accents over it, primes after."""
    chars = unicodedata.normalize("NFD", base)
    marks = [c for c in chars if c in _ACCENTS]
    letters = re.sub(r"[\u0300-\u036f\u20d0-\u20ff]", "", chars)
    primes = letters.count("′") + letters.count("'")
    letters = letters.replace("′", "").replace("'", "")
    if _WORD.fullmatch(letters):  # \mathit{ctx}: a word in italic letters
        style = "bold-italic" if bold else "italic"
        text, ok = _letters(letters, style)
        core = mi(text, mathvariant=style, class_=None if ok else "b")
    else:
        core = row(*(_letter(c, bold) for c in letters))
    for mark in marks:
        core = tag("mover", core, mo(_ACCENTS[mark]), accent="true")
    if primes:
        core = tag("msup", core, mo("′" * primes))
    return core


def _script(part: str) -> str:
    """A subscript or superscript: a word upright, names within it (`1:N_data`) as names."""
    if SCRIPT_WORD.fullmatch(part):
        return mi(part)  # several letters: upright, as \mathrm
    if "_" in part or "^" in part:
        return row(*(symbol(tok) if re.match(r"[^\s:,;+\-*/()]", tok) else
                     row(*(mo(c) for c in tok if not c.isspace()))
                     for tok in re.split(r"([\s:,;+\-*/()]+)", part) if tok))
    return row(*_tokens(unicodedata.normalize("NFD", part)))


def _tokens(chars: str) -> list[str]:
    """Characters of a script or a number: digits as numbers, letters as names, the rest as
    operators; accents and braces dropped as latex._math_char drops them."""
    out = []
    for run in re.findall(r"\d+(?:\.\d+)?|.", chars):
        if run[0].isdigit():
            out.append(tag("mn", escape(run)))
        elif run.isalpha():
            out.append(_letter(run, False))
        elif run not in "{}" and not unicodedata.combining(run) and not run.isspace():
            out.append(mo(run))
    return out


def _decorated(core: str, decor: list[tuple[str, str]]) -> str:
    """`core` with its subscripts and superscripts; a second of a kind scripts what is before,
    as latex._decorated groups it."""
    scripts: dict[str, str] = {}
    for kind, part in decor:
        if kind in scripts:
            core, scripts = _scripted(core, scripts), {}
        scripts[kind] = _script(part)
    return _scripted(core, scripts)


def _scripted(core: str, scripts: dict[str, str]) -> str:
    sub, sup = scripts.get("_"), scripts.get("^")
    if sub and sup:
        return tag("msubsup", corrected(core), sub, sup)
    if sub:
        return tag("msub", core, sub)
    if sup:
        return tag("msup", corrected(core), sup)
    return core


def corrected(markup: str) -> str:
    """A slanted letter that overhangs its box (V, W, Y …) with room after it: TeX's italic
    correction, which Chromium leaves out, so that a superscript or a bracket after it does
    not touch it. Anything else as it is."""
    m = re.fullmatch(r'<mi((?: [a-z]+="[^"]*")*)>([^<])</mi>', markup)
    if m is None or 'mathvariant="normal"' in m.group(1) or not _overhangs(m.group(2)):
        return markup
    return with_class(markup, "ic")


@cache
def _overhangs(ch: str) -> bool:
    name = unicodedata.name(ch, "") if not ch.isascii() else \
        f"ITALIC {'CAPITAL' if ch.isupper() else 'SMALL'} {ch.upper()}"
    return "ITALIC" in name and name.endswith(_OVERHANG)


def symbol(name: str, bold: bool = False) -> str:
    """A name as MathML: `θ^block_ℓ` → θ with `block` upright above and ℓ below."""
    base, decor = split_name(name)
    return _decorated(_base(base, bold), decor)


def function(name: str, href: str | None = None) -> str:
    """A card's or a function's name, upright; a symbol (σ, 𝒩) stays the letter. With `href`, a
    link: an HTML `<a>` in `<mtext>`, the one place MathML Core lets HTML in."""
    if len(display(name)) == 1 and not name.isascii():
        return mi(display(name))
    words = snake_words(name)
    base, decor = ("_".join(words), []) if words else split_name(name)  # layer_norm: one name
    if href is not None:
        core = f'<mtext class="call"><a href="{escape(href)}">{escape(display(base))}</a></mtext>'
    else:
        core = mi(display(base), mathvariant="normal")
    return _decorated(core, decor)


def number(text: str, vector: bool = False) -> str:
    """A number: `1e-5` as 10^−5 (2.5·10^−5), ∞, the ones vector 1 bold."""
    if vector:
        return _letter(text, True) if len(text) == 1 else tag("mn", escape(text))
    if text == "∞":
        return mi("∞")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)[eE]([-+]?\d+)", text)
    if m:
        mant, exp = m.group(1), int(m.group(2))
        power = tag("msup", tag("mn", "10"), row(*([mo("−")] if exp < 0 else []),
                                                  tag("mn", str(abs(exp)))))
        return power if mant in ("1", "1.0") else row(tag("mn", mant), mo("·"), power)
    return row(*_tokens(text))


def shape_math(ty: Ty) -> str:
    """A checker's type as MathML, as `Ty.__str__` spells it: ℝ^{T×D}, sums in a shape of
    several dimensions parenthesized for the reader."""
    elem = fenced(joined([tag("mn", "0"), tag("mn", "1")]), "{", "}", stretchy=False) \
        if ty.elem == "𝔹" else mi(ty.elem)
    if not ty.shape:
        return elem
    dims = [_dim(d, len(ty.shape) > 1) for d in ty.shape]
    return tag("msup", elem, joined(dims, "×"))


def _dim(d: Dim | None, several: bool) -> str:
    """A symbolic dimension as dims.Dim.__str__ writes it: `d_r − 1`, `d/2`, `3 D/(2 H)`."""
    if d is None:
        return mo("∗")
    if not d.terms:
        return tag("mn", "0")
    parts = []
    for i, (mono, coef) in enumerate(sorted(d.terms, key=lambda t: t[0] == ())):
        if coef < 0 or i:
            parts.append(mo("−" if coef < 0 else "+"))
        parts.append(_term(mono, abs(coef)))
    out = row(*parts)
    return fenced(out) if several and len(d.terms) > 1 else out


def _term(mono: tuple[tuple[str, int], ...], mag: Fraction) -> str:
    def power(sym: str, e: int) -> str:
        base = symbol(sym) if re.fullmatch(r"[^\s/()·]+", sym) else mi(display(sym))
        return base if e == 1 else tag("msup", base, tag("mn", str(e)))

    num = [power(sym, e) for sym, e in mono if e > 0]
    den = [power(sym, -e) for sym, e in mono if e < 0]
    if mag.denominator != 1:
        den.insert(0, tag("mn", str(mag.denominator)))
    top = ([tag("mn", str(mag.numerator))] if mag.numerator != 1 or not num else []) + num
    body = joined(top, THIN)
    if den:
        below = den[0] if len(den) == 1 else fenced(joined(den, THIN))
        body = row(body, mo("/", lspace="0", rspace="0"), below)
    return body


# ---------------------------------------------------------------------- the renderer
