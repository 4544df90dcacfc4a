"""The statement checker: assignments, returns, sampling, loops and conditions of one card's
steps, in order; the expressions in them are the expression checker's."""

from __future__ import annotations

from dataclasses import replace

from .. import syntax as s
from ..dims import Dim
from ..render.text import render_expr
from ..spelling import display
from ..types import BundleTy, Entry, FamilyTy, FuncTy, Ty, subst_dim, substitute
from .declarations import DeclEnv
from .expressions import ExprChecker
from .indexed import instance, split_name
from .results import CardInfo, Cards, CheckError
from .scope import BodyState, Part
from .shapes import _adopt, _d, _is_sequence, _same_vocab, broadcastable, same_shape


class StepChecker(Part):
    """Checks the steps of one card."""

    def __init__(self, checker: Cards, alg: s.Algorithm, info: CardInfo):
        super().__init__(BodyState(checker, alg, info))
        self.exprs = ExprChecker(self.state)

    def run(self) -> None:
        if not self.alg.steps:
            self.error(self.alg.span, f"'{self.alg.label or 'this card'}' has no steps",
                       hint="write its steps after the blocks: '1 Y ← …', '2 return …'")
        for step in self.alg.steps:
            self.step(step)
        for call in self.info.calls.values():  # sizes no step fixes become the card's own
            for d in call.bind.values():
                for sym in d.symbols:
                    if sym.startswith("?") and sym not in self.state.solved:
                        self.state.solved[sym] = Dim.sym(sym[1:])
                        self.sig.hypers.setdefault(sym[1:], Ty(elem="ℕ", value=Dim.sym(sym[1:])))
        if self.state.solved:
            solved = substitute(self.sig.tree, self.state.solved)
            self.sig.tree.members.update(solved.members)
            for call in self.info.calls.values():  # a callee's free sizes, as the card fixed them
                call.bind = {k: subst_dim(v, self.state.solved) for k, v in call.bind.items()}
        self.adopt_sizes()

    def adopt_sizes(self) -> None:
        """A bundle declared `see (4)` has the callee's shapes in the callee's symbols; the call
        that receives it says what they are here."""
        def adopt(members: dict[str, Entry], given: str, bind: dict[str, Dim]) -> None:
            for key, entry in members.items():
                if isinstance(entry, BundleTy) and entry.card is None:
                    adopt(entry.members, given, bind)
                elif isinstance(entry, BundleTy) and key == given:
                    members[key] = substitute(entry, bind)
                elif isinstance(entry, FamilyTy) and isinstance(entry.entry, BundleTy) and \
                        entry.entry.card and instance(key, entry.var, given) is not None:
                    members[key] = FamilyTy(entry.var, entry.over, substitute(entry.entry, bind))

        for call in self.info.calls.values():
            for given in call.params.values():
                if isinstance(given, s.Name):
                    adopt(self.sig.tree.members, given.id, call.bind)
        if self.alg.name and self.alg.outputs and not self.state.returned:
            self.error(self.alg.span, f"'{self.alg.name}' never returns its output",
                       hint="end the card with 'return …'")

    def step(self, step: s.Step) -> None:
        try:
            ty = self.stmt(step.stmt)
        except CheckError:
            self.state.failed.update(_targets(step.stmt))
            return
        if step.annotation is not None and isinstance(ty, Ty) and step.annotation.type is not None:
            want = DeclEnv(self.c, self.alg)
            want.definitions = self.sig.definitions
            declared = want.decl_type(step.annotation)
            if not same_shape(declared, ty):
                self.error(step.annotation.span,
                           f"annotation says {declared} but the value is {ty}")

    def stmt(self, st: s.Stmt) -> Ty | None:
        return s.dispatch(self, "stmt", st)

    def stmt_Assign(self, st: s.Assign) -> Ty | None:
        self.state.scaled = {}
        if isinstance(st.target, s.Several):
            return self.assign_several(st.target, st.value)
        value = self.exprs.expr(st.value)
        target = st.target
        if isinstance(target, s.Name):
            self.state_from_number(target, value)
            self.reassign(target, value)
            self.state.assign_name(target.id, value)
            self.state.assigned[target.id] = st.span
            self.state.depends[target.id] = self.state.computed_from(n.id for n in _names(st.value))
            self.state.staleness.assign(target.id, st.span, self.state.depends[target.id])
            return value
        if isinstance(target, s.Index) and isinstance(target.base, s.Name):
            return self.assign_indexed(target, self.exprs.as_tensor(st.value, value))
        if isinstance(target, s.Call):  # P(θ) ← …, loss(θ) = …: functions of the parameters
            self.define_function(target, st.value, value)
            return value
        self.error(target.span, "cannot assign to this expression")
        raise CheckError

    def assign_several(self, target: s.Several, value: s.Expr) -> Ty | None:
        """`P, r ← M(x | θ)`: each name takes one output of a card of as many, in order."""
        if not isinstance(value, s.Call):
            self.error(value.span, f"{len(target.items)} names take the outputs of a card "
                                   "of as many, not of this expression",
                       hint="write 'P, r ← M(x | θ)' for a card whose header is 'P, r ← M(x | θ)'")
            raise CheckError
        self.state.naming = id(value)
        try:
            self.exprs.expr(value)
        finally:
            self.state.naming = None
        info = self.info.calls.get(id(value))
        outs = info.outputs if info is not None else ()
        if len(outs) != len(target.items):
            have = len(outs) or 1
            self.error(target.span, f"{len(target.items)} names, but '{display(value.func)}' "
                                    f"has {have} output{'s' if have > 1 else ''}",
                       notes=((info.callee.span, "declared here"),) if info else ())
            raise CheckError
        computed_from = self.state.computed_from(n.id for n in _names(value))
        for name, out in zip(target.items, outs, strict=True):
            self.reassign(name, out)
            self.state.assign_name(name.id, out)
            self.state.assigned[name.id] = name.span
            self.state.depends[name.id] = computed_from
            self.state.staleness.assign(name.id, name.span, computed_from)
        return None

    def state_from_number(self, target: s.Name, value: Entry) -> None:
        """A loop's state that enters it as a number (h ← 0) and whose update multiplies it
        by a matrix (`h W_h`) scales the matrix on the first pass: the state would take the
        matrix's shape, not the one the card means. Said here, at the step, not at `return`."""
        product = self.state.scaled.get(target.id)
        if product is None or not isinstance(value, Ty) or not value.shape:
            return
        name, line = display(target.id), self.state.number_states[target.id].line
        self.error(product.span, f"'{name}' enters this loop as a number (line {line}), so on "
                                 f"the first pass '{render_expr(product)}' scales a matrix, and "
                                 f"'{name}' would become {value}",
                   hint=f"give '{name}' its shape before the loop, as a vector or matrix of "
                        "zeros, so that this product is the one the card means")
        raise CheckError

    def reassign(self, target: s.Name, value: Entry) -> None:
        """Parameters stay parameters of one card; a sequence of tokens stays one (it may grow)."""
        old = self.state.try_lookup(target.id)
        name = display(target.id)
        if isinstance(old, BundleTy):
            if not isinstance(value, BundleTy) or not old.same_kind(value):
                self.error(target.span, f"'{name}' is {old}; cannot assign {value} to it")
                raise CheckError
            _adopt(old, value)
        elif _is_sequence(old) and not (_is_sequence(value) and _same_vocab(old, value)):
            self.error(target.span, f"'{name}' is a sequence of tokens; cannot assign {value} to it",
                       hint="a sequence may be reassigned a sequence of the same vocabulary, "
                            "such as [x, y]")
            raise CheckError

    def define_function(self, target: s.Call, body: s.Expr, value: Entry) -> None:
        """`P(θ) ← DTransformer(x | θ)`: P is the value, as a function of θ."""
        params = []
        for arg in target.args:
            if not isinstance(arg, s.Name) or target.params:
                self.error(arg.span, f"the parameters of '{display(target.func)}' must be names")
                raise CheckError
            self.exprs.expr(arg)  # the parameter must be in scope
            if arg.id not in self.state.computed_from(n.id for n in _names(body)):
                self.error(arg.span, f"'{display(target.func)}({display(arg.id)})' is defined by an "
                                     f"expression that does not use '{display(arg.id)}'",
                           hint=f"its value must be computed from '{display(arg.id)}', here or "
                                "in an earlier step")
            params.append(arg.id)
            self.stale_reads(body, arg.id, render_expr(target))
        self.state.bind(target.func, FuncTy(tuple(params), value))
        self.state.assigned[target.func] = target.span
        self.state.depends[target.func] = self.state.computed_from(n.id for n in _names(body))
        self.state.staleness.assign(target.func, target.span, self.state.depends[target.func])
        self.info.types[id(target)] = value

    def stale_reads(self, body: s.Expr, wrt: str, reader: str) -> None:
        """A function of `wrt` reads no value, nor function (`P(θ)`), computed from an older
        `wrt`."""
        reads = [(n.id, n.span) for n in _names(body)] + \
            [(c.func, c.span) for c in s.nodes(body) if isinstance(c, s.Call)]
        for name, span in reads:
            found = self.state.staleness.read(name, wrt, span, reader)
            if found is not None:
                self.refuse_stale(found)

    def assign_indexed(self, target: s.Index, value: Ty) -> Ty:
        name = target.base.id
        existing = self.state.try_lookup(name)
        if existing is None:  # X̃[:, t] ← v inside a loop over t builds X̃ column by column
            shape: list[Dim | None] = []
            rest = list(value.shape)
            for item in target.items:
                if isinstance(item, s.Slice):
                    shape.append(rest.pop(0) if rest else None)
                elif isinstance(item, s.Name) and item.id in self.state.loop_vars:
                    size = self.state.loop_vars[item.id]
                    if size == Dim.sym(f"|{item.id}|"):  # ∀t says not over which range
                        v = display(item.id)
                        self.error(item.span, f"'∀{v}' gives '{v}' no range, so this step "
                                              f"cannot define '{display(name)}'",
                                   hint=f"state its range, '∀{v} ∈ [T], …', or define "
                                        f"'{display(name)}' in an earlier step")
                        raise CheckError
                    shape.append(size)
                else:
                    self.error(item.span, "cannot infer the size of this axis")
                    raise CheckError
            ty = Ty(tuple(shape) + tuple(rest), value.elem, vocab=value.vocab)
            self.state.bind(name, ty)
            self.info.types[id(target)] = ty
            return ty
        got = self.exprs.index(existing, target)
        if not broadcastable(value, got):
            self.error(target.span, f"cannot store {value} into {got}")
        return got

    def stmt_Return(self, st: s.Return) -> Entry:
        self.state.returned = True
        if isinstance(st.value, s.Several) or self.sig.more:
            return self.return_several(st)
        value = self.exprs.expr(st.value)
        out = self.sig.output
        if st.name and self.alg.outputs and st.name not in self.alg.outputs:
            self.error(st.span, f"returns '{display(st.name)}' but the header promises "
                                f"'{display(self.alg.outputs[0])}'")
        if isinstance(out, BundleTy):  # θ̂, the trained parameters: those of the card trained
            if not isinstance(value, BundleTy) or not out.same_kind(value):
                self.error(st.value.span, f"returns {value} but Output declares {out}")
            else:
                _adopt(out, value)
            return value
        if out is None:
            return value
        if not isinstance(value, Ty):
            self.error(st.value.span, f"returns {value} but Output declares {out}")
        elif not same_shape(self.free_length(out, value), value):
            self.error(st.value.span, f"returns {value} but Output declares {out}",
                       hint="the returned value must have the declared output shape")
        elif not _same_vocab(out, value):
            self.error(st.value.span, f"returns tokens of a vocabulary of {_d(value.vocab)}, "
                                      f"but Output declares one of {_d(out.vocab)}")
        return value

    def return_several(self, st: s.Return) -> None:
        """`return P, r`: one value per output the header names, each of its declared type."""
        values = st.value.items if isinstance(st.value, s.Several) else (st.value,)
        outs = [self.sig.output, *self.sig.more] if self.alg.outputs else []
        if len(values) != len(outs):
            names = ", ".join(display(o) for o in self.alg.outputs) or "nothing"
            self.error(st.span, f"returns {len(values)} value{'s' if len(values) > 1 else ''}, "
                                f"but the header promises {names}",
                       hint="return one value per output, in the header's order: "
                            f"'return {names}'")
            raise CheckError
        for name, value, out in zip(self.alg.outputs, values, outs, strict=True):
            got = self.exprs.expr(value)
            if out is None:  # not declared: said at the header
                continue
            if not isinstance(got, Ty) or not isinstance(out, Ty) or \
                    not same_shape(self.free_length(out, got), got):
                self.error(value.span, f"returns {got} as '{display(name)}' but Output declares "
                                       f"{out}")

    def free_length(self, out: Ty, value: Ty) -> Ty:
        """An Output y ∈ V* has whatever length the card gives it: |y| is free."""
        own = {Dim.sym(f"|{o}|") for o in self.alg.outputs}
        if out.rank == 1 and out.shape[0] in own and value.rank == 1:
            return replace(out, shape=value.shape)
        return out

    def stmt_Sample(self, st: s.Sample) -> Ty:
        """sample a token y from q ∝ w: q is the distribution w normalised, y a token of it."""
        weights = self.exprs.tensor(st.weights)
        size = weights.shape[0] if weights.rank == 1 else None
        if size is None:  # y is still a token, of a vocabulary not known here
            self.error(st.weights.span, f"a token is sampled from a vector of weights, not {weights}",
                       hint="index one column: p ← P[:, t]")
            size = Dim.sym("?N_V")
        self.state.bind(st.dist, Ty((size,), "ℝ"))
        token = Ty(elem="ℕ", vocab=size)
        self.reassign(s.Name(st.var, span=st.span), token)
        self.state.assign_name(st.var, token)
        self.state.assigned[st.var] = st.span
        return token

    def stmt_For(self, st: s.For) -> None:
        self.loop_body(st)
        over = self.state.dim_of(st.over.last) if isinstance(st.over, s.Range) else self.exprs.set_size(st.over)
        bound = [st.var]
        alias = self.misnamed_loop_var(st)
        if alias is not None:  # reported once at the loop; its body is checked as if it bound both
            bound.append(alias)
        self.state.scopes.append({})
        for var in bound:
            self.state.loop_vars[var] = over
            self.state.bind(var, Ty(elem="ℕ", value=Dim.sym(var)))
        self.grow_sequences(st.body)
        self.loop_steps(st.body)
        inner = self.state.scopes.pop()
        for var in bound:
            self.state.loop_vars.pop(var, None)
        for name, entry in inner.items():  # a loop's assignments are visible after it
            if name not in bound:
                self.state.bind(name, entry)

    def misnamed_loop_var(self, st: s.For) -> str | None:
        """`for i = 1, …, L do` whose body never says i but indexes parameters by an unbound l
        (the paper's Algorithm 8): one diagnostic at the loop, not one per step. Returns l."""
        names = _names(st.body)
        if any(n.id == st.var or st.var in (v for _, v in split_name(n.id)[1]) for n in names):
            return None
        nested = _bound_vars(st.body)  # x_n in a loop over n inside this one is bound there
        free: dict[str, s.Name] = {}
        for n in names:
            entry = self.state.try_lookup(n.id)
            if isinstance(entry, FamilyTy) and entry.var not in self.state.loop_vars.keys() | nested:
                free.setdefault(entry.var, n)
        if len(free) != 1:
            return None
        ((var, use),) = free.items()
        header = f"for {var} {st.binder} {render_expr(st.over)}" + (" do" if st.style == "do" else " :")
        self.error(st.var_span, f"the loop binds '{display(st.var)}' but its body indexes by "
                                f"'{display(var)}'",
                   hint=f"did you mean '{display(header)}'?",
                   notes=((use.span, f"'{display(use.id)}' is indexed by '{display(var)}'"),))
        return var

    def stmt_ForAll(self, st: s.ForAll) -> None:
        # ∀t binds t as a loop does (k_t ← … defines the family k_t), over a set left unsaid;
        # ∀t ∈ [T] over the set it states, so that its step may define a value entry by entry
        outer = {v: self.state.loop_vars[v] for v in st.vars if v in self.state.loop_vars}
        over = st.over or (None,) * len(st.vars)
        sizes = {v: Dim.sym(f"|{v}|") if o is None else self.exprs.set_size(o)
                 for v, o in zip(st.vars, over, strict=True)}
        self.state.loop_vars.update(sizes)
        self.state.scopes.append({v: Ty(elem="ℕ", value=None if o is None else Dim.sym(v))
                                  for v, o in zip(st.vars, over, strict=True)})
        try:
            self.stmt(st.body)
        finally:
            inner = self.state.scopes.pop()
            for v in st.vars:
                self.state.loop_vars.pop(v, None)
            self.state.loop_vars.update(outer)
        if st.over:  # a value it defines entry by entry is visible after it, as a loop's
            for name, entry in inner.items():
                if name not in st.vars:
                    self.state.bind(name, entry)

    def stmt_If(self, st: s.If) -> None:
        cond = self.exprs.expr(st.cond)
        if cond.shape:
            self.error(st.cond.span, f"a condition must be a single truth value, not {cond}")
        self.stmt(st.then)

    def loop_body(self, st: s.For | s.While) -> None:
        if not st.body:
            block = "indent the steps of the loop under it" if getattr(st, "style", "") == \
                "block" else "put the steps of the loop between its head and 'end'"
            kind = "while" if isinstance(st, s.While) else "for"
            self.error(st.span, f"this '{kind}' loop has no steps", hint=block)

    def stmt_While(self, st: s.While) -> None:
        self.loop_body(st)
        cond = self.exprs.tensor(st.cond)
        if cond.shape:
            self.error(st.cond.span, f"a condition must be a single truth value, not {cond}")
        self.grow_sequences(st.body)
        self.loop_steps(st.body)

    def loop_steps(self, body: tuple[s.Step, ...]) -> None:
        """A loop's steps, the states it assigns that enter it as numbers noted."""
        outer = self.state.number_states
        numbers = {}
        for name in (n for step in body for n in _targets(step.stmt)):
            entry = self.state.try_lookup(name)
            if name in self.state.assigned and isinstance(entry, Ty) and not entry.shape:
                numbers[name] = self.state.assigned[name]
        self.state.number_states = {**outer, **numbers}
        self.state.staleness.enter_loop()
        try:
            for step in body:
                self.step(step)
        finally:
            self.state.number_states = outer
            carried = self.state.staleness.leave_loop()
        for found in carried:  # what a second pass would read
            self.refuse_stale(found)

    def grow_sequences(self, body: tuple[s.Step, ...]) -> None:
        """A sequence the loop appends to (x ← [x, y]) has a new length on each pass: |x|′."""
        for name in _appended(body):
            entry = self.state.try_lookup(name)
            if _is_sequence(entry):
                self.state.bind(name, replace(entry, shape=(Dim.sym(f"|{name}|′"),)))


