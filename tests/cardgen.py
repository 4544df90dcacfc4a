"""Random well-typed cards and differential runs: `python tests/cardgen.py --cases 2000 --seed 1`.

Each case is a model card (with a small library of sub-cards beside it) composed at random from
the language's constructs — matrix products and transposes, ⊙ and +/−, scalar hyperparameter
arithmetic, softmax, GELU, ReLU, SiLU, σ, tanh, exp, log, √, Σ sums, slices `a : b`, `[[·]]`
masks, causal and windowed attention, maps over positions and heads, loops over layers with a
parameter family θ^ℓ, calls to sub-cards, row- and column-major layouts, token or real inputs —
seeded by `random.Random`, so a case is its seed. Only what `cardc check` accepts is run (the
rejects are counted: a generator that is mostly rejected is a bad one).

Oracles, each a function of a built case so that more can be added (a reference interpreter):
`runs` — `build` either refuses with one located diagnostic or gives a module that runs on random
inputs; `fused_equals_literal` — the fused lowering and the literal one (`fuse=False`) agree in
float64, values and gradients; `cache_equals_recomputation` — a model that offers `new_cache()`
decodes a few tokens at a time to the logits of full recomputation, through a static cache too
(`new_cache(length=…)`), and with gradients enabled to its gradients (tests/decodecheck.py,
check_static_decoding, check_cached_gradients). Some token cards are causal
language models (every mask hides later keys, the library's attention is causal), which the
lowering gives a cache where it proves every attention extends it.

Constructs that meet a known defect of the compiler are left out unless `--known-defects` asks for
them (each is an expected failure in tests/test_cardgen.py), so that a run's disagreements are new.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Sizes every case runs at: small, and different from one another so a swapped axis shows.
SIZES = {"V": 11, "D": 8, "F": 6, "K": 3, "H": 2, "N": 2, "ctx": 9, "D_f": 5}
T_RUN = 7  # positions of the inputs a case runs on (≤ ctx)
SCALARS = {"α": 0.5, "β": 1.25}
TOLERANCE = 1e-9  # float64: fused and literal lowerings compute the same math in another order

# Constructs that meet a known compiler defect, left out unless asked for (tests/test_cardgen.py
# holds a shrunk card of each as an expected failure).
KNOWN_DEFECTS = {
}


# ------------------------------------------------------------------ cards


@dataclass
class Case:
    """A generated card file (the model card first) and the sub-cards' file beside it."""

    seed: int
    model: str
    text: str
    library: str
    tokens: bool
    layout: str
    features: set[str] = field(default_factory=set)

    def write(self, folder: Path) -> Path:
        (folder / "lib.card").write_text(self.library, encoding="utf-8")
        path = folder / "case.card"
        path.write_text(self.text, encoding="utf-8")
        return path


class Layout:
    """How a row-major formula is spelled: a logical (T, c) value is `T×c` row-major and `c×T`
    column-major; products, broadcasts, slices, masks and maps are written accordingly."""

    def __init__(self, row: bool):
        self.row = row

    def shape(self, r: str, c: str) -> str:
        return f"{r}×{c}" if self.row else f"{c}×{r}"

    def matmul(self, a: str, w: str) -> str:  # a ∈ (T, k), w declared k×c (row) or c×k (col)
        return f"{atom(a)} {w}" if self.row else f"{w} {atom(a)}"

    def weight(self, k: str, c: str) -> str:
        return self.shape(k, c)

    def bias(self, a: str, b: str) -> str:
        return f"{atom(a)} + {b}" if self.row else f"{atom(a)} + {b} 1^⊺"

    def scores(self, q: str, k: str, width: str) -> str:  # S[t, t′] row, S[t′, t] col
        return f"{q} {k}^⊺/√{width}" if self.row else f"{k}^⊺ {q}/√{width}"

    def attend(self, s: str, v: str) -> str:
        return f"softmax({s}) {v}" if self.row else f"{v} softmax({s})"

    def mask(self, s: str, hide: str) -> str:
        """`hide` is a condition on t (the query) and t′ (the key)."""
        if self.row:
            return f"∀t, t′, if {hide} then {s}[t, t′] ← −∞"
        hide = re.sub(r"\bt\b", "t_x", hide.replace("t′", "t_z"))
        return f"∀t_z, t_x, if {hide} then {s}[t_z, t_x] ← −∞"

    def cols(self, a: str, lo: str, hi: str) -> str:
        return f"{a}[:, {lo} : {hi}]" if self.row else f"{a}[{lo} : {hi}, :]"

    def side_by_side(self, a: str, b: str) -> str:
        return f"[{a}, {b}]" if self.row else f"[{a}; {b}]"

    def position(self, a: str) -> str:
        return f"{a}[t, :]" if self.row else f"{a}[:, t]"


