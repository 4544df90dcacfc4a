"""Preset values, evaluated exactly and checked through every card a card calls.

A card's hyperparameters take values from its defaults, then a preset, then the command line.
`check` evaluates every preset here so that whatever it accepts also builds: numbers are exact
(Fractions), finite and within a float's range; ℕ hyperparameters are whole numbers; every size the
card or a card it calls derives from them (D/H, the shape of every parameter and of every step's
value that the values determine, each family's count) is a positive whole number; scalars lie
inside the interval the card declares. A problem is reported where the value came from: the
preset value, the preset's name for a derived size (with a note at the declaration that derives
it), or the command-line flag.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING

from . import syntax as s
from .diagnostics import CardError, Diagnostics
from .dims import Dim
from .render.text import render_expr
from .spelling import display
from .types import BundleTy, Entry, FamilyTy, Ty

if TYPE_CHECKING:
    from .checker import Checker, RunValue, Signature

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
    raise _NotNumber(e.span, "expected a number", hint="a value is a number or arithmetic "
                                                        "(+ − · / ^ √) on numbers and names")


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


# ------------------------------------------------------------------ where values come from


@dataclass
class _Values:
    """Values of one card's hyperparameters, and the root hyperparameters each depends on."""

    env: dict[str, Fraction] = field(default_factory=dict)
    deps: dict[str, frozenset[str]] = field(default_factory=dict)

    def set(self, name: str, value: Fraction, deps: frozenset[str]) -> None:
        self.env[name], self.deps[name] = value, deps

    def deps_of(self, symbols: set[str]) -> frozenset[str]:
        return frozenset().union(*(self.deps.get(x, frozenset()) for x in symbols))


@dataclass
class _Source:
    """Who set the root card's values: a preset (its values' spans), the command line."""

    alg: s.Algorithm
    sources: dict[str, str]
    preset: s.Preset | None = None
    spans: dict[str, s.Span] = field(default_factory=dict)  # preset-set name → its value's span
    flags: dict[str, str] = field(default_factory=dict)  # overridden name → the flag that set it
    notices: list[str] = field(default_factory=list)  # values changed to follow a flag's

    def blame(self, deps: frozenset[str], message: str, note: tuple[s.Span, str] | None,
              direct: str | None = None) -> Exception:
        """The error for a problem in a quantity computed from the root values `deps`."""
        flags = [self.flags[n] for n in self.flags if n in deps]
        if flags:
            where = f" ({note[1]} at {_path(note[0].file)}:{note[0].line})" if note else ""
            return OverrideError(f"{flags[0]}: {message}{where}")
        notes = (note,) if note and note[0] != s.NOWHERE else ()
        if direct is not None and direct in self.spans and deps <= {direct}:
            return PresetError(self.spans[direct], message, notes=notes)
        if self.preset is not None and deps & set(self.spans):
            return PresetError(_name_span(self.preset, self.sources), message, notes=notes)
        if notes:  # the card's own defaults: blame the declaration
            return PresetError(notes[0][0], message)
        return PresetError(self.alg.span, message)


def _path(path: str) -> str:
    """A path relative to the working directory when it lies below it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _name_span(preset: s.Preset, sources: dict[str, str]) -> s.Span:
    """The span of the preset's name on its `Preset NAME:` line."""
    sp = preset.span
    lines = sources.get(sp.file, "").splitlines()
    if 0 < sp.line <= len(lines):
        at = lines[sp.line - 1].find(preset.name, sp.col - 1)
        if at >= 0:
            return s.Span(sp.file, sp.line, at + 1, sp.line, at + 1 + len(preset.name))
    return sp


def _value_name_span(expr: s.Expr, sources: dict[str, str]) -> s.Span:
    """The span of NAME in `NAME = value` on a preset line, read off the source text."""
    sp = expr.span
    lines = sources.get(sp.file, "").splitlines()
    if not 0 < sp.line <= len(lines):
        return sp
    text = lines[sp.line - 1][:sp.col - 1].rstrip()
    if not text.endswith("="):
        return sp
    end = len(text[:-1].rstrip())
    start, depth = end, 0
    while start > 0:
        c = text[start - 1]
        depth += (c == "}") - (c == "{")
        if depth == 0 and (c in ",:" or c.isspace()):
            break
        start -= 1
    return s.Span(sp.file, sp.line, start + 1, sp.line, end + 1) if start < end else sp


# ------------------------------------------------------------------ one card's values


