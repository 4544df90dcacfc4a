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
from collections.abc import Iterator
from dataclasses import replace
from fractions import Fraction

from .. import syntax as s
from ..dims import Dim
from ..render.text import render_expr
from ..spelling import display
from ..types import BundleTy, Entry, FamilyTy, Ty
from .driver import Checker
from .exact import MAX_SIZE, PresetError, UnknownPreset, _NotNumber, _shown, _Unknown, number
from .presetvalues import (
    _declared,
    _define,
    _dim_value,
    _Divides,
    _name_span,
    _own_values,
    _positive,
    _Source,
    _Values,
    run_values,
)
from .results import Signature

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
        if isinstance(entry, FamilyTy):  # a count of members, which may be none (N − N_d = 0
            self.size(entry.over, vals, note, empty=True)  # when every layer is dense)
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

    def size(self, d: Dim, vals: _Values, note, empty: bool = False) -> Fraction | None:
        """A size the values determine: a positive whole number (or 0, where `empty`). `note`
        is (span, text), or a function giving it, called only for a problem."""
        value = _dim_value(d, vals)
        if value is None or not d.symbols:
            return value  # unknown here, or a constant the checker already judged
        if empty and value == 0:
            return value
        if value.denominator != 1 or not 0 < value <= MAX_SIZE:
            _positive(display(str(d)), d, value, vals, self.src, note() if callable(note) else note)
        return value

    def steps(self, alg: s.Algorithm, info, vals: _Values) -> None:
        """The shape of every value a step computes, where the values determine it: positive,
        but for a slice that is a part of a concatenation, which may be empty (the columns
        after d_r of `[RoPE(X[:, 1 : d_r]), X[:, d_r + 1 : d]]` at d_r = d)."""
        for d, node, ty, may_be_empty in _step_shapes(alg, info, self.cache):
            if may_be_empty and _dim_value(d, vals) == 0:
                continue
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


def _step_shapes(alg: s.Algorithm, info, cache: dict) -> list[tuple[Dim, object, Ty, bool]]:
    """Each distinct size of a value the card's steps compute, with the first node of it, and
    whether every value of that size is a slice concatenated with others (which may be
    empty: the concatenation is the other parts)."""
    if id(alg) not in cache:
        parts = {id(item) for node in s.nodes(alg.steps)
                 if isinstance(node, s.Concat) and len(node.items) > 1
                 for item in node.items if isinstance(item, s.Index) and
                 any(isinstance(i, s.Slice) for i in item.items)}
        found: dict[Dim, tuple[Dim, object, Ty, bool]] = {}
        for node in s.nodes(alg.steps):
            ty = info.types.get(id(node))
            if isinstance(ty, Ty):
                for d in ty.shape:
                    if d is not None and d.symbols:
                        first = found.get(d, (d, node, ty, True))
                        found[d] = (*first[:3], first[3] and id(node) in parts)
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
    if chosen is None:  # a name only a command gives: the card itself names its own
        raise UnknownPreset(alg.name, preset, [p.name for p in alg.presets])
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
        if chosen is not None:  # a preset sizes a whole model: every parameter it holds
            _every_parameter_sized(sig, vals, src, chosen)
    except _Divides as err:
        raise src.blame(err.vals.deps_of({err.symbol}), f"{display(err.symbol)} = 0 divides "
                        f"the size {display(str(err.dim))}", None, direct=err.symbol) from None
    return vals.env


def _every_parameter_sized(sig: Signature, vals: _Values, src: _Source,
                           preset: s.Preset) -> None:
    """Each size of each parameter has a value at `preset`: a bundle adopted from a called
    card keeps that card's size names (D_f) where no card between binds them, and a card
    that does not declare one cannot be counted (`info`) or built."""
    for path, entry, bound in _parameters(sig.tree, "", frozenset()):
        for d in entry.shape:
            missing = sorted((d.symbols if d is not None else set()) - set(vals.env) - bound)
            if missing:
                name = display(missing[0])
                raise PresetError(_name_span(preset, src.sources),
                                  f"preset '{preset.name}' gives '{name}' no value, and it "
                                  f"sizes {display(path)} ∈ {entry}",
                                  hint=f"declare '{name}' among the hyperparameters of "
                                       f"'{sig.alg.label}' and set it in its presets")


def _parameters(entry: Entry, path: str, bound: frozenset[str]
                ) -> Iterator[tuple[str, Ty, frozenset[str]]]:
    """Every tensor of a parameter tree, with its path (θ^mlp.W_1) and the family indices
    around it."""
    if isinstance(entry, Ty):
        yield path, entry, bound
    elif isinstance(entry, FamilyTy):
        yield from _parameters(entry.entry, path, bound | {entry.var})
    elif isinstance(entry, BundleTy):
        for name, member in entry.members.items():
            yield from _parameters(member, f"{path}.{name}" if path else name, bound)


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