def atom(x: str) -> str:
    """`x` as an operand: parenthesised unless it is a name, a call or already bracketed whole."""
    if " " not in x:
        return x
    opening = x.find("(")
    head = x[:opening] if opening > 0 else ""
    if x.endswith(")") and (opening == 0 or head.isidentifier() or head in UNARY + ("√",)) \
            and _closes_at_end(x, opening):
        return x
    if x.startswith("[") and x.endswith("]") and _closes_at_end(x, 0):
        return x
    return f"({x})"


def _closes_at_end(x: str, start: int) -> bool:
    depth = 0
    for i, ch in enumerate(x[start:], start):
        depth += ch in "(["
        depth -= ch in ")]"
        if depth == 0:
            return i == len(x) - 1
    return False


NEGATED = {"t′ > t": "t′ ≤ t", "t′ < t": "t′ ≥ t", "t′ ≤ t − 2": "t′ > t − 2"}
UNARY = ("ReLU", "SiLU", "σ", "GELU", "GELU_tanh", "tanh")
MAX_DEPTH = 3


class CardWriter:
    """One card's steps and declarations, composed at random; shapes are tracked as (T, c)."""

    def __init__(self, gen: Generator, layout: Layout, params: list[str]):
        self.gen, self.rng, self.lay = gen, gen.rng, layout
        self.params = params
        self.steps: list[str] = []
        self.env: dict[str, list[str]] = {"D": [], "F": [], "K": []}
        self.n = 0
        self.hypers: set[str] = {"D"}

    def fresh(self, stem: str) -> str:
        self.n += 1
        return f"{stem}_{self.n}"

    def param(self, stem: str, shape: str) -> str:
        name = self.fresh(stem)
        self.params.append(f"{name} ∈ ℝ^{{{shape}}}")
        return name

    def step(self, text: str) -> None:
        self.steps.append(text)

    def bind(self, value: str, c: str) -> str:
        name = self.fresh("Z")
        self.step(f"{name} ← {value}")
        self.env[c].append(name)
        return name

    def name_of(self, c: str) -> str:
        """A value of width c already computed, or one computed now."""
        if self.env[c] and self.rng.random() < 0.7:
            return self.rng.choice(self.env[c])
        return self.bind(self.expr(c, 1), c)

    # -- expressions of logical shape (T, c)

    def expr(self, c: str, depth: int = 0) -> str:
        if depth >= MAX_DEPTH:
            return self.leaf(c)
        forms = [self.leaf, self.elementwise, self.unary, self.scaled, self.product,
                 self.biased, self.attention, self.special]
        if c == "D":
            forms += [self.norm, self.call, self.spliced]
        if c == "K":
            forms += [self.sliced, self.sliced]
        return self.rng.choice(forms)(c, depth + 1)

    def leaf(self, c: str, depth: int = 0) -> str:
        if self.env[c]:
            return self.rng.choice(self.env[c])
        if c == "K":
            return self.sliced(c, depth)
        return self.product(c, MAX_DEPTH)

    def elementwise(self, c: str, depth: int) -> str:
        op = self.rng.choice(("⊙", "+", "−"))
        return f"{atom(self.expr(c, depth))} {op} {atom(self.expr(c, depth))}"

    def unary(self, c: str, depth: int) -> str:
        self.gen.feature("unary")
        return f"{self.rng.choice(UNARY)}({self.expr(c, depth)})"

    def special(self, c: str, depth: int) -> str:
        """exp, log and √ on arguments that keep them finite."""
        a = atom(self.expr(c, depth))
        if "(" in a and self.rng.random() < 0.5:  # named, or written twice below
            a = self.bind(a, c)
        elif "softmax(" in a or "Attention(" in a:
            self.gen.feature("attention written twice")
        self.gen.feature("exp/log/√")
        return self.rng.choice((f"exp(tanh({a}))", f"log(1 + {a} ⊙ {a})",
                                f"√({a} ⊙ {a} + α)", f"log(σ({a}))"))

    def scaled(self, c: str, depth: int) -> str:
        self.hypers.add(c)
        self.gen.feature("scalar")
        s = self.rng.choice(("α", "β", "(α + β)", "α/β", "(1 − α)", f"1/√{c}", "2 α β"))
        if self.rng.random() < 0.2:
            self.gen.feature("log of hyperparameters")
            s = "log(α/β)"
        return f"{s} · {atom(self.expr(c, depth))}"

    def product(self, c: str, depth: int) -> str:
        k = self.rng.choice(("D", "F"))
        if depth >= MAX_DEPTH and not self.env[k]:
            k = "D"
        self.hypers.update((k, c))
        a = self.expr(k, depth) if depth < MAX_DEPTH else self.input_or(k)
        if self.rng.random() < 0.3:  # a transposed weight
            self.gen.feature("transpose")
            w = self.param("W", self.lay.weight(c, k))
            return self.lay.matmul(a, f"{w}^⊺")
        return self.lay.matmul(a, self.param("W", self.lay.weight(k, c)))

    def input_or(self, k: str) -> str:
        if self.env[k]:
            return self.rng.choice(self.env[k])
        return self.rng.choice(self.env["D"])  # the input, at least

    def biased(self, c: str, depth: int) -> str:
        self.hypers.add(c)
        return self.lay.bias(self.expr(c, depth), self.param("b", c))

    def attention(self, c: str, depth: int) -> str:
        """softmax of scores, masked by a rule that leaves each query a key, times values."""
        q, k = self.name_of("D"), self.name_of("D")
        v = self.name_of(c)
        if self.rng.random() < 0.7:  # keys and values of their own
            k, v = self.projected(k, "D"), self.projected(v, c)
        else:  # values read elsewhere too (a cache must extend a copy)
            self.gen.feature("shared key and value")
        s = self.fresh("S")
        self.step(f"{s} ← {self.lay.scores(q, k, 'D')}")
        hide = self.rng.choice(self.gen.masks)
        if hide:
            self.gen.feature(f"mask {hide}")
            if self.rng.random() < 0.3:  # the same rule as an Iverson bracket
                self.gen.feature("[[·]]")
                hide = f"¬[[{NEGATED[hide]}]]"
            self.step(self.lay.mask(s, hide))
        self.gen.feature("attention")
        if self.rng.random() < 0.5:
            return self.bind(self.lay.attend(s, v), c)
        self.gen.feature("attention within an expression")  # maybe beside another
        return self.lay.attend(s, v)

    def projected(self, a: str, c: str) -> str:
        """A new value `a W` that no other step reads."""
        name = self.fresh("P")
        w = self.param("W", self.lay.weight("D" if a in self.env["D"] else c, c))
        self.hypers.add(c)
        self.step(f"{name} ← {self.lay.matmul(a, w)}")
        return name

    def norm(self, c: str, depth: int) -> str:
        gain = self.param("γ", "D")
        a = self.name_of("D")
        if self.rng.random() < 0.5:
            call = f"RMSNorm({{}} | {gain})"
        else:
            call = f"LayerNorm({{}} | {gain}, {self.param('β', 'D')})"
        self.gen.feature("norm")
        if self.lay.row and self.rng.random() < 0.3:
            self.gen.feature("elementwise map over positions")
            b = self.name_of("D")
            call = f"σ({{}}) ⊙ {self.lay.position(b)}"
        elif self.lay.row and self.rng.random() < 0.5:
            return call.format(a)
        z = self.fresh("Z")
        self.gen.feature("map over positions")
        self.step(f"for t ∈ [T] : {self.lay.position(z)} ← {call.format(self.lay.position(a))}")
        return z

    def call(self, c: str, depth: int) -> str:
        """A generated vector sub-card (Σ, mean, var) on each position, or a library card: an
        MLP, or attention whose heads are a map and whose mask is a rule `[[t′ ≤ t]]`."""
        if not self.lay.row:
            return self.norm(c, depth)
        causal = self.gen.masks == ["t′ > t"]
        name = self.rng.choice(("vector", "vector", "MLP", "ErfMLP", "SwiGLU",
                                "CausalSelfAttention" if causal else "SelfAttention"))
        if name == "vector":
            name = self.gen.vector_card()
            self.gen.feature("sub-card")
        else:
            self.gen.feature(f"library {name}")
            self.hypers.add("H" if "Attention" in name else "D_f")
        a = self.name_of("D")
        bundle = self.fresh("θ")
        self.params.append(f"{bundle}, the parameters of a {name}.")
        return f"{name}({a} | {bundle})"

    def spliced(self, c: str, depth: int) -> str:
        """Columns 1 … K of one value beside columns K + 1 … D of another."""
        self.hypers.add("K")
        self.gen.feature("slice" if self.lay.row else "column-major slice")
        a, b = self.name_of("K"), self.name_of("D")
        return self.lay.side_by_side(a, self.lay.cols(b, "K + 1", "D"))

    def sliced(self, c: str, depth: int) -> str:
        self.hypers.add("K")
        self.gen.feature("slice" if self.lay.row else "column-major slice")
        a = self.name_of("D")
        lo, hi = self.rng.choice((("1", "K"), ("D − K + 1", "D"), ("2", "K + 1")))
        return self.lay.cols(a, lo, hi)


