"""The card AST: plain dataclasses, one per construct of the notation.

Every node carries a source span, excluded from equality, so that
``parse(render(parse(src))) == parse(src)`` is an ordinary ``==``.
Identifiers are stored in canonical (Unicode) spelling.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

WHOLE_POWER = re.compile(r"(.+)\^\{(\d+)\}")  # p^{2}: a power of p in a step, not a name


def whole_power(name: str) -> tuple[str, str] | None:
    """(base, exponent) of a name that ends in a whole number in braces, `p^{2}`: a step
    reads it as that power of the name before it (as `p²`)."""
    found = WHOLE_POWER.fullmatch(name)
    return (found.group(1), found.group(2)) if found else None


@dataclass(frozen=True)
class Span:
    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:  # a whole-file problem (line 0) names the file alone
        return f"{self.file}:{self.line}:{self.col}" if self.line > 0 else self.file


NOWHERE = Span("<none>", 0, 0, 0, 0)


def _span() -> Span:
    return field(default=NOWHERE, compare=False, repr=False, kw_only=True)


# ---------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Name:
    id: str
    span: Span = _span()


@dataclass(frozen=True)
class Num:
    text: str  # as written canonically: "1", "0.02", "1e-5", "∞"
    span: Span = _span()

    @property
    def value(self) -> float:
        return float("inf") if self.text == "∞" else float(self.text)


@dataclass(frozen=True)
class BinOp:
    op: str  # "+", "−", "·", "⊙", "/", " " (juxtaposition), comparisons
    left: Expr
    right: Expr
    span: Span = _span()
    # where a `·` was spelled `*` (the checker warns where a reader may have meant ⊙)
    star: Span | None = field(default=None, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
class Unary:
    op: str  # "−", "¬", "√", "∇"
    operand: Expr
    span: Span = _span()


@dataclass(frozen=True)
class Power:
    base: Expr
    exponent: Expr  # Num("2") for ², otherwise the braced exponent
    span: Span = _span()


@dataclass(frozen=True)
class Transpose:
    operand: Expr
    span: Span = _span()


@dataclass(frozen=True)
class Slice:
    lo: Expr | None  # None: from the start
    hi: Expr | None  # None: to the end (inclusive bounds, 1-based)
    span: Span = _span()


@dataclass(frozen=True)
class Progression:
    """``1, 3, …, d − 1`` as an index: the entries first, second, … up to last, a step of
    second − first apart (the odd columns of X are ``X[:, 1, 3, …, d − 1]``)."""

    first: Expr
    second: Expr
    last: Expr
    span: Span = _span()


@dataclass(frozen=True)
class Index:
    base: Expr
    items: tuple[Expr, ...]  # each an Expr, a Slice or a Progression
    span: Span = _span()


@dataclass(frozen=True)
class Arg:
    """A call parameter bound by name: ``Mask[t, t′] = [[t ≤ t′]]``, ``ε = ε``."""

    target: Expr
    value: Expr
    op: str = "="  # "=" or "≡"
    span: Span = _span()


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Expr, ...]
    params: tuple[Expr, ...] = ()  # Exprs or Args after "|"
    bar: bool = False  # whether "|" was written
    span: Span = _span()


@dataclass(frozen=True)
class Ellipsis_:
    span: Span = _span()


@dataclass(frozen=True)
class Concat:
    items: tuple[Expr, ...]  # may contain Ellipsis_
    sep: str = ","  # "," column concatenation, ";" row stacking
    span: Span = _span()


@dataclass(frozen=True)
class Several:
    """``P, r``: the several outputs of a card, as `return P, r` gives them and as
    `P, r ← M(x | θ)` names them (a target of names only)."""

    items: tuple[Expr, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Iverson:
    cond: Expr
    span: Span = _span()


@dataclass(frozen=True)
class Sum:
    index: str
    lo: Expr | None  # Σ_{i=lo}^{hi}
    hi: Expr | None
    over: Expr | None  # Σ_{i∈over}; all three None: Σ_u, over the family the body indexes
    body: Expr
    span: Span = _span()


@dataclass(frozen=True)
class Choice:
    """``a or b randomly with probability p or q``: one of the options, drawn at random."""

    options: tuple[Expr, ...]
    probs: tuple[Expr, ...]  # one probability per option
    span: Span = _span()


@dataclass(frozen=True)
class SetBuilder:
    """``{t ∈ [ℓ] : cond}``: the elements of a set for which a condition holds."""

    var: str
    domain: Expr
    cond: Expr  # `=` here is a comparison: BinOp("=", …)
    span: Span = _span()


@dataclass(frozen=True)
class Norm:
    """``‖x‖``: the Euclidean (L2) norm of every entry of a tensor (a vector's length, a
    matrix's Frobenius norm), or of a parameter bundle as one vector: ``‖g‖`` of a gradient
    ``g ← ∇loss(θ)`` is its global norm over all of θ's parameters."""

    operand: Expr
    span: Span = _span()


Expr = (Name | Num | BinOp | Unary | Power | Transpose | Slice | Progression | Index | Arg | Call
        | Ellipsis_ | Concat | Several | Iverson | Sum | Choice | SetBuilder | Norm)

# ---------------------------------------------------------------------- types


@dataclass(frozen=True)
class Scalar:
    set: str  # "ℕ" or "ℝ"
    span: Span = _span()


@dataclass(frozen=True)
class Interval:
    lo: Expr
    hi: Expr
    lo_closed: bool = False
    hi_closed: bool = False
    span: Span = _span()


@dataclass(frozen=True)
class Bits:
    """The set {0,1} (masks)."""

    span: Span = _span()


@dataclass(frozen=True)
class IntRange:
    """{lo..hi}: token IDs."""

    lo: Expr
    hi: Expr
    span: Span = _span()


# the number formats a hyperparameter may choose among, by torch's names for them
FORMATS = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class Formats:
    """{float32, bfloat16}: number formats, one of which a hyperparameter names."""

    names: tuple[str, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Finite:
    """[N] = {1, …, N}."""

    size: Expr
    span: Span = _span()


@dataclass(frozen=True)
class Sequences:
    """V*: sequences over a vocabulary."""

    of: str
    span: Span = _span()


@dataclass(frozen=True)
class Iso:
    """``V ≅ [N_V]``: a set named for the set it is identified with (the vocabulary)."""

    name: str
    of: Type
    span: Span = _span()


@dataclass(frozen=True)
class Simplex:
    """``Δ(V)``: the probability distributions over a finite set."""

    over: str
    span: Span = _span()


@dataclass(frozen=True)
class Tensor:
    """elem^{d1×d2×…}."""

    elem: Type
    dims: tuple[Expr, ...]
    span: Span = _span()


@dataclass(frozen=True)
class CardType:
    """``{1..V}^{T} → ℝ^{T×V} for T ≤ T_max``: a card taken as a value (a recipe's model), by
    the signature it must have; `window` bounds the length of the input it is handed."""

    input: Type
    output: Type
    length: str | None = None
    window: str | None = None
    span: Span = _span()


Type = (Scalar | Interval | Bits | IntRange | Formats | Finite | Sequences | Iso | Simplex
        | Tensor | CardType)

# ---------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Decl:
    """``names ∈ type [= value] [~ init], prose`` or ``name = value`` or ``name, prose``.

    A name declared by prose alone is a parameter bundle whose contents are inferred from
    the card it is passed to.
    """

    names: tuple[str, ...]
    type: Type | None = None
    value: Expr | None = None  # a default, a definition or an initial value
    init: Expr | None = None  # a distribution after "~"
    prose: str | None = None
    end: str = ""  # "," or ".": the line ends after it so (a list printed over several lines)
    pad: str | None = None  # `, padding row v_pad`: the hyperparameter naming a padding row
    seed: bool = False  # `, seed of every random draw`: the run's random draws start from it
    format_of: str | None = None  # `, number format of θ`: the input whose numbers it formats
    span: Span = _span()


@dataclass(frozen=True)
class Bundle:
    """``W consisting of:`` followed by an indented list."""

    name: str
    items: tuple[Item, ...]
    prose: str | None = None
    intro: str = "consisting of"  # or "includes all of the following parameters"
    span: Span = _span()


@dataclass(frozen=True)
class Family:
    """``For l ∈ [L]:`` followed by an indented list; ``For h ∈ [H], W^h consisting of:``."""

    index: str
    over: Expr
    items: tuple[Item, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Dataset:
    """``{x_n}_{n=1}^{N_data}`` or ``{(z_n, x_n)}_{n=1}^{N_data}``: a family of examples.

    The header names the whole family with the index range as a subscript: ``x_{1:N_data}``.
    """

    elems: tuple[str, ...]  # x_n, or z_n and x_n for pairs
    index: str
    lo: Expr
    hi: Expr
    prose: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class Sentence:
    """A block written as prose: ``Input: Trained transformer parameters θ̂.``

    It declares the header's symbols that it mentions; their types are inferred from use.
    """

    text: str
    span: Span = _span()


Item = Decl | Bundle | Family | Dataset | Sentence


@dataclass(frozen=True)
class Block:
    kind: str  # "Input", "Output", "Hyperparameters", "Parameters"
    items: tuple[Item, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Preset:
    name: str
    values: tuple[tuple[str, Expr], ...]
    prose: str | None = None
    span: Span = _span()


# ------------------------------------------------------------------ statements


@dataclass(frozen=True)
class Assign:
    target: Expr
    value: Expr
    op: str = "←"  # "←" assignment or "=" binding
    span: Span = _span()


@dataclass(frozen=True)
class Return:
    value: Expr
    name: str | None = None  # return Ṽ = …
    span: Span = _span()


@dataclass(frozen=True)
class Range:
    """``1, 2, …, L``: the explicitly written leading terms and the last one."""

    first: tuple[Expr, ...]
    last: Expr
    span: Span = _span()


@dataclass(frozen=True)
class For:
    var: str
    over: Expr | Range  # a set ([ℓ]) or a range
    body: tuple[Step, ...]
    style: str = "do"  # "do" (… end), "map" (one line "for t ∈ [ℓ] : s"), "block" (indented)
    binder: str = "∈"  # "∈", "=" or "←"
    end_number: str | None = None  # the step number of a numbered `end` line
    span: Span = _span()
    var_span: Span = _span()  # where the loop variable is written, for diagnostics


@dataclass(frozen=True)
class ForAll:
    vars: tuple[str, ...]
    body: Stmt
    # each variable's range where the card states one (∀t ∈ [T], t′ ∈ [T]), None where it
    # does not; () where none is stated (∀t, t′)
    over: tuple[Expr | None, ...] = ()
    span: Span = _span()


@dataclass(frozen=True)
class If:
    cond: Expr
    then: Stmt
    span: Span = _span()


@dataclass(frozen=True)
class While:
    cond: Expr
    body: tuple[Step, ...]
    end_number: str | None = None
    span: Span = _span()


# the builtins that filter a distribution, `top_k(w | k)` and `top_p(w | p)`: in a sample step
# `q ∝ top_k(p^{1/τ} | k)` their weights read as the step's own (p to the power 1/τ)
FILTERS = ("top_k", "top_p")


@dataclass(frozen=True)
class Sample:
    """``sample a token y from q ∝ p^{1/τ}``: draw `var` from the distribution `dist`, whose
    probabilities are proportional to `weights`."""

    var: str
    dist: str
    weights: Expr
    span: Span = _span()


Stmt = Assign | Return | For | ForAll | If | While | Sample


@dataclass(frozen=True)
class Step:
    """One numbered line of an algorithm (a loop's body holds further steps)."""

    stmt: Stmt
    number: str | None = None
    annotation: Decl | None = None  # ▷ X ∈ ℝ^{…} or [[X ∈ ℝ^{…}]]: checked
    note: str | None = None  # ▷ free text
    where: str | None = None  # ", where …" prose
    comments: tuple[str, ...] = ()  # /* … */ lines just before the step
    span: Span = _span()


# ------------------------------------------------------------------ algorithms


@dataclass(frozen=True)
class Algorithm:
    name: str | None  # None for a titled algorithm without a signature
    number: str | None = None
    outputs: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    title: str | None = None
    note: str | None = None
    comments: tuple[str, ...] = ()
    blocks: tuple[Block, ...] = ()
    presets: tuple[Preset, ...] = ()
    steps: tuple[Step, ...] = ()
    span: Span = _span()

    @property
    def label(self) -> str | None:
        """The name; a titled card (`Algorithm 1: Token embedding.`) is named for its title."""
        if self.name or not self.title:
            return self.name
        return "".join(w[:1].upper() + w[1:] for w in re.split(r"[^0-9A-Za-z]+", self.title) if w)

    def decls(self, kind: str) -> tuple[Item, ...]:
        return tuple(item for b in self.blocks if b.kind == kind for item in b.items)


@dataclass(frozen=True)
class CardFile:
    path: str
    algorithms: tuple[Algorithm, ...]
    span: Span = field(default=NOWHERE, compare=False, repr=False)

    def __eq__(self, other: object) -> bool:  # the path is where it came from, not what it says
        return isinstance(other, CardFile) and self.algorithms == other.algorithms

    def __hash__(self) -> int:
        return hash(self.algorithms)


def nodes(tree: object) -> Iterator[object]:
    """Every node of `tree` (a node, or a tuple of them) and below it, spans left out; parents
    before children, fields in declaration order."""
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, tuple):
            stack += reversed(x)
        elif hasattr(x, "__dataclass_fields__") and not isinstance(x, Span):
            yield x
            stack += [getattr(x, name) for name in reversed(child_fields(type(x)))]


_CHILDREN: dict[type, tuple[str, ...]] = {}


# the fields that say where a node (or a part of it) is written, not what it is
LOCATIONS = frozenset({"span", "var_span", "star"})


def child_fields(cls: type) -> tuple[str, ...]:
    """A node class's fields but its locations, in declaration order."""
    names = _CHILDREN.get(cls)
    if names is None:
        names = _CHILDREN[cls] = tuple(n for n in cls.__dataclass_fields__
                                       if n not in LOCATIONS)
    return names


MAX_DEPTH = 64  # node levels: every recursive pass (check, render, lower, ==) stays far from
# Python's recursion limit below it; real cards nest a quarter as deep (16 levels)


def too_deep(tree: object, limit: int = MAX_DEPTH) -> object | None:
    """The first node found `limit` node levels below `tree` (tuples do not count as levels),
    or None: walked with a stack, as the tree may be deeper than Python's recursion limit."""
    stack: list[tuple[object, int]] = [(tree, 0)]
    while stack:
        x, depth = stack.pop()
        if isinstance(x, tuple):
            stack += [(y, depth) for y in x]
        elif hasattr(x, "__dataclass_fields__") and not isinstance(x, Span):
            if depth >= limit:
                return x
            stack += [(getattr(x, n), depth + 1) for n in child_fields(type(x))]
    return None


def depth(tree: object) -> int:
    """The number of node levels of `tree`."""
    deepest, stack = 0, [(tree, 0)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, tuple):
            stack += [(y, d) for y in x]
        elif hasattr(x, "__dataclass_fields__") and not isinstance(x, Span):
            deepest = max(deepest, d + 1)
            stack += [(getattr(x, n), d + 1) for n in child_fields(type(x))]
    return deepest


def dispatch(visitor: object, prefix: str, node: object, *args: Any,
             missing: Callable[[Any], Any] | None = None) -> Any:
    """Call `visitor.<prefix>_<kind>(node, *args)`, the kind being the node's class name less a
    trailing underscore (`Ellipsis_` only avoids Python's builtin): `stmt_Assign`, `expr_BinOp`,
    `text_Name`. A kind the visitor has no method for goes to `missing(node)` where given (the
    lowering refuses the card construct there, at its place); else it is a fault of the compiler,
    not of the card, and the error names the kind and the visitor."""
    kind = type(node).__name__.rstrip("_")
    method = getattr(visitor, f"{prefix}_{kind}", None)
    if method is not None:
        return method(node, *args)
    if missing is not None:
        return missing(node)
    raise NotImplementedError(f"{type(visitor).__name__} handles no {kind} node "
                              f"(no method {prefix}_{kind})")
