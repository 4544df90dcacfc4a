"""The functions, constants and special tokens a card may name without declaring them: one
table, read by the checker (what a name means and how a call to it types), the lowering (the
torch function an element-wise builtin becomes) and the renderers (which names LaTeX and
MathML set upright, as functions). It imports nothing heavier than the syntax.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import syntax as s


@dataclass(frozen=True)
class Builtin:
    """A function a card may call, or apply by juxtaposition (`log p`), undeclared.

    `rule` is how the checker types it: "elementwise" (the argument's shape), "reducing" (the
    last axis summed away; with two arguments, the min or max entry by entry), "length" (a whole
    number), "filter" (a distribution of the weights' shape), "dropout" (its tensor's shape),
    "optimizer" (parameters and their gradient in, parameters out)."""

    name: str
    rule: str
    args: tuple[int, ...] = (1,)  # how many arguments it takes
    params: int = 0  # how many numbers after '|' (at most, for an optimizer)
    torch: str | None = None  # the torch function it lowers to, where that is all it is
    math: str | None = None  # the Python function it is on a number (a hyperparameter's)
    upright: bool = True  # set upright, as a function, by LaTeX and MathML
    # the kind of number an element-wise builtin gives: "ℝ", "ℕ" (a whole number, as ⌊x⌋),
    # or "same" (its argument's, as |x|)
    result: str = "ℝ"


TABLE = (
    Builtin("GELU", "elementwise"),  # exact (erf) form; GELU_tanh its tanh approximation
    Builtin("GELU_tanh", "elementwise"),
    Builtin("ReLU", "elementwise", torch="torch.relu"),
    Builtin("SiLU", "elementwise", torch="F.silu"),
    Builtin("σ", "elementwise", torch="torch.sigmoid"),
    Builtin("exp", "elementwise", torch="torch.exp", math="math.exp"),
    Builtin("log", "elementwise", torch="torch.log", math="math.log"),
    Builtin("tanh", "elementwise", torch="torch.tanh", math="math.tanh"),
    Builtin("cos", "elementwise"),
    Builtin("sin", "elementwise"),
    Builtin("softmax", "elementwise"),  # over the first index, eq. 2 of the paper
    # ⌊x⌋, ⌈x⌉ (whole numbers), |x| (the argument's kind of number), log₂ x; the card's text
    # writes them so, ASCII floor(x), ceil(x), abs(x), log2(x)
    Builtin("floor", "elementwise", torch="torch.floor", math="math.floor", result="ℕ"),
    Builtin("ceil", "elementwise", torch="torch.ceil", math="math.ceil", result="ℕ"),
    Builtin("abs", "elementwise", torch="torch.abs", math="abs", result="same"),
    Builtin("log2", "elementwise", torch="torch.log2", math="math.log2"),
    Builtin("mean", "reducing"),
    Builtin("var", "reducing"),
    # max(x), min(x): the largest, smallest entry of a vector (one argument); max(a, b),
    # min(a, b): of two numbers, as a learning-rate schedule writes them, or entry by entry of
    # tensors (a tensor and a number broadcast); clamping is min(max(x, a), b)
    Builtin("max", "reducing", args=(1, 2)),
    Builtin("min", "reducing", args=(1, 2)),
    Builtin("length", "length"),
    # top_k(w | k), top_p(w | p): the distribution ∝ w on its k largest entries (ties with the
    # k-th kept), or on the fewest largest whose share of Σ w reaches p; k ≥ the entries or
    # p = 1 keeps every entry
    Builtin("top_k", "filter", params=1, upright=False),
    Builtin("top_p", "filter", params=1, upright=False),
    # I ← argtop_k(r | k): the set of the indices of r's k largest entries (of two equal
    # entries, the first), a subset of [n] for r ∈ ℝ^{n}, as Σ_{e ∈ I} and a mixture of
    # experts's router read it
    Builtin("argtop_k", "argtop", params=1, upright=False),
    # indicator(I): the vector of a set I ⊆ [n], 1 at its members and 0 elsewhere, ℝ^{n}; the
    # choices of a router as numbers (a load-balancing loss counts them)
    Builtin("indicator", "indicator"),
    # dropout(X | p): while a model trains, each entry of X zeroed with probability p and the
    # others scaled by 1/(1 − p); in evaluation (and sampling) X itself
    Builtin("dropout", "dropout", params=1, upright=False),
    # patches(X | p): an image X ∈ ℝ^{C×H×W} (or ℝ^{H×W}, one channel) cut into p×p blocks,
    # one row per block, blocks row by row; each row the block's entries channel by channel,
    # then row by row: ℝ^{(H/p)(W/p)×C p p}, as ViT's patch embedding reads an image
    Builtin("patches", "patches", params=1),
    # θ ← AdamW(θ, ∇loss(θ) | η, β_1, β_2, λ): an update a training card may name instead of
    # writing θ − η · ∇loss(θ); its hyperparameters are the learning rate, the two decay rates
    # of the moment estimates and the weight decay (Loshchilov & Hutter), trailing ones omitted
    Builtin("AdamW", "optimizer", args=(2,), params=4, upright=False),
)
BY_NAME = {b.name: b for b in TABLE}

# the views each reader needs, all from the table
ELEMENTWISE = {b.name for b in TABLE if b.rule == "elementwise"} - {"softmax"}
REDUCING = {b.name for b in TABLE if b.rule == "reducing"}
PAIRWISE = {b.name for b in TABLE if b.rule == "reducing" and 2 in b.args}
# the filters, in the order the grammar lists them: name → (the bound's name in messages, what
# it is)
FILTERS = dict(zip(s.FILTERS, (("k", "how many of the largest entries it keeps"),
                               ("p", "the share of the weights its largest entries must reach")),
                   strict=True))
BUILTINS = {b.name for b in TABLE
            if b.rule in ("elementwise", "reducing", "length", "filter", "argtop", "indicator")}
ARGTOP = "argtop_k"
INDICATOR = "indicator"
DROPOUT = "dropout"
PATCHES = "patches"
OPTIMIZERS = {b.name: b.params for b in TABLE if b.rule == "optimizer"}
TORCH = {b.name: b.torch for b in TABLE if b.torch is not None}
MATH = {b.name: b.math for b in TABLE if b.math is not None}
# names set upright: the builtins', and words the paper's prose uses as functions
UPRIGHT = {b.name for b in TABLE if b.upright} | {"erf", "sigmoid"}
# the builtins the paper writes as brackets around their argument: name → (open, close)
BRACKETS = {"floor": ("⌊", "⌋"), "ceil": ("⌈", "⌉"), "abs": ("|", "|")}
# the builtins the paper writes as a name with a subscript: name → that spelling
SUBSCRIPTED = {"log2": "log₂"}
RESULT = {b.name: b.result for b in TABLE}

CONSTANTS = {"π": "math.pi"}  # a constant → its Python spelling

# The paper's special tokens (§4) are the last IDs of the vocabulary V ≅ [N_V]: mask_token,
# bos_token and eos_token are N_V − 2, N_V − 1 and N_V, counted from 1 as the paper counts
# (N_V − 3, N_V − 2 and N_V − 1 counted from 0, as tensors are). Name → IDs after it.
SPECIAL_TOKENS = {"mask_token": 2, "bos_token": 1, "eos_token": 0}


def special_token_id(name: str, vocab: int) -> int:
    """The 0-based ID of a special token in a vocabulary of `vocab` tokens."""
    return vocab - 1 - SPECIAL_TOKENS[name]
