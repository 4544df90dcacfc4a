"""Values and names of the lowering: how card values sit in PyTorch tensors.

Layout of values. A card's row-major shapes become the *trailing* axes of a tensor; anything
that depends on a model input carries leading batch axes in front (`B`, and the rows a vector
card was mapped over). Ops on a card's own axes therefore act on the trailing axes, and the
batch comes for free. Parameters carry no batch axes and broadcast from the right.

Column-major cards (the paper's X ∈ ℝ^{d×ℓ}, W X) are lowered to the same row-major tensors: a
matrix that is not a parameter is stored *flipped*, its card axes reversed, so the paper's
activations sit as (B, ℓ, d) like everyone else's. A transpose then only toggles the flag, `W X`
becomes `F.linear(X, W)`, and a per-position map over columns acts on the rows at once.
Parameters keep the card's own layout, which for `W ∈ ℝ^{d_out×d_in}` is `nn.Linear`'s.

Roles of cards. The model card and every card handed a whole parameter bundle become
`nn.Module`s (a bundle passed in a loop over layers becomes an `nn.ModuleList`); a card handed
individual tensors becomes a function. A family of parameter tensors indexed by a head (or any
map) is stored stacked: members of equal shape share one tensor, the family axis and the member
axis flattened into the last one, which is the layout `X @ W` needs to compute every head's
projection in one product.

"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .. import ir
from .. import syntax as s
from ..checker import Signature, split_name
from ..dims import Dim
from ..names import attribute, identifier, number
from ..spelling import display
from ..types import Ty


class LowerError(Exception):
    """A card the code generator cannot translate; carries the span to blame."""

    def __init__(self, span: s.Span, message: str, hint: str | None = None):
        super().__init__(message)
        self.span, self.message, self.hint = span, message, hint


def local_name(name: str) -> str:
    """A card name as a Python local, argument or keyword (see cardc.names)."""
    return identifier(name)


def attr_name(name: str, family_var: str | None = None) -> str:
    """`θ^block_ℓ` → `block`, `θ^attn` → `attn`, `W^h_qkv` → `W_qkv`, `γ^1` → `gamma1`."""
    base, decor = split_name(name)
    return attribute(base, decor, family_var)


# ------------------------------------------------------------------ values


@dataclass
class Val:
    """A lowered expression: its code, its card type, whether it carries batch axes."""

    code: ir.Expr
    ty: Ty
    lifted: bool = False
    flipped: bool = False  # a matrix stored with its two card axes swapped
    rows: tuple[Dim, ...] = ()  # axes of a map over positions, between batch and card axes
    tensor: bool = False  # one number held in a 0-d tensor (‖g‖), not a Python number: it
    # stays on its device, as `torch.clamp`, never `min` (which would wait for its value)
    exact: bool = False  # reals of integers alone (a position divided), held in real_type's
    # format (float32 beside bfloat16): they meet the model's values in the model's format

    def axis(self, k: int) -> int:
        """The physical axis (counted from the right) of card axis `k`."""
        rank = len(self.ty.shape)
        return -1 - k if self.flipped else k - rank


@dataclass
class Stacked:
    """A member of a stacked family: one slice of a shared storage tensor."""

    storage: str
    index: int  # the member's place in its group
    count: int  # members in the group
    over: Dim  # the family's size
    shape: tuple[Dim, ...]  # the member's own shape
    var: str
    axis: str = "last"  # stacked along: "last" (heads, row-major), "first" (heads, column-
    # major: the output axis, nn.Linear's), "lead" (layers: a new leading axis)


@dataclass
class Family:
    """A family of values produced by a map (Y^h for h ∈ [H]): a Python list, or stacked."""

    var: str
    local: str
    ty: Ty
    stacked: Val | None = None
    positions: bool = False  # a map over positions: `stacked` holds every member as rows
    flipped: bool = False  # members are matrices stored flipped
    merged: bool = False  # `stacked` holds the heads of every group on one axis (cardc.lower.heads)
    count: Dim | None = None  # a map's: how many members (a sum over them must read them all)


@dataclass
class Gradient:
    """A gradient a training card names, `g ← ∇loss(θ)`: the `.grad` of θ's parameters, where
    `backward()` puts it and adds to it (`g ← g + ∇loss(θ)`), scaled there in place; reading
    it lists those tensors. `told` is the loss it is the gradient of, for `report`."""

    model: ir.Ref  # θ's module
    theta: str  # θ's card name
    told: ir.Expr
    listed: int | None = None  # the step whose code last listed the tensors (id)
    replaced: s.Step | None = None  # a later gradient of θ took θ's .grad over (where)


@dataclass
class ModuleSlot:
    attr: str
    card: s.Algorithm
    var: str | None = None  # a stack of layers indexed by `var`
    count: Dim | None = None  # its layers: the family's range, [N]


@dataclass
class Scope:
    """Names visible while lowering one card's steps."""

    values: dict[str, Val | Family | Gradient] = field(default_factory=dict)
    tensors: dict[str, ir.Expr] = field(default_factory=dict)  # parameters: name → storage
    stacked: dict[str, Stacked] = field(default_factory=dict)
    modules: dict[str, ModuleSlot] = field(default_factory=dict)
    loop_modules: dict[str, ir.Expr] = field(default_factory=dict)  # θ^block_ℓ → a loop local


