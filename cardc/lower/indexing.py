"""Lowering of indexing: 1-based inclusive card indices and slices to 0-based Python ones,
embeddings (columns picked by tokens), positions in maps, strided progressions, and the
indices of training and inference cards, where tokens pick by gather."""

from __future__ import annotations

from .. import ir
from .. import syntax as s
from ..checker import expr_dim
from ..dims import Dim
from ..spelling import display
from ..types import Ty
from .body import (
    _call,
    _dec,
    _int,
    _is_all,
    _method,
    _mT,
    _names_in,
    _whole,
)
from .values import (
    Val,
)


class Indexing:
    """Indices, slices and progressions (part of `cardc.lower.steps.Body`)."""

    def expr_Index(self, e: s.Index) -> Val:
        if isinstance(e.base, s.Name) and e.base.id in self.decoded:
            return self.last_row(e)
        if self.sum_axis and len(e.items) == 1 and getattr(e.items[0], "id", None) == \
                self.sum_axis[0]:
            base = self.expr(e.base)  # e[i] under Σ_i: the last axis, summed later
            return Val(self.summed_prefix(base.code, base.ty), Ty((self.sum_axis[1],)),
                       base.lifted)
        if self.sum_axis and len(e.items) > 1 and all(map(_is_all, e.items[:-1])) and \
                getattr(e.items[-1], "id", None) == self.sum_axis[0]:
            base = self.expr(e.base)  # C[:, j] under Σ_j: every column, the j axis last
            code = _mT(base.code) if base.flipped else base.code
            return Val(self.summed_prefix(code, base.ty),
                       Ty((*base.ty.shape[:-1], self.sum_axis[1])), base.lifted)
        if len(e.items) == 1 and self.family_vars.get(getattr(e.items[0], "id", None)):
            return self.member_index(e)
        if self.sum_axis:
            self.sum_index_read_whole(e)
        if self.point and all(getattr(i, "id", None) in self.point for i in e.items):
            return self.point_index(e)
        if self.positions and len(e.items) in (1, 2) and \
                self.position_offset(e.items[-1]) is not None:
            return self.position_index(e)
        if self.positions and len(e.items) == 2 and _is_all(e.items[1]) and \
                getattr(e.items[0], "id", None) == self.positions[0]:
            row = self.row_index(e)
            if row is not None:
                return row
        if self.positions and any(self.positions[0] in _names_in(i) and
                                  not isinstance(i, (s.Name, s.Index)) for i in e.items):
            self.other_position(e)  # X[:, t − 1] would tie iterations together
        base = self.expr(e.base)
        if len(e.items) == 2 and len(base.ty.shape) == 2 and _is_all(e.items[0]) and \
                not isinstance(e.items[1], s.Slice | s.Progression):
            idx = self.expr(e.items[1])
            if idx.lifted or idx.rows:  # W_e[:, x[t]]: the columns the tokens pick
                if base.lifted:
                    self.fail(e, "code generation picks columns of parameters only")
                cols = base.code if base.flipped else _mT(base.code)
                # token IDs are 0-based in tensors; a position (W_p[:, ℓ]) is 1-based
                pick = idx.code if idx.ty.vocab is not None or idx.rows else _dec(idx.code)
                pad = self.ty(e.base).pad
                code = ir.Sub(cols, (pick,)) if pad is None else self.embedding(pick, cols, pad)
                return Val(code, self.ty(e), idx.lifted, False, idx.rows)
        if self.procedure:
            return self.procedure_index(e, base)
        axes: list[ir.Expr | ir.SliceX] = []  # one index or slice per card axis
        lifted = base.lifted
        rows: tuple[Dim, ...] = ()  # a map's positions, where a token x[t] picks the entries
        point: tuple[Dim | None, ...] = ()  # the axes of the quantified variables it is read at
        for k, item in enumerate(e.items):
            if isinstance(item, s.Slice):
                axes.append(self.slice(item, base, k))
                continue
            if isinstance(item, s.Progression):
                axes.append(self.progression(item, base, k))
                continue
            idx = self.expr(item)
            pad = self.ty(e.base).pad
            if idx.ty.shape and pad is not None and len(e.items) == 1 and not base.lifted:
                return Val(self.embedding(idx.code, base.code, pad), self.ty(e), idx.lifted)
            if idx.ty.shape and idx.lifted and base.lifted and len(e.items) == 1 and \
                    len(base.ty.shape) == 1 and getattr(item, "id", None) not in self.point:
                return self.lookup(e, base, idx)
            if idx.ty.shape:  # W_e[x]: token IDs are 0-based in tensors, other indices 1-based
                axes.append(idx.code if idx.ty.vocab is not None else _dec(idx.code))
                lifted = lifted or idx.lifted
                if getattr(item, "id", None) in self.point:  # A[t′, 1] under ∀t, t′: on t′'s axis
                    point = tuple(a if a is not None else b for a, b in zip(
                        point or (None,) * len(idx.ty.shape), idx.ty.shape, strict=True))
            else:  # a token (x[t] in a map, x[1]) is 0-based in tensors too
                axes.append(idx.code if idx.ty.vocab is not None else _dec(idx.code))
                if idx.rows and idx.lifted:  # W_e[x[t], :] in a map over t: every row at once
                    if base.lifted or base.flipped or rows or k != 0:
                        self.fail(e, "code generation reads a parameter's rows at the map's "
                                     "tokens only, as 'W[x[t], :]'")
                    lifted, rows = lifted or idx.lifted, idx.rows
        ty = Ty(point, self.ty(e).elem) if point and not self.ty(e).shape else self.ty(e)
        if base.flipped and len(axes) == len(base.ty.shape) == 2:
            # a column-major matrix is stored with its card axes swapped: E[1 : K, :] of a
            # D×T value takes features, the last stored axis; a result that is still a
            # matrix stays flipped
            items = [ir.Ref("...")] if base.lifted else []
            flip = len(ty.shape) == 2
            return Val(ir.Sub(base.code, (*items, *axes[::-1])), ty, lifted, flip)
        items = [ir.Ref("...")] if base.lifted else []
        items += axes
        if base.lifted and not base.flipped:  # E[1] of a T×D matrix is its first row: E[..., 0, :]
            items += [ir.SliceX(None, None)] * (len(base.ty.shape) - len(e.items))
        return Val(ir.Sub(base.code, tuple(items)), ty, lifted, False, rows)

    def lookup(self, e: s.Index, base: Val, idx: Val) -> Val:
        """`w[β]`, a vector with axes in front (one per head) read at a tensor of indices that
        has its own (the examples'): the two sets of leading axes broadcast, which plain
        indexing would put side by side (modelkit's lookup)."""
        if base.rows or idx.rows or idx.flipped:
            self.fail(e, "code generation looks up a vector by a tensor of indices only")
        first = () if idx.ty.vocab is not None else (_int(1),)  # a token counts from 0
        code = _call("lookup", base.code, idx.code, _int(len(idx.ty.shape)), *first)
        return Val(code, Ty(idx.ty.shape, self.ty(e).elem), True)

    def sum_index_read_whole(self, e: s.Index) -> None:
        """Under Σ_i code generation sums a value's last axis: `e[i]` and `C[:, i]` read it;
        a computed index (`e[i + 1]`), another axis (`A[i, :]`) or a fixed one beside it
        (`A[1, i]`) it cannot sum: each is refused where it is written."""
        var = display(self.sum_axis[0])
        for k, item in enumerate(e.items):
            if self.sum_axis[0] not in _names_in(item):
                continue
            if not isinstance(item, s.Name):
                self.fail(item, f"code generation sums a value read at the sum's index '{var}' "
                                f"itself, not at an index computed from it",
                          hint=f"write the sum over the entries it reads, e.g. "
                               f"'Σ_{{{var}=2}}^{{D}} e[{var}]' for 'Σ_{{{var}=1}}^{{D − 1}} "
                               f"e[{var} + 1]'")
            if k != len(e.items) - 1 or not all(map(_is_all, e.items[:k])):
                self.fail(item, f"code generation sums a value's last axis: '{var}' must be "
                                f"its last index, every other ':', as 'e[{var}]' or "
                                f"'C[:, {var}]'")

    def embedding(self, tokens: ir.Expr, table: ir.Expr, pad: str) -> ir.Expr:
        """Rows of `table` picked by tokens, the padding row's receiving no gradient: card
        token v_pad is row v_pad − 1, and v_pad = 0 names none."""
        row = self.dim(Dim.sym(pad))
        index = ir.Cond(ir.Bin(">", row, _int(0)), ir.Bin("-", row, _int(1)), ir.Ref("None"))
        return _call("F.embedding", tokens, table, padding_idx=index)

    def member_index(self, e: s.Index) -> Val:
        """`g[e]` under Σ_e over a map's family: g's entries 1 … E, one per member, as rows."""
        size = self.family_vars[e.items[0].id]
        base = self.expr(e.base)
        if len(base.ty.shape) != 1 or base.rows:
            self.fail(e, f"under a sum over a family's members, code generation indexes "
                         f"vectors only by '{display(e.items[0].id)}'")
        code = base.code if base.ty.shape[0] == size else \
            ir.Sub(base.code, (ir.Ref("..."), ir.SliceX(None, self.dim(size))))
        return Val(code, Ty(elem=base.ty.elem), base.lifted, False, (size,))

    def summed_prefix(self, code: ir.Expr, ty: Ty) -> ir.Expr:
        """The entries 1 … n of the last axis that Σ_{i=1}^{n} reads: all of it where the
        axis is n long, else its first n (`Σ_{i=1}^{K} e[i]` of a D-vector)."""
        size = self.sum_axis[1]
        if ty.shape and ty.shape[-1] == size:
            return code
        return ir.Sub(code, (ir.Ref("..."), ir.SliceX(None, self.dim(size))))

    def procedure_index(self, e: s.Index, base: Val) -> Val:
        """Indexing in a training or inference card, where indices may be tensors: positions
        for every t at once (x_n[t + 1]), or tokens (P(θ)[x_n[t + 1], t]). Positions are
        1-based in the card; token IDs are 0-based in tensors, as every tokenizer makes them."""
        ty = self.ty(e)
        vals = [item if isinstance(item, s.Slice) else self.expr(item) for item in e.items]
        stored = vals[::-1] if base.flipped else vals  # physical order of the card's axes

        def index(v) -> ir.Expr | ir.SliceX:
            if isinstance(v, s.Slice):
                return self.slice(v, base, 0)
            return v.code if v.ty.vocab is not None else _dec(v.code)

        tensors = [v for v in stored if isinstance(v, Val) and (v.rows or v.lifted)]
        rows = next((v.rows for v in tensors if v.rows), ())
        if not tensors:
            code = ir.Sub(base.code, (ir.Ref("..."), *map(index, stored)) if base.lifted
                          else tuple(map(index, stored)))
            return Val(code, ty, base.lifted, False, base.rows)
        last = stored[-1]
        if isinstance(last, Val) and last.lifted:  # tokens pick along the last axis: a gather
            lead = [ir.Ref("...")] + [index(v) for v in stored[:-1]] + [ir.SliceX(None, None)]
            picked = ir.Sub(base.code, tuple(lead)) if len(stored) > 1 else base.code
            tok = ir.Sub(last.code, (ir.Ref("..."), ir.Ref("None")))
            code = ir.Sub(_method(picked, "gather", _int(-1), tok), (ir.Ref("..."), _int(0)))
            return Val(code, ty, True, False, rows)
        code = ir.Sub(base.code, (ir.Ref("..."), *map(index, stored)))
        return Val(code, ty, base.lifted or any(v.lifted for v in tensors), False, rows)

    def position_offset(self, item: s.Expr) -> Dim | None:
        """k of `t + k` (or `k + t`, or t itself: 0), t the map's position and k a number or
        the hyperparameters' that reads no position; else None."""
        var = self.positions[0]
        if isinstance(item, s.Name):
            return Dim.const(0) if item.id == var else None
        if not (isinstance(item, s.BinOp) and item.op == "+"):
            return None
        for t, k in ((item.left, item.right), (item.right, item.left)):
            if isinstance(t, s.Name) and t.id == var and var not in _names_in(k):
                return expr_dim(k, self.info.sig.definitions)
        return None

    def other_position(self, e: s.Index) -> None:
        var = display(self.positions[0])
        self.fail(e, f"a map over '{var}' reads a value at '{var}', and a parameter at "
                     f"'{var} + k' too, never another position",
                  hint="code generation vectorises a map whose iterations are independent")

    def position_index(self, e: s.Index) -> Val:
        """`X[:, t]`, `x[t]` or `W_p[:, t]` in a map over positions t ∈ [ℓ]: every position;
        a parameter's also at an offset, `W_p[t + k]` (rows k + 1 … ℓ + k)."""
        var, size = self.positions
        base = self.expr(e.base)
        ty = self.ty(e)
        skip = self.position_offset(e.items[-1])
        if skip != Dim.const(0) and (base.lifted or skip is None):
            self.other_position(e)
        if len(e.items) == 2 and not _is_all(e.items[0]):
            self.fail(e, f"a map over '{display(var)}' reads whole columns 'X[:, {display(var)}]'")
        if base.lifted and base.rows:
            self.fail(e, "positions of a value already mapped over positions")
        if base.lifted:  # columns of a flipped matrix are its rows; a sequence's items, itself
            if len(e.items) == 2 and not base.flipped:
                self.fail(e, "code generation reads columns of flipped matrices only")
            return Val(base.code, ty, True, False, (size,))
        # a parameter: its first ℓ columns, as rows (W_p[:, t] for t ≤ ℓ); they bound the
        # sequence only where ℓ is read off the inputs, not in a map over channels n ∈ [N]
        n = self.dim(size)  # before runtime_used is read: reading ℓ off the inputs adds it
        if size.symbols & self.runtime_used:  # the table's rows (or columns) bound ℓ
            axis = base.ty.shape[len(e.items) - 1]
            self.max_seq_len = self.max_seq_len or self.dim(axis - skip)
            self.low.masking.positions(self.alg, True)
        stored = base.code if len(e.items) == 1 or base.flipped else _mT(base.code)
        rows = ir.SliceX(None, n) if skip == Dim.const(0) else \
            ir.SliceX(self.dim(skip), ir.Bin("+", n, self.dim(skip)))  # as the cache offsets it
        return Val(ir.Sub(stored, (rows,)), ty, False, False, (size,))

    def row_index(self, e: s.Index) -> Val | None:
        """`X[t, :]` in a map over positions t ∈ [ℓ] of a value stored row by row: its
        first ℓ rows, the positions axis in front of the card's own; None where X is
        stored otherwise (read as any other index)."""
        var, size = self.positions
        base = self.expr(e.base)
        if base.rows or base.flipped or len(base.ty.shape) != 2:
            return None
        code = base.code
        if not base.lifted:  # a parameter's rows bound the positions (W_p[t, :] for t ≤ ℓ)
            self.max_seq_len = self.max_seq_len or self.dim(base.ty.shape[0])
            if size.symbols & self.runtime_used:
                self.low.masking.positions(self.alg, True)
        if base.ty.shape[0] != size:
            lead = (ir.Ref("..."),) if base.lifted else ()
            code = ir.Sub(code, (*lead, ir.SliceX(None, self.dim(size)), ir.SliceX(None, None)))
        return Val(code, self.ty(e), base.lifted, False, (size,))

    def slice(self, item: s.Slice, base: Val, axis: int) -> ir.SliceX:
        """1-based inclusive [lo : hi] → 0-based half-open [lo − 1 : hi]."""
        lo = None
        if item.lo is not None and not (isinstance(item.lo, s.Num) and item.lo.text == "1"):
            lo_val = self.expr(item.lo)
            lo = _dec(_whole(lo_val.code))
        hi = None if item.hi is None else _whole(self.expr(item.hi).code)
        if base.lifted or not base.ty.shape or not self.reads_runtime(item):
            return ir.SliceX(lo, hi)
        offset = self.runtime_offset(item)
        self.low.masking.positions(self.alg, offset is not None)
        if offset is None:
            return ir.SliceX(lo, hi)
        # W_p[1 : T] bounds T by the rows; W_p[3 : T + 2] (positions from row 3) by 2 fewer;
        # written [k : T + k], the form the decoding pass offsets by the tokens cached
        length, skip = offset
        self.max_seq_len = self.dim(base.ty.shape[axis] - skip)
        t = self.dim(Dim.sym(length))
        if skip == Dim.const(0):
            return ir.SliceX(None, t)
        return ir.SliceX(self.dim(skip), ir.Bin("+", t, self.dim(skip)))

    def progression(self, item: s.Progression, base: Val, axis: int) -> ir.SliceX:
        """1-based inclusive `a, b, …, c` → 0-based `a − 1 : c : b − a`; the end is left out
        where c is the axis's last entry of the progression (`X[..., 0::2]`)."""
        defs = self.info.sig.definitions
        first, second, last = (expr_dim(x, defs) for x in (item.first, item.second, item.last))
        if first is None or second is None or last is None:
            self.fail(item, "code generation needs a progression of sizes the card declares")
        step = (second - first).constant()
        if step is None or step < 1 or step.denominator != 1:
            self.fail(item.second, "code generation needs a progression with a whole step")
        lo = None
        if first != Dim.const(1):
            lo = _dec(_whole(self.expr(item.first).code))
        size = base.ty.shape[axis]
        rest = None if size is None else (size - last).constant()
        hi = None if rest is not None and 0 <= rest < step else _whole(self.expr(item.last).code)
        return ir.SliceX(lo, hi, _int(int(step)))

    def expr_Progression(self, e: s.Progression) -> Val:
        self.fail(e, "code generation reads a progression 'a, b, …, c' as an index of a "
                     "value of the card only")

    def reads_runtime(self, item: s.Slice) -> bool:
        """Whether a slice's bounds read a size of the inputs (T, the tokens given)."""
        names = {n.id for b in (item.lo, item.hi) if b is not None for n in s.nodes(b)
                 if isinstance(n, s.Name)}
        defs = self.info.sig.definitions
        names |= {sym for n in list(names) if n in defs for sym in defs[n].symbols}
        return bool(names & self.runtime_used)

    def runtime_offset(self, item: s.Slice) -> tuple[str, Dim] | None:
        """(T, k) for a slice [k + 1 : T + k] of a length T read at call time (k a number or
        the hyperparameters', `W_p[o + 1 : T + o]`), else None."""
        defs = self.info.sig.definitions
        hi = expr_dim(item.hi, defs) if item.hi is not None else None
        runtime = [n for n in self.runtime_used if hi is not None and n in hi.symbols]
        if len(runtime) != 1:
            return None
        k = hi - Dim.sym(runtime[0])
        if k.symbols & self.runtime_used:
            return None
        lo = Dim.const(1) if item.lo is None else expr_dim(item.lo, defs)
        return (runtime[0], k) if lo == k + Dim.const(1) else None

    def point_index(self, e: s.Index) -> Val:
        """`Mask[t, t′]` under ∀t, t′: the whole tensor, transposed if the order differs."""
        base = self.expr(e.base)
        order = [self.point[i.id][0] for i in e.items]
        stored = [self.physical(base, k) for k in range(len(e.items))]
        if order == stored:
            return base
        if len(order) == 2:
            return Val(_method(base.code, "transpose", _int(-2), _int(-1)), base.ty, base.lifted)
        return self.fail(e, "code generation handles two quantified variables at most")
