"""What the evaluator runs in: a card's frame (its hyperparameters, parameters and locals),
and the errors a run can end with; the small tests on values every part uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .. import syntax as s
from ..checker import CardInfo

Value = Any  # a tensor, a number, a bundle (dict), a family (list), a set of indices (list)
MAX_STEPS = 10_000_000  # loop iterations in one run: a bound on work, never on time


class InterpretError(Exception):
    """A construct the interpreter does not run, or a value it cannot take, at its place."""

    def __init__(self, span: s.Span, message: str):
        super().__init__(f"{span}: {message}")
        self.span = span
        self.message = message


class Return(Exception):
    def __init__(self, value: Value):
        self.value = value




@dataclass
class Frame:
    """One card's run: its hyperparameters and sizes (`ints`, `nums`), its parameters
    (`params`, by the card's own names; a family is a list, member i at [i − 1]) and locals."""

    alg: s.Algorithm
    info: CardInfo
    nums: dict[str, Value]  # hyperparameters and sizes by name (ℕ ones are ints)
    params: dict[str, Value]
    locals: dict[str, Value] = field(default_factory=dict)
    loops: dict[str, int] = field(default_factory=dict)  # bound indices: loop variables
    outer: dict[str, Value] = field(default_factory=dict)  # the callers' hyperparameters
    ranges: dict[str, int] = field(default_factory=dict)  # t of an input family e_t: its length

    @property
    def column(self) -> bool:
        return self.info.sig.layout == "column"

def rank(x: Value) -> int:
    return x.dim() if isinstance(x, torch.Tensor) else 0


def is_bool(x: Value) -> bool:
    return isinstance(x, bool) or isinstance(x, torch.Tensor) and x.dtype == torch.bool


def floaty(x: Value) -> bool:
    return isinstance(x, float) or isinstance(x, torch.Tensor) and x.is_floating_point()


def is_ones_row(e: s.Expr) -> bool:
    return isinstance(e, s.Transpose) and isinstance(e.operand, s.Num) and e.operand.text == "1"


def grown(old: torch.Tensor | None, key: tuple, v: torch.Tensor, at: s.Index) -> torch.Tensor:
    """`old` with zeros appended (or made of zeros) so that `key` lies inside it: the sizes
    a part's place and the value assigned to it ask for."""
    axes = iter(v.shape[v.dim() - sum(not isinstance(k, int) for k in key):]
                if v.dim() >= sum(not isinstance(k, int) for k in key) else ())
    need = []
    for k in key:
        if isinstance(k, int):
            need.append(k + 1)
        elif isinstance(k, slice):
            width = next(axes, None)
            stop = k.stop if k.stop is not None else None if width is None \
                else (k.start or 0) + width
            if stop is None:
                raise InterpretError(at.span, "cannot tell the size of a new value")
            need.append(stop)
        else:
            next(axes, None)
            need.append(int(k.max()) + 1)
    need += list(axes)
    if old is None:
        return torch.zeros(need, dtype=v.dtype)
    if old.dim() != len(need) or all(n <= o for n, o in zip(need, old.shape, strict=True)):
        return old
    grown = torch.zeros([max(n, o) for n, o in zip(need, old.shape, strict=True)],
                        dtype=old.dtype)
    grown[tuple(slice(0, o) for o in old.shape)] = old
    return grown