class Generator:
    """Cards from one seed."""

    def __init__(self, seed: int, known_defects: bool = False):
        self.rng = random.Random(seed)
        self.seed, self.known = seed, known_defects
        self.features: set[str] = set()
        self.subcards: list[str] = []
        # causal and other attention mixed in one model, as often as not
        self.masks: list[str | None] = ["t′ > t", "t′ > t", "t′ < t", "t′ ≤ t − 2", None]
        self.hypers: set[str] = set()

    def feature(self, name: str) -> None:
        self.features.add(name)

    def vector_card(self) -> str:
        """A card on one vector ℝ^{D}: sums, mean and var; applied row by row."""
        name = f"Vec{self.seed}x{len(self.subcards)}"
        rng = self.rng
        body = rng.choice((
            ("m ← Σ_{i=1}^{D} e[i]/D", "return y = (e − m) ⊙ γ"),
            ("m ← mean(e)", "v ← var(e)", "return y = (e − m)/√(v + α) ⊙ γ"),
            ("s ← Σ_{i=1}^{K} e[i]²", "return y = e/√(s + 1) ⊙ γ"),
            ("return y = e − max(e) + γ",),
        ))
        hypers = "D, K ∈ ℕ; α ∈ (0, ∞)" if "K" in "".join(body) else "D ∈ ℕ; α ∈ (0, ∞)"
        self.subcards.append("\n".join([
            f"Algorithm: y ← {name}(e | θ)",
            "/* A generated function of one vector. */",
            "Input: e ∈ ℝ^{D}", "Output: y ∈ ℝ^{D}", f"Hyperparameters: {hypers}",
            "Parameters: θ consisting of:", "    γ ∈ ℝ^{D}",
            *(f"{i} {s}" for i, s in enumerate(body, 1))]))
        self.feature("Σ/mean/var")
        return name

    def block_card(self, layout: Layout, scaled: bool = False) -> str:
        """A block X ↦ X + f(X) with its own parameter bundle, for a loop over layers;
        `scaled`: X + κ · f(X), κ a real hyperparameter each layer is handed."""
        name = f"Block{self.seed}x{len(self.subcards)}"
        params: list[str] = []
        w = CardWriter(self, layout, params)
        w.env["D"].append("X")
        out = w.expr("D", 1)
        if not params:
            self.feature("parameter-free block")
        steps = w.steps + [f"return X + κ · ({out})" if scaled else f"return X + {out}"]
        self.hypers |= w.hypers  # the caller declares what its blocks take from it
        own = "; κ ∈ (0, ∞)" if scaled else ""
        self.subcards.append("\n".join([
            f"Algorithm: X ← {name}(X | θ)", "/* A generated block. */",
            f"Input: X ∈ ℝ^{{{layout.shape('T', 'D')}}}",
            f"Output: X ∈ ℝ^{{{layout.shape('T', 'D')}}}",
            f"Hyperparameters: {hyper_line(w.hypers)}{own}",
            "Parameters: θ consisting of:", *(f"    {p}" for p in params),
            *(f"{i} {s}" for i, s in enumerate(steps, 1))]))
        return name

    def layer_value(self) -> str:
        """A positive real made of the layer's index ℓ and the depth N, for `κ = …`."""
        return self.rng.choice((
            "ℓ/N", "1 + [[ℓ = N]]", "[[2 ⌊ℓ/2⌋ = ℓ]] + 1/2", "⌊ℓ/2⌋ + 1", "min(ℓ, 2)/3",
            "1/(N + 1 − ℓ)", "[[ℓ ≤ N − 1]] (ℓ + 1)/N + [[ℓ > N − 1]]", "⌈ℓ/2⌉/N"))

    def head_card(self) -> str:
        """One attention head for a map over heads: its own projections, a mask."""
        name = f"Head{self.seed}x{len(self.subcards)}"
        hide = self.rng.choice(self.masks)
        mask = [f"∀t, t′, if {hide} then S[t, t′] ← −∞"] if hide else []
        steps = ["Q ← X W_q", "K ← X W_k", "V ← X W_v", "S ← Q K^⊺/√d", *mask,
                 "return Y = softmax(S) V"]
        self.subcards.append("\n".join([
            f"Algorithm: Y ← {name}(X | W_qkv)", "/* A generated head. */",
            "Input: X ∈ ℝ^{T×D}", "Output: Y ∈ ℝ^{T×d}",
            "Parameters: W_qkv consisting of:", "    W_q, W_k, W_v ∈ ℝ^{D×d}",
            *(f"{i} {s}" for i, s in enumerate(steps, 1))]))
        return name

    def case(self) -> Case:
        rng = self.rng
        row = rng.random() < 0.7
        lay = Layout(row)
        tokens = not row or rng.random() < 0.6
        if row and tokens and rng.random() < 0.4:  # a causal language model: it gets a cache
            self.masks = ["t′ > t"]
            self.feature("causal language model")
        params: list[str] = []
        w = CardWriter(self, lay, params)
        name = f"Gen{self.seed}"
        if tokens:
            self.feature("tokens")
            params.append(f"W_e ∈ ℝ^{{{lay.weight('V', 'D')}}}")
            if row:
                pos = rng.random() < 0.5
                if pos:
                    params.append("W_p ∈ ℝ^{ctx×D}")
                if rng.random() < 0.2:  # token by token, row by row
                    self.feature("row-major map over tokens")
                    w.step(f"for t ∈ [T] : E[t, :] ← W_e[x[t]]{' + W_p[t]' if pos else ''}")
                else:
                    w.step(f"E ← W_e[x]{' + W_p[1 : T]' if pos else ''}")
            else:
                w.step("for t ∈ [T] : E[:, t] ← W_e[:, x[t]]")
        w.env["D"].append("E")
        if row and rng.random() < 0.3:
            self.feature("map over heads")
            head = self.head_card()
            params.append("For h ∈ [H], W^h_qkv consisting of:")
            params.append("    W^h_q, W^h_k, W^h_v ∈ ℝ^{D×d}")
            w.step(f"for h ∈ [H] : Y^h ← {head}(E | W^h_qkv)")
            w.step("A ← [Y^1, Y^2, …, Y^H]")
            w.env["D"].append("A")
            w.hypers.add("H")
        if rng.random() < 0.4:
            self.feature("loop over layers")
            scaled = rng.random() < 0.4
            block = self.block_card(lay, scaled)
            params.append("For ℓ ∈ [N]:")
            params.append("    θ^block_ℓ, the parameters of block ℓ.")
            w.step("for ℓ = 1, …, N do")
            if scaled:
                self.feature("per-layer hyperparameter")
                w.step(f"    E ← {block}(E | θ^block_ℓ, κ = {self.layer_value()})")
            else:
                w.step(f"    E ← {block}(E | θ^block_ℓ)")
            w.step("end")
            w.hypers.add("N")
        for _ in range(rng.randint(1, 3)):
            c = rng.choice(("D", "D", "F", "K"))
            w.bind(w.expr(c), c)
        if row and rng.random() < 0.05:  # a loop-carried recurrence over positions
            self.feature("recurrence")
            a = w.name_of("D")
            w.step(f"h ← {a}[1, :]")
            w.step("for t = 1, …, T do")
            w.step(f"    h ← α · h + {a}[t, :]")
            w.step("    R[t, :] ← h")
            w.step("end")
            w.env["D"].append("R")
        out = f"{atom(w.env['D'][-1])} + {atom(w.expr('D'))}"  # the last value is used
        if tokens and row and rng.random() < 0.7:
            out_ty, ret = "T×V", f"return Y = {atom(out)} W_e^⊺"
            self.feature("tied logits")
        else:
            out_ty, ret = lay.shape("T", "D"), f"return Y = {out}"
        hypers = set(w.hypers) | self.hypers | {"D"} | ({"V"} if tokens else set())
        if any("W_p" in p for p in params):
            hypers.add("ctx")
        if any("[H]" in p for p in params):
            hypers.add("H")
        head = [f"Algorithm: Y ← {name}({'x' if tokens else 'E'} | θ)",
                "/* A generated card. */",
                "Input: x ∈ {1..V}^{T}, token IDs." if tokens else
                f"Input: E ∈ ℝ^{{{lay.shape('T', 'D')}}}",
                f"Output: Y ∈ ℝ^{{{out_ty}}}",
                f"Hyperparameters: {hyper_line(hypers)}",
                "Parameters: θ includes all of the following parameters:",
                *(f"    {p}" for p in params)]
        steps = [*w.steps, ret]
        if any(st.count("softmax(") > 1 for st in steps):
            self.feature("attentions side by side")  # two in one step, or one written twice
        numbered = [f"{k} {s}" for k, s in enumerate(steps, 1)]
        text = "\n".join(head + numbered) + "\n"
        library = "\n\n".join(self.subcards) + "\n" if self.subcards else \
            "/* No sub-cards. */\n"
        self.feature("row-major" if row else "column-major")
        return Case(self.seed, name, text, library, tokens, "row" if row else "col",
                    set(self.features))


