"""Figures a card implies at a preset: hyperparameter values, parameter counts and memory,
and the FLOPs and activation memory its math implies (cardc.flops)."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from . import syntax as s
from .checker import Signature
from .dims import Dim
from .flops import Cost
from .presets import PresetError, find_preset, in_ranges, own_values
from .spelling import display
from .types import BundleTy, Entry, FamilyTy, Ty, subst_dim


def preset_values(sig: Signature, preset: str | None, overrides: dict[str, float]) -> dict[str, float]:
    """Hyperparameter values: defaults, then the preset, then overrides; definitions derived.

    ℕ values are ints, the others floats. Only the card's own declarations are checked here;
    `presets.validate` checks the sizes of every card it calls too."""
    env = own_values(sig, find_preset(sig.alg, preset), overrides)
    return {k: int(v) if sig.hypers.get(k, Ty()).elem == "ℕ" and v.denominator == 1 else float(v)
            for k, v in env.items()}


def check_ranges(alg: s.Algorithm, values: dict[str, float]) -> None:
    """Hyperparameter values inside the intervals the card declares (`η ∈ (0, ∞)`)."""
    in_ranges(alg, {k: Fraction(v) for k, v in values.items()})


def evaluate(dim: Dim, env: dict[str, float], span: s.Span) -> Fraction:
    try:
        return dim.evaluate(env)
    except KeyError as err:
        raise PresetError(span, f"hyperparameter '{err.args[0]}' has no value",
                          hint="set it in a preset or with NAME=VALUE") from None


def count(entry: Entry, env: dict[str, float], span: s.Span) -> int:
    if isinstance(entry, Ty):
        total = Fraction(1)
        for d in entry.shape:
            size = evaluate(d, env, span) if d is not None else 1
            if size != int(size) or size < 1:
                raise PresetError(span, f"a parameter dimension {d} is {float(size):g} at these "
                                        "hyperparameters, not a positive whole number")
            total *= size
        return int(total)
    if isinstance(entry, FamilyTy):
        return int(evaluate(entry.over, env, span)) * count(entry.entry, env, span)
    return sum(count(e, env, span) for e in entry.members.values())


DTYPES = {"fp32": 4, "bf16": 2}  # bytes per value


@dataclass
class Summary:
    card: str
    preset: str | None
    values: dict[str, float]
    parameters: int
    compute: Compute | None = None

    def text(self) -> str:
        hyper = ", ".join(f"{k} = {number(v)}" for k, v in self.values.items())
        memory = ", ".join(f"{byte_size(self.parameters * n)} {k}" for k, n in DTYPES.items())
        lines = [f"{self.card}" + (f" (preset {self.preset})" if self.preset else ""),
                 f"  hyperparameters: {hyper}",
                 f"  parameters: {self.parameters:,} ({memory})"]
        if self.compute is not None:
            lines += self.compute.lines()
        return "\n".join(lines)


@dataclass
class Compute:
    """FLOPs per token and activation memory at a sequence length (symbolic without one)."""

    length: str | None  # the sequence length's symbol (T), None: the card has none
    seq: int | None  # its value, if given
    batch: int
    per_token: Dim  # forward FLOPs per token, in `length` only
    values: Dim  # entries of the values one sequence computes, in `length` only
    # a language model's loss: its vocabulary, and the most logits training holds at once
    # (None: all of them; cardc.lower.likelihood)
    loss: tuple[int, int | None] | None = None

    def lines(self) -> list[str]:
        t = self.length
        if t is None or self.seq is not None:
            env = {} if t is None else {t: self.seq}
            fwd = self.per_token.evaluate(env)
            where = "" if t is None else f" at {display(t)} = {self.seq}"
            acts = self.values.evaluate(env) * self.batch
            # inputs with no free length (an image ℝ^{C×S×S}): the cost of a whole example
            per = "example" if t is None else "token"
            return [f"  FLOPs per {per}{where}: forward {figure(fwd)}, training {figure(3 * fwd)}",
                    f"  activations{where}, batch {self.batch}: " +
                    ", ".join(f"{byte_size(acts * n)} {k}" for k, n in DTYPES.items()),
                    *self.loss_lines(where)]
        return [f"  FLOPs per token: forward {polynomial(self.per_token, t)}, training 3× that "
                f"({display(t)}: the sequence length; --seq to evaluate)",
                f"  activations per sequence: {polynomial(self.values, t)} values (--seq, --batch)"]


    def loss_lines(self, where: str) -> list[str]:
        """What the training loss holds of the logits at the batch and sequence length."""
        if self.loss is None or self.seq is None:
            return []
        vocab, most = self.loss
        logits = self.batch * self.seq * vocab
        held = logits if most is None else min(logits, most)
        how = "all at once" if held == logits else "a few positions at a time"
        return [f"  the loss{where}, batch {self.batch}: {logits:,} logits, {held:,} held at "
                f"once ({how}; {byte_size(held * 4)} fp32, and as much for their log-softmax)"]


def number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def summarize(sig: Signature, preset: str | None, overrides: dict[str, float] | None = None,
              cost: Cost | None = None, seq: int | None = None, batch: int = 1) -> Summary:
    """The figures at a preset; with the card's `cost` (cardc.flops), its compute too."""
    env = preset_values(sig, preset, overrides or {})
    params = count(sig.tree, env, sig.alg.span) if isinstance(sig.tree, BundleTy) else 0
    compute = None if cost is None else _compute(sig, env, cost, seq, batch)
    return Summary(sig.alg.label or "", preset, env, params, compute)


def _compute(sig: Signature, env: dict[str, float], cost: Cost, seq: int | None,
             batch: int) -> Compute | None:
    """The cost at these hyperparameters, per token of the first input's sequence length."""
    lengths = [sym for _, ty in sig.inputs if isinstance(ty, Ty) for d in ty.shape
               if d is not None for sym in d.symbols if sym not in env]
    length = lengths[0] if lengths else None
    fixed = {k: Dim.const(Fraction(v)) for k, v in env.items()}
    flops, values = subst_dim(cost.flops, fixed), subst_dim(cost.values, fixed)
    if {*flops.symbols, *values.symbols} - {length}:
        return None  # a size no hyperparameter gives: no figure
    per_token = flops if length is None else flops / Dim.sym(length)
    return Compute(length, seq, batch, per_token, values) if per_token is not None else None


def polynomial(d: Dim, t: str) -> str:
    """`94,371,840 + 36,864·T`: a polynomial in one symbol, highest power last."""
    parts = []
    for mono, coef in sorted(d.terms, key=lambda tc: dict(tc[0]).get(t, 0)):
        power = dict(mono).get(t, 0)
        sym = "" if power == 0 else display(t) if power == 1 else f"{display(t)}^{power}"
        parts.append(figure(coef) + ("·" + sym if sym else ""))
    return " + ".join(parts) or "0"


def figure(n: Fraction | float) -> str:
    n = float(n)
    return f"{n:,.0f}" if n.is_integer() or abs(n) >= 100 else f"{n:.3g}"


def byte_size(n: Fraction | float) -> str:
    n = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000
    return f"{n:.3g} TB"
