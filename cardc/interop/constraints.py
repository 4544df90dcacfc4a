"""What a mapping file says a hyperparameter's value must be, beyond what the card declares:
`"constraints": {"H": {"power_of_two": true}, "d_r": {"max": "D / H - 2"}}`.

A card computes some configs of its family only approximately or not at all (ALiBi slopes as
the card writes them hold for a power-of-two head count; a partial rotary card needs a part of
each head that is not turned). The mapping states it; import refuses a config.json outside it,
naming the config key, and export refuses a model outside it. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from . import expr as ex

_KEYS = ("min", "max", "multiple_of", "power_of_two", "one_of")


@dataclass(frozen=True)
class Constraint:
    """The values one hyperparameter may take: `min` ≤ value ≤ `max` (expressions of the
    card's hyperparameters), a whole multiple of `multiple_of`, a power of two, one of
    `one_of`. Each is optional."""
    min: str | None = None
    max: str | None = None
    multiple_of: str | None = None
    power_of_two: bool = False
    one_of: tuple[Fraction, ...] = ()


def parse_constraint(name: str, spec: Any) -> Constraint:
    """One entry of `constraints`; ExprError says what is malformed."""
    if not isinstance(spec, dict) or not spec or set(spec) - set(_KEYS):
        raise ex.ExprError(f"constraint of '{name}' must be an object of "
                           f"{', '.join(repr(k) for k in _KEYS)}")
    exprs = {}
    for key in ("min", "max", "multiple_of"):
        value = spec.get(key)
        if value is None:
            continue
        text = str(value) if type(value) in (int, float) else value
        if not isinstance(text, str):
            raise ex.ExprError(f"constraint of '{name}': '{key}' must be a number or an expression")
        ex.parse(text)
        exprs[key] = text
    power = spec.get("power_of_two", False)
    if not isinstance(power, bool):
        raise ex.ExprError(f"constraint of '{name}': 'power_of_two' must be true or false")
    one_of = spec.get("one_of", [])
    if not isinstance(one_of, list) or (("one_of" in spec) and not one_of):
        raise ex.ExprError(f"constraint of '{name}': 'one_of' must be a non-empty list of numbers")
    return Constraint(exprs.get("min"), exprs.get("max"), exprs.get("multiple_of"), power,
                      tuple(ex.exact(v) for v in one_of))


def names(c: Constraint) -> list[str]:
    """The hyperparameters its bounds read."""
    out: list[str] = []
    for text in (c.min, c.max, c.multiple_of):
        if text is not None:
            out += [n for n in ex.names(ex.parse(text)) if n not in out]
    return out


def violation(c: Constraint, value: Fraction, env: dict[str, Fraction]) -> str | None:
    """What `value` breaks (`a power of two`, `≤ D / H - 2 = 6`), or None; `env` holds the
    hyperparameters the bounds read."""
    def bound(text: str) -> Fraction:
        return ex.evaluate(ex.parse(text), env)

    def shown(text: str) -> str:
        value = ex.number(bound(text))
        return text if text == str(value) else f"{text} = {value}"

    if c.min is not None and value < bound(c.min):
        return f"≥ {shown(c.min)}"
    if c.max is not None and value > bound(c.max):
        return f"≤ {shown(c.max)}"
    if c.multiple_of is not None:
        step = bound(c.multiple_of)
        if step == 0 or (value / step).denominator != 1:
            return f"a whole multiple of {shown(c.multiple_of)}"
    if c.power_of_two and not (value > 0 and value.denominator == 1 and
                               value.numerator & (value.numerator - 1) == 0):
        return "a power of two"
    if c.one_of and value not in c.one_of:
        return f"one of {', '.join(str(ex.number(v)) for v in c.one_of)}"
    return None