def hyper_line(hypers: set[str]) -> str:
    dims = [h for h in ("V", "D", "F", "K", "H", "N", "ctx", "D_f") if h in hypers]
    extra = "; d = D/H" if "H" in hypers else ""
    scalars = "; ".join(f"{s} ∈ (0, ∞) = {v}" for s, v in SCALARS.items())
    return f"{', '.join(dims)} ∈ ℕ{extra}; {scalars}"


def generate(seed: int, known_defects: bool = False) -> Case:
    return Generator(seed, known_defects).case()


# ------------------------------------------------------------------ running a case


@dataclass
class Built:
    """A case that checked: its checker and model card, and how to make its modules."""

    case: Case
    checker: object
    alg: object

    def module(self, fuse: bool):
        import torch

        from cardc.build import instantiate
        from cardc.names import identifier

        values = {identifier(k): v for k, v in {**SIZES, **SCALARS}.items()}
        model, _ = instantiate(self.checker, self.alg, values, fuse)
        g = torch.Generator().manual_seed(self.case.seed)
        with torch.no_grad():  # weights of order 1, so that no difference hides in small values
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        return model.double()

    def inputs(self):
        import torch

        g = torch.Generator().manual_seed(self.case.seed)
        if self.case.tokens:
            return (torch.randint(0, SIZES["V"], (2, T_RUN), generator=g),)
        return (torch.randn(2, T_RUN, SIZES["D"], generator=g, dtype=torch.float64),)


