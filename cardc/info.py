"""Figures a card implies at a preset: hyperparameter values and parameter counts."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from . import syntax as s
from .checker import Signature
from .dims import Dim
from .presets import PresetError, find_preset, in_ranges, own_values
from .types import BundleTy, Entry, FamilyTy, Ty


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


@dataclass
class Summary:
    card: str
    preset: str | None
    values: dict[str, float]
    parameters: int

    def text(self) -> str:
        hyper = ", ".join(f"{k} = {_fmt(v)}" for k, v in self.values.items())
        lines = [f"{self.card}" + (f" (preset {self.preset})" if self.preset else ""),
                 f"  hyperparameters: {hyper}",
                 f"  parameters: {self.parameters:,}"]
        return "\n".join(lines)


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def summarize(sig: Signature, preset: str | None, overrides: dict[str, float] | None = None) -> Summary:
    env = preset_values(sig, preset, overrides or {})
    params = count(sig.tree, env, sig.alg.span) if isinstance(sig.tree, BundleTy) else 0
    return Summary(sig.alg.label or "", preset, env, params)
