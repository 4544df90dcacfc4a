"""The state of checking one card's steps: the scopes of names, the loop variables, the families
a loop defines (e_t), the sizes inference has solved, and where each name got its value."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

from .. import syntax as s
from ..builtins import CONSTANTS, SPECIAL_TOKENS
from ..dims import Dim
from ..spelling import display
from ..types import BundleTy, Entry, FamilyTy, FuncTy, Ty
from .declarations import DeclEnv
from .indexed import instance, split_name
from .messages import _read_as_prose, _spelling_hint, _suggest
from .results import SCALAR, CardInfo, Cards, CheckError, Signature
from .shapes import _dim, _members
from .staleness import Staleness, StaleRead, describe


class BodyState:
    """Names visible while one card's steps are checked, and what checking them found."""

    def __init__(self, checker: Cards, alg: s.Algorithm, info: CardInfo):
        self.c = checker
        self.alg = alg
        self.info = info
        self.sig = info.sig
        self.file = checker.lib.file_of(alg)
        self.scopes: list[dict[str, Entry]] = [self.base_scope()]
        self.loop_vars: dict[str, Dim] = {}
        self.families: dict[str, tuple[str, Dim, Ty]] = {}  # e_t defined in a loop over t
        self.solved: dict[str, Dim] = {}  # inference variables of callees' free dimensions
        self.returned = False
        self.naming: int | None = None  # the call whose several outputs a step names, by id
        self.declared = {n: d.span for d in checker.decls(alg) for n in d.names}  # for notes
        self.assigned: dict[str, s.Span] = {}  # the step that last gave a name its value
        # the names each assigned name's value was computed from, through earlier steps too:
        # `P, r ← M(x | θ)` makes P and r functions of θ as `P(θ) ← M(x | θ)` does
        self.depends: dict[str, frozenset[str]] = {}
        # states of the loops being checked that enter them as numbers (h ← 0), and the
        # product in the step being checked that scales a matrix by one (`h W_h`)
        self.number_states: dict[str, s.Span] = {}
        self.scaled: dict[str, s.BinOp] = {}
        # names whose step failed, or already reported unknown: their later uses stay quiet
        self.failed: set[str] = set()
        # values computed from a name changed since, which a loss or gradient must not read
        self.staleness = Staleness()

    def base_scope(self) -> dict[str, Entry]:
        vocab = DeclEnv(self.c, self.alg).set_size("V")  # special tokens belong to V
        scope: dict[str, Entry] = {
            name: Ty(elem="ℕ", value=vocab - Dim.const(back), vocab=vocab)
            for name, back in SPECIAL_TOKENS.items()}
        scope.update(self.sig.hypers)
        scope.update(self.sig.elements)
        scope.update({n: t for n, t in self.sig.inputs})
        scope.update(self.sig.tree.members)
        for _name, entry in self.sig.tree.members.items():
            if isinstance(entry, BundleTy):  # members of a bundle are in scope by their names
                scope.update(_members(entry))
        return scope

    def error(self, span, msg, hint=None, notes=()):
        self.c.diags.error(span, msg, hint, notes)

    def lookup(self, name: str, span: s.Span) -> Entry:
        for scope in reversed(self.scopes):
            if name in scope:
                return self.enter_family(scope[name], name, span)
        for pattern, (var, _over, ty) in self.families.items():
            if self.known_index(instance(pattern, var, name)):
                return ty
        for scope in reversed(self.scopes):
            for key, entry in scope.items():
                if isinstance(entry, FamilyTy) and self.known_index(instance(key, entry.var, name)):
                    return entry.entry
        if name in CONSTANTS:
            return SCALAR
        if name in self.failed or self.of_failed_family(name):  # a consequence of an
            raise CheckError                                       # error already reported
        self.failed.add(name)
        if name in self.sig.run:
            what = "seed" if self.sig.run[name].seed else "number format"
            self.error(span, f"'{display(name)}' is the run's {what}, which no step reads",
                       hint="the run takes it; the steps' math cannot")
            raise CheckError
        hint = _spelling_hint(name) or _read_as_prose(self.alg, name) or \
            _suggest(name, [k for sc in self.scopes for k in sc])
        self.error(span, f"unknown name '{display(name)}'", hint)
        raise CheckError

    def of_failed_family(self, name: str) -> bool:
        """Y^1 where the step that defines Y^h failed: no new error for its members."""
        return any(instance(f, var, name) is not None
                   for f in self.failed for _, var in split_name(f)[1] if var.isidentifier())

    def known_index(self, idx: str | None) -> bool:
        """e_1, W_{l+1}, x_m: a member of a family where the index is a number or names in scope."""
        if idx is None:
            return False
        words = re.findall(r"[^\W\d][\w\u0302\u0303′]*", idx)
        return all(w in self.loop_vars or self.try_lookup(w) is not None for w in words)

    def enter_family(self, entry: Entry, name: str, span: s.Span) -> Entry:
        if isinstance(entry, FamilyTy):
            if entry.var not in self.loop_vars:
                self.error(span, f"'{display(name)}' is indexed by '{display(entry.var)}', "
                                 "which no enclosing loop binds",
                           hint=f"use it inside 'for {display(entry.var)} ∈ …'")
                raise CheckError
            return entry.entry
        return entry

    def bind(self, name: str, entry: Entry) -> None:
        self.scopes[-1][name] = entry

    def try_lookup(self, name: str) -> Entry | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def computed_from(self, names: Iterable[str]) -> frozenset[str]:
        """The names a value written with `names` is computed from: those, and what each of
        them was computed from."""
        names = frozenset(names)
        return names.union(*(self.depends.get(n, frozenset()) for n in names))

    def assign_name(self, name: str, value: Entry) -> None:
        for var in self.loop_vars:
            if any(v == var for _, v in split_name(name)[1]):
                self.families[name] = (var, self.loop_vars[var], value)
                return
        self.bind(name, value)

    def dim_of(self, e: s.Expr) -> Dim:
        values = {}
        for scope in self.scopes:
            for k, v in scope.items():
                if isinstance(v, Ty) and v.value is not None:
                    values[k] = v.value
        d = _dim(e, self.sig.definitions, self.c.diags, values)
        if d is None:
            raise CheckError
        return d


class Expressions(Protocol):
    """What the call checker asks of the expression checker that owns it."""

    def expr(self, e: s.Expr) -> Entry: ...

    def tensor(self, e: s.Expr) -> Ty: ...


class Part:
    """A piece of the body checker: it reads and writes one card's shared state."""

    def __init__(self, state: BodyState):
        self.state = state

    # what the card is: fixed while its steps are checked (the rest of the state changes)
    @property
    def c(self) -> Cards:
        return self.state.c

    @property
    def alg(self) -> s.Algorithm:
        return self.state.alg

    @property
    def sig(self) -> Signature:
        return self.state.sig

    @property
    def info(self) -> CardInfo:
        return self.state.info

    def error(self, span, msg, hint=None, notes=()):
        self.state.error(span, msg, hint, notes)

    def refuse_stale(self, r: StaleRead) -> None:
        """A loss or gradient that reads a value of a changed name's old value."""
        function = isinstance(self.state.try_lookup(r.name), FuncTy)
        msg, hint, notes = describe(r, self.state.assigned.get(r.name), function)
        self.error(r.at, msg, hint=hint, notes=notes)