class Disagreement(Exception):
    """An oracle's finding."""


def checked(case: Case, folder: Path) -> Built | str:
    """The case checked with cardc's own library and its sub-cards, or check's first error."""
    from cardc.build import checked as check_cards
    from cardc.diagnostics import CardError

    path = case.write(folder)
    try:
        lib, checker, _ = check_cards([str(path)], [str(folder)])
    except CardError as err:
        first = err.diagnostics.errors[0]
        return f"{first.span.line}: {first.message}"
    return Built(case, checker, lib.find(case.model))


def refusal(built: Built) -> str | None:
    """The build's one located diagnostic, or None where it generates code; raises
    Disagreement on several diagnostics or an unlocated one."""
    from cardc.build import lowered
    from cardc.diagnostics import CardError

    try:
        lowered(built.checker, built.alg, True)
        lowered(built.checker, built.alg, False)
    except CardError as err:
        errors = err.diagnostics.errors
        if len(errors) != 1 or errors[0].span.line < 1:
            raise Disagreement(f"build refused with {len(errors)} diagnostics: "
                               f"{err.diagnostics.render()}") from None
        return errors[0].message
    return None


def runs(built: Built) -> None:
    """Oracle 1: the generated module runs on random inputs (with a backward pass)."""
    model = built.module(True)
    out = model(*built.inputs())
    if out.requires_grad:  # a card whose output no parameter reaches has no backward pass
        out.sum().backward()


