"""Lowering of a card's statements: assignments (a value, a part of one, a model decoded with
a KV cache), `return`, and the loops of a module: over layers, over positions (vectorised), over
heads (fused or literal), and `∀` maps and masked fills."""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from .. import syntax as s
from ..checker import instance
from ..dims import Dim
from ..spelling import display
from ..types import BundleTy, Ty
from .body import (
    _call,
    _dec,
    _int,
    _is_all,
    _is_tensor,
    _like,
    _method,
    _mT,
    _name_reads,
)
from .gradients import gradient_step
from .recurrence import sequential
from .values import (
    Family,
    LowerError,
    ModuleSlot,
    Val,
    attr_name,
    local_name,
)


class Statements:
    """Statements and loops of a card (part of `cardc.lower.steps.Body`)."""

    def stmt_Assign(self, st: s.Assign, step: s.Step) -> None:
        if self.procedure and isinstance(st.target, s.Call):  # P(θ) ← …: P, a function of θ
            st = replace(st, target=s.Name(st.target.func, span=st.target.span))
        if self.procedure and gradient_step(self, st, step):  # g ← ∇loss(θ), g ← g · s
            return
        if self.procedure and isinstance(st.target, s.Name) and \
                self.is_model(self.scope.values.get(st.target.id)):
            if self.update(st, step):
                return
            self.fail(st, "code generation updates parameters as 'θ ← θ − η · ∇loss(θ)' or "
                          "'θ ← AdamW(θ, ∇loss(θ) | η, β_1, β_2, λ)'",
                      hint="a gradient named before, 'g ← ∇loss(θ)', takes the place of "
                           "∇loss(θ): 'θ ← AdamW(θ, g | η)'")
        if isinstance(st.target, s.Several):
            return self.assign_several(st, step)
        if isinstance(st.value, s.SetBuilder) and isinstance(st.target, s.Name):
            self.sets[st.target.id] = self.arange_of(st.value.var, st.value.domain, step)
            self.domain = self.sets[st.target.id]
        if isinstance(st.target, s.Index) and self.assign_part(st.target, st.value, step):
            return
        if not isinstance(st.target, s.Name):
            self.fail(st.target, "code generation handles assignments to a name only here",
                      hint="assign the whole value, e.g. 'X ← …'")
        if self.decode(st, step):
            return
        val = self.expr(st.value)
        family = self.family_of(st.target.id)
        if family is not None:
            family.flipped = val.flipped
            self.emit(ir.Assign((), _method(ir.Ref(family.local), "append", val.code),
                                self.note(step, val, display(st.target.id))))
            return
        name = local_name(st.target.id)
        if val.code != ir.Ref(name):  # `ℓ ← length(x)` where ℓ is already read off x
            self.emit(ir.Assign((name,), val.code, self.note(step, val)))
        self.scope.values[st.target.id] = _like(val, ir.Ref(name))

    def assign_part(self, target: s.Index, value: s.Expr, step: s.Step) -> bool:
        """`Y[:, a : b] ← v` (or a strided part, `Y[:, 1, 3, …, d − 1] ← v`) where Y already
        holds a value: Y with that part replaced, computed as a new tensor (`slice_scatter`),
        so gradients reach both v and the entries of Y that are kept."""
        old = self.scope.values.get(target.base.id) if isinstance(target.base, s.Name) else None
        if not isinstance(old, Val) or old.rows or self.family_of(target.base.id) is not None:
            return False
        parts = [(k, i) for k, i in enumerate(target.items) if not _is_all(i)]
        if len(parts) != 1 or not isinstance(parts[0][1], s.Slice | s.Progression):
            self.fail(target, "code generation replaces one range of one axis at a time",
                      hint="write 'Y[:, a : b] ← …' with ':' for every other axis")
        k, item = parts[0]
        part = self.slice(item, old, k) if isinstance(item, s.Slice) else \
            self.progression(item, old, k)
        val = self.expr(value)
        src = _mT(val.code) if val.flipped != old.flipped and len(val.ty.shape) == 2 else val.code
        index = (ir.Ref("..."),) + tuple(
            part if j == old.axis(k) else ir.SliceX(None, None) for j in range(old.axis(k), 0))
        if val.lifted != old.lifted or len(val.ty.shape) != len(old.ty.shape):  # broadcast
            src = ir.Bin("+", _call("torch.zeros_like", ir.Sub(old.code, index)), src)
        kwargs = {"dim": _int(old.axis(k))}
        for key, bound in (("start", part.lo), ("end", part.hi), ("step", part.step)):
            if bound is not None:
                kwargs[key] = bound
        name = local_name(target.base.id)
        code = _method(old.code, "slice_scatter", src, **kwargs)
        self.emit(ir.Assign((name,), code, self.note(step, old)))
        self.scope.values[target.base.id] = _like(old, ir.Ref(name))
        return True

    def decode(self, st: s.Assign, step: s.Step) -> bool:
        """`P ← M(…, x[a : b] | θ̂)` in a loop, where only P's last row is read: M decodes with
        a KV cache, fed only the tokens of x it has not seen (all of them when the window
        moved), and P holds the rows of those tokens."""
        call = self.info.calls.get(id(st.value)) if self.procedure and self.loop_index else None
        model = self.module_for(st.value, call) if call is not None else None
        rows = self.ty(st.value).shape[0] if self.ty(st.value).rank == 2 else None
        if model is None or rows is None or not self.reads_last_row(st.target.id, rows) or \
                not self.low.decodes(call.callee):
            return False
        cache = self.fresh("cache")
        self.prologue.append(ir.Assign((cache,), _method(model, "new_cache"), ir.Note(
            text=f"{call.callee.label} decodes with a KV cache", line=self.line(step))))
        args = [a.code for a in self.call_args(st.value, call)]
        args[-1] = _method(ir.Ref(cache), "new", args[-1])
        val = Val(ir.Call(model, tuple(args), (("cache", ir.Ref(cache)),)), self.ty(st.value),
                  True)
        name = local_name(st.target.id)
        self.emit(ir.Assign((name,), val.code, self.note(step, None, "rows of the new tokens only")))
        self.scope.values[st.target.id] = _like(val, ir.Ref(name))
        self.decoded.add(st.target.id)
        return True

    def reads_last_row(self, name: str, rows: Dim) -> bool:
        """Every read of `name` in the card is `name[rows, …]`, and it is assigned once."""
        uses, reads = _name_reads(self.alg).get(name, (0, []))
        if uses != len(reads) + 1:  # the assignment's target, and the reads' bases
            return False
        for r in reads:
            if isinstance(r.items[0], s.Slice) or any(not _is_all(i) for i in r.items[1:]):
                return False
            try:
                if self.size(r.items[0]) != rows:
                    return False
            except LowerError:
                return False
        return bool(reads)

    def last_row(self, e: s.Index) -> Val:
        """`P[ℓ + i − s, :]` of a decoded P: its last row, the newest token's."""
        base = self.expr(e.base)
        rest = tuple(ir.SliceX(None, None) for _ in e.items[1:])
        return Val(ir.Sub(base.code, (ir.Ref("..."), _int(-1), *rest)), self.ty(e), True)

    @staticmethod
    def is_model(val) -> bool:
        return isinstance(val, Val) and isinstance(val.ty, BundleTy)

    def stmt_Return(self, st: s.Return, step: s.Step) -> None:
        if isinstance(st.value, s.Several):  # return P, r: a tuple, in the header's order
            vals = [self.output(self.expr(x)) for x in st.value.items]
            self.returned = vals[0]
            self.emit(ir.Return(ir.Seq(tuple(v.code for v in vals)), self.note(step, vals[0])))
            return
        val = self.output(self.expr(st.value))
        self.returned = val
        self.emit(ir.Return(val.code, self.note(step, val)))

    def output(self, val: Val) -> Val:
        """A value the card returns, stored as its callers read it."""
        column = self.info.sig.layout == "column"  # its callers read a matrix stored so
        if isinstance(val.ty, Ty) and val.ty.rank == 2 and not val.rows and val.flipped != column:
            val = replace(val, code=_mT(val.code), flipped=column)
        return self.per_example(val)

    def assign_several(self, st: s.Assign, step: s.Step) -> None:
        """`P, r ← M(x | θ)`: the module or function of M returns a tuple, unpacked."""
        call = self.info.calls.get(id(st.value))
        if call is None or not call.outputs:
            self.fail(st, "code generation names the several outputs of a model card's call")
        val = self.expr(st.value)
        if not isinstance(val.code, ir.Call) or val.rows:
            self.fail(st.value, "code generation calls a card of several outputs as a module "
                                "or a function, on whole values")
        column = self.low.checker.info(call.callee).sig.layout == "column"
        names = [local_name(t.id) for t in st.target.items]
        self.emit(ir.Assign(tuple(names), val.code, self.note(step, val)))
        for target, name, ty in zip(st.target.items, names, call.outputs, strict=True):
            flipped = column and isinstance(ty, Ty) and ty.rank == 2
            self.scope.values[target.id] = Val(ir.Ref(name), ty, True, flipped)

    def per_example(self, val: Val) -> Val:
        """A card's output is one value per example: a tensor that no input varies (a table
        of position buckets) is given the batch axes of the card's first input, as a view."""
        inputs = self.info.sig.inputs
        if self.procedure or not inputs or val.lifted or val.rows or \
                not isinstance(val.ty, Ty) or not val.ty.shape or None in val.ty.shape:
            return val
        name, ty = inputs[0]
        batch = ir.Sub(ir.Attr(ir.Ref(local_name(name)), "shape"),
                       (ir.SliceX(None, _int(-ty.rank) if ty.rank else None),))
        dims = val.ty.shape[:-2] + val.ty.shape[:-3:-1] if val.flipped else val.ty.shape
        shape = ir.Bin("+", batch, ir.Seq(tuple(self.dim(d) for d in dims)))
        return replace(val, code=_method(val.code, "expand", shape), lifted=True)

    def stmt_For(self, st: s.For, step: s.Step) -> None:
        stack = self.module_stack(st)
        if stack is not None and st.style == "map" and self.defines_members(st):
            return self.map_loop(st, step)  # `y^e ← Expert(x | θ^e)`: a family, member by member
        if stack is not None:
            return self.layer_loop(st, step, stack)
        if self.procedure:
            return self.procedure_loop(st, step)
        if st.style == "map" or isinstance(st.over, s.Concat):
            nest = _entrywise(st)
            if nest is not None:
                return self.entrywise(nest, step)
            if self.indexes_by(st.body, st.var) and not self.slices_by(st.body, st.var):
                return self.position_map(st, step)
            if self.fuse_loop(st, step):
                return None
            return self.map_loop(st, step)
        if sequential(st):  # `for t = 1, …, T do h ← …; Y[t, :] ← … end`
            return self.recurrence(st, step)
        return self.fail(st, "code generation does not handle this loop yet")

    def module_stack(self, st: s.For) -> tuple[str, ModuleSlot] | None:
        for name, slot in self.scope.modules.items():
            if slot.var is not None and self.uses_family(st.body, name, slot.var, st.var):
                return name, slot
        return None

    @staticmethod
    def defines_members(st: s.For) -> bool:
        """Whether every step of the loop defines a member of a family by its variable
        (`Y^h ← …`): a map whose results are kept side by side, not a stack of layers."""
        return all(isinstance(sub.stmt, s.Assign) and isinstance(sub.stmt.target, s.Name) and
                   instance(sub.stmt.target.id, st.var, sub.stmt.target.id) == st.var
                   for sub in st.body)

    @staticmethod
    def uses_family(body, pattern: str, var: str, loop_var: str) -> bool:
        return any(isinstance(n, s.Name) and instance(pattern, var, n.id) == loop_var
                   for n in s.nodes(body))

    def layer_loop(self, st: s.For, step: s.Step, stack: tuple[str, ModuleSlot]) -> None:
        """A stack of layers: `for block in self.block`, or by index when the layers' own
        tensors (γ^1_l) are stacked beside their modules."""
        pattern, slot = stack
        body = self.child()
        used = [name for name, sl in self.scope.modules.items()
                if sl.var is not None and self.uses_family(st.body, name, sl.var, st.var)]
        by_index = len(used) > 1 or any(
            self.uses_family(st.body, name, fam.var, st.var)
            for name, fam in self.scope.stacked.items() if fam.axis == "lead")
        if by_index:
            local = self.loop_var(st.var)
            body.loop_index[st.var] = ir.Ref(local)
            for name in used:
                attr = ir.Ref(f"self.{self.scope.modules[name].attr}")
                self.scope.loop_modules[name] = ir.Sub(attr, (ir.Ref(local),))
            over = _call("range", self.loop_count(st))
        else:
            local = self.fresh(slot.attr)
            self.scope.loop_modules[pattern] = ir.Ref(local)
            over = layers_run(self, st, slot)
        before = dict(self.scope.values)
        for sub in st.body:
            body.step(sub)
        body.keep_layouts(before)
        for name in used:
            self.scope.loop_modules.pop(name, None)
        self.max_seq_len = self.max_seq_len or body.max_seq_len
        self.emit(ir.Loop(local, over, tuple(body.out), self.note(step)))

    def keep_layouts(self, before: dict) -> None:
        """A matrix a loop's steps assign stored as it was when the loop began: the steps
        are lowered once, for the layout of the first iteration's values, so every later
        iteration must find them stored the same way."""
        for name, old in before.items():
            new = self.scope.values.get(name)
            if not isinstance(old, Val) or not isinstance(new, Val) or new is old or \
                    len(new.ty.shape) != 2 or not new.lifted or new.flipped == old.flipped:
                continue
            local = local_name(name)
            self.emit(ir.Assign((local,), _mT(new.code), self.note(self.at_step, old)))
            self.scope.values[name] = replace(new, code=ir.Ref(local), flipped=old.flipped)

    def loop_count(self, st: s.For) -> ir.Expr:
        """How many times a loop over 1, 2, …, n runs: n. A loop from elsewhere is refused
        where only its count is read (a stack of layers, a recurrence over positions)."""
        if not counts_from_one(st.over):
            return self.fail(st.over, "code generation runs this loop from 1: write its range "
                                      "as 1, 2, …, n or [n]")
        if isinstance(st.over, s.Range):
            return self.dim(self.size(st.over.last))
        return self.dim(self.size(st.over.items[0]))

    @staticmethod
    def indexes_by(body, var: str) -> bool:
        """Whether `var` indexes a value somewhere in `body` (X[:, t]): a map over positions."""
        return any(isinstance(n, s.Index) and any(getattr(i, "id", None) == var for i in n.items)
                   for n in s.nodes(body))

    @staticmethod
    def slices_by(body, var: str) -> bool:
        """Whether a slice's bounds read `var` (`Q[:, (h − 1) d + 1 : h d]`): blocks picked by
        the map's variable, which a map over positions never reads, but a map over heads that
        also reads a column by it (`W_b[:, h]`) does."""
        return any(isinstance(n, s.Slice) and var in {m.id for b in (n.lo, n.hi) if b is not None
                                                      for m in s.nodes(b) if isinstance(m, s.Name)}
                   for n in s.nodes(body))

    def position_map(self, st: s.For, step: s.Step) -> None:
        """`for t ∈ [ℓ] : X̃[:, t] ← f(X[:, t])` or `e_t ← …`: every column at once.

        Columns of a flipped matrix are its rows, so `X[:, t]` is all of X with the position
        axis in front of the card's own. Steps may read column t of anything, never another
        column, which is what makes the iterations independent."""
        size = self.size(st.over.items[0]) \
            if isinstance(st.over, s.Concat) and len(st.over.items) == 1 else None
        if size is None:
            self.fail(st.over, "expected a range such as [ℓ]")
        outer, self.positions = self.positions, (st.var, size)
        try:
            for sub in st.body:
                self.position_step(sub, st.var, size)
        finally:
            self.positions = outer

    def position_step(self, step: s.Step, var: str, size: Dim) -> None:
        st = step.stmt
        if not isinstance(st, s.Assign):
            self.fail(step, "a map over positions holds assignments only")
        val = self.expr(st.value)
        if size is None and val.rows:  # a map over a family: its members are the rows
            size = val.rows[0]
        target = st.target
        kind = self.mapped_target(target, var)
        if val.rows != (size,):
            if val.rows or val.lifted and self.reads_inputs(st.value) or val.flipped or \
                    kind is None:
                self.fail(st.value, f"this value does not depend on '{display(var)}'")
            val = self.every_position(val, size)
        if kind is not None:  # X̃[:, t], X̃[t, :] or x[t] ← v: X̃ (x) holds every t's value
            name = target.base.id
            if kind == "column":  # the matrix of all columns, stored flipped
                whole = replace(val, ty=Ty((*val.ty.shape, size), val.ty.elem), rows=(),
                                flipped=True)
            else:  # the positions axis is already in front of the card's own: rows
                whole = replace(val, ty=Ty((size, *val.ty.shape), val.ty.elem), rows=())
            local = local_name(name)
            self.emit(ir.Assign((local,), val.code, self.note(step, whole)))
            self.scope.values[name] = _like(whole, ir.Ref(local))
        elif isinstance(target, s.Name) and instance(target.id, var, target.id) is not None:
            local = self.fresh(attr_name(target.id, var))
            self.emit(ir.Assign((local,), val.code, self.note(step, val)))
            self.scope.values[target.id] = Family(var, local, val.ty, _like(val, ir.Ref(local)),
                                                  positions=True)
        else:
            v = display(var)
            self.fail(target, f"a map over '{v}' assigns 'X[:, {v}]', 'X[{v}, :]', 'x[{v}]' "
                              f"or a value named for '{v}'")

    def reads_inputs(self, e: s.Expr) -> bool:
        """Whether `e` reads a value computed from the inputs (one per example); a call of
        parameters alone is lifted as if it did."""
        return any(isinstance(n, s.Name) and getattr(self.scope.values.get(n.id), "lifted", True)
                   and n.id not in self.scope.tensors and n.id in self.scope.values
                   for n in s.nodes(e))

    def every_position(self, val: Val, size: Dim) -> Val:
        """A value no position changes (`Y[t, :] ← f(W)` of parameters alone), the same at
        every position: the positions axis in front of its own."""
        dims = ir.Seq((self.dim(size), *(self.dim(d) for d in val.ty.shape)))
        code = _call("torch.broadcast_to", val.code, dims) if _is_tensor(val) else \
            _call("torch.full", dims, val.code, device=self.device_expr())
        return replace(val, code=code, rows=(size,), lifted=False)

    @staticmethod
    def mapped_target(target: s.Expr, var: str) -> str | None:
        """Which part of a value a map over `var` assigns: "column" (X̃[:, t]), "row"
        (X̃[t, :]) or "entry" (x[t]); None for anything else."""
        if not (isinstance(target, s.Index) and isinstance(target.base, s.Name)):
            return None
        items = [getattr(i, "id", None) == var or (_is_all(i) and "all") for i in target.items]
        return {(True,): "entry", ("all", True): "column", (True, "all"): "row"}.get(tuple(items))

    def map_loop(self, st: s.For, step: s.Step) -> None:
        """`for h ∈ [H] : Y^h ← f(…)`, literally: a Python loop that collects a list."""
        if not isinstance(st.over, s.Concat) or len(st.over.items) != 1:
            self.fail(st.over, "expected a range such as [H]")
        count = self.dim(self.size(st.over.items[0]))
        var = self.loop_var(st.var)
        for sub in st.body:
            target = sub.stmt.target if isinstance(sub.stmt, s.Assign) else None
            if isinstance(target, s.Name) and st.var in target.id:
                fam = Family(st.var, self.fresh(f"{attr_name(target.id, st.var)}_{var}"),
                             self.ty(sub.stmt.value), count=self.size(st.over.items[0]))
                self.scope.values[target.id] = fam
                self.emit(ir.Assign((fam.local,), ir.Seq((), "list"), self.note(step)))
        body = self.child()
        body.loop_index[st.var] = ir.Ref(var)
        modules = [name for name, slot in self.scope.modules.items()
                   if slot.var is not None and self.uses_family(st.body, name, slot.var, st.var)]
        for name in modules:  # each member's own module: `self.experts[e]`
            attr = ir.Ref(f"self.{self.scope.modules[name].attr}")
            self.scope.loop_modules[name] = ir.Sub(attr, (ir.Ref(var),))
        try:
            for sub in st.body:
                body.step(sub)
        finally:
            for name in modules:
                self.scope.loop_modules.pop(name, None)
        self.emit(ir.Loop(var, _call("range", count), tuple(body.out), self.note(step)))

    def entrywise(self, nest: tuple[list[str], list[s.Concat], s.Assign], step: s.Step) -> None:
        """`for t ∈ [T] : for t′ ∈ [T] : G[t, t′] ← t − t′`, or `∀t ∈ [T], t′ ∈ [T] : …`:
        every entry at once, each variable counting 1, 2, … along its own axis, broadcast to
        the whole."""
        names, sets, assign = nest
        sizes = [self.size(o.items[0]) for o in sets]
        rank = len(names)
        self.point = {v: (k, rank, sizes[k]) for k, v in enumerate(names)}
        try:
            val = self.expr(assign.value)
        finally:
            self.point = {}
        if val.lifted or val.rows or val.flipped:
            self.fail(assign.value, "code generation defines entry by entry only values of "
                                    "the loop variables, hyperparameters and parameters")
        dims = ir.Seq(tuple(self.dim(d) for d in sizes))
        code = _call("torch.broadcast_to", val.code, dims) if _is_tensor(val) else \
            _call("torch.full", dims, val.code, device=self.device_expr())
        name = local_name(assign.target.base.id)
        whole = Val(ir.Ref(name), Ty(tuple(sizes), val.ty.elem))
        self.emit(ir.Assign((name,), code, self.note(step, whole)))
        self.scope.values[assign.target.base.id] = whole

    def member(self, name: str) -> tuple[Family | None, str | None]:
        """The family `name` belongs to, and its index there: k_u → (k_t's family, u)."""
        for pattern, fam in self.scope.values.items():
            if isinstance(fam, Family):
                index = fam.var if pattern == name else instance(pattern, fam.var, name)
                if index is not None:
                    return fam, index
        return None, None

    def family_of(self, name: str) -> Family | None:
        return self.member(name)[0]

    def stmt_ForAll(self, st: s.ForAll, step: s.Step) -> None:
        """`∀t, t′, if c then S[t, t′] ← v`: a masked fill of S where c holds. `∀t: k_t ← f(e_t)`
        (one variable, a family on each side) is a map over the family's members."""
        body = st.body
        nest = _ranged(st)
        if nest is not None:
            return self.entrywise(nest, step)
        if len(st.vars) == 1 and isinstance(body, s.Assign):
            outer, self.positions = self.positions, (st.vars[0], None)
            try:
                return self.position_step(s.Step(body, span=step.span), st.vars[0], None)
            finally:
                self.positions = outer
        if isinstance(body, s.Assign):
            return self.forall_update(st, body, step)
        if not (isinstance(body, s.If) and isinstance(body.then, s.Assign)
                and isinstance(body.then.target, s.Index)
                and isinstance(body.then.target.base, s.Name)
                and [getattr(i, "id", None) for i in body.then.target.items] == list(st.vars)):
            self.fail(st, "code generation handles '∀…, if c then A[…] ← v' with A indexed "
                          "by exactly the quantified variables")
        target = body.then.target.base.id
        current = self.expr(body.then.target.base)
        rank = len(st.vars)
        shape = current.ty.shape[-rank:]
        self.point = {v: (self.physical(current, k), rank, shape[k]) for k, v in enumerate(st.vars)}
        try:
            cond = self.expr(body.cond)
            value = self.expr(body.then.value)
        finally:
            self.point = {}
        if value.lifted or value.ty.shape:
            code = _call("torch.where", cond.code, value.code, current.code)
        else:
            code = _method(current.code, "masked_fill", cond.code, value.code)
        name = local_name(target)
        self.emit(ir.Assign((name,), code, self.note(step, current)))
        self.scope.values[target] = _like(current, ir.Ref(name))

    def forall_update(self, st: s.ForAll, body: s.Assign, step: s.Step) -> None:
        """`∀t, t′ : S[t, t′] ← S[t, t′] − m · (t − t′)`: every entry of S at once, each
        variable counting 1, 2, … along the axis it indexes (the value is S's shape)."""
        target = body.target
        if not (isinstance(target, s.Index) and isinstance(target.base, s.Name)
                and [getattr(i, "id", None) for i in target.items] == list(st.vars)):
            self.fail(st, "code generation handles '∀…: A[…] ← v' with A indexed by exactly "
                          "the quantified variables")
        current = self.expr(target.base)
        rank = len(st.vars)
        shape = current.ty.shape[-rank:]
        self.point = {v: (self.physical(current, k), rank, shape[k]) for k, v in enumerate(st.vars)}
        try:
            value = self.expr(body.value)
        finally:
            self.point = {}
        if value.rows or value.flipped != current.flipped and len(shape) == 2:
            self.fail(body.value, "code generation updates entry by entry only from values "
                                  "stored as the target is")
        code = value.code
        if target.base.id not in {n.id for n in s.nodes(body.value) if isinstance(n, s.Name)}:
            code = _call("torch.broadcast_to", code, ir.Attr(current.code, "shape")) \
                if _is_tensor(value) else _call("torch.full_like", current.code, code)
        name = local_name(target.base.id)
        self.emit(ir.Assign((name,), code, self.note(step, current)))
        self.scope.values[target.base.id] = _like(current, ir.Ref(name))

    @staticmethod
    def physical(val: Val, k: int) -> int:
        """Where card axis `k` of a matrix sits among its physical card axes (0-based)."""
        return len(val.ty.shape) + val.axis(k)