def _declared(alg: s.Algorithm) -> dict[str, s.Span]:
    """Every name the card declares (hyperparameters, inputs, outputs, parameters) → its line."""
    out: dict[str, s.Span] = {}

    def go(item: s.Item) -> None:
        if isinstance(item, s.Decl):
            for n in item.names:
                out.setdefault(n, item.span)
        for sub in getattr(item, "items", ()):
            go(sub)
        name = getattr(item, "name", None)
        if isinstance(item, s.Bundle) and name:
            out.setdefault(name, item.span)

    for block in alg.blocks:
        for item in block.items:
            go(item)
    return out


def _natural(name: str, v: Fraction, span_problem) -> None:
    if v.denominator != 1 or v < 0:
        raise span_problem(f"'{display(name)}' ∈ ℕ is {_shown(v)}, not a whole number ≥ 0")
    if v > MAX_SIZE:
        raise span_problem(f"'{display(name)}' = {_shown(v)} is too large for a size "
                           f"(at most 2^63 − 1)")


def _own_values(sig: Signature, src: _Source, preset: s.Preset | None,
                overrides: dict[str, float]) -> _Values:
    """The root card's values: defaults, then the preset, then the overrides; then definitions."""
    vals = _Values()
    declared = _declared(sig.alg)
    for name, expr in sig.defaults.items():
        vals.set(name, number(expr, vals.env), frozenset())
    seen: dict[str, s.Expr] = {}
    for name, expr in preset.values if preset else ():
        where = _value_name_span(expr, src.sources)
        if name in seen:
            raise PresetError(where, f"preset '{preset.name}' sets '{display(name)}' twice",
                              notes=((seen[name].span, "first set here"),))
        seen[name] = expr
        if name in sig.run:
            continue  # the run's own values: run_values reads them
        if name not in sig.hypers:
            raise PresetError(where, f"preset '{preset.name}' sets '{display(name)}', which is "
                                     f"not a hyperparameter of '{sig.alg.label}'",
                              hint=_known(sig))
        if name in sig.definitions:
            raise PresetError(where, f"'{display(name)}' = {display(str(sig.definitions[name]))} "
                                     "is derived, not set",
                              hint=f"set {', '.join(map(display, sorted(sig.definitions[name].symbols)))} instead")
        src.spans[name] = expr.span
        vals.set(name, number(expr, vals.env), frozenset({name}))
    stated = dict(vals.env)  # the card's own values, before the command line's
    for name, value in overrides.items():
        flag = src.flags.setdefault(name, f"{display(name)}={_shown_number(value)}")
        if name not in sig.hypers:
            raise OverrideError(f"{flag}: '{display(name)}' is not a hyperparameter of "
                                f"'{sig.alg.label}' ({_known(sig)})")
        if name in sig.definitions:
            raise OverrideError(f"{flag}: '{display(name)}' = "
                                f"{display(str(sig.definitions[name]))} is derived, not set")
        if isinstance(value, float) and not math.isfinite(value):
            raise OverrideError(f"{flag}: {value} is not a finite number")
        try:
            exact = _fits(Fraction(value), s.NOWHERE)
        except PresetError:
            raise OverrideError(f"{flag}: {_shown_number(value)} overflows") from None
        vals.set(name, exact, frozenset({name}))
    for name, value in vals.env.items():
        if sig.hypers.get(name, Ty()).elem == "ℕ" and name not in sig.definitions:
            decl = declared.get(name)
            _natural(name, value, lambda m, n=name, d=decl: src.blame(
                vals.deps[n], m, (d, f"'{display(n)}' declared") if d else None, direct=n))
    _follow_bounds(sig, vals, stated, src)
    _define(sig, vals, src, declared)
    return vals


def run_values(sig: Signature, preset: s.Preset | None, overrides: dict[str, str],
               flags: dict[str, str] | None = None) -> dict[str, int | str]:
    """The values of the card's seed and number formats: defaults, then the preset, then the
    overrides (as typed; `flags` names each one's flag). A value without a default or a preset
    is left out: the run chooses it."""
    out: dict[str, int | str] = {n: v.default for n, v in sig.run.items() if v.default is not None}
    for name, expr in preset.values if preset else ():
        value = sig.run.get(name)
        if value is not None:
            out[name] = _run_value(name, value, expr, lambda m, e=expr: PresetError(e.span, m))
    for name, text in overrides.items():
        flag = (flags or {}).get(name, f"--set {display(name)}={text}")
        value = sig.run.get(name)
        if value is None:
            raise OverrideError(f"{flag}: '{display(name)}' is not a seed or a number format of "
                                f"'{sig.alg.label}'")
        out[name] = _run_value(name, value, _typed_text(text),
                               lambda m, f=flag: OverrideError(f"{f}: {m}"))
    return out