def ctor_type(ty: Ty) -> str:
    return "int" if ty.elem == "ℕ" else "float"


def dim_expr(d: Dim, name_of) -> ir.Expr:
    """A dimension as integer arithmetic; `name_of` maps a symbol to its Python expression."""
    out: ir.Expr | None = None
    for mono, coef in d.terms:
        num: ir.Expr | None = None if abs(coef.numerator) == 1 else ir.Lit(str(abs(coef.numerator)))
        den: ir.Expr | None = None if coef.denominator == 1 else ir.Lit(str(coef.denominator))
        for sym, e in mono:
            for _ in range(abs(e)):
                ref = name_of(sym.lstrip("?"))
                if e > 0:
                    num = ref if num is None else ir.Bin("*", num, ref)
                else:
                    den = ref if den is None else ir.Bin("*", den, ref)
        term = num or ir.Lit("1")
        if den is not None:
            term = ir.Bin("//", term, den)
        if out is None:
            out = ir.Un("-", term) if coef < 0 else term
        else:
            out = ir.Bin("-" if coef < 0 else "+", out, term)
    return out or ir.Lit("0")


def shape_text(val: Val, lead: str, names: dict[Dim, str]) -> str:
    """`(B, T, D)`: the physical shape, batch axes first; `names` spells derived sizes."""
    if not isinstance(val.ty, Ty):  # a model handed to a procedure
        return ""
    dims = [display(names.get(d, str(d))).replace("?", "") if d is not None else "1"
            for d in val.ty.shape]
    if val.flipped:
        dims.reverse()
    dims = [display(names.get(d, str(d))).replace("?", "") for d in val.rows] + dims
    if val.lifted:
        dims = [lead, *dims]
    if not dims:
        return ""
    return f"({', '.join(dims)})" if len(dims) > 1 else f"({dims[0]},)"


def num_lit(text: str, span: s.Span = s.NOWHERE) -> ir.Expr:
    """A card number as a Python literal; ∞ is math.inf, and a number too large for a float
    (1e999) is refused rather than written as `inf`."""
    if text == "∞":
        return ir.Ref("math.inf")
    value = float(text)
    try:
        return ir.Lit(number(value, integral=value.is_integer() and "e" not in text))
    except ValueError as err:
        raise LowerError(span, f"the number {text} cannot be represented: {err}",
                         "write a number within the range of a 64-bit float") from None


def card_names(sig: Signature) -> list[str]:
    """Declared hyperparameters, in declaration order; a card taken as a value (a recipe's
    model) is not one the generated function takes: it is the θ it is handed. Nor are the
    seed and the number formats: the run takes them."""
    names = []
    for item in sig.alg.decls("Hyperparameters"):
        if isinstance(item, s.Decl) and not isinstance(item.type, s.CardType) \
                and not any(n in sig.run for n in item.names):
            names += [n for n in item.names if n not in names]
    return names


def is_token(val: Val) -> bool:
    return isinstance(val.ty, Ty) and val.ty.vocab is not None


def counted(val: Val) -> Val:
    """Token IDs as the numbers the card declares, 1 … V: tensors hold them 0-based (as an
    index picks rows), so a token compared or computed with is one more."""
    if not is_token(val):
        return val
    return replace(val, code=ir.Bin("+", val.code, ir.Lit("1")), ty=replace(val.ty, vocab=None))
