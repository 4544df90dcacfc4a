"""Symbolic dimensions: Laurent polynomials over hyperparameter names with rational coefficients.

`D/H · H == D` holds by construction, so a card may define `d = D/H` and still multiply an
ℝ^{T×H d} matrix with an ℝ^{D×D} one.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

Monomial = tuple[tuple[str, int], ...]  # sorted (symbol, exponent), exponents ≠ 0
_ZERO = Fraction(0)


def _mul_mono(a: Monomial, b: Monomial) -> Monomial:
    exps = dict(a)
    for sym, e in b:
        exps[sym] = exps.get(sym, 0) + e
    return tuple(sorted((s, e) for s, e in exps.items() if e))


@dataclass(frozen=True)
class Dim:
    terms: tuple[tuple[Monomial, Fraction], ...]  # sorted, coefficients ≠ 0

    @staticmethod
    def of(terms: dict[Monomial, Fraction]) -> Dim:
        return Dim(tuple(sorted((m, c) for m, c in terms.items() if c)))

    @staticmethod
    def sym(name: str) -> Dim:
        return Dim((((((name, 1),)), Fraction(1)),))

    @staticmethod
    def const(value: int | Fraction) -> Dim:
        return Dim.of({(): Fraction(value)})

    def __add__(self, other: Dim) -> Dim:
        terms = dict(self.terms)
        for m, c in other.terms:
            terms[m] = terms.get(m, _ZERO) + c
        return Dim.of(terms)

    def __neg__(self) -> Dim:
        return Dim(tuple((m, -c) for m, c in self.terms))

    def __sub__(self, other: Dim) -> Dim:
        return self + (-other)

    def __mul__(self, other: Dim) -> Dim:
        terms: dict[Monomial, Fraction] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = _mul_mono(m1, m2)
                terms[m] = terms.get(m, _ZERO) + c1 * c2
        return Dim.of(terms)

    def __truediv__(self, other: Dim) -> Dim | None:
        """Exact division by a single term; None when the divisor is a sum."""
        if len(other.terms) != 1:
            return self if other == Dim.const(1) else None
        (mono, coef), = other.terms
        inverse = tuple((s, -e) for s, e in mono)
        return self * Dim.of({inverse: 1 / coef})

    @property
    def symbols(self) -> set[str]:
        return {s for m, _ in self.terms for s, _ in m}

    def constant(self) -> Fraction | None:
        if not self.terms:
            return Fraction(0)
        if len(self.terms) == 1 and self.terms[0][0] == ():
            return self.terms[0][1]
        return None

    def evaluate(self, env: dict[str, int | float]) -> Fraction:
        total = Fraction(0)
        for mono, coef in self.terms:
            value = Fraction(coef)
            for sym, e in mono:
                if sym not in env:
                    raise KeyError(sym)
                value *= Fraction(env[sym]) ** e
            total += value
        return total

    def __str__(self) -> str:
        """`d_r − 1`, `d/2`, `3 D/(2 H)`: terms with symbols first, the constant last."""
        if not self.terms:
            return "0"
        terms = sorted(self.terms, key=lambda t: t[0] == ())
        parts = []
        for i, (mono, coef) in enumerate(terms):
            body = _term_text(mono, abs(coef))
            if i == 0:
                parts.append(("−" if coef < 0 else "") + body)
            else:
                parts.append(f" {'−' if coef < 0 else '+'} {body}")
        return "".join(parts)


def _term_text(mono: Monomial, mag: Fraction) -> str:
    num = [s if e == 1 else f"{s}^{e}" for s, e in mono if e > 0]
    den = [s if e == -1 else f"{s}^{-e}" for s, e in mono if e < 0]
    if mag.denominator != 1:
        den.insert(0, str(mag.denominator))
    top = ([str(mag.numerator)] if mag.numerator != 1 or not num else []) + num
    body = " ".join(top)
    if den:
        body += "/" + (den[0] if len(den) == 1 else "(" + " ".join(den) + ")")
    return body


ONE = Dim.const(1)


def solve(want: Dim, got: Dim, unknowns: set[str]) -> tuple[str, Dim] | None:
    """The one unknown of `want = got`, where it can be read off exactly: `want` holds one
    symbol of `unknowns`, in one term, to the power 1 or −1 (`3 d = 3 D/H` gives d = D/H,
    `d_r + e = d` gives e = d − d_r). None when there is no such unknown."""
    present = want.symbols & unknowns
    if len(present) != 1:
        return None
    (sym,) = present
    terms = [(m, c) for m, c in want.terms if any(s == sym for s, _ in m)]
    if len(terms) != 1:
        return None
    (mono, coef), = terms
    power = dict(mono)[sym]
    if power not in (1, -1):
        return None
    rest = Dim.of({m: c for m, c in want.terms if m != mono})
    factor = Dim.of({tuple((s, e) for s, e in mono if s != sym): coef})
    value = (got - rest) / factor  # a single term: exact
    if value is None:
        return None
    if power == -1:
        value = ONE / value if value.terms else None
    return (sym, value) if value is not None else None

