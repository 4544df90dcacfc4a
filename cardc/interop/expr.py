"""The arithmetic a mapping file may write: `head_dim * partial_rotary_factor`, `pad_token_id + 1`.

A tiny parser of its own (never `eval`): numbers, names (config keys, dotted for nested objects:
`rope_parameters.partial_rotary_factor`; or card hyperparameters), `+ - * /` (also `−`, `·`,
`×`), `//`, parentheses and `min(a, b)`, `max(a, b)`. Values are exact fractions: a config's
0.4 is 4/10, read from its shortest decimal spelling as JSON wrote it, so `20 * 0.4` is 8 and not
8.000000000000002, and solving back gives 0.4 to the bit. An expression is inverted for one of
its names (`d_r = head_dim * partial_rotary_factor` → `partial_rotary_factor = d_r / head_dim`)
when that name occurs once and only under `+ - * /`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from fractions import Fraction

Number = int | float


class ExprError(ValueError):
    """An expression that does not parse, or cannot be evaluated or solved; the message says why."""


@dataclass(frozen=True)
class Num:
    value: Fraction


@dataclass(frozen=True)
class Name:
    name: str


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * / //
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Call:
    fn: str  # min, max
    args: tuple[Expr, ...]


Expr = Num | Name | BinOp | Call

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)"
                    r"|(?P<name>[^\W\d]\w*(?:\.[^\W\d]\w*)*)"
                    r"|(?P<op>//|[-+*/(),−·×]))")
_SPELLING = {"−": "-", "·": "*", "×": "*"}
_FUNCTIONS = ("min", "max")


MAX_TOKENS = 200  # far beyond any mapping's arithmetic; keeps every walk over it shallow
MAX_DIGITS = 30  # a literal's digits and exponent: sizes and factors, not 10^(10^9)


def parse(text: str) -> Expr:
    """The expression `text`; an ExprError says what is wrong and where."""
    tokens = _tokens(text)
    if len(tokens) > MAX_TOKENS:
        raise ExprError(f"'{_shown(text[:40])}…' is too long (more than {MAX_TOKENS} tokens)")
    parser = _Parser(tokens, text)
    expr = parser.sum()
    if parser.pos < len(tokens):
        raise ExprError(f"unexpected '{tokens[parser.pos]}' in '{_shown(text)}'")
    return expr


def _shown(text: str) -> str:
    """`text` for a one-line message: a line break or other control character escaped."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise ExprError(f"unexpected '{_shown(text[pos:].strip()[0])}' in '{_shown(text)}'")
        tok = m.group("num") or m.group("name") or m.group("op")
        if m.group("num") and _too_big(tok):
            raise ExprError(f"the number '{tok[:20]}{'…' if len(tok) > 20 else ''}' in "
                            f"'{_shown(text[:40])}' is too large (at most {MAX_DIGITS} digits and an "
                            f"exponent of at most {MAX_DIGITS})")
        out.append(_SPELLING.get(tok, tok))
        pos = m.end()
    if not out:
        raise ExprError("empty expression")
    return out


def _too_big(num: str) -> bool:
    """Whether a literal has more digits, or a larger exponent, than MAX_DIGITS."""
    mantissa, _, exponent = num.lower().partition("e")
    return len(mantissa) > MAX_DIGITS + 1 or len(exponent.lstrip("+-")) > 2 or \
        abs(int(exponent or 0)) > MAX_DIGITS


class _Parser:
    """Recursive descent: sum := product (('+'|'-') product)*; product := unary (('*'|'/'|'//')
    unary)*; unary := '-' unary | atom; atom := number | name | fn '(' sum, sum ')' | '(' sum ')'."""

    def __init__(self, tokens: list[str], text: str) -> None:
        self.tokens, self.text, self.pos = tokens, text, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            found = "the end" if tok is None else f"'{tok}'"
            raise ExprError(f"expected {want or 'a value'} but found {found} in '{_shown(self.text)}'")
        self.pos += 1
        return tok

    def sum(self) -> Expr:
        left = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            left = BinOp(op, left, self.product())
        return left

    def product(self) -> Expr:
        left = self.unary()
        while self.peek() in ("*", "/", "//"):
            op = self.take()
            left = BinOp(op, left, self.unary())
        return left

    def unary(self) -> Expr:
        if self.peek() == "-":
            self.take()
            return BinOp("-", Num(Fraction(0)), self.unary())
        return self.atom()

    def atom(self) -> Expr:
        tok = self.take()
        if tok == "(":
            inner = self.sum()
            self.take(")")
            return inner
        if tok[0].isdigit() or tok[0] == ".":
            return Num(Fraction(tok))
        if tok[0].isalpha() or tok[0] == "_":
            if tok in _FUNCTIONS:
                self.take("(")
                args = [self.sum()]
                while self.peek() == ",":
                    self.take()
                    args.append(self.sum())
                self.take(")")
                return Call(tok, tuple(args))
            return Name(tok)
        raise ExprError(f"unexpected '{tok}' in '{_shown(self.text)}'")


