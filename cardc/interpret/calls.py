"""Calls: a builtin, or another card run in a frame of its own with the hyperparameters and
the parameters the checker bound to it (part of `cardc.interpret.evaluate.Evaluator`)."""

from __future__ import annotations

from itertools import product

import torch

from .. import syntax as s
from ..builtins import ARGTOP, DROPOUT, INDICATOR, PATCHES
from ..checker import CallInfo
from ..spelling import display
from ..types import BundleTy, Entry, FamilyTy, Ty
from . import functions
from .frames import Frame, InterpretError, Value


class Calls:
    """Calls of builtins and cards."""

    def expr_Call(self, e: s.Call, frame: Frame) -> Value:
        call = frame.info.calls.get(id(e))
        if call is not None:
            return self.call_card(e, call, frame)
        if e.func == DROPOUT and len(e.args) == 1:  # in evaluation, its input itself
            return self.expr(frame, e.args[0])
        if e.func == PATCHES and len(e.args) == 1 and len(e.params) == 1:
            return self.patches(e, frame)
        if e.func == ARGTOP and len(e.args) == 1 and len(e.params) == 1:
            scores = self.expr(frame, e.args[0])
            return functions.argtop(scores, self.integer(frame, e.params[0]))
        if e.func == INDICATOR and len(e.args) == 1:  # 1 at the members (from 1) of the set
            size = self.dim(frame, frame.info.types[id(e)].shape[0], e.span)
            marks = torch.zeros(int(size), dtype=self.dtype)
            marks[[i - 1 for i in self.expr(frame, e.args[0])]] = 1
            return marks
        if e.bar and e.params or len(e.args) != 1 and e.func not in ("max", "min"):
            return self.unsupported(e, f"the call of '{display(e.func)}'")
        if e.func == "log" and (whole := self.log_of(e.args[0], frame)) is not None:
            return whole
        args = [self.expr(frame, a) for a in e.args]
        return self.builtin(e, e.func, args, frame)

    def log_of(self, e: s.Expr, frame: Frame) -> Value | None:
        """log of `e` where `e` is σ(z) or softmax(z), taken as one function of z (the
        logarithm of a value rounded to 0 would be −∞, not the number it is); else None."""
        if not isinstance(e, s.Call) or e.func not in functions.LOG_OF or len(e.args) != 1 or \
                e.params or id(e) in frame.info.calls:
            return None
        return functions.log_of(e.func, self.real(self.expr(frame, e.args[0])), frame.column)

    def patches(self, e: s.Call, frame: Frame) -> Value:
        """patches(X | p), the image cut into blocks the size p names; a size that does not
        divide the image's sides is named."""
        x = self.expr(frame, e.args[0])
        p = self.expr(frame, e.params[0])
        size = int(p)
        if size != p or size < 1 or any(n % size for n in x.shape[-2:]):
            raise InterpretError(e.span, f"an image of {x.shape[-2]}×{x.shape[-1]} does not cut "
                                         f"into blocks of {p}×{p}")
        return functions.patches(x, size)

    def builtin(self, e: s.Expr, name: str, args: list[Value], frame: Frame) -> Value:
        return functions.apply(self, e, name, args, frame)

    def call_card(self, e: s.Call, call: CallInfo, frame: Frame) -> Value:
        """A call of another card: its inputs, parameters and hyperparameters as the checker
        bound them; a card declared on vectors and given matrices runs row by row."""
        callee = call.callee
        sig = self.checker.info(callee).sig
        args = [self.expr(frame, a) for a in e.args]
        args += [args[0]] * (len(sig.inputs) - len(args))  # Z = X: self-attention
        nums = self.callee_nums(e, call, frame)
        params = {}
        for name, entry in sig.params:
            if name in call.params:
                given = self.expr(frame, call.params[name])
                params.update(self.bundle_view(name, entry, given))
        for name, given in call.hypers.items():
            nums[name] = self.hyper_value(frame, callee, name, given, nums)
        lifted = len(call.lift)
        outer = {**frame.outer, **frame.nums}
        if not lifted:
            return self.run(callee, args, params, nums, outer)
        return self.run_rows(callee, sig, args, params, nums, lifted, outer)

    def run_rows(self, callee, sig, args, params, nums, lifted: int, outer) -> Value:
        wants = [ty.rank if isinstance(ty, Ty) else 0 for _, ty in sig.inputs]
        lead = next(a.shape[:lifted] for a, w in zip(args, wants, strict=True)
                    if isinstance(a, torch.Tensor) and a.dim() > w)
        rows = []
        for idx in product(*(range(n) for n in lead)):
            row_args = [a[idx] if isinstance(a, torch.Tensor) and a.dim() > w else a
                        for a, w in zip(args, wants, strict=True)]
            rows.append(self.run(callee, row_args, params, dict(nums), outer))
        if isinstance(rows[0], tuple):  # a card of several outputs: each stacked on its own
            return tuple(_stacked([r[k] for r in rows], lead) for k in range(len(rows[0])))
        return _stacked(rows, lead)

    def callee_nums(self, e: s.Call, call: CallInfo, frame: Frame) -> dict[str, Value]:
        """The callee's sizes and hyperparameters: bound by the call (in the caller's
        symbols), else the caller's own of that name, else the callee's defaults."""
        sig = self.checker.info(call.callee).sig
        nums: dict[str, Value] = {}
        for name, dim in call.bind.items():
            if any(sym.startswith("?") for sym in dim.symbols):
                continue
            try:
                nums[name] = self.dim(frame, dim, e.span)
            except InterpretError:
                continue
        for name in sig.hypers:  # else the caller's of that name, or its callers'
            if name not in nums and name not in call.hypers:
                for scope in (frame.nums, frame.outer):
                    if name in scope:
                        nums[name] = scope[name]
                        break
        callee_frame = Frame(call.callee, self.checker.info(call.callee), nums, {})
        for name, default in sig.defaults.items():
            if name not in nums and name not in call.hypers:
                nums[name] = self.expr(callee_frame, default)
        return nums

    def hyper_value(self, frame: Frame, callee: s.Algorithm, name: str, given: s.Expr,
                    nums: dict[str, Value]) -> Value:
        """`ε = ε`, `Mask ≡ 1`, or a mask by its rule, `Mask[t, t′] = [[t′ ≤ t]]`, made a
        table over the callee's declared sizes."""
        if not isinstance(given, s.Arg):
            return self.expr(frame, given)
        ty = self.checker.info(callee).sig.hypers.get(name)
        probe = Frame(callee, self.checker.info(callee), nums, {})
        if not isinstance(given.target, s.Index):
            value = self.expr(frame, given.value)
            if given.op == "≡" and isinstance(ty, Ty) and ty.shape:  # the same everywhere
                sizes = [self.dim(probe, d, given.span) for d in ty.shape]
                return torch.full(sizes, bool(value) if ty.elem == "𝔹" else value)
            return value
        assert isinstance(ty, Ty)
        sizes = [self.dim(probe, d, given.span) for d in ty.shape]
        idx = [i.id for i in given.target.items if isinstance(i, s.Name)]
        table = torch.zeros(sizes, dtype=torch.bool)
        saved = dict(frame.loops)
        for values in product(*(range(1, n + 1) for n in sizes)):
            frame.loops.update(zip(idx, values, strict=True))
            table[tuple(v - 1 for v in values)] = self.truth(self.expr(frame, given.value))
        frame.loops.clear()
        frame.loops.update(saved)
        return table

    def bundle_view(self, name: str, entry: Entry, given: Value) -> dict[str, Value]:
        """The parameters a callee sees, by its own names: a bundle's members matched in
        order with the caller's (as the checker matched them), a bundle declared in place
        opened so its members are names of the callee."""
        if isinstance(entry, BundleTy) and isinstance(given, dict):
            renamed = dict(zip(entry.members, given.values(), strict=False))
            out: dict[str, Value] = {name: renamed}
            for member, sub in entry.members.items():
                if isinstance(sub, BundleTy) and sub.card is not None:
                    out[member] = renamed[member]  # a called card's: that card opens it
                else:
                    out.update(self.bundle_view(member, sub, renamed[member]))
            return out
        if isinstance(entry, FamilyTy) and isinstance(given, list):
            return {name: [self.bundle_view(name, entry.entry, g)[name] for g in given]}
        return {name: given}


def _stacked(rows: list, lead) -> torch.Tensor:
    """The values a card gave row by row, as one tensor with the rows' leading axes."""
    return torch.stack([torch.as_tensor(r) for r in rows]).reshape(*lead, *torch.as_tensor(rows[0]).shape)
