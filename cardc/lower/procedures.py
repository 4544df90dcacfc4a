"""Lowering of what only training and inference cards hold: loops that run as written or over
a dataset's examples, parameter updates (an optimizer made once), sampling steps and their
filters, `while`, random choices, sets of positions, and sums over examples or ranges."""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from .. import syntax as s
from ..checker import CONSTANTS, FILTERS, split_name
from ..dims import Dim
from ..spelling import display
from ..types import Ty
from .body import (
    _call,
    _dec,
    _int,
    _method,
    _names_in,
)
from .gradients import current, take_over
from .statements import loop_range
from .values import (
    Gradient,
    Val,
    local_name,
)


class Procedures:
    """The steps of training and inference cards (part of `cardc.lower.steps.Body`)."""

    def procedure_loop(self, st: s.For, step: s.Step) -> None:
        """A loop of a training or inference card. Over a dataset's index it visits each
        example (a batch of one); a loop whose variable indexes positions (`x̃_n[t] ← …`) is
        computed for every position at once; any other loop runs as written."""
        elems = [e for e, (_, var, _) in self.datasets.items() if var == st.var]
        if self.indexes_by(st.body, st.var) and not elems:
            return self.ranged_steps(st, step)
        var = self.loop_var(st.var)
        body = self.child()
        body.loop_index[st.var] = ir.Ref(var)
        for elem in elems:
            local = local_name(elem)
            examples, _, ty = self.datasets[elem]
            item = ir.Sub(ir.Ref(examples), (ir.Ref(var),))
            body.emit(ir.Assign((local,), ir.Sub(item, (ir.Ref("None"),)),
                                ir.Note(None, self.line(step), "a batch of one example")))
            self.scope.values[elem] = Val(ir.Ref(local), ty, True)
        over = loop_range(self, st)
        before, fixed = len(self.updates), True
        for sub in st.body:
            made = len(self.updates)
            body.step(sub)
            if len(self.updates) > made and not isinstance(sub.stmt, s.Assign):
                fixed = False  # updates inside a loop or a condition: not one each per visit
        if elems:
            self.visits.append(len(self.updates) - before if fixed else None)
        body.stop_check()
        self.emit(ir.Loop(var, over, tuple(body.out), self.note(step)))

    def example(self, name: str) -> Val | None:
        """`x_k`, a dataset's k-th example by a number (`m ← length(x_1)` before the loops):
        a batch of one, as a loop over the dataset visits it."""
        base, decor = split_name(name)
        if len(decor) != 1 or decor[0][0] != "_" or not decor[0][1].isdigit() or \
                int(decor[0][1]) < 1:
            return None
        for elem, (examples, _, ty) in self.datasets.items():
            if split_name(elem)[0] == base:
                item = ir.Sub(ir.Ref(examples), (_int(int(decor[0][1]) - 1),))
                return Val(ir.Sub(item, (ir.Ref("None"),)), ty, True)
        return None

    def ranged_steps(self, st: s.For, step: s.Step) -> None:
        """`for t = 1, …, ℓ do x̃_n[t] ← f(t) end`: each step for every t at once."""
        t = self.arange_of(st.var, st.over)
        outer, self.ranged = self.ranged, {**self.ranged, st.var: t}
        try:
            for sub in st.body:
                stmt = sub.stmt
                if not (isinstance(stmt, s.Assign) and isinstance(stmt.target, s.Index)
                        and isinstance(stmt.target.base, s.Name) and len(stmt.target.items) == 1
                        and getattr(stmt.target.items[0], "id", None) == st.var):
                    self.fail(sub, f"a loop over positions assigns 'x[{display(st.var)}]' only")
                val = self.expr(stmt.value)
                name = stmt.target.base.id
                local = local_name(name)
                self.emit(ir.Assign((local,), val.code, self.note(sub, val)))
                self.scope.values[name] = replace(val, code=ir.Ref(local), rows=(),
                                                  ty=Ty((t.rows[0],), val.ty.elem, vocab=val.ty.vocab))
        finally:
            self.ranged = outer

    def arange_of(self, var: str, over, where=None) -> Val:
        """The values a variable ranges over, as a tensor: 1, …, n or a, …, b."""
        if isinstance(over, s.Range):
            lo, hi = over.first[0], over.last
        elif isinstance(over, s.Concat) and len(over.items) == 1:
            lo, hi = s.Num("1"), over.items[0]
        else:
            return self.fail(over, "expected a range such as [ℓ] or 1, 2, …, ℓ")
        first, last = self.expr(lo).code, self.expr(hi).code
        end = last.left if isinstance(last, ir.Bin) and last.op == "-" and \
            last.right == ir.Lit("1") else ir.Bin("+", last, _int(1))
        code = _call("torch.arange", first, end, device=self.device_expr())
        local = self.loop_var(var)
        self.emit(ir.Assign((local,), code,
                            ir.Note(None, self.line(where or over), f"every {display(var)}")))
        size = Dim.sym(hi.id) if isinstance(hi, s.Name) and isinstance(lo, s.Num) and \
            lo.text == "1" else Dim.sym(var)
        return Val(ir.Ref(local), Ty(elem="ℕ"), rows=(size,))

    def update(self, st: s.Assign, step: s.Step) -> bool:
        """`θ ← θ − η · ∇loss(θ)` is torch.optim.SGD; `θ ← AdamW(θ, ∇loss(θ) | η, β_1, β_2, λ)`
        is torch.optim.AdamW. Either is made once, before the loops, and steps here; a rate
        the loop computes (a schedule, η_i) is set before each step. A gradient named before,
        `θ ← AdamW(θ, g | …)`, is already in θ's .grad: the update only steps."""
        model = self.scope.values[st.target.id].code
        found = self.optimizer(st.value, st.target.id, model)
        if found is None:
            return False
        make, rate, grad = found  # the loss's name, or a gradient named before
        fixed = rate is None or all(n in self.info.sig.hypers or n in CONSTANTS
                                    for n in _names_in(rate))
        lr = self.expr(rate).code if rate is not None else None
        if lr is not None and fixed:
            make = ir.Call(make.func, make.args, (("lr", lr), *make.kwargs))
        if not any("optimizer" in getattr(x, "targets", ()) for x in self.prologue):
            self.prologue.append(ir.Assign(("optimizer",), make, self.note(step)))
        if lr is not None and not fixed:
            groups = ir.Attr(ir.Ref("optimizer"), "param_groups")
            self.emit(ir.Loop("group", groups, (ir.Assign(('group["lr"]',), lr),),
                              ir.Note(None, self.line(step), "this step's learning rate")))
        self.updates.append(step)
        if isinstance(grad, Gradient):
            self.emit(ir.Assign((), _method(ir.Ref("optimizer"), "step"), self.note(step)))
            told = (grad.told, lr if lr is not None else ir.Lit("None"))
        else:
            take_over(self, "", st.target.id, step)  # zero_grad empties any named gradient
            loss = self.expr(s.Name(grad, span=st.value.span))
            self.emit(ir.Assign((), _method(ir.Ref("optimizer"), "zero_grad"), self.note(step)))
            total = _method(loss.code, "sum")
            self.emit(ir.Assign((), _method(total, "backward")))
            self.emit(ir.Assign((), _method(ir.Ref("optimizer"), "step")))
            told = (_method(total, "detach"), lr if lr is not None else ir.Lit("None"))
        self.emit(ir.If(ir.Bin("is not", ir.Ref("report"), ir.Ref("None")),
                        (ir.Assign((), _call("report", *told)),)))
        return True

    def optimizer(self, v: s.Expr, theta: str, model: ir.Expr
                  ) -> tuple[ir.Call, s.Expr | None, str | Gradient] | None:
        """The optimizer's constructor (without its rate), the rate and the loss's name (or
        the named gradient of θ it steps with)."""
        def gradient(g) -> str | Gradient | None:  # ∇loss(θ) → "loss"; g ← ∇loss(θ) → g's
            named = self.scope.values.get(g.id) if isinstance(g, s.Name) else None
            if isinstance(named, Gradient) and named.theta == theta:
                return current(self, g.id, g)
            ok = isinstance(g, s.Unary) and g.op == "∇" and isinstance(g.operand, s.Call)
            return g.operand.func if ok else None

        if isinstance(v, s.BinOp) and v.op == "−" and getattr(v.left, "id", None) == theta \
                and isinstance(v.right, s.BinOp) and v.right.op in ("·", " ") \
                and gradient(v.right.right):
            params = _method(model, "parameters")
            return _call("torch.optim.SGD", params), v.right.left, gradient(v.right.right)
        if isinstance(v, s.Call) and v.func == "AdamW" and len(v.args) == 2 \
                and getattr(v.args[0], "id", None) == theta and gradient(v.args[1]):
            given = [p.value if isinstance(p, s.Arg) else p for p in v.params]
            values = [self.expr(p).code for p in given[1:]]
            kwargs: dict[str, ir.Expr] = {}
            if len(values) >= 2:
                kwargs["betas"] = ir.Seq((values[0], values[1]))
            if len(values) >= 3:
                kwargs["weight_decay"] = values[2]
            kwargs["fused"] = ir.Lit("True")  # one kernel for every tensor's update
            make = _call("torch.optim.AdamW", self.decay_groups(model), **kwargs)
            return make, given[0] if given else None, gradient(v.args[1])
        return None

    def decay_groups(self, model: ir.Expr) -> ir.Expr:
        """AdamW's weight decay λ shrinks the weight matrices only: decaying gains and biases
        pulls them toward 0, not toward their identity values."""
        if not isinstance(model, ir.Ref):
            return _method(model, "parameters")
        params = f"{model.id}.parameters()"
        if any("decayed" in getattr(x, "targets", ()) for x in self.prologue):
            return ir.Lit('[{"params": decayed}, {"params": undecayed, "weight_decay": 0.0}]')
        for name, test, why in (("decayed", ">= 2", "weight matrices: AdamW's λ shrinks these"),
                                ("undecayed", "< 2", "gains and biases: not decayed")):
            self.prologue.append(ir.Assign((name,), ir.Lit(f"[p for p in {params} if p.ndim {test}]"),
                                           ir.Note(None, None, why)))
        return ir.Lit('[{"params": decayed}, {"params": undecayed, "weight_decay": 0.0}]')

    def stmt_Sample(self, st: s.Sample, step: s.Step) -> None:
        """`sample a token y from q ∝ p^{1/τ}`: q = softmax(log p / τ); τ → 0 is the arg-max."""
        logits, base, tau = self.logits(st.weights)
        y, q = local_name(st.var), self.fresh(local_name(st.dist))
        draw = (ir.Assign((q,), _call("torch.softmax", logits, dim=_int(-1)), self.note(step)),
                ir.Assign((y,), ir.Sub(_call("torch.multinomial", ir.Ref(q), _int(1)),
                                       (ir.Ref("..."), _int(0)))))
        if tau is None:
            self.out.extend(draw)
        else:  # top_k and top_p keep the most probable token: the limit is theirs too
            greedy = ir.Assign((y,), _method(base.code, "argmax", _int(-1)))
            self.emit(ir.If(ir.Bin("==", tau.code, _int(0)), (greedy,), draw,
                            ir.Note(None, None, "the limit τ → 0: the most probable token")))
        self.scope.values[st.var] = Val(ir.Ref(y), Ty(elem="ℕ"), True)
        self.drawn = y

    def logits(self, w: s.Expr) -> tuple[ir.Expr, Val, Val | None]:
        """The logits of weights w (log w, up to a constant): log p / τ of `p^{1/τ}`, z/τ of
        `exp(z/τ)`, those of w filtered of `top_k(w | k)` and `top_p(w | p)`; with the value
        whose arg-max is w's, and the temperature τ (None where w has none)."""
        if self.is_filter(w):
            inner, base, tau = self.logits(w.args[0])
            return self.filtered(inner, w), base, tau
        if isinstance(w, s.Power) and isinstance(w.exponent, s.BinOp) and w.exponent.op == "/" \
                and isinstance(w.exponent.left, s.Num) and w.exponent.left.value == 1:
            p, tau = self.expr(w.base), self.expr(w.exponent.right)
            return ir.Bin("/", _call("torch.log", p.code), tau.code), p, tau
        if isinstance(w, s.Call) and w.func == "exp" and len(w.args) == 1 and \
                id(w) not in self.info.calls:
            arg = w.args[0]
            if isinstance(arg, s.BinOp) and arg.op == "/":  # q ∝ exp(z/τ)
                z, tau = self.expr(arg.left), self.expr(arg.right)
                return ir.Bin("/", z.code, tau.code), z, tau
            z = self.expr(arg)
            return z.code, z, None
        p = self.expr(w)
        return _call("torch.log", p.code), p, None

    def is_filter(self, e: s.Expr) -> bool:
        return isinstance(e, s.Call) and e.func in FILTERS and id(e) not in self.info.calls

    def filtered(self, logits: ir.Expr, f: s.Call) -> ir.Expr:
        """`logits` with −∞ where top_k or top_p drops an entry: cardc.runtime.logits's
        filter_logits, copied into the module; top_p after top_k joins its call, which applies
        them in that order."""
        bound = self.expr(f.params[0]).code
        if f.func == "top_p" and isinstance(logits, ir.Call) and \
                logits.func == ir.Ref("filter_logits") and [k for k, _ in logits.kwargs] == ["top_k"]:
            return replace(logits, kwargs=(*logits.kwargs, ("top_p", bound)))
        return _call("filter_logits", logits, **{f.func: bound})

    def stop_check(self) -> None:
        """After a loop's steps that draw a token: `stop(y)`, the caller's, may end the loop
        (cardc sample stops at a stop text)."""
        if self.drawn is None or not self.procedure:
            return
        self.hooks.add("stop")
        asked = ir.Bin("and", ir.Bin("is not", ir.Ref("stop"), ir.Ref("None")),
                       _call("stop", ir.Ref(self.drawn)))
        self.emit(ir.If(asked, (ir.Break(),)))

    def stmt_While(self, st: s.While, step: s.Step) -> None:
        if not self.procedure:
            self.fail(step, "code generation does not handle 'while' steps in a model yet",
                      hint="a forward pass runs a fixed number of steps")
        cond = self.expr(st.cond)
        body = self.child()
        for sub in st.body:
            body.step(sub)
        body.stop_check()
        test = _method(_call("torch.as_tensor", cond.code), "any")  # any row not done yet
        self.emit(ir.While(test, tuple(body.out), self.note(step)))

    def expr_Choice(self, e: s.Choice) -> Val:
        """`a or b randomly with probability p or 1 − p`: a where a uniform draw falls below p."""
        if len(e.options) != 2:
            self.fail(e, "code generation draws between two options only")
        a, b = (self.expr(o) for o in e.options)
        p = self.expr(e.probs[0])
        shaped = b if (b.lifted or b.rows) else a
        u = _call("torch.rand_like", shaped.code, dtype=ir.Ref("torch.float"))
        code = _call("torch.where", ir.Bin("<", u, p.code), a.code, b.code)
        return replace(shaped, code=code, ty=self.ty(e) if self.ty(e).shape == shaped.ty.shape
                       else shaped.ty)

    def expr_SetBuilder(self, e: s.SetBuilder) -> Val:
        """`{t ∈ [ℓ] : c}`: a mask over the domain, true where c holds."""
        t, self.domain = self.domain or self.arange_of(e.var, e.domain, e), None
        outer, self.ranged = self.ranged, {**self.ranged, e.var: t}
        try:
            cond = self.expr(e.cond)
        finally:
            self.ranged = outer
        return replace(cond, ty=Ty((t.rows[0],), "𝔹"), rows=())

    def ranged_sum(self, e: s.Sum) -> Val:
        """Σ_{t=a}^{b} f(t) or Σ_{t∈T̃} f(t): f for every t at once, then summed."""
        elems = [x for x, (_, var, _) in self.datasets.items() if var == e.index]
        if elems and e.over is None:
            return self.minibatch_sum(e, elems)
        if e.over is None and (e.lo is None or e.hi is None):
            return self.axis_sum(e)
        found = self.likelihood_sum(e)
        if found is not None:
            return found
        if e.over is not None:
            if not (isinstance(e.over, s.Name) and e.over.id in self.sets):
                self.fail(e.over, "code generation sums over a set built with {t ∈ … : …}")
            t, mask = self.sets[e.over.id], self.expr(e.over)
        else:
            t, mask = self.arange_of(e.index, s.Range((e.lo,), e.hi), e), None
        outer, self.ranged = self.ranged, {**self.ranged, e.index: t}
        try:
            body = self.expr(e.body)
        finally:
            self.ranged = outer
        code = body.code
        if mask is not None:
            code = _call("torch.where", mask.code, code, ir.Lit("0.0"))
        return Val(_method(code, "sum", _int(-1)), Ty(), body.lifted)

    def likelihood_sum(self, e: s.Sum) -> Val | None:
        """Σ_{t=a}^{b} log softmax(M(x | θ)[t, :])[y] of a language model that scores rows
        itself (cardc.lower.likelihood): M(x, nll=(t − 1, y)), no more logits at once than it
        needs; None for any other sum, which is lowered as written."""
        call = _likelihood_call(e)
        info = self.info.calls.get(id(call)) if call is not None else None
        if info is None or e.over is not None or self.module_for(call, info) is None or \
                not self.low.analysis(info.callee).likelihood:
            return None
        t = self.arange_of(e.index, s.Range((e.lo,), e.hi), e)
        outer, self.ranged = self.ranged, {**self.ranged, e.index: t}
        try:
            model, y = self.expr(call), self.expr(e.body.right.items[0])
        finally:
            self.ranged = outer
        if not isinstance(model.code, ir.Call):
            return None
        rows = ir.Seq((ir.Bin("-", t.code, _int(1)), y.code))  # the card counts rows from 1
        code = ir.Call(model.code.func, model.code.args, (*model.code.kwargs, ("nll", rows)))
        return Val(code, Ty(), True)

    def axis_sum(self, e: s.Sum) -> Val:
        """Σ_e F[e] · G[e]: the index reads the last axis of the values it indexes, all of it
        (as the checker typed it), summed."""
        read = [self.expr(n.base).ty for n in s.nodes(e.body) if isinstance(n, s.Index) and
                n.items and getattr(n.items[-1], "id", None) == e.index]
        sizes = {ty.shape[-1] for ty in read if isinstance(ty, Ty) and ty.shape}
        if len(sizes) != 1:
            self.fail(e, f"code generation sums Σ_{display(e.index)} over the last axis of the "
                         f"values it indexes, of one size; give the sum its range, "
                         f"Σ_{{{display(e.index)}=1}}^{{n}}")
        outer, self.sum_axis = self.sum_axis, (e.index, sizes.pop())
        try:
            body = self.expr(e.body)
        finally:
            self.sum_axis = outer
        return Val(_method(body.code, "sum", _int(-1)), Ty(), body.lifted)

    def minibatch_sum(self, e: s.Sum, elems: list[str]) -> Val:
        """Σ_{n=a}^{b} f(x_n) over a dataset's examples: f of the minibatch x_a, …, x_b at
        once (every example one row of a batch), then summed over the rows."""
        lo, hi = self.expr(e.lo).code, self.expr(e.hi).code
        outer = {elem: self.scope.values.get(elem) for elem in elems}
        for elem in elems:
            examples, _, ty = self.datasets[elem]
            local = self.fresh(local_name(elem))
            rows = ir.Sub(ir.Ref(examples), (ir.SliceX(_dec(lo), hi),))
            self.emit(ir.Assign((local,), _call("torch.stack", rows),
                                ir.Note(None, self.line(e), "a minibatch: one example per row")))
            self.scope.values[elem] = Val(ir.Ref(local), ty, True)
        try:
            body = self.expr(e.body)
        finally:
            for elem, val in outer.items():
                if val is None:
                    self.scope.values.pop(elem, None)
                else:
                    self.scope.values[elem] = val
        if not body.lifted or body.ty.shape:
            self.fail(e, "a sum over a dataset's examples sums one number per example")
        return Val(_method(body.code, "sum"), Ty())

    def sequence(self, e: s.Concat, items: list[s.Expr]) -> Val:
        """`[x, y]`, `[bos_token]`: tokens and sequences joined into one sequence."""
        parts = []
        for item in items:
            v = self.expr(item)
            if v.ty.shape:
                parts.append(v.code)
            elif v.lifted:
                parts.append(ir.Sub(v.code, (ir.Ref("..."), ir.Ref("None"))))
            else:  # a constant token, once per row of the batch
                batch = ir.Sub(ir.Attr(self.batch_source(), "shape"), (ir.SliceX(None, _int(-1)),))
                parts.append(_call("torch.full", ir.Seq((ir.Un("*", batch), _int(1))), v.code,
                                   device=self.device_expr()))
        code = parts[0] if len(parts) == 1 else _call("torch.cat", ir.Seq(tuple(parts), "list"),
                                                       dim=_int(-1))
        return Val(code, self.ty(e), True)

    def batch_source(self) -> ir.Expr:
        return ir.Ref(local_name(self.info.sig.inputs[0][0]))


def _likelihood_call(e: s.Sum) -> s.Call | None:
    """The call M(x | θ) of a sum `log softmax(M(x | θ)[t, :])[y]` over t, or None."""
    b = e.body
    if not (isinstance(b, s.BinOp) and b.op == " " and isinstance(b.left, s.Name) and
            b.left.id == "log" and isinstance(b.right, s.Index) and len(b.right.items) == 1):
        return None
    soft = b.right.base
    if not (isinstance(soft, s.Call) and soft.func == "softmax" and len(soft.args) == 1 and
            not soft.params and isinstance(soft.args[0], s.Index)):
        return None
    scores = soft.args[0]
    if len(scores.items) != 2:
        return None
    row, cols = scores.items
    whole = isinstance(cols, s.Slice) and cols.lo is None and cols.hi is None
    if not (isinstance(row, s.Name) and row.id == e.index and whole and
            isinstance(scores.base, s.Call)):
        return None
    return scores.base