def _values_and_grads(model, inputs):
    import torch

    out = model(*inputs)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    finite = torch.where(torch.isfinite(out), out, torch.zeros_like(out))
    if out.requires_grad:
        (finite * weight).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return out.detach(), grads


def fused_equals_literal(built: Built) -> None:
    """Oracle 2: fused and literal lowerings agree in float64, values and gradients."""

    fused, literal = built.module(True), built.module(False)
    literal.load_state_dict(fused.state_dict())
    inputs = built.inputs()
    a, ga = _values_and_grads(fused, inputs)
    b, gb = _values_and_grads(literal, inputs)
    if not close(a, b):
        raise Disagreement(f"values differ: {_gap(a, b)}")
    for name, g in ga.items():
        h = gb.get(name)
        if (g is None) != (h is None) or g is not None and not close(g, h):
            raise Disagreement(f"gradient of {name} differs: {_gap(g, h)}")


def close(a, b) -> bool:
    """`a` and `b` agree up to float64 rounding at the tensor's scale.

    The lowerings add the same terms in other orders. A sum's rounding error follows the size
    of its terms, not of its result: an entry that cancels to 5e-4 among entries of 1e3 (in a
    gradient, most often) carries an error near 1e3 · ε. So each entry may differ by TOLERANCE
    times the largest finite entry of either tensor (at least 1), besides TOLERANCE relative to
    itself. A wrong entry still shows: its error is of its own size, and the largest entry is
    held to TOLERANCE relative to itself.
    """
    import torch

    if a.shape != b.shape:
        return False
    both = torch.cat([a.detach().reshape(-1), b.detach().reshape(-1)]).abs()
    finite = both[torch.isfinite(both)]
    scale = max(1.0, finite.max().item()) if finite.numel() else 1.0
    return torch.allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE * scale, equal_nan=True)


