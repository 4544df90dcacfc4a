"""One card's preset values: where each comes from (a default, a preset, the command line), the
sizes they derive, and the run's own values (the seed, the number formats)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from fractions import Fraction

from .. import syntax as s
from ..dims import Dim
from ..render.text import render_expr
from ..spelling import display
from ..types import Ty
from .exact import MAX_SIZE, OverrideError, PresetError, _fits, _shown, _shown_number, number
from .results import RunValue, Signature

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
        if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
            raise OverrideError(f"{display(name)}={value!r}: a hyperparameter's value is a "
                                f"number, not {type(value).__name__}")
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
