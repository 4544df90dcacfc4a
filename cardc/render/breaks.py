"""Where a step too long for its line breaks: the points the LaTeX and the HTML renderings share.

A statement is walked as the text renderer writes it (cardc.render.text), into its text and the
points where a line may break, each after an operator: after the assignment's `←`, after a `+`
or `−`, a `·`, `⊙` or juxtaposition, and after the commas between a call's arguments (or a
list's items) and after its `|`. A point is the looser the fewer brackets hold it, then the
looser its operator, in that order: `←`, `+`/`−`, the products, the commas.

The width of a line is counted in characters of the card's text (a subscript's or a
superscript's braces and marks not counted), not measured on a page, so a rendering is the same
each time. `choose` breaks a statement only where it is wider than the budget, and then only at
the loosest points that bring every line within it: first the loosest kind of point alone, then
each next kind with those before, a line always filled as far as it can go.

A point is named by its node and the item it comes before (`Break.key`); the renderers put
`BREAK` where a chosen point falls and then split their markup there.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from .. import syntax as s
from ..builtins import BRACKETS, SUBSCRIPTED
from .text import POSTFIX, SUM, TEXT, notation

BREAK = "\x1f"  # a chosen break in rendered markup, until the renderer splits the markup there
ASSIGNED, SUMMED, MULTIPLIED, LISTED = range(4)  # the kinds of point, loosest first
_RANKS = {"+": SUMMED, "−": SUMMED, "·": MULTIPLIED, "⊙": MULTIPLIED, " ": MULTIPLIED,
          "mod": MULTIPLIED}


@dataclass(frozen=True)
class Break:
    """A point where a line may break: after the text before it, before item `key[1]` of the
    node `id` `key[0]`."""

    key: tuple[int, int]
    depth: int  # the brackets around it
    rank: int  # ASSIGNED … LISTED

    @property
    def kind(self) -> tuple[int, int]:
        return self.depth, self.rank


Piece = str | Break


def width(text: str) -> int:
    """The characters `text` shows: combining accents and a script's `^`, `_` and braces are
    no characters of their own."""
    return sum(1 for c in text if not unicodedata.combining(c) and c not in "^_{}")


def pieces(stmt: s.Stmt) -> list[Piece]:
    """`stmt` as its text and its break points, in order."""
    out: list[Piece] = []
    _statement(stmt, out)
    return out


def _statement(node: s.Stmt, out: list[Piece]) -> None:
    if isinstance(node, s.Assign):
        out += [f"{TEXT.sub(node.target, POSTFIX)} {node.op} ", Break((id(node), 1), 0, ASSIGNED)]
        _expr(node.value, 0, True, 0, out)
    elif isinstance(node, s.Return):
        out.append("return ")
        if node.name is not None:
            out += [f"{node.name} = ", Break((id(node), 1), 0, ASSIGNED)]
        _expr(node.value, 0, True, 0, out)
    elif isinstance(node, s.If | s.ForAll):
        body = node.then if isinstance(node, s.If) else node.body
        _prefixed(node, [body], out)
    elif isinstance(node, s.For) and node.style == "map":
        _prefixed(node, [step.stmt for step in node.body], out)
    else:
        out.append(TEXT.text(node))


def _prefixed(node: s.Stmt, body: list[s.Stmt], out: list[Piece]) -> None:
    """A head (`if … then`, `∀t, t′,`, `for h ∈ [H] :`) whose text is the node's without its
    body's, then the body's statements, which break as statements of their own."""
    whole, tail = TEXT.text(node), " ".join(TEXT.text(b) for b in body)
    if not whole.endswith(tail):  # a head this walk does not know: the whole as one piece
        out.append(whole)
        return
    out.append(whole[:len(whole) - len(tail)])
    for i, stmt in enumerate(body):
        out += [" "] if i else []
        _statement(stmt, out)


def _expr(node: s.Expr, min_prec: int, tail: bool, depth: int, out: list[Piece]) -> None:
    """`node` as an operand held to `min_prec`, parenthesized as Renderer.sub does."""
    if TEXT.precedence(node) < min_prec or (not tail and isinstance(node, s.Sum)):
        out.append("(")
        _inner(node, True, depth + 1, out)
        out.append(")")
    else:
        _inner(node, tail, depth, out)


def _inner(node: s.Expr, tail: bool, depth: int, out: list[Piece]) -> None:
    """`node` itself: a sum or product and a call open into their parts, anything else (an
    index, a fraction, a power) stays one piece, as a reader takes it in."""
    if isinstance(node, s.BinOp) and node.op in _RANKS:
        prec = TEXT.precedence(node)
        _expr(node.left, TEXT.left_min(node), prec == SUM, depth, out)
        out += [" " if node.op == " " else f" {node.op} ", Break((id(node), 1), depth,
                                                                  _RANKS[node.op])]
        _expr(node.right, TEXT.right_min(node.op), tail, depth, out)
    elif isinstance(node, s.Call) and notation(node) not in {*BRACKETS, *SUBSCRIPTED} and (
            node.params or not node.bar or not node.args):  # not `f(x |)`, which is rare
        out.append(f"{node.func}(")
        seps = [", "] * (len(node.args) - 1) + [" | " if node.args else "| "] * bool(
            node.params or node.bar) + [", "] * (len(node.params) - 1)
        _listed([*node.args, *node.params], seps, node, depth + 1, out)
        out.append(")")
    elif isinstance(node, s.Several):  # a tuple: its commas as loose as its brackets' would be
        _listed(node.items, [", "] * (len(node.items) - 1), node, depth, out, held=SUM)
    elif isinstance(node, s.Choice):  # after "probability": the options, then their odds
        options = " or ".join(TEXT.sub(x, SUM) for x in node.options)
        out += [f"{options} randomly with probability ", Break((id(node), 1), depth, ASSIGNED),
                " or ".join(TEXT.sub(x, SUM) for x in node.probs)]
    elif isinstance(node, s.Concat):
        out.append("[")
        _listed(node.items, [f"{node.sep} "] * (len(node.items) - 1), node, depth + 1, out,
                held=SUM)
        out.append("]")
    else:
        out.append(TEXT.text(node, tail))


def _listed(items: Iterable[s.Expr], seps: list[str], node: s.Expr, depth: int,
            out: list[Piece], held: int = 0) -> None:
    """Items after their separators; a break after each separator between two items (`| x`
    with no arguments before it has none)."""
    items = list(items)
    if len(seps) == len(items):  # `| params` with no arguments: the bar comes first
        out.append(seps.pop(0))
    for k, item in enumerate(items):  # an item's own points lie deeper than the commas
        if k:
            out += [seps[k - 1], Break((id(node), k), depth, LISTED)]
        if held:
            _expr(item, held, True, depth + 1, out)
        else:
            _inner(item, True, depth + 1, out)


def choose(stmt_pieces: list[Piece], budget: int, indent: int) -> frozenset[tuple[int, int]]:
    """The breaks that bring `stmt_pieces` within `budget` characters a line, a continuation
    line holding `indent` fewer: none where it fits; else the loosest kinds of point that
    suffice, each line filled as far as it goes. Where no choice fits, the one with every
    point allowed (a piece too wide for any line stays whole)."""
    chosen: list[tuple[int, int]] = []
    for allowed in _kinds(stmt_pieces, budget):
        chosen, fits = _fill(stmt_pieces, allowed, budget, indent)
        if fits:
            break
    return frozenset(chosen)


def points(stmt_pieces: list[Piece], budget: int, indent: int) -> frozenset[tuple[int, int]]:
    """Every point of the kinds `choose` would allow: where a reader's page (not ours)
    decides which of them to break at, its width unknown here. None where it fits."""
    kinds: set[tuple[int, int]] = set()
    for kinds in _kinds(stmt_pieces, budget):
        if _fill(stmt_pieces, kinds, budget, indent)[1]:
            break
    return frozenset(p.key for p in stmt_pieces if isinstance(p, Break) and p.kind in kinds)


def _kinds(stmt_pieces: list[Piece], budget: int) -> list[set[tuple[int, int]]]:
    """The sets of kinds of point to try, the loosest kind alone first, then each next kind
    with those before it; none where the statement fits in one line."""
    if sum(width(p) for p in stmt_pieces if isinstance(p, str)) <= budget:
        return []
    kinds = sorted({p.kind for p in stmt_pieces if isinstance(p, Break)})
    return [set(kinds[:n]) for n in range(1, len(kinds) + 1)]


def _fill(stmt_pieces: list[Piece], allowed: set[tuple[int, int]], budget: int,
          indent: int) -> tuple[list[tuple[int, int]], bool]:
    """Lines filled greedily, breaking at the last allowed point before a line would pass
    `budget`; the breaks, and whether every line fits."""
    chosen: list[tuple[int, int]] = []
    line, widest = 0, 0
    last: tuple[Break, int] | None = None  # the line's last allowed point, and its width there
    for piece in stmt_pieces:
        if isinstance(piece, Break):
            if piece.kind in allowed:
                last = (piece, line)
            continue
        if line + width(piece) > budget and last is not None:
            widest = max(widest, last[1])
            chosen.append(last[0].key)
            line, last = indent + line - last[1], None
        line += width(piece)
    return chosen, max(widest, line) <= budget
