"""The IR: a batched tensor program, one level above Python text.

Lowering (`lower.py`) turns checked cards into these nodes; passes (`intrinsics.py`) replace
patterns of them with fused PyTorch ops; `codegen.py` prints them. Expressions are trees of
tensor operations; statements carry the physical shape of what they compute and the card line
they come from, which become the comments of the generated code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

# ------------------------------------------------------------------ expressions


@dataclass(frozen=True)
class Ref:
    """A name: a local (`X`), an attribute path (`self.W_e`), a module (`F.gelu`)."""

    id: str


@dataclass(frozen=True)
class Lit:
    """A Python literal, already spelled: `2`, `1e-05`, `float("-inf")`, `"tanh"`, `True`."""

    text: str


@dataclass(frozen=True)
class Call:
    func: Expr
    args: tuple[Expr, ...] = ()
    kwargs: tuple[tuple[str, Expr], ...] = ()


@dataclass(frozen=True)
class Attr:
    """`obj.name`: methods are calls of attributes (`K.transpose(-2, -1)`)."""

    obj: Expr
    name: str


@dataclass(frozen=True)
class Bin:
    op: str  # Python operator: + - * / @ ** <= < >= > == != & |
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Un:
    op: str  # "-" or "~"
    operand: Expr


@dataclass(frozen=True)
class SliceX:
    lo: Expr | None
    hi: Expr | None
    step: Expr | None = None


@dataclass(frozen=True)
class Sub:
    """`obj[items]`; items may be slices, `...` (Ref("...")) or `None` (Ref("None"))."""

    obj: Expr
    items: tuple[Expr | SliceX, ...]


@dataclass(frozen=True)
class Seq:
    """A tuple or list display: `(D,)`, `[a, b]`."""

    items: tuple[Expr, ...]
    kind: str = "tuple"


@dataclass(frozen=True)
class Cond:
    """`body if test else orelse`."""

    test: Expr
    body: Expr
    orelse: Expr


@dataclass(frozen=True)
class Lambda:
    """`lambda: body`: a value computed only when the callee needs it (a memo's miss). Where
    its statement would not fit a line, it is printed as a local function of this name."""

    body: Expr
    name: str = "make"
    params: tuple[str, ...] = ()  # `lambda h: body`: a function of these


Expr = Ref | Lit | Call | Attr | Bin | Un | Sub | Seq | Cond | Lambda

# ------------------------------------------------------------------ statements


@dataclass(frozen=True)
class Note:
    """Where a statement comes from and what it computes: `# (B, T, D)  gpt2.card:14`."""

    shape: str | None = None
    line: str | None = None
    text: str | None = None


@dataclass(frozen=True)
class Assign:
    targets: tuple[str, ...]  # empty: an expression statement
    value: Expr
    note: Note = Note()


@dataclass(frozen=True)
class Loop:
    target: str
    iter: Expr
    body: tuple[Stmt, ...]
    note: Note = Note()


@dataclass(frozen=True)
class If:
    cond: Expr
    body: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...] = ()
    note: Note = Note()


@dataclass(frozen=True)
class Comment:
    """A line of the card's own commentary (`/* Encode the context sequence: */`)."""

    text: str


@dataclass(frozen=True)
class While:
    cond: Expr
    body: tuple[Stmt, ...]
    note: Note = Note()


@dataclass(frozen=True)
class Break:
    """Leave the innermost loop: a sampling card's caller asked it to stop."""


@dataclass(frozen=True)
class Raise:
    error: str
    message: Expr


@dataclass(frozen=True)
class Return:
    value: Expr
    note: Note = Note()


Stmt = Assign | Loop | If | While | Comment | Raise | Return

# ------------------------------------------------------------------ definitions


@dataclass
class Param:
    name: str
    shape: tuple[Expr, ...]
    init: Expr  # a tensor-creating expression over the constructor's arguments
    note: Note = Note()


@dataclass
class Submodule:
    name: str
    cls: str
    kwargs: tuple[tuple[str, Expr], ...]
    count: Expr | None = None  # a stack of layers: nn.ModuleList of `count` copies
    note: Note = Note()
    index: str | None = None  # the stack's 0-based layer, where a layer's sizes depend on it


@dataclass
class Arg:
    name: str
    default: Expr | None = None
    type: str | None = None  # "int", "float", "torch.Tensor"


@dataclass
class Function:
    """A card lowered to a plain function: its parameters arrive as arguments."""

    name: str
    doc: str
    origin: str
    args: list[Arg]
    body: list[Stmt]
    # a training card's updates per example it visits, where not 1 (None: not a fixed number)
    updates_per_example: int | None = 1


@dataclass
class Module:
    """A card that owns parameters, lowered to an `nn.Module`."""

    name: str
    doc: str
    origin: str
    hypers: list[Arg]  # constructor arguments, kept as attributes
    derived: list[tuple[str, Expr]]  # attributes computed from them (d = D // H)
    params: list[Param]
    submodules: list[Submodule]
    inputs: list[Arg]
    body: list[Stmt]
    language_model: bool = False  # forward(idx, targets) also returns the cross-entropy loss
    max_seq_len: Expr | None = None
    probabilities: bool = False  # forward returns a softmax (the paper's P), not logits
    cached: bool = False  # a causal decoder: forward(x, cache=…) reads only the new tokens
    generates: bool = False  # and decoder-only: generate(idx, …) continues idx through the cache
    source: str | None = None  # or an encoder–decoder's source input: generate(source, idx, …)


@dataclass(frozen=True)
class Analysis:
    """What the rest of cardc asks of a lowered model, found once while lowering it
    (cardc.lower.analysis)."""

    decodes: bool = False  # forward(x, cache=…) reads a KV cache: it decodes token by token
    causal: bool = False  # forward(x, targets), and no position's scores read a later token
    # forward(x, nll=(rows, targets)): the log-likelihood of targets at those rows, per
    # example, made a few rows' logits at a time (cardc.lower.likelihood)
    likelihood: bool = False


@dataclass
class Program:
    """One generated file: the modules and functions a model card needs, callees first."""

    sources: list[str]
    doc: str = ""
    functions: list[Function] = field(default_factory=list)
    modules: list[Module] = field(default_factory=list)
    presets: dict[str, dict[str, Expr]] = field(default_factory=dict)
    imports: set[str] = field(default_factory=set)  # "math"
    analysis: Analysis = field(default_factory=Analysis)  # a model's, once it is lowered


# ------------------------------------------------------------------ rewriting


def rewrite(node, fn: Callable[[object], object | None]):
    """`node` with every sub-node `fn` replaces (it returns None to descend instead); nodes
    nothing changed in are shared as they are."""
    new = fn(node)
    if new is not None:
        return new
    if type(node) is tuple:
        items = tuple(rewrite(n, fn) for n in node)
        return node if all(a is b for a, b in zip(items, node, strict=True)) else items
    names = _FIELDS.get(type(node))
    if names is None:
        if not hasattr(node, "__dataclass_fields__") or type(node) is Note:
            return node  # a leaf: a string, a number, a note
        names = _FIELDS[type(node)] = tuple(node.__dataclass_fields__)
    changes = {}
    for name in names:
        old = getattr(node, name)
        new = rewrite(old, fn)
        if new is not old:
            changes[name] = new
    return dataclasses.replace(node, **changes) if changes else node


_FIELDS: dict[type, tuple[str, ...]] = {}  # a node class's fields, looked up once


def assigned(node) -> set[str]:
    """Every name a statement (or a tuple of them) assigns, loop variables included, in any
    statement it holds."""
    found: set[str] = set()
    rewrite(node, lambda n: found.update(n.targets) if isinstance(n, Assign) else
            (found.add(n.target) if isinstance(n, Loop) else None))
    return found


def ref_ids(stmts) -> set[str]:
    """Every name the statements refer to (`Ref`s), anywhere in them."""
    found: set[str] = set()
    for st in stmts:
        rewrite(st, lambda e: found.add(e.id) if isinstance(e, Ref) else None)
    return found