def _typed_text(text: str) -> s.Expr:
    text = text.strip()
    return s.Num(text) if text.isdigit() else s.Name(text)


def _run_value(name: str, value: RunValue, expr: s.Expr, problem) -> int | str:
    if value.seed:
        if not isinstance(expr, s.Num) or not expr.text.isdigit():
            raise problem(f"the seed '{display(name)}' is a whole number ≥ 0, not "
                          f"{render_expr(expr)}")
        if int(expr.text) > MAX_SIZE:
            raise problem(f"the seed '{display(name)}' = {expr.text} is beyond 2^63 − 1")
        return int(expr.text)
    if not isinstance(expr, s.Name) or expr.id not in value.formats:
        raise problem(f"'{display(name)}' is one of {{{', '.join(value.formats)}}}, not "
                      f"{render_expr(expr)}")
    return expr.id


def _follow_bounds(sig: Signature, vals: _Values, stated: dict[str, Fraction],
                   src: _Source) -> None:
    """A value the card states (a preset's, a default) whose type bounds it by another
    hyperparameter, `N_warmup ∈ {0..N_steps}`, keeps its share of that bound when a flag moves
    the bound below it: a shorter run's warm-up shrinks with the run, and a notice says so. A
    value a flag sets is not moved: outside its bound it is an error naming the flag (_ranges)."""
    for d in sig.alg.decls("Hyperparameters"):
        bound = _named_bound(d, sig)
        if bound is None or bound not in src.flags or not stated.get(bound):
            continue
        for name in d.names:
            old, limit = vals.env.get(name), vals.env[bound]
            if name in src.flags or old is None or old <= limit:
                continue
            new = old * limit / stated[bound]
            if sig.hypers[name].elem == "ℕ":
                new = Fraction(math.ceil(new))
            vals.set(name, new, vals.deps.get(name, frozenset()) | vals.deps[bound])
            n, b = display(name), display(bound)
            src.notices.append(
                f"{src.flags[bound]} makes {b} = {_shown(limit)} < {n} = {_shown(old)}, which "
                f"the card bounds by {b} ({n} ∈ {render_expr(d.type)}): {n} is scaled with it, "
                f"from {_shown(old)} of {_shown(stated[bound])} to {_shown(new)} of "
                f"{_shown(limit)}; set it with --set {n}=VALUE")


def _named_bound(d: s.Item, sig: Signature) -> str | None:
    """The hyperparameter a declaration's type bounds its names by: N_steps of
    `N_warmup ∈ {0..N_steps}` or `∈ [0, N_steps]`."""
    t = d.type if isinstance(d, s.Decl) else None
    hi = t.hi if isinstance(t, s.IntRange | s.Interval) else None
    return hi.id if isinstance(hi, s.Name) and hi.id in sig.hypers else None


def _known(sig: Signature) -> str:
    names = [display(n) for item in sig.alg.decls("Hyperparameters") if isinstance(item, s.Decl)
             for n in item.names if n not in sig.definitions]
    return f"its hyperparameters: {', '.join(names)}" if names else "it has no hyperparameters"


def _define(sig: Signature, vals: _Values, src: _Source, declared: dict[str, s.Span]) -> None:
    """Derived hyperparameters (d = D/H): positive whole numbers."""
    for name, dim in sig.definitions.items():
        value = _dim_value(dim, vals)
        if value is None:
            continue
        note = (declared.get(name, sig.alg.span), f"{display(name)} = {display(str(dim))} "
                                                  f"in '{sig.alg.label}'")
        _positive(f"{display(name)} = {display(str(dim))}", dim, value, vals, src, note)
        vals.set(name, value, vals.deps_of(dim.symbols))


class _Divides(Exception):
    """A size divides by a value that is 0 (d = D/H at H = 0)."""

    def __init__(self, dim: Dim, symbol: str, vals: _Values):
        super().__init__(symbol)
        self.dim, self.symbol, self.vals = dim, symbol, vals