def _ranged(st: s.ForAll) -> tuple[list[str], list[s.Concat], s.Assign] | None:
    """`∀t ∈ [T], t′ ∈ [T] : G[t, t′] ← …`: every variable given a range [n], the step
    defining one entry of a tensor indexed by exactly the variables in order."""
    if not st.over or not all(_whole_range(o) for o in st.over):
        return None
    body = st.body
    if not isinstance(body, s.Assign) or not _indexed_by(body.target, list(st.vars)):
        return None
    return list(st.vars), list(st.over), body


def _whole_range(over: s.Expr | None) -> bool:
    """Whether a set is written [n]: 1, 2, …, n."""
    return isinstance(over, s.Concat) and over.sep == "," and len(over.items) == 1 and \
        not isinstance(over.items[0], s.Ellipsis_)


def _indexed_by(target: s.Expr, names: list[str]) -> bool:
    """Whether `target` is a name indexed by exactly `names`, in order, each once."""
    return isinstance(target, s.Index) and isinstance(target.base, s.Name) and \
        [getattr(i, "id", None) for i in target.items] == names and \
        len(set(names)) == len(names)


def _entrywise(st: s.For) -> tuple[list[str], list[s.Concat], s.Assign] | None:
    """A nest of maps over ranges, one step each, whose innermost step defines one entry
    of a tensor indexed by exactly the nest's variables in order, `G[t, t′] ← …`."""
    loops: list[s.For] = []
    stmt: s.Stmt = st
    while isinstance(stmt, s.For) and stmt.style == "map" and len(stmt.body) == 1 and \
            isinstance(stmt.over, s.Concat) and len(stmt.over.items) == 1:
        loops.append(stmt)
        stmt = stmt.body[0].stmt
    if len(loops) < 2 or not isinstance(stmt, s.Assign) or \
            not _indexed_by(stmt.target, [f.var for f in loops]):
        return None
    return [f.var for f in loops], [f.over for f in loops], stmt