def _gap(a, b) -> str:
    if a is None or b is None or a.shape != b.shape:
        return f"shapes {getattr(a, 'shape', None)} and {getattr(b, 'shape', None)}"
    return f"max |Δ| = {(a - b).abs().nan_to_num(float('inf')).max().item():.3g}"


def cache_equals_recomputation(built: Built) -> None:
    """Oracle 3: a model with new_cache() decodes chunk by chunk to full recomputation's logits,
    through a static cache too (where it holds keys and values alone), and with gradients to
    its gradients."""
    import torch
    from decodecheck import check_cached_gradients, check_static_decoding

    model = built.module(True).eval()
    if not hasattr(model, "new_cache"):
        return
    (x,) = built.inputs()
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        chunks = [x[:, :3], x[:, 3:4], x[:, 4:6], x[:, 6:]]
        rows = torch.cat([model(chunk, cache=cache) for chunk in chunks], dim=1)
    if rows.shape != full.shape or not torch.allclose(rows, full, rtol=1e-7, atol=1e-7):
        raise Disagreement(f"cached decoding differs from recomputation: {_gap(rows, full)}")
    try:
        check_static_decoding(model, [x], (3, 1, 2), tolerance=1e-7)
        check_cached_gradients(model, [x], (3, 1, 2), tolerance=1e-7)
    except AssertionError as err:
        raise Disagreement(str(err)) from None


def interpreter_equals_module(built: Built) -> None:
    """Oracle 4: the fused module computes what the reference interpreter (cardc.interpret)
    says the card means, example by example in float64, values and gradients."""
    import torch
    from cardparams import card_params

    from cardc.interpret import Program

    program = Program.of(built.checker.lib, built.checker, built.alg)
    env = program.hyperparameters(None, **{k: v for k, v in {**SIZES, **SCALARS}.items()
                                           if k in program.sig.hypers})
    model = built.module(True)
    params = card_params(built.checker, built.alg, model)
    column = program.sig.layout == "column"
    (x,) = built.inputs()
    examples = [x[b] + 1 if built.case.tokens else x[b].mT if column else x[b]
                for b in range(x.shape[0])]  # the card's 1-based tokens, in its layout
    want = torch.stack([y.mT if column and y.dim() == 2 else y
                        for y in (program(e, params=params, hypers=env) for e in examples)])
    weight = torch.linspace(-1, 1, want.numel(), dtype=want.dtype).reshape(want.shape)
    finite = lambda v: torch.where(torch.isfinite(v), v, torch.zeros_like(v))  # noqa: E731
    if want.requires_grad:
        (finite(want) * weight).sum().backward()
    wanted = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    got, grads = _values_and_grads(model, built.inputs())
    if not close(got, want.detach()):
        raise Disagreement(f"values differ from the interpreter's: {_gap(got, want.detach())}")
    for name, g in grads.items():
        h = wanted.get(name)
        g = torch.zeros_like(h) if g is None and h is not None else g
        h = torch.zeros_like(g) if h is None and g is not None else h
        if g is not None and not close(g, h):
            raise Disagreement(f"gradient of {name} differs from the interpreter's: "
                               f"{_gap(g, h)}")


ORACLES: list[Callable[[Built], None]] = [runs, fused_equals_literal, cache_equals_recomputation,
                                          interpreter_equals_module]


@dataclass
class Outcome:
    kind: str  # rejected, refused, agreed, crash, disagreement
    detail: str = ""


def run_case(case: Case, oracles: list[Callable[[Built], None]] | None = None) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="cardgen-") as tmp:
        built = checked(case, Path(tmp))
        if isinstance(built, str):
            return Outcome("rejected", built)
        try:
            message = refusal(built)
        except Disagreement as err:
            return Outcome("disagreement", str(err))
        if message is not None:
            return Outcome("refused", message)
        for oracle in oracles or ORACLES:
            try:
                oracle(built)
            except Disagreement as err:
                return Outcome("disagreement", f"{oracle.__name__}: {err}")
            except Exception:  # noqa: BLE001 - a run-time crash is what this looks for
                return Outcome("crash", f"{oracle.__name__}: {traceback.format_exc(limit=-3)}")
    return Outcome("agreed")