def _dim_value(dim: Dim, vals: _Values) -> Fraction | None:
    if not dim.symbols <= set(vals.env):
        return None  # a size known only at run time (T, |x|), or a loop variable
    for mono, _ in dim.terms:
        for sym, e in mono:
            if e < 0 and vals.env[sym] == 0:
                raise _Divides(dim, sym, vals)
    return dim.evaluate(vals.env)


def _positive(what: str, dim: Dim, value: Fraction, vals: _Values, src: _Source,
              note: tuple[s.Span, str]) -> None:
    if value.denominator == 1 and 0 < value <= MAX_SIZE:
        return
    bare = len(dim.symbols) == 1 and dim == Dim.sym(next(iter(dim.symbols)))
    given = "" if bare else " (" + ", ".join(f"{display(x)} = {_shown(vals.env[x])}"
                                             for x in sorted(dim.symbols)) + ")"
    if value.denominator != 1:
        problem = "is not a whole number"
    elif value <= 0:
        problem = "is not positive: a size is at least 1"
    else:
        problem = "is too large for a size (at most 2^63 − 1)"
    ratio = f"{value.numerator}/{value.denominator}" if value.denominator < 10**6 and \
        abs(value.numerator) < 10**12 and value.denominator != 1 else _shown(value)
    raise src.blame(vals.deps_of(dim.symbols), f"{what} = {ratio}{given} {problem}",
                    note, direct=next(iter(dim.symbols)) if bare else None)


# ------------------------------------------------------------------ through the calls


class _Walk:
    """Checks one root card's values, and every card it calls at the values the call gives."""

    def __init__(self, checker: Checker, src: _Source, cache: dict | None = None):
        self.checker, self.src = checker, src
        self.cache = cache if cache is not None else {}
        self.seen: set[tuple[int, tuple]] = set()

    def card(self, alg: s.Algorithm, vals: _Values) -> None:
        key = (id(alg), tuple(sorted(vals.env.items())))
        info = self.checker.infos.get(id(alg))
        if key in self.seen or info is None:
            return
        self.seen.add(key)
        declared = _declared(alg)
        self.ranges(alg, vals, declared)
        self.entries(info.sig, vals, declared)
        self.steps(alg, info, vals)
        for call in info.calls.values():
            callee = self.checker.infos.get(id(call.callee))
            if callee is not None:
                self.card(call.callee, self.callee_values(call, callee.sig, vals))

    def ranges(self, alg: s.Algorithm, vals: _Values, declared: dict[str, s.Span]) -> None:
        _ranges(alg, vals, declared, self.src)

    def entries(self, sig: Signature, vals: _Values, declared: dict[str, s.Span]) -> None:
        """The card's own declared tensors: every size positive, every parameter's count too."""
        named = [*sig.inputs, *((o, sig.output) for o in sig.alg.outputs[:1]),
                 *sig.tree.members.items()]
        for name, entry in named:
            if name in declared and entry is not None:
                self.entry(name, entry, vals, declared, sig.alg)

    def entry(self, name: str, entry: Entry, vals: _Values, declared: dict[str, s.Span],
              alg: s.Algorithm) -> None:
        note = (declared.get(name, alg.span), f"{display(name)} in '{alg.label}'")
        if isinstance(entry, FamilyTy):
            self.size(entry.over, vals, note)
            self.entry(name, entry.entry, vals, declared, alg)
        elif isinstance(entry, BundleTy) and entry.card is None:  # adopted: its card checks it
            for sub, e in entry.members.items():
                if sub in declared:
                    self.entry(sub, e, vals, declared, alg)
        elif isinstance(entry, Ty):
            for d in (entry.vocab, *entry.shape):
                if d is not None:
                    self.size(d, vals, note)
            sizes = [_dim_value(d, vals) if d is not None else 1 for d in entry.shape]
            total = math.prod(int(v) for v in sizes if v is not None)
            if total > MAX_SIZE:
                symbols = {x for d in entry.shape if d is not None for x in d.symbols}
                raise self.src.blame(vals.deps_of(symbols), f"{display(name)} would hold "
                                     f"{total:.4g} numbers, more than a tensor can", note)

    def size(self, d: Dim, vals: _Values, note) -> Fraction | None:
        """A size the values determine: a positive whole number. `note` is (span, text), or
        a function giving it, called only for a problem."""
        value = _dim_value(d, vals)
        if value is None or not d.symbols:
            return value  # unknown here, or a constant the checker already judged
        if value.denominator != 1 or not 0 < value <= MAX_SIZE:
            _positive(display(str(d)), d, value, vals, self.src, note() if callable(note) else note)
        return value

    def steps(self, alg: s.Algorithm, info, vals: _Values) -> None:
        """The shape of every value a step computes, where the values determine it."""
        for d, node, ty in _step_shapes(alg, info, self.cache):
            self.size(d, vals, lambda n=node, ty=ty: (n.span, f"a value of shape {ty} in "
                                                               f"'{alg.label}'"))

    def callee_values(self, call, sig: Signature, caller: _Values) -> _Values:
        """The callee's hyperparameters: bound through shapes, by name (`ε = ε`), inherited
        from the caller's of the same name, or the callee's defaults."""
        vals = _Values()
        for sym, dim in call.bind.items():
            value = _dim_value(dim, caller)
            if value is not None:
                vals.set(sym, value, caller.deps_of(dim.symbols))
        for name, arg in call.hypers.items():
            if name in vals.env or not (isinstance(arg, s.Arg) and arg.op == "="
                                        and isinstance(arg.target, s.Name)):
                continue
            try:
                vals.set(name, number(arg.value, caller.env),
                         caller.deps_of({n.id for n in s.nodes(arg.value)
                                         if isinstance(n, s.Name)}))
            except (_Unknown, _NotNumber):
                continue
        for name in sig.hypers:
            if name not in vals.env and name in caller.env:
                vals.set(name, caller.env[name], caller.deps[name])
        for name, expr in sig.defaults.items():
            if name not in vals.env:
                try:
                    vals.set(name, number(expr, vals.env), frozenset())
                except (_Unknown, _NotNumber):
                    continue
        _define(sig, vals, self.src, _declared(sig.alg))
        return vals


