"""Spellings of names: ASCII → canonical Unicode, and canonical → Python identifiers."""

from __future__ import annotations

import keyword
import re
import unicodedata
from functools import lru_cache

GREEK = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "eps": "ε", "zeta": "ζ",
    "eta": "η", "theta": "θ", "iota": "ι", "kappa": "κ", "lambda": "λ", "mu": "μ", "nu": "ν",
    "xi": "ξ", "pi": "π", "rho": "ρ", "sigma": "σ", "tau": "τ", "upsilon": "υ", "phi": "φ",
    "chi": "χ", "psi": "ψ", "omega": "ω", "Gamma": "Γ", "Theta": "Θ", "Lambda": "Λ",
    "Xi": "Ξ", "Pi": "Π", "Phi": "Φ", "Psi": "Ψ", "Omega": "Ω", "ell": "ℓ",
}
ASCII_OF = {v: k for k, v in GREEK.items()}
ASCII_OF.update({"ε": "eps", "ℓ": "l", "ϵ": "eps", "ϑ": "theta", "ϕ": "phi", "𝒩": "Normal"})

HAT, TILDE = "\u0302", "\u0303"
_RUN = re.compile(r"[A-Za-z]+")


# Greek letters that name builtin functions: spelled out at a call (`sigma(x)`), they are the
# symbol; any other name before "(" names a card or a function and keeps its letters
FUNCTION_SYMBOLS = frozenset({"σ"})


@lru_cache(maxsize=4096)  # a card repeats its names many times over
def canonical_name(text: str, greek: bool = True) -> str:
    """`gamma^1_l` → `γ^1_l`, `X~` → `X̃`, `e^` → `ê`, `t'` → `t′` (decomposed Unicode).
    With `greek` false, letters are kept as written (card names: `Phi` is not `Φ`)."""
    text = unicodedata.normalize("NFD", text)
    if greek:
        text = _RUN.sub(lambda m: GREEK.get(m.group(0), m.group(0)), text)
    text = text.replace("~", TILDE).replace("'", "′")
    if text.endswith("^"):
        text = text[:-1] + HAT
    return re.sub(r"\^(?=[_^])", HAT, text)


def function_name(written: str) -> str:
    """The name of a card or function as a header or a call writes it: decorations in canonical
    form, Greek spelled out only where it is a builtin's symbol (`sigma` → `σ`)."""
    symbol = canonical_name(written)
    return symbol if symbol in FUNCTION_SYMBOLS else canonical_name(written, greek=False)


def display(text: str) -> str:
    """Composed Unicode for people: Ṽ rather than V + U+0303."""
    return unicodedata.normalize("NFC", text)


@lru_cache(maxsize=4096)
def python_name(text: str) -> str:
    """A readable Python identifier for a card name: `γ^1_l` → `gamma1_l`, `W_e` → `W_e`."""
    out = []
    for ch in unicodedata.normalize("NFD", text):
        if ch == HAT:
            out.append("_hat")
        elif ch == TILDE:
            out.append("_tilde")
        elif ch == "′":
            out.append("_prime")
        elif ch in ASCII_OF:
            out.append(ASCII_OF[ch])
        elif ch.isascii() and (ch.isalnum() or ch == "_"):
            out.append(ch)
        elif ch == "^":
            out.append("")
        else:
            out.append("_")
    name = re.sub(r"_+", "_", "".join(out).replace("{", "").replace("}", "")).strip("_") or "v"
    if name[0].isdigit():
        name = "v" + name
    return name + "_" if keyword.iskeyword(name) else name


def edit_distance(a: str, b: str) -> int:
    """The fewest insertions, deletions, substitutions and swaps of two neighbours that turn
    `a` into `b` (`Ouput` → `Output`: 1; `Inptu` → `Input`: 1)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i]
        for j, cb in enumerate(b, 1):
            best = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                best = min(best, prev2[j - 2] + 1)
            row.append(best)
        prev2, prev = prev, row
    return prev[-1]
