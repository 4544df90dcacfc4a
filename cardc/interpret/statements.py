"""Steps run one at a time, as written: assignments (whole or part by part), loops over ranges
and sets, `∀`, `if` and `while` (part of `cardc.interpret.evaluate.Evaluator`)."""

from __future__ import annotations

from itertools import product

import torch

from .. import syntax as s
from ..spelling import display
from ..types import Ty
from .frames import MAX_STEPS, Frame, InterpretError, Return, Value, grown


class Statements:
    """Steps of a card, run in its frame."""

    def block(self, frame: Frame, steps: tuple[s.Step, ...]) -> None:
        for step in steps:
            self.stmt(frame, step.stmt)

    def stmt(self, frame: Frame, st: s.Stmt) -> None:
        s.dispatch(self, "stmt", st, frame, missing=lambda n: self.unsupported(n, "this step"))

    def tick(self, span: s.Span) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise InterpretError(span, f"more than {MAX_STEPS:,} loop iterations")

    def stmt_Return(self, st: s.Return, frame: Frame) -> None:
        raise Return(self.expr(frame, st.value))

    def stmt_Assign(self, st: s.Assign, frame: Frame) -> None:
        if st.op == "=" and not isinstance(st.target, s.Name):
            self.unsupported(st, "a function definition")
        value = self.expr(frame, st.value)
        target = st.target
        if isinstance(target, s.Several):  # P, r ← M(x | θ): the card's outputs, in order
            for name, part in zip(target.items, value, strict=True):
                frame.locals[self.concrete(frame, name.id)] = part
            return
        if isinstance(target, s.Name):
            frame.locals[self.concrete(frame, target.id)] = value
        elif isinstance(target, s.Index) and isinstance(target.base, s.Name):
            self.assign_part(frame, target, value)
        else:
            self.unsupported(target, "this assignment target")

    def assign_part(self, frame: Frame, target: s.Index, value: Value) -> None:
        """`X[:, t] ← v`: a copy of X with that part replaced; X is made (zero) where it is
        new, and grown where the part lies beyond it (`for i ∈ [n] : ω[i] ← …` makes ω)."""
        name = self.concrete(frame, target.base.id)
        old = frame.locals.get(name)
        v = self.tensor(value)
        if v.dtype == torch.bool or v.is_floating_point():
            v = v.to(self.dtype)
        key = self.index_key(frame, target, old, grow=True)
        new = grown(old, key, v, target)
        if v.is_floating_point() and not new.is_floating_point():
            new = new.to(v.dtype)
        new = new.clone()
        part = new[key]
        new[key] = v.reshape(part.shape) if v.numel() == part.numel() else v.to(new.dtype)
        frame.locals[name] = new

    def elem_dtype(self, ty: Ty) -> torch.dtype:
        return torch.long if ty.elem == "ℕ" else self.dtype

    def stmt_For(self, st: s.For, frame: Frame) -> None:
        for i in self.domain(frame, st.over, st.span):
            self.tick(st.span)
            frame.loops[st.var] = i
            self.block(frame, st.body)
        frame.loops.pop(st.var, None)

    def domain(self, frame: Frame, over: s.Expr | s.Range, span: s.Span) -> list[int]:
        """`[ℓ]`, `1, 2, …, L` or a set's elements: the values a loop variable takes."""
        if isinstance(over, s.Range):
            first = [self.integer(frame, e) for e in over.first]
            last = self.integer(frame, over.last)
            step = first[1] - first[0] if len(first) > 1 else 1
            if step <= 0:
                raise InterpretError(span, "a range that does not increase")
            return list(range(first[0], last + 1, step))
        if isinstance(over, s.Concat) and over.sep == "," and len(over.items) == 1:
            return list(range(1, self.integer(frame, over.items[0]) + 1))  # [n] = {1, …, n}
        value = self.expr(frame, over)
        if isinstance(value, list):
            return [int(v) for v in value]
        raise InterpretError(over.span, "a loop over something that is not a set of indices")

    def stmt_ForAll(self, st: s.ForAll, frame: Frame) -> None:
        """`∀t, t′: stmt`: every combination of values, each variable's range the one it is
        given (`∀t ∈ [T]`), else the size of the axis it indexes in the statement."""
        over = st.over or (None,) * len(st.vars)
        ranges = [range(1, self.forall_size(frame, st, v) + 1) if o is None else
                  self.domain(frame, o, st.span) for v, o in zip(st.vars, over, strict=True)]
        for values in product(*ranges):
            self.tick(st.span)
            frame.loops.update(zip(st.vars, values, strict=True))
            self.stmt(frame, st.body)
        for v in st.vars:
            frame.loops.pop(v, None)

    def forall_size(self, frame: Frame, st: s.ForAll, var: str) -> int:
        if var in frame.ranges:  # ∀t over the members of an input family e_t
            return frame.ranges[var]
        for node in s.nodes(st.body):
            if isinstance(node, s.Index) and isinstance(node.base, s.Name):
                for axis, item in enumerate(node.items):
                    if isinstance(item, s.Name) and item.id == var:
                        base = self.lookup(frame, node.base, required=False)
                        if isinstance(base, torch.Tensor) and axis < base.dim():
                            return base.shape[axis]
        raise InterpretError(st.span, f"cannot tell the range of '{display(var)}'")

    def stmt_If(self, st: s.If, frame: Frame) -> None:
        if self.truth(self.expr(frame, st.cond)):
            self.stmt(frame, st.then)

    def stmt_While(self, st: s.While, frame: Frame) -> None:
        while self.truth(self.expr(frame, st.cond)):
            self.tick(st.span)
            self.block(frame, st.body)

    def truth(self, value: Value) -> bool:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise InterpretError(s.NOWHERE, "a condition that is not one truth value")
            return bool(value.item())
        return bool(value)

    # ------------------------------------------------------------------ names