def _step_shapes(alg: s.Algorithm, info, cache: dict) -> list[tuple[Dim, object, Ty]]:
    """Each distinct size of a value the card's steps compute, with the first node of it."""
    if id(alg) not in cache:
        found: dict[Dim, tuple[Dim, object, Ty]] = {}
        for node in s.nodes(alg.steps):
            ty = info.types.get(id(node))
            if isinstance(ty, Ty):
                for d in ty.shape:
                    if d is not None and d.symbols and d not in found:
                        found[d] = (d, node, ty)
        cache[id(alg)] = list(found.values())
    return cache[id(alg)]


def _ranges(alg: s.Algorithm, vals: _Values, declared: dict[str, s.Span], src: _Source) -> None:
    """Scalars inside the intervals the card declares (`η ∈ (0, ∞)`)."""
    for name, (lo, hi, text, bounds) in _intervals(alg, vals.env).items():
        v = vals.env.get(name)
        if v is None:
            continue
        lo_ok = lo is None or (v >= lo[0] if lo[1] else v > lo[0])
        hi_ok = hi is None or (v <= hi[0] if hi[1] else v < hi[0])
        if not (lo_ok and hi_ok):  # blamed on whoever set the value, or a bound it names
            note = (declared.get(name, alg.span), f"'{display(name)}' ∈ {text} in '{alg.label}'")
            deps = vals.deps.get(name, frozenset()) | vals.deps_of(bounds)
            raise src.blame(deps, f"'{display(name)}' = {_shown(v)} lies outside {text}, where "
                            "the card declares it", note, direct=name)


def _intervals(alg: s.Algorithm, env: dict[str, Fraction]) -> dict[str, tuple]:
    """`η ∈ (0, ∞)`: name → ((lo, closed) or None for −∞, (hi, closed) or None for ∞, text,
    the names its ends are written with)."""
    out = {}
    for d in alg.decls("Hyperparameters"):
        written = d.type if isinstance(d, s.Decl) else None
        if isinstance(d, s.Decl) and isinstance(d.type, s.IntRange):  # {0..V}: [0, V]
            d = replace(d, type=s.Interval(d.type.lo, d.type.hi, True, True))
        if not (isinstance(d, s.Decl) and isinstance(d.type, s.Interval)):
            continue
        t = d.type
        try:
            lo, hi = _bound(t.lo, env), _bound(t.hi, env)
        except PresetError:
            continue
        text = (("[" if t.lo_closed else "(") + (_shown(lo) if lo is not None else "−∞") + ", "
                + (_shown(hi) if hi is not None else "∞") + ("]" if t.hi_closed else ")"))
        bounds = {n.id for n in s.nodes((t.lo, t.hi)) if isinstance(n, s.Name)}
        if bounds:  # [0, 40] ({0..N_steps}): the values, then the bounds as written
            text = f"{text} ({render_expr(written)})"
        for name in d.names:
            out[name] = ((lo, t.lo_closed) if lo is not None else None,
                         (hi, t.hi_closed) if hi is not None else None, text, bounds)
    return out


