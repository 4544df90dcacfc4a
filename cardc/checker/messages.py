"""The words of diagnostics: what an operator does, how a value is shown, and hints for a name
that is not one (a misspelling, a power written as a superscript, prose read as a name)."""

from __future__ import annotations

import difflib
import re

from .. import syntax as s
from ..builtins import BUILTINS
from ..dims import Dim
from ..render.text import render_expr
from ..spelling import canonical_name, display
from ..types import Entry, Ty, substitute
from .shapes import dims_equal

_WORDS = {"+": "add", "−": "subtract", "⊙": "multiply element-wise", "·": "multiply",
          " ": "multiply", "/": "divide"}


def _shown(ty: Ty, bind: dict[str, Dim]) -> str:
    return str(substitute(ty, bind))


def _entry_text(e: Entry) -> str:
    return str(e)


def _text(e: s.Expr) -> str:
    return display(e.id) if isinstance(e, s.Name) else "this expression"


def _product_hint(e: s.BinOp, a: Ty, b: Ty) -> str | None:
    if a.rank == 2 and b.rank == 2 and dims_equal(a.shape[-1], b.shape[-1]):
        return "did you mean to transpose the right operand (^⊺)?"
    if a.rank == 2 and b.rank == 2 and dims_equal(a.shape[0], b.shape[0]):
        return "did you mean to transpose the left operand (^⊺)?"
    return None


def _read_as_prose(alg: s.Algorithm, name: str) -> str | None:
    """`θ^attn, θ^mlp` (or `θ^attn, θ^mlp, the attention and the MLP`) declares θ^attn,
    described as 'θ^mlp…': the hint says so."""
    for decl in (n for n in s.nodes(alg) if isinstance(n, s.Decl)):
        if decl.prose is None or decl.type is not None:
            continue
        first = decl.prose.split(",")[0].strip(" .")
        if first in (name, display(name)) or canonical_name(first) == name:
            return (f"'{display(decl.names[-1])}, {decl.prose}' declares "
                    f"{display(decl.names[-1])} and describes it as '{decl.prose}': "
                    f"declare each parameter bundle on its own line")
    return None


def _spelling_hint(name: str) -> str | None:
    """What a name that is not one was meant to be, in the card's notation."""
    power = re.fullmatch(r"(.+)\^(\d+)", name)
    if power:
        base = display(power.group(1))
        return (f"'{display(name)}' reads as one name with a superscript; a power is "
                f"'{base}²' or '{base}^{{{power.group(2)}}}'")
    if name in ("sum", "Sum"):
        return "a sum is 'Σ_{i=1}^{N} x_i' (ASCII 'sum_{i=1}^{N} x_i')"
    if name.startswith("sum_"):
        return "an ASCII sum takes braces: 'sum_{i=1}^{N} x_i' or 'sum_{i} x_i'"
    if name in ("matmul", "dot"):
        return "a matrix product is written 'W X' (side by side) or 'W · X'"
    return None


def _card_like(name: str) -> bool:
    """A name spelled as cards are (SwiGLU, LayerNorm), not a builtin's in another case: no
    builtin is offered for it, only a card."""
    return bool(re.fullmatch(r"[A-Z][A-Za-z0-9]*[A-Z][A-Za-z0-9]*", name)) and len(name) > 3 \
        and name.lower() not in {b.lower() for b in BUILTINS}


def _join_hints(*hints: str | None) -> str | None:
    return " ".join(h for h in hints if h) or None


def _suggest(name: str, candidates: list[str]) -> str | None:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f"did you mean '{display(close[0])}'?" if close else None


def _call_hint(call: s.Call) -> str | None:
    """What a call to an unknown name was meant to be: Python's `range(N)` as a card's loop
    writes its range, or a builtin in another case (`relu` for `ReLU`; a card's name in
    another case gets the hint of any misspelt card, with where cards were looked for)."""
    if call.func == "range":
        n = render_expr(call.args[0]) if len(call.args) == 1 else "N"
        return (f"a card's loops count from 1: 'for i ∈ [{n}] do' or 'for i = 1, …, {n} do' "
                f"(ASCII 'for i in [{n}] do', '1, ..., {n}')")
    same = [n for n in sorted(BUILTINS) if n != call.func and n.lower() == call.func.lower()]
    if same:
        return f"did you mean '{display(same[0])}'? Names are case-sensitive"
    return None