def signature(outcome: Outcome) -> str:
    """What a failure is, for shrinking: its kind and the last line of its detail."""
    lines = outcome.detail.strip().splitlines()
    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", f"{outcome.kind}: {lines[-1] if lines else ''}")


def renumber(text: str) -> str:
    """Steps numbered 1, 2, … again after lines were taken out."""
    out, k = [], 0
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        k = 0 if line.startswith("Algorithm") else k
        if head.isdigit():
            k += 1
            line = f"{k} {rest}"
        out.append(line)
    return "\n".join(out) + "\n"


STEP = re.compile(r"^(\d+ (?:return \S+ =|\S+ ←) )(.*)$")
NAME = re.compile(r"(?<![\w′^_])(?:[A-Z]|[A-Z]_\d+)(?![\w′(])")


def simpler(line: str) -> list[str]:
    """`k Z ← f(A, B)` as `k Z ← A`, `k Z ← B`: a step's value replaced by a name it reads."""
    m = STEP.match(line)
    if not m:
        return []
    names = dict.fromkeys(NAME.findall(m.group(2)))
    return [m.group(1) + n for n in names if n != m.group(2)]


def shrink(case: Case, oracles: list[Callable[[Built], None]] | None = None) -> Case:
    """The case made smaller while it fails the same way: lines (of either file) taken out, and
    steps' values replaced by a name they read."""
    import dataclasses

    want = signature(run_case(case, oracles))
    changed = True
    while changed:
        changed = False
        for attr in ("text", "library"):
            lines = getattr(case, attr).splitlines()
            i = len(lines) - 1
            while i > 0:
                i = min(i, len(lines) - 1)
                # a mask stays, and keys and values stay projections (P_k ← A W): without
                # them a causal model fails another way (KNOWN_DEFECTS)
                trials = [] if "−∞" in lines[i] else [lines[:i] + lines[i + 1:]]
                if " P_" not in lines[i]:
                    trials += [lines[:i] + [s] + lines[i + 1:] for s in simpler(lines[i])]
                for trial_lines in trials:
                    trial = dataclasses.replace(case, **{attr: renumber("\n".join(trial_lines))})
                    if signature(run_case(trial, oracles)) == want:
                        case, lines, changed = trial, getattr(trial, attr).splitlines(), True
                        break
                i -= 1
    return case


def campaign(cases: int, seed: int, known_defects: bool = False, verbose: bool = False) -> Counter:
    counts: Counter = Counter()
    for i in range(cases):
        case = generate(seed * 1_000_003 + i, known_defects)
        outcome = run_case(case)
        counts[outcome.kind] += 1
        if outcome.kind in ("refused", "rejected"):
            counts[f"{outcome.kind}: {outcome.detail}"] += 1
        if outcome.kind in ("crash", "disagreement") or verbose:
            print(f"--- case seed {case.seed}: {outcome.kind}\n{outcome.detail}\n{case.text}",
                  file=sys.stderr)
    return counts


def summary(counts: Counter) -> str:
    n = sum(counts[k] for k in ("rejected", "refused", "agreed", "crash", "disagreement"))
    checked_ = n - counts["rejected"]
    return (f"cardgen: {n} generated, {checked_} checked, {checked_ - counts['refused']} built, "
            f"{counts['refused']} refused at build, {counts['disagreement']} disagreements, "
            f"{counts['crash']} run-time crashes")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tests/cardgen.py", description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=200, help="how many cards (default: 200)")
    p.add_argument("--seed", type=int, default=0, help="the run's seed (default: 0)")
    p.add_argument("--known-defects", action="store_true",
                   help="also generate the constructs that meet known defects")
    p.add_argument("--show", type=int, default=None, help="print the card of one case seed and stop")
    p.add_argument("--shrink", type=int, default=None,
                   help="shrink the failing case of this case seed, print it and its outcome")
    args = p.parse_args(argv)
    if args.show is not None or args.shrink is not None:
        case = generate(args.show if args.show is not None else args.shrink, args.known_defects)
        case = shrink(case) if args.shrink is not None else case
        print(case.text + "\n" + case.library)
        if args.shrink is not None:
            print(signature(run_case(case)))
        return 0
    counts = campaign(args.cases, args.seed, args.known_defects)
    refusals = sorted((k for k in counts if k.startswith(("refused: ", "rejected: "))),
                      key=lambda k: -counts[k])
    for k in refusals[:10]:
        print(f"  {counts[k]:5d}  {k}")
    print(summary(counts))
    return 1 if counts["crash"] or counts["disagreement"] else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