def names(expr: Expr) -> list[str]:
    """The names `expr` reads, each once, in order."""
    if isinstance(expr, Name):
        return [expr.name]
    children = (expr.left, expr.right) if isinstance(expr, BinOp) else \
        expr.args if isinstance(expr, Call) else ()
    out: list[str] = []
    for child in children:
        out += [n for n in names(child) if n not in out]
    return out


def exact(value: Number) -> Fraction:
    """A number as the fraction its shortest decimal spelling names (0.4 → 2/5)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ExprError(f"{value!r} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ExprError(f"{value!r} is not a finite number")
    return Fraction(value) if isinstance(value, int) else Fraction(repr(value))


def number(value: Fraction) -> Number:
    """A fraction as JSON writes it: an int when whole, else the nearest float."""
    return int(value) if value.denominator == 1 else float(value)


def evaluate(expr: Expr, env: dict[str, Fraction]) -> Fraction:
    """`expr` with every name's value from `env` (a missing one raises KeyError)."""
    if isinstance(expr, Num):
        return expr.value
    if isinstance(expr, Name):
        return env[expr.name]
    if isinstance(expr, Call):
        values = [evaluate(a, env) for a in expr.args]
        return min(values) if expr.fn == "min" else max(values)
    a, b = evaluate(expr.left, env), evaluate(expr.right, env)
    if expr.op in ("/", "//") and b == 0:
        raise ExprError(f"division by zero in '{render(expr)}'")
    if expr.op == "+":
        return a + b
    if expr.op == "-":
        return a - b
    if expr.op == "*":
        return a * b
    return a / b if expr.op == "/" else Fraction(a // b)


def solvable(expr: Expr, name: str) -> str | None:
    """Why `expr` cannot be solved for `name`, or None when it can."""
    count = _count(expr, name)
    if count != 1:
        return f"'{name}' occurs {count} times" if count else f"it does not read '{name}'"
    node = expr
    while not isinstance(node, Name):
        if not isinstance(node, BinOp) or node.op == "//":
            return f"'{name}' is inside {'//' if isinstance(node, BinOp) else node.fn + '()'}"
        node = node.left if _count(node.left, name) else node.right
    return None


def solve(expr: Expr, name: str, value: Fraction, env: dict[str, Fraction]) -> Fraction:
    """The value of `name` for which `expr` equals `value`, the other names from `env`.
    `solvable(expr, name)` must be None."""
    node = expr
    while not isinstance(node, Name):
        assert isinstance(node, BinOp)
        left_has = _count(node.left, name) > 0
        other = evaluate(node.right if left_has else node.left, env)
        value = _undo(node.op, value, other, left_has, node)
        node = node.left if left_has else node.right
    return value


def _undo(op: str, value: Fraction, other: Fraction, left: bool, node: BinOp) -> Fraction:
    """x from `x op other = value` (left) or `other op x = value`."""
    if op == "+":
        return value - other
    if op == "-":
        return value + other if left else other - value
    if op == "/" and left:
        return value * other
    divisor = other if op == "*" else value  # x · other = value, or other / x = value
    if divisor == 0:
        raise ExprError(f"'{render(node)}' = {number(value)} has no unique solution")
    return value / other if op == "*" else other / value


def _count(expr: Expr, name: str) -> int:
    if isinstance(expr, Name):
        return int(expr.name == name)
    if isinstance(expr, BinOp):
        return _count(expr.left, name) + _count(expr.right, name)
    return sum(_count(a, name) for a in expr.args) if isinstance(expr, Call) else 0


def render(expr: Expr) -> str:
    """`expr` in the mapping file's spelling, fully parenthesised below the top."""
    if isinstance(expr, Num):
        return str(number(expr.value))
    if isinstance(expr, Name):
        return expr.name
    if isinstance(expr, Call):
        return f"{expr.fn}({', '.join(render(a) for a in expr.args)})"
    wrap = lambda e: render(e) if isinstance(e, (Num, Name, Call)) else f"({render(e)})"  # noqa: E731
    return f"{wrap(expr.left)} {expr.op} {wrap(expr.right)}"
