"""The evaluator: one checked card's steps run on concrete tensors, as the paper reads them.

Indices count from 1 and slices include both ends; loops, sums and `∀` run one value at a time,
as written; `[[c]]` is 1 where c holds and 0 elsewhere; a call to another card runs that card's
steps in a frame of its own, with its hyperparameters bound as the checker bound them. Nothing
here is vectorised or fused: it is slow on purpose, and each construct is a few lines to read.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

import torch

from .. import syntax as s
from ..builtins import CONSTANTS, SPECIAL_TOKENS
from ..checker import Checker, instance, split_name
from ..dims import Dim
from ..spelling import display
from ..types import Ty
from .calls import Calls
from .frames import Frame, InterpretError, Return, Value, floaty, is_bool, is_ones_row, rank
from .statements import Statements

_DECOR = re.compile(r"([_^])(\{[^{}]*\}|[^_^{}]+)")


class Evaluator(Statements, Calls):
    """Runs cards of one checked library; `dtype` is the format of every real value."""

    def __init__(self, checker: Checker, dtype: torch.dtype = torch.float64):
        self.checker = checker
        self.dtype = dtype
        self.steps = 0

    # ------------------------------------------------------------------ cards

    def run(self, alg: s.Algorithm, args: list[Value], params: dict[str, Value],
            nums: dict[str, Value], outer: dict[str, Value] | None = None) -> Value:
        """`alg` on inputs `args` with parameters `params` (the card's own names) and the
        hyperparameters `nums`; sizes of the inputs bind the symbols their types name."""
        info = self.checker.info(alg)
        frame = Frame(alg, info, dict(nums), params, outer=dict(outer or {}))
        for (name, ty), value in zip(info.sig.inputs, args, strict=True):
            if isinstance(value, list) and isinstance(ty, Ty):
                self.bind_family(frame, name, ty, value)
                continue
            frame.locals[name] = value
            if isinstance(ty, Ty) and isinstance(value, torch.Tensor):
                self.bind_shape(frame, ty, value)
        for name, dim in info.sig.definitions.items():
            if name not in frame.nums:
                frame.nums[name] = self.dim(frame, dim, alg.span)
        try:
            self.block(frame, alg.steps)
        except Return as ret:
            return ret.value
        raise InterpretError(alg.span, f"'{alg.label}' ended without a return step")

    def bind_family(self, frame: Frame, name: str, ty: Ty, members: list) -> None:
        """An input `e_t` given as a list: members e_1, e_2, … by name, t's range their count,
        and the size its declaration names (`t ∈ [T]`) that count too."""
        var = next((v for _, v in reversed(split_name(name)[1]) if not v.isdigit()), None)
        if var is None:
            raise InterpretError(frame.alg.span, f"'{display(name)}' is given as a list of "
                                                 f"values but is not a family")
        for i, member in enumerate(members, 1):
            frame.loops[var] = i
            frame.locals[self.concrete(frame, name)] = member
            self.bind_shape(frame, ty, member)
        frame.loops.pop(var)
        frame.ranges[var] = len(members)
        decl = next(d for b in frame.alg.blocks if b.kind == "Input" for d in b.items
                    if name in d.names)
        size = re.search(rf"(?<!\w){re.escape(var)} ∈ \[(\w+)\]", decl.prose or "")
        if size and size.group(1) not in frame.nums:
            frame.nums[size.group(1)] = len(members)

    def bind_shape(self, frame: Frame, ty: Ty, value: torch.Tensor) -> None:
        """Sizes written as a single symbol (T, D) take the size of the value given."""
        for d, size in zip(ty.shape, value.shape[value.dim() - ty.rank:], strict=False):
            if d is not None and len(d.terms) == 1 and d.terms[0][1] == 1:
                mono = d.terms[0][0]
                if len(mono) == 1 and mono[0][1] == 1 and mono[0][0] not in frame.nums:
                    frame.nums[mono[0][0]] = int(size)

    def dim(self, frame: Frame, d: Dim, span: s.Span) -> int | float:
        env = {**frame.nums, **frame.loops}
        try:
            value = d.evaluate({k: v for k, v in env.items() if isinstance(v, (int, float))})
        except KeyError as err:
            raise InterpretError(span, f"the size {display(str(d))} needs a value for "
                                       f"'{display(err.args[0])}'") from None
        return int(value) if value.denominator == 1 else float(value)

    # ------------------------------------------------------------------ steps

    def concrete(self, frame: Frame, name: str) -> str:
        """`Y^h` with h = 2 bound is `Y^2`: decorations that are bound indices or sizes,
        written as their values."""
        env = {**frame.nums, **frame.loops}

        def sub(m: re.Match) -> str:
            v = m.group(2).strip("{}")
            val = env.get(v)
            return f"{m.group(1)}{val}" if isinstance(val, int) else m.group(0)

        base = re.match(r"[^_^]+", name)
        head = base.group(0) if base else ""
        return head + _DECOR.sub(sub, name[len(head):])

    def lookup(self, frame: Frame, e: s.Name, required: bool = True) -> Value:
        name = e.id
        if name in frame.loops:
            return frame.loops[name]
        for key in (self.concrete(frame, name), name):
            if key in frame.locals:
                return frame.locals[key]
        found = self.param(frame, name)
        if found is not None:
            return found
        if name in frame.nums:
            return frame.nums[name]
        if name in SPECIAL_TOKENS:
            return self.special_token(frame, e)
        if name in CONSTANTS:
            return math.pi
        if not required:
            return None
        raise InterpretError(e.span, f"'{display(name)}' has no value here")

    def special_token(self, frame: Frame, e: s.Name) -> int:
        """The paper's special tokens are the last IDs of the vocabulary, counted from 1."""
        ty = frame.info.types.get(id(e))
        vocab = ty.vocab if isinstance(ty, Ty) else None
        if vocab is None:
            raise InterpretError(e.span, f"cannot tell the vocabulary of '{e.id}'")
        return self.dim(frame, vocab, e.span) - SPECIAL_TOKENS[e.id]

    def param(self, frame: Frame, name: str) -> Value:
        """A parameter by its name: `θ^block_ℓ` with ℓ bound is member ℓ of its family, and
        `W^h_q` with h bound the member `W^h_q` of member h of the family `W^h_qkv`."""
        whole = frame.params.get(name)
        if whole is not None and not isinstance(whole, list):
            return whole
        for pattern, family in frame.params.items():
            if not isinstance(family, list) or not family:
                continue
            inner = list(family[0]) if isinstance(family[0], dict) else []
            for var in {v for _, v in split_name(pattern)[1] if not v.isdigit()}:
                for candidate in (pattern, *inner):
                    idx = instance(candidate, var, name)
                    k = None if idx is None else self.index_text(frame, idx)
                    if k is None or not 1 <= k <= len(family):
                        continue
                    member = family[k - 1]
                    return member if candidate == pattern else member[candidate]
        return whole  # a family itself, outside a loop over it

    def index_text(self, frame: Frame, text: str) -> int | None:
        if text.isdigit():
            return int(text)
        value = frame.loops.get(text, frame.nums.get(text, frame.locals.get(text)))
        return value if isinstance(value, int) else None

    # ------------------------------------------------------------------ expressions

    def expr(self, frame: Frame, e: s.Expr) -> Value:
        return s.dispatch(self, "expr", e, frame,
                          missing=lambda n: self.unsupported(n, "this expression"))

    def unsupported(self, node: Any, what: str) -> None:
        kind = type(node).__name__.rstrip("_")
        raise InterpretError(getattr(node, "span", s.NOWHERE),
                             f"the interpreter does not run {what} ({kind})")

    def integer(self, frame: Frame, e: s.Expr) -> int:
        value = self.expr(frame, e)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise InterpretError(e.span, f"expected a whole number, got {value!r}")
        return value

    def expr_Name(self, e: s.Name, frame: Frame) -> Value:
        return self.lookup(frame, e)

    def expr_Num(self, e: s.Num, frame: Frame) -> Value:
        value = e.value
        return int(value) if value.is_integer() and "." not in e.text and "e" not in e.text \
            else value

    def expr_Iverson(self, e: s.Iverson, frame: Frame) -> Value:
        return self.real(self.expr(frame, e.cond))

    def real(self, value: Value) -> Value:
        """A truth value or whole number as a real: [[c]] is 1 or 0."""
        if isinstance(value, torch.Tensor):
            return value.to(self.dtype)
        return torch.tensor(float(value), dtype=self.dtype)

    def tensor(self, value: Value) -> torch.Tensor:
        """A value as a tensor; a Python real in `dtype`, not torch's default float32, which
        would round it."""
        if isinstance(value, torch.Tensor):
            return value
        return torch.tensor(value, dtype=self.dtype) if isinstance(value, float) else \
            torch.as_tensor(value)

    def expr_Unary(self, e: s.Unary, frame: Frame) -> Value:
        x = self.expr(frame, e.operand)
        if e.op == "−":
            return -x if not is_bool(x) else -self.real(x)
        if e.op == "¬":
            return ~x.bool() if isinstance(x, torch.Tensor) else not x
        if e.op == "√":
            return torch.sqrt(self.real(x))
        return self.unsupported(e, f"'{e.op}'")

    def expr_Power(self, e: s.Power, frame: Frame) -> Value:
        base, exp = self.expr(frame, e.base), self.expr(frame, e.exponent)
        if isinstance(base, torch.Tensor) or isinstance(exp, torch.Tensor):
            return torch.pow(self.real(base), exp)
        return base ** exp

    def expr_Transpose(self, e: s.Transpose, frame: Frame) -> Value:
        x = self.expr(frame, e.operand)
        if isinstance(x, torch.Tensor) and x.dim() == 2:
            return x.T
        return x  # a vector: q^⊺ k is the product of two vectors, a number

    def expr_BinOp(self, e: s.BinOp, frame: Frame) -> Value:
        if e.op == " " and is_ones_row(e.right):  # b 1^⊺: b repeated along a free axis
            b = self.expr(frame, e.left)
            return b.unsqueeze(-1)
        if e.op == " " and isinstance(e.left, s.Name) and e.left.id not in frame.locals and \
                self.lookup(frame, e.left, required=False) is None:  # `log p`: applied
            if e.left.id == "log" and (whole := self.log_of(e.right, frame)) is not None:
                return whole
            return self.builtin(e, e.left.id, [self.expr(frame, e.right)], frame)
        a, b = self.expr(frame, e.left), self.expr(frame, e.right)
        return self.binary(e, a, b)

    def binary(self, e: s.BinOp, a: Value, b: Value) -> Value:
        op = e.op
        if op in (" ", "·"):
            if rank(a) == 0 or rank(b) == 0:
                return self.arith(a, b, lambda x, y: x * y)
            return self.real(a) @ self.real(b)
        if op == "⊙":
            return self.arith(a, b, lambda x, y: x * y)
        if op == "+":
            return self.arith(a, b, lambda x, y: x + y)
        if op == "−":
            return self.arith(a, b, lambda x, y: x - y)
        if op == "/":
            return self.arith(a, b, lambda x, y: x / y, exact=True)
        if op == "mod":  # whole numbers: the remainder of floor division, 0 ≤ r < b
            return self.arith(a, b, lambda x, y: x % y)
        compare = {"≤": torch.le, "≥": torch.ge, "<": torch.lt, ">": torch.gt, "≠": torch.ne,
                   "=": torch.eq, "≡": torch.eq}
        if op in compare:
            return compare[op](torch.as_tensor(a), torch.as_tensor(b))
        if op == "∧":
            return torch.as_tensor(a).bool() & torch.as_tensor(b).bool()
        return self.unsupported(e, f"the operator '{op}'")

    def arith(self, a: Value, b: Value, f, exact: bool = False) -> Value:
        """Numbers stay numbers (a fraction of whole numbers is exact); truth values count as
        0 and 1; token IDs and indices keep their whole numbers."""
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            if exact and isinstance(a, int) and isinstance(b, int):
                q = Fraction(a, b)
                return int(q) if q.denominator == 1 else float(q)
            return f(a, b)
        a = self.real(a) if is_bool(a) or floaty(b) or exact else a
        b = self.real(b) if is_bool(b) or floaty(a) or exact else b
        return f(a, b)

    # ------------------------------------------------------------------ indexing

    def expr_Index(self, e: s.Index, frame: Frame) -> Value:
        base = self.expr(frame, e.base)
        if isinstance(base, list):  # a set or a family of values
            if len(e.items) != 1:
                self.unsupported(e, "several indices into a family")
            return base[self.integer(frame, e.items[0]) - 1]
        if not isinstance(base, torch.Tensor):
            self.unsupported(e, "an index into a number")
        if base.dim() < len(e.items):
            raise InterpretError(e.span, f"{len(e.items)} indices into a value of "
                                         f"{base.dim()} axes")
        return base[self.index_key(frame, e, base)]

    def index_key(self, frame: Frame, e: s.Index, base: torch.Tensor | None,
                  grow: bool = False) -> tuple:
        """The 0-based key of a 1-based index: `a : b` includes b, a token ID t is row t − 1,
        several index vectors select a block (each axis on its own, as the math does)."""
        key: list[Any] = []
        vectors = 0
        for axis, item in enumerate(e.items):
            size = base.shape[axis] if base is not None and axis < base.dim() and not grow \
                else None
            if isinstance(item, s.Slice):
                lo = 1 if item.lo is None else self.integer(frame, item.lo)
                hi = size if item.hi is None else self.integer(frame, item.hi)
                if size is not None and (not 1 <= lo <= hi + 1 or hi > size):
                    raise InterpretError(item.span, f"the slice {lo} : {hi} is outside 1 … {size}")
                key.append(slice(lo - 1, hi))
            elif isinstance(item, s.Progression):
                first, second = self.integer(frame, item.first), self.integer(frame, item.second)
                last = self.integer(frame, item.last)
                key.append(torch.arange(first - 1, last, second - first))
                vectors += 1
            else:
                idx = self.expr(frame, item)
                if isinstance(idx, torch.Tensor) and idx.dim() > 0:
                    key.append(idx.long() - 1)
                    vectors += 1
                else:
                    k = int(idx.item() if isinstance(idx, torch.Tensor) else idx)
                    if size is not None and not 1 <= k <= size:
                        raise InterpretError(item.span, f"the index {k} is outside 1 … {size}")
                    key.append(k - 1)
        if vectors > 1:  # an outer product of index vectors: broadcast each on its own axis
            shaped, n, seen = [], sum(isinstance(k, torch.Tensor) for k in key), 0
            for k in key:
                if isinstance(k, torch.Tensor):
                    view = [1] * n
                    view[seen] = -1
                    shaped.append(k.reshape(view))
                    seen += 1
                else:
                    shaped.append(k)
            key = shaped
        return tuple(key)

    # ------------------------------------------------------------------ collections

    def expr_Several(self, e: s.Several, frame: Frame) -> tuple[Value, ...]:
        """`return P, r`: the outputs of a card of several, in the header's order."""
        return tuple(self.expr(frame, x) for x in e.items)

    def expr_Concat(self, e: s.Concat, frame: Frame) -> Value:
        items = [self.expr(frame, x) for x in self.expand(frame, e)]
        ty = frame.info.types.get(id(e))
        rank = ty.rank if isinstance(ty, Ty) else None
        tensors = [torch.as_tensor(x) if not isinstance(x, torch.Tensor) else x for x in items]
        if any(t.is_floating_point() for t in tensors):
            tensors = [self.real(t) for t in tensors]
        axis = -1 if e.sep == "," else 0
        if rank is not None and all(t.dim() + 1 == rank for t in tensors):
            return torch.stack(tensors, dim=axis)  # vectors as columns (",") or rows (";")
        return torch.cat([t.reshape(1) if t.dim() == 0 else t for t in tensors], dim=axis)

    def expand(self, frame: Frame, e: s.Concat) -> list[s.Expr]:
        """`[e_1, e_2, …, e_ℓ]`: the members between the first and the last, as names."""
        if not any(isinstance(x, s.Ellipsis_) for x in e.items):
            return list(e.items)
        named = [x for x in e.items if not isinstance(x, s.Ellipsis_)]
        if not all(isinstance(x, s.Name) for x in named) or len(named) < 2:
            self.unsupported(e, "an elided list of anything but names")
        first, last = split_name(named[0].id), split_name(named[-1].id)
        where = [k for k, (a, b) in enumerate(zip(first[1], last[1], strict=False)) if a != b]
        if first[0] != last[0] or len(first[1]) != len(last[1]) or len(where) != 1:
            self.unsupported(e, "an elided list whose names differ in more than one index")
        k = where[0]
        lo, hi = (self.index_text(frame, d[1][k][1]) for d in (first, last))
        step = 1
        if len(named) > 2:
            second = self.index_text(frame, split_name(named[1].id)[1][k][1])
            step = second - lo if second is not None and lo is not None else 0
        if lo is None or hi is None or step <= 0:
            self.unsupported(e, "an elided list whose ends are not whole numbers")
        out = []
        for i in range(lo, hi + 1, step):
            decor = list(first[1])
            decor[k] = (decor[k][0], str(i))
            out.append(s.Name(first[0] + "".join(f"{kind}{v}" for kind, v in decor),
                              span=e.span))
        return out

    def expr_SetBuilder(self, e: s.SetBuilder, frame: Frame) -> Value:
        out = []
        for i in self.domain(frame, e.domain, e.span):
            frame.loops[e.var] = i
            if self.truth(self.expr(frame, e.cond)):
                out.append(i)
        frame.loops.pop(e.var, None)
        return out

    def expr_Sum(self, e: s.Sum, frame: Frame) -> Value:
        if e.over is not None:
            values = self.domain(frame, e.over, e.span)
        elif e.lo is not None and e.hi is not None:
            values = list(range(self.integer(frame, e.lo), self.integer(frame, e.hi) + 1))
        else:  # Σ_u: over the family its body reads
            n = frame.ranges.get(e.index) or self.family_range(frame, e.body, e.index)
            if n is None:
                return self.unsupported(e, "a sum over an unstated family")
            values = list(range(1, n + 1))
        total: Value = 0
        saved = frame.loops.get(e.index)
        for i in values:
            self.tick(e.span)
            frame.loops[e.index] = i
            total = self.arith(total, self.expr(frame, e.body), lambda x, y: x + y)
        if saved is None:
            frame.loops.pop(e.index, None)
        else:
            frame.loops[e.index] = saved
        return total

    def family_range(self, frame: Frame, body: s.Expr, var: str) -> int | None:
        """The range of an index written only as a family's subscript (Σ_u … k_u …): the
        length of that family (k_1, k_2, … as they are defined)."""
        for node in s.nodes(body):
            if isinstance(node, s.Name) and any(v == var for _, v in split_name(node.id)[1]):
                n = 0
                while True:
                    frame.loops[var] = n + 1
                    found = self.concrete(frame, node.id) in frame.locals
                    frame.loops.pop(var)
                    if not found:
                        break
                    n += 1
                if n:
                    return n
        return None

    def expr_Norm(self, e: s.Norm, frame: Frame) -> Value:
        x = self.expr(frame, e.operand)
        return torch.sqrt((self.real(x) ** 2).sum())

    # ------------------------------------------------------------------ calls