def _appended(body: tuple[s.Step, ...]) -> list[str]:
    """Names a loop body appends to: x ← [x, y]."""
    out = []
    for step in body:
        st = step.stmt
        if isinstance(st, s.Assign) and isinstance(st.target, s.Name) \
                and isinstance(st.value, s.Concat) and st.target in st.value.items:
            out.append(st.target.id)
        elif isinstance(st, (s.For, s.While)):
            out += _appended(st.body)
    return out


def _targets(st: s.Stmt) -> list[str]:
    """The names a statement gives a value to."""
    if isinstance(st, s.Assign) and isinstance(st.target, s.Several):
        return [n.id for n in st.target.items]
    if isinstance(st, s.Assign):
        t = st.target.base if isinstance(st.target, s.Index) else st.target
        return [t.id] if isinstance(t, s.Name) else [t.func] if isinstance(t, s.Call) else []
    if isinstance(st, s.Sample):
        return [st.var]
    if isinstance(st, (s.If, s.ForAll)):
        return _targets(st.then if isinstance(st, s.If) else st.body)
    return []


def _bound_vars(node: object) -> set[str]:
    """The variables that loops, sums and set-builders inside a node bind."""
    out: set[str] = set()
    if isinstance(node, (s.For, s.SetBuilder)):
        out.add(node.var)
    elif isinstance(node, s.ForAll):
        out.update(node.vars)
    elif isinstance(node, s.Sum):
        out.add(node.index)
    if isinstance(node, tuple):
        for x in node:
            out |= _bound_vars(x)
    elif hasattr(node, "__dataclass_fields__"):
        for f in node.__dataclass_fields__:
            out |= _bound_vars(getattr(node, f))
    return out


def _names(node: object) -> list[s.Name]:
    """Every name written in a node (steps, expressions), in source order."""
    if isinstance(node, s.Name):
        return [node]
    if isinstance(node, tuple):
        return [n for x in node for n in _names(x)]
    if hasattr(node, "__dataclass_fields__"):
        return [n for f in node.__dataclass_fields__ for n in _names(getattr(node, f))]
    return []
