"""Preset values as exact numbers: a card's arithmetic on Fractions, finite and within a float's
range, and the errors a value that gives no model raises, located where the value came from."""

from __future__ import annotations

import difflib
import math
import re
import sys
from fractions import Fraction

from .. import syntax as s
from ..diagnostics import CardError, Diagnostics
from ..spelling import display

LARGEST = Fraction(int(sys.float_info.max))  # generated code holds every value as a float or int
MAX_SIZE = 2**63 - 1  # torch sizes are 64-bit signed integers
MAX_DECIMAL_EXPONENT = 400  # 1e400 is beyond any float: refused before the exact value is built
MAX_POWER_BITS = 1 << 16  # an exact power bigger than this is computed as a float instead
_NUMBER = re.compile(r"(\d*\.?\d*)(?:[eE]([+-]?\d+))?")


class PresetError(Exception):
    """A value a card states (a preset, a default) that does not give a model; located."""

    def __init__(self, span: s.Span, message: str, hint: str | None = None,
                 notes: tuple[tuple[s.Span, str], ...] = ()):
        super().__init__(message)
        self.span, self.message, self.hint, self.notes = span, message, hint, notes

    def card_error(self, sources: dict[str, str]) -> CardError:
        """The located diagnostic a command reports."""
        diags = Diagnostics(sources=sources)
        diags.error(self.span, self.message, self.hint, self.notes)
        return CardError(diags)


class OverrideError(ValueError):
    """A value given on the command line (`--set H=3`, `--steps -3`) that the card refuses."""


class UnknownPreset(ValueError):
    """A preset the command line names (--preset) that the card has not: the flag's error,
    said with the flag, not located in the card, which is not at fault."""

    def __init__(self, card: str, preset: str, names: list[str]):
        close = difflib.get_close_matches(preset, names, n=1, cutoff=0.6)
        guess = f"; did you mean '{close[0]}'?" if close else ""
        listed = ", ".join(names) or "none"
        super().__init__(f"--preset {preset}: '{card}' has no preset '{preset}'{guess} "
                         f"(presets: {listed})")
        self.preset = preset


class _Unknown(PresetError):
    """A name without a value here (a loop variable, an input's length): not checkable yet."""


class _NotNumber(PresetError):
    """An expression that is not arithmetic on numbers (a mask rule passed to a call)."""


# ------------------------------------------------------------------ exact numbers


def _fits(v: Fraction, span: s.Span) -> Fraction:
    if abs(v) > LARGEST:
        raise PresetError(span, f"this value overflows: it is beyond {sys.float_info.max:.4g}, "
                                "the largest number generated code can hold")
    return v


def number(e: s.Expr, env: dict[str, Fraction]) -> Fraction:
    """The exact value of a number written in a card; PresetError for anything else, for ∞, for
    a division by zero and for a value beyond a float's range."""
    if isinstance(e, s.Num):
        return _literal(e)
    if isinstance(e, s.Name):
        if e.id not in env:
            raise _Unknown(e.span, f"'{display(e.id)}' has no value here")
        return env[e.id]
    if isinstance(e, s.Unary) and e.op in ("−", "+"):
        if isinstance(e.operand, s.Num) and e.operand.text == "∞":
            raise PresetError(e.span, f"{e.op}∞ is not a finite number", hint="give a finite value")
        v = number(e.operand, env)
        return -v if e.op == "−" else v
    if isinstance(e, s.Unary) and e.op == "√":
        return _root(number(e.operand, env), e.span)
    if isinstance(e, s.Power):
        return _power(number(e.base, env), number(e.exponent, env), e.span)
    if isinstance(e, s.BinOp) and e.op in ("+", "−", "·", " ", "/"):
        a, b = number(e.left, env), number(e.right, env)
        if e.op == "/" and b == 0:
            raise PresetError(e.span, "division by zero")
        ops = {"+": lambda: a + b, "−": lambda: a - b, "·": lambda: a * b, " ": lambda: a * b,
               "/": lambda: a / b}
        return _fits(ops[e.op](), e.span)
    if isinstance(e, s.Call) and e.func in _STEP_ONLY:
        raise _NotNumber(e.span, f"{_STEP_ONLY[e.func]} is not computed in a hyperparameter's "
                                 "value", hint="a value is a number or arithmetic (+ − · / ^ √) "
                                 "on numbers and names; compute it in a step of the card, as "
                                 "'c ← 2^{⌊log₂ H⌋}'")
    raise _NotNumber(e.span, "expected a number", hint="a value is a number or arithmetic "
                                                        "(+ − · / ^ √) on numbers and names")


# integer math a step computes (cardc/builtins.py) and a value does not, as the card writes it
_STEP_ONLY = {"floor": "⌊·⌋", "ceil": "⌈·⌉", "abs": "|·|", "log2": "log₂", "min": "min",
              "max": "max"}


def _literal(e: s.Num) -> Fraction:
    if e.text == "∞":
        raise PresetError(e.span, "∞ is not a finite number", hint="give a finite value")
    m = _NUMBER.fullmatch(e.text)
    if not m or m.group(1) in ("", "."):
        raise PresetError(e.span, f"'{e.text}' is not a number")
    mantissa = Fraction(m.group(1))
    exp = int(m.group(2) or 0)
    if mantissa and abs(exp) > MAX_DECIMAL_EXPONENT:
        raise PresetError(e.span, f"{e.text} is {'beyond' if exp > 0 else 'below'} the range of "
                                  "the numbers generated code can hold")
    return _fits(mantissa * Fraction(10) ** exp, e.span)


def _root(v: Fraction, span: s.Span) -> Fraction:
    if v < 0:
        raise PresetError(span, "the square root of a negative number")
    n, d = math.isqrt(v.numerator), math.isqrt(v.denominator)
    if n * n == v.numerator and d * d == v.denominator:
        return Fraction(n, d)
    return Fraction(math.sqrt(v))


def _power(base: Fraction, exp: Fraction, span: s.Span) -> Fraction:
    if base == 0:
        if exp < 0:
            raise PresetError(span, "division by zero (0 to a negative power)")
        return Fraction(1) if exp == 0 else Fraction(0)
    size = base.numerator.bit_length() - base.denominator.bit_length()  # ≈ log2 |base|
    if abs(exp) * abs(size) > 1100:  # 2^1100: past the largest float, or an underflow
        raise PresetError(span, "this power overflows: it is beyond the range of the numbers "
                                "generated code can hold")
    bits = abs(exp) * (base.numerator.bit_length() + base.denominator.bit_length())
    if exp.denominator == 1 and bits <= MAX_POWER_BITS:
        return _fits(base ** int(exp), span)
    if base < 0:
        if exp.denominator != 1:
            raise PresetError(span, "a negative number to a fractional power is not a real number")
        return -_power(-base, exp, span) if int(exp) % 2 else _power(-base, exp, span)
    try:
        return _fits(Fraction(math.pow(float(base), float(exp))), span)
    except (OverflowError, ValueError):
        raise PresetError(span, "this power overflows") from None


def _shown(v: Fraction) -> str:
    if v.denominator == 1:
        return str(v.numerator) if abs(v.numerator) < 10**16 else f"{float(v):.4g}"
    den = v.denominator
    for f in (2, 5):
        while den % f == 0:
            den //= f
    if den == 1:  # a decimal fraction: as it was written
        return f"{float(v):.12g}"
    if v.denominator < 10**6 and abs(v.numerator) < 10**12:
        return f"{v.numerator}/{v.denominator}"
    return f"{float(v):.6g}"


def _shown_number(v: float | Fraction) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return _shown(Fraction(v))
