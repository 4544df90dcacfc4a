"""Figures a card implies at a preset: hyperparameter values and parameter counts."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from . import syntax as s
from .checker import Signature
from .diagnostics import CardError, Diagnostics
from .dims import Dim
from .types import BundleTy, Entry, FamilyTy, Ty


class PresetError(Exception):
    def __init__(self, span: s.Span, message: str, hint: str | None = None):
        super().__init__(message)
        self.span, self.message, self.hint = span, message, hint

    def card_error(self, sources: dict[str, str]) -> CardError:
        """The located diagnostic a command reports."""
        diags = Diagnostics(sources=sources)
        diags.error(self.span, self.message, self.hint)
        return CardError(diags)


def _number(e: s.Expr, env: dict[str, float]) -> float:
    if isinstance(e, s.Num):
        return e.value
    if isinstance(e, s.Name):
        if e.id not in env:
            raise PresetError(e.span, f"'{e.id}' has no value here")
        return env[e.id]
    if isinstance(e, s.Unary) and e.op == "−":
        return -_number(e.operand, env)
    if isinstance(e, s.Power):
        return _number(e.base, env) ** _number(e.exponent, env)
    if isinstance(e, s.BinOp):
        a, b = _number(e.left, env), _number(e.right, env)
        ops = {"+": a + b, "−": a - b, "·": a * b, " ": a * b, "/": a / b if b else float("nan")}
        if e.op in ops:
            return ops[e.op]
    raise PresetError(e.span, "expected a number")


def preset_values(sig: Signature, preset: str | None, overrides: dict[str, float]) -> dict[str, float]:
    """Hyperparameter values: defaults, then the preset, then overrides; definitions derived."""
    alg = sig.alg
    env: dict[str, float] = {}
    chosen = None
    if preset is not None:
        chosen = next((p for p in alg.presets if p.name == preset), None)
        if chosen is None:
            names = ", ".join(p.name for p in alg.presets) or "none"
            raise PresetError(alg.span, f"'{alg.name}' has no preset '{preset}' (presets: {names})")
    for name, expr in sig.defaults.items():
        env[name] = _number(expr, env)
    for name, expr in chosen.values if chosen else ():
        if name not in sig.hypers:
            raise PresetError(expr.span, f"preset '{preset}' sets '{name}', which is not a "
                                         f"hyperparameter of '{alg.name}'")
        env[name] = _number(expr, env)
    for name, value in overrides.items():
        if name not in sig.hypers:
            raise PresetError(alg.span, f"'{name}' is not a hyperparameter of '{alg.name}'")
        env[name] = value
    for name, dim in sig.definitions.items():
        value = evaluate(dim, env, alg.span)
        if value != int(value):
            raise PresetError(alg.span, f"'{name}' = {dim} is not a whole number ({float(value):g})")
        env[name] = int(value)
    return env


def check_ranges(alg: s.Algorithm, values: dict[str, float]) -> None:
    """Hyperparameter values inside the intervals the card declares (`η ∈ (0, ∞)`)."""
    for d in alg.decls("Hyperparameters"):
        if not (isinstance(d, s.Decl) and isinstance(d.type, s.Interval)):
            continue
        lo, hi = (_number(b, values) for b in (d.type.lo, d.type.hi))
        for name in d.names:
            v = values.get(name)
            if v is None:
                continue
            above = v >= lo if d.type.lo_closed else v > lo
            below = v <= hi if d.type.hi_closed else v < hi
            if not (above and below):
                left, right = "[(" [not d.type.lo_closed], "])" [not d.type.hi_closed]
                shown = [("−∞" if b < 0 else "∞") if abs(b) == float("inf") else f"{b:g}"
                         for b in (lo, hi)]
                raise PresetError(d.span, f"'{name}' = {v:g} lies outside {left}{shown[0]}, "
                                          f"{shown[1]}{right}, where the card declares it")


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
