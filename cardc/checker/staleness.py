"""Values computed from a name that has changed since: a function of θ (`loss(θ) = …`) or a
gradient (`∇loss(θ)`) must not read them, since they hold the old θ's value, not the current
one's. Generated code would differentiate through the old θ's graph, freed by the update
(a crash), or differentiate nothing (a silent difference), so the checker refuses such a read
at the read.

A loop's later passes read what its earlier passes left: a value read at the top of the body
and made stale further down (`θ` updated below the read) is stale from the second pass on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import syntax as s
from ..spelling import display


@dataclass(frozen=True)
class Stale:
    """A value computed from `source`, which the step at `changed` gave a new value since."""

    source: str
    changed: s.Span


@dataclass(frozen=True)
class StaleRead:
    """A read of `name` by `reader`, a function of (or a gradient with respect to) the name
    its value is stale in."""

    name: str
    at: s.Span
    reader: str  # as the card writes it: loss(θ), ∇loss(θ)
    stale: Stale
    carried: bool  # stale only from a loop's second pass on


@dataclass
class _Pass:
    """One loop body being checked: the names it assigned so far, and the reads it made of
    values from before it (an earlier pass's, on later passes)."""

    assigned: set[str] = field(default_factory=set)
    reads: list[tuple[str, str, s.Span, str]] = field(default_factory=list)


class Staleness:
    """Which names hold values computed from a name changed since, as the steps go."""

    def __init__(self) -> None:
        self.stale: dict[str, Stale] = {}
        self.passes: list[_Pass] = []
        self.reported: set[tuple[str, s.Span]] = set()  # by an inner loop, not again
        self.sources: dict[str, frozenset[str]] = {}  # each value's, as it was computed
        self.dependents: dict[str, set[str]] = {}  # the values computed from each name

    def assign(self, name: str, span: s.Span, sources: frozenset[str]) -> None:
        """`name` takes a new value computed from `sources` (now: not stale), and every value
        computed from its old one becomes stale."""
        self.stale.pop(name, None)
        for p in self.passes:
            p.assigned.add(name)
        for other in self.dependents.pop(name, ()):
            if other != name and name in self.sources.get(other, ()):
                self.stale[other] = Stale(name, span)
        self.sources[name] = sources
        for source in sources - {name}:
            self.dependents.setdefault(source, set()).add(name)

    def read(self, name: str, wrt: str, at: s.Span, reader: str) -> StaleRead | None:
        """`reader`, a function of `wrt` or a gradient with respect to it, reads `name`: stale
        now, or noted for the loops around it to judge at their end."""
        found = self.stale.get(name)
        if found is not None and found.source == wrt:
            return StaleRead(name, at, reader, found, carried=False)
        for p in self.passes:
            if name not in p.assigned:
                p.reads.append((name, wrt, at, reader))
        return None

    def enter_loop(self) -> None:
        self.passes.append(_Pass())

    def leave_loop(self) -> list[StaleRead]:
        """The reads of the loop's body that a second pass would make of stale values."""
        p = self.passes.pop()
        out = []
        for name, wrt, at, reader in p.reads:
            found = self.stale.get(name)
            if found is not None and found.source == wrt and (name, at) not in self.reported:
                self.reported.add((name, at))
                out.append(StaleRead(name, at, reader, found, carried=True))
        return out


def describe(r: StaleRead, computed: s.Span | None,
             function: bool) -> tuple[str, str, tuple[tuple[s.Span, str], ...]]:
    """The refusal of a stale read: message, hint, notes (`computed`: where the value was
    made; `function`: whether it is a function of the changed name, `P(θ) ← …`)."""
    name, source, line = display(r.name), display(r.stale.source), r.stale.changed.line
    reader = display(r.reader)
    made = f"define '{name}({source})'" if function else f"compute '{name}'"
    if r.carried:
        msg = (f"'{reader}' reads '{name}' on every pass of the loop, but line {line} gives "
               f"'{source}' a new value later in it: from the second pass on, '{name}' would "
               f"hold its value at the old '{source}'")
        hint = f"{made} in the loop, after line {line} or before this step"
    else:
        msg = (f"'{name}' was computed from '{source}' before line {line} gave '{source}' a "
               f"new value: '{reader}' would read its value at the old '{source}'")
        hint = f"{made} again after line {line}"
    notes = ((r.stale.changed, f"'{source}' changes here"),)
    if computed is not None:
        notes = ((computed, f"'{name}' is {'defined' if function else 'computed'} here"),
                 *notes)
    return msg, hint, notes