def _bound(e: s.Expr, env: dict[str, Fraction]) -> Fraction | None:
    """An interval's end: a number, or None for ±∞."""
    inner = e.operand if isinstance(e, s.Unary) and e.op in ("−", "+") else e
    if isinstance(inner, s.Num) and inner.text == "∞":
        return None
    return number(e, env)


# ------------------------------------------------------------------ entry points


def find_preset(alg: s.Algorithm, preset: str | None) -> s.Preset | None:
    """The preset of `alg` named `preset` (None for none); a name it lacks is an error."""
    if preset is None:
        return None
    chosen = next((p for p in alg.presets if p.name == preset), None)
    if chosen is None:
        names = ", ".join(p.name for p in alg.presets) or "none"
        raise PresetError(alg.span, f"'{alg.name}' has no preset '{preset}' (presets: {names})")
    return chosen


def validate(checker: Checker, alg: s.Algorithm, preset: str | None = None,
             overrides: dict[str, float] | None = None,
             flags: dict[str, str] | None = None, cache: dict | None = None,
             notices: list[str] | None = None) -> dict[str, Fraction]:
    """The values of `alg`'s hyperparameters at `preset` and `overrides`, checked through every
    card it calls. Raises PresetError for the card's own values (located), OverrideError naming
    the flag (`flags`: hyperparameter → the flag as typed) for values from the command line.
    A stated value that follows a flag's (a warm-up bounded by the run) adds to `notices`."""
    sig = checker.infos[id(alg)].sig if id(alg) in checker.infos else checker.info(alg).sig
    chosen = find_preset(alg, preset)
    src = _Source(alg, checker.diags.sources, chosen, flags=dict(flags or {}),
                  notices=notices if notices is not None else [])
    try:
        vals = _own_values(sig, src, chosen, dict(overrides or {}))
        _Walk(checker, src, cache).card(alg, vals)
    except _Divides as err:
        raise src.blame(err.vals.deps_of({err.symbol}), f"{display(err.symbol)} = 0 divides "
                        f"the size {display(str(err.dim))}", None, direct=err.symbol) from None
    return vals.env


def check_presets(checker: Checker) -> None:
    """Every card's defaults and presets, as `check` sees them: each problem a diagnostic."""
    cache: dict = {}  # each card's step shapes, read once
    for card_file in checker.lib.files:
        for alg in card_file.algorithms:
            if id(alg) in checker.infos:
                for problem in _card_problems(checker, alg, cache):
                    checker.diags.error(problem.span, problem.message, problem.hint,
                                        problem.notes)


def _card_problems(checker: Checker, alg: s.Algorithm, cache: dict) -> Iterator[PresetError]:
    names: dict[str, s.Preset] = {}
    for p in alg.presets:
        if p.name in names:
            yield PresetError(_name_span(p, checker.diags.sources),
                              f"a preset named '{p.name}' is already defined",
                              notes=((names[p.name].span, "first defined here"),))
            continue
        names[p.name] = p
    for name in (None, *names):
        try:
            validate(checker, alg, name, cache=cache)
            run_values(checker.infos[id(alg)].sig, find_preset(alg, name), {})
        except PresetError as err:
            yield err
            if name is None:
                return  # the defaults every preset starts from are wrong: one report


def own_values(sig: Signature, preset: s.Preset | None, overrides: dict[str, float],
               sources: dict[str, str] | None = None) -> dict[str, Fraction]:
    """The card's values at `preset` and `overrides`, its own declarations checked (not the
    cards it calls: `validate` does that)."""
    src = _Source(sig.alg, sources or {}, preset)
    try:
        return _own_values(sig, src, preset, dict(overrides)).env
    except _Divides as err:
        raise src.blame(err.vals.deps_of({err.symbol}), f"{display(err.symbol)} = 0 divides "
                        f"the size {display(str(err.dim))}", None, direct=err.symbol) from None


def in_ranges(alg: s.Algorithm, env: dict[str, Fraction]) -> None:
    """Values inside the intervals the card declares; PresetError at the declaration."""
    vals = _Values(dict(env), {n: frozenset({n}) for n in env})
    _ranges(alg, vals, _declared(alg), _Source(alg, {}))