def counts_from_one(over: s.Expr) -> bool:
    """`[n]`, `1, …, n` or `1, 2, …, n`."""
    if isinstance(over, s.Concat):
        return len(over.items) == 1
    return isinstance(over, s.Range) and \
        [getattr(f, "text", None) for f in over.first] in (["1"], ["1", "2"])


def loop_range(body: Statements, st: s.For) -> ir.Expr:
    """The 0-based values of a loop's variable: `range(n)` over 1, …, n, `range(a − 1, b)`
    over a, …, b (a training card's minibatch, (i − 1) · B + 1, …, i · B)."""
    if counts_from_one(st.over):
        return _call("range", body.loop_count(st))
    if isinstance(st.over, s.Range) and len(st.over.first) == 1:
        first, last = body.expr(st.over.first[0]).code, body.expr(st.over.last).code
        return _call("range", _dec(first), last)
    return body.fail(st.over, "expected a range such as [L], 1, 2, …, L or a, …, b")


def layers_run(body: Statements, st: s.For, slot: ModuleSlot) -> ir.Expr:
    """The stack's layers a loop over them runs: all of them where its range is the
    stack's own, 1, …, N; else the ones it names, `self.block[a − 1 : b]`."""
    stack = ir.Ref(f"self.{slot.attr}")
    if counts_from_one(st.over):
        last = st.over.last if isinstance(st.over, s.Range) else st.over.items[0]
        if slot.count is not None and body.size(last) == slot.count:
            return stack
        return ir.Sub(stack, (ir.SliceX(None, body.loop_count(st)),))
    if isinstance(st.over, s.Range) and len(st.over.first) == 1:
        first, last = body.expr(st.over.first[0]).code, body.expr(st.over.last).code
        return ir.Sub(stack, (ir.SliceX(_dec(first), last),))
    return body.fail(st.over, "expected a range such as [N], 1, 2, …, N or a, …, b")
