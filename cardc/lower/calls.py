"""Lowering of calls: builtins (elementwise functions, softmax, reductions, dropout, min/max),
and calls of other cards, as a submodule (the card owns parameters), a model handed to a
procedure, or a function; with the masks and hyperparameters they are given."""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from .. import syntax as s
from ..builtins import ARGTOP, INDICATOR, PATCHES
from ..checker import DROPOUT, FILTERS, PAIRWISE, CallInfo, instance
from ..dims import Dim
from ..spelling import display
from ..types import BundleTy, FamilyTy, Ty, substitute
from .analysis import hides_later
from .body import (
    ELEMENTWISE,
    ON_NUMBERS,
    _call,
    _int,
    _is_tensor,
    _like,
    _log_of,
    _method,
    _mT,
)
from .experts import argtop, indicator
from .gelu import literal as literal_gelu
from .patches import literal as literal_patches
from .values import (
    LowerError,
    Val,
    counted,
    local_name,
)

GELUS = ("GELU", "GELU_tanh")
NUMBER_KIND = ("floor", "ceil", "abs", "log2")  # builtins that set their kind of number


class Calls:
    """Builtins and calls of other cards (part of `cardc.lower.steps.Body`)."""

    def expr_Call(self, e: s.Call) -> Val:
        if self.procedure and isinstance(self.scope.values.get(e.func), Val):
            return self.scope.values[e.func]  # P(θ): the value P, computed from θ
        info = self.info.calls.get(id(e))
        if info is None:
            return self.builtin(e)
        return self.call_card(e, info)

    def builtin(self, e: s.Call) -> Val:
        if e.func in PAIRWISE and len(e.args) == 2:
            return self.pairwise(e)
        if e.func in ("cos", "sin") and len(e.args) == 1:
            x = self.expr(e.args[0])
            if not x.lifted and not x.ty.shape and not x.tensor:  # a number (a schedule's)
                self.low.program.imports.add("math")
                return Val(_call(f"math.{e.func}", x.code), Ty())
            return _like(x, _call(f"torch.{e.func}", x.code), self.ty(e))
        if e.func == DROPOUT:
            return self.dropout(e)
        if e.func == PATCHES:
            return literal_patches(self, e)
        if e.func == ARGTOP:
            return argtop(self, e)
        if e.func == INDICATOR:
            return indicator(self, e)
        if e.func in FILTERS:  # a distribution: the softmax of the filtered logits
            logits, base, _ = self.logits(e)
            return _like(base, _call("torch.softmax", logits, dim=_int(-1)), self.ty(e))
        if len(e.args) != 1:
            self.fail(e, f"'{e.func}' takes one argument")
        x = self.expr(e.args[0])
        ty = self.ty(e)
        if self.sum_axis and len(x.ty.shape) > len(ty.shape) and e.func not in ("mean", "var",
                                                                             "max", "min"):
            ty = Ty(x.ty.shape, ty.elem)  # exp(x[i]) under Σ_i: on the summed axis, as x[i]
        if (e.func in ELEMENTWISE or e.func in GELUS) and not _is_tensor(x) and \
                not self.sum_axis:
            x = self.on_number(e.func, x, ty)
            if not x.tensor:
                return x
        if e.func in GELUS:
            return _like(x, literal_gelu(self, x.code, e.func == "GELU_tanh"), ty)
        if e.func in NUMBER_KIND:
            return self.number_kind(e.func, x, ty)
        if e.func in ELEMENTWISE:
            log = _log_of(x.code) if e.func == "log" else None
            return _like(x, log or _call(ELEMENTWISE[e.func], x.code), ty)
        if e.func == "softmax":  # over the first index in the paper's layout (its eq. 2)
            axis = x.axis(0) if self.column and x.ty.shape else -1
            self.count_fixed_softmax(x)
            return _like(x, _call("torch.softmax", x.code, dim=_int(axis)), ty)
        if e.func in ("mean", "var"):
            return Val(_method(x.code, e.func, _int(-1), **(
                {"unbiased": ir.Lit("False")} if e.func == "var" else {})), ty, x.lifted)
        if e.func in ("max", "min"):
            return Val(_method(x.code, "a" + e.func, _int(-1)), ty, x.lifted)
        if e.func == "length":
            size = self.ty(e).value
            if size is not None and not x.rows and not self.procedure:  # lengths change in loops
                try:
                    return Val(self.dim(size), Ty(elem="ℕ"))
                except LowerError:
                    pass
            return Val(ir.Sub(ir.Attr(x.code, "shape"), (_int(-1),)), Ty(elem="ℕ"))
        return self.fail(e, f"code generation does not know '{e.func}' yet")

    def count_fixed_softmax(self, x: Val) -> None:
        """A softmax over an axis whose size the card's hyperparameters fix (a router's over
        its E experts) mixes no positions: it is no attention a KV cache must account for."""
        if not x.ty.shape or self.sum_axis:
            return
        size = x.ty.shape[0 if self.column else -1]
        hypers = self.info.sig.hypers
        if size is not None and size.symbols and all(
                sym in hypers and not hypers[sym].shape for sym in size.symbols):
            self.low.masking.fixed_softmaxes += 1

    def on_number(self, func: str, x: Val, ty: Ty | None = None) -> Val:
        """An elementwise builtin of a number (log(δ/μ) of hyperparameters): Python's math
        where it has the function, else the number as a 0-d float64 tensor for torch's, which
        never changes the number format of the tensors it meets."""
        if func in ON_NUMBERS:
            if ON_NUMBERS[func].startswith("math."):
                self.low.program.imports.add("math")
            return Val(_call(ON_NUMBERS[func], x.code), Ty(elem=ty.elem) if ty else Ty())
        number = _call("torch.tensor", x.code, dtype=ir.Ref("torch.float64"))
        return Val(number, Ty(), tensor=True)

    def dropout(self, e: s.Call) -> Val:
        """dropout(X | p): F.dropout while the module trains; nothing in evaluation."""
        if self.training is None:
            self.fail(e, "dropout acts in a card that owns parameters (a module, which knows "
                         "whether it is training)",
                      hint="apply it in the card that holds the parameters, or in its caller")
        x, p = self.expr(e.args[0]), self.expr(e.params[0])
        return _like(x, _call("F.dropout", x.code, p.code, self.training), self.ty(e))

    def number_kind(self, func: str, x: Val, ty: Ty) -> Val:
        """⌊x⌋, ⌈x⌉ of a tensor: whole numbers, held as integers (as positions are), so that
        they index; of whole numbers, the numbers themselves. |x| keeps x's kind of number,
        log₂ of whole numbers is a real in the card's number format."""
        ty = Ty(x.ty.shape, ty.elem) if self.point or self.sum_axis else ty
        if func in ("floor", "ceil"):
            if x.ty.elem in ("ℕ", "ℤ"):
                return _like(x, x.code, ty)
            return _like(x, _method(_call(ELEMENTWISE[func], x.code), "long"), ty)
        if func == "log2":
            x = self.real(x, x)
        return _like(x, _call(ELEMENTWISE[func], x.code), ty)

    def pairwise(self, e: s.Call) -> Val:
        """min(a, b), max(a, b): Python's for numbers, torch's entry by entry for tensors; a
        number beside a tensor bounds each entry (torch.clamp), and a number held on a device
        stays there: no wait for it."""
        a, b = (counted(self.expr(x)) for x in e.args)  # token IDs as the numbers 1 … V
        ty = self.ty(e)
        if not _is_tensor(a) and not _is_tensor(b):
            return Val(_call(e.func, a.code, b.code), ty)
        if not _is_tensor(a) or not _is_tensor(b):
            x, bound = (a, b) if _is_tensor(a) else (b, a)
            if self.point or self.sum_axis:
                ty = Ty(x.ty.shape, ty.elem)
            limit = {"max" if e.func == "min" else "min": bound.code}
            return _like(x, _call("torch.clamp", x.code, **limit), ty)
        a, b = self.align(a, b), self.align(b, a)  # lined up as a binary operator's sides are
        a, b = self.same_layout(a, b), self.same_layout(b, a)
        if self.point or self.sum_axis:
            ty = Ty((a.ty if len(a.ty.shape) >= len(b.ty.shape) else b.ty).shape, ty.elem)
        func = "torch.minimum" if e.func == "min" else "torch.maximum"
        return Val(_call(func, a.code, b.code), ty, a.lifted or b.lifted, a.flipped or b.flipped,
                   a.rows or b.rows, a.tensor and b.tensor)

    def call_card(self, e: s.Call, call: CallInfo) -> Val:
        ty = self.ty(e)
        flipped = len(ty.shape) == 2 and \
            self.low.checker.info(call.callee).sig.layout == "column"
        rows = (self.positions[1],) if self.positions and self.reads_position(e) else ()
        fused = self.fuse_call(e, call)
        if fused is not None:
            return Val(fused, ty, True, flipped, rows)
        args = self.call_args(e, call)
        module = self.module_for(e, call)
        if module is not None:
            masks = [self.hyper_value(call, n, g) for n, g in call.hypers.items()
                     if n in self.module_inputs(call.callee)]
            return Val(ir.Call(module, tuple(a.code for a in args) + tuple(masks)), ty, True,
                       flipped, rows)
        fn = self.low.function(call.callee)
        kwargs = self.call_params(e, call) + self.call_sizes(e, call, fn)
        code: ir.Expr = ir.Call(ir.Ref(fn), tuple(a.code for a in args), tuple(kwargs))
        if self.low.decoder:
            self.low.masking.call(fn, self.low.masking.reads_decoded(self.alg, *e.args))
        if self.low.decoder and id(e) in self.low.masking.positioned.calls:
            code = self.positioned(fn, code)
        return Val(code, ty, True, flipped, rows)

    def positioned(self, fn: str, call: ir.Call) -> ir.Expr:
        """A value of every pair of the decoded rows' positions (cardc.lower.analysis
        .positioned): with a cache, made over the positions before the new ones too, `past=`
        (cardc.lower.decoding gives the function that argument), and read at the new rows
        (`cache.positioned`)."""
        self.low.masking.position_functions.add(fn)
        over = ir.Lambda(ir.Call(call.func, call.args, (*call.kwargs, ("past", ir.Ref("past")))),
                         self.fresh("over"), ("past",))
        new = ir.Sub(ir.Attr(call.args[0], "shape"), (ir.Lit("-2"),))
        rows = ir.Call(ir.Attr(ir.Ref("cache"), "positioned"), (over, new))
        return ir.Cond(ir.Bin("is", ir.Ref("cache"), ir.Lit("None")), call, rows)

    def reads_position(self, e: s.Call) -> bool:
        """Whether a call in a map over positions t reads t (`f(X[:, t])`, `f(e_t)`): its
        result then has a row per position. A call of whole values (`Gate(X)[t, :]`) is
        computed once, and its rows are the card's own."""
        var = self.positions[0]
        return any(isinstance(n, s.Name) and (n.id == var or self.member(n.id)[1] == var)
                   for n in s.nodes(e))

    def module_inputs(self, callee: s.Algorithm) -> list[str]:
        """Tensor hyperparameters (a Mask) a module takes with its inputs at call time."""
        return self.low.tensor_hypers(callee)

    def call_args(self, e: s.Call, call: CallInfo) -> list[Val]:
        sig = self.low.checker.info(call.callee).sig
        args = [self.laid_out(self.expr(a), sig.layout == "column") for a in e.args]
        return args + [args[0]] * (len(sig.inputs) - len(args))  # Z = X: self-attention

    @staticmethod
    def laid_out(arg: Val, flipped: bool) -> Val:
        """A matrix handed to a card, stored as that card reads its inputs: flipped where it
        is column-major, in its card layout where it is not (a card without products has no
        layout of its own, and reads its inputs as declared)."""
        if len(arg.ty.shape) != 2 or not arg.lifted or arg.flipped == flipped:
            return arg
        return replace(arg, code=_mT(arg.code), flipped=flipped)

    def module_for(self, e: s.Call, call: CallInfo) -> ir.Expr | None:
        for given in call.params.values():
            if not isinstance(given, s.Name):
                continue
            if self.is_model(self.scope.values.get(given.id)):  # a model handed to a procedure
                return self.scope.values[given.id].code
            if given.id in self.scope.modules and self.scope.modules[given.id].var is None:
                return ir.Ref(f"self.{self.scope.modules[given.id].attr}")
            for pattern, ref in self.scope.loop_modules.items():
                slot = self.scope.modules[pattern]
                if instance(pattern, slot.var, given.id) is not None:
                    return ref
        return None

    def call_params(self, e: s.Call, call: CallInfo) -> list[tuple[str, ir.Expr]]:
        """Keyword arguments of a card lowered to a function: tensors, masks, scalars."""
        callee = self.low.checker.info(call.callee).sig
        out: list[tuple[str, ir.Expr]] = []
        for name, entry in callee.params:
            if name in callee.hypers:
                continue
            given = call.params.get(name)
            if given is None:
                self.fail(e, f"'{call.callee.name}' needs '{display(name)}'")
            if isinstance(entry, BundleTy):
                mine = self.bundle_members(given)
                for (member, _), value in zip(self.low.flat_tensors(entry), mine, strict=True):
                    out.append((local_name(member), value))
            else:
                out.append((local_name(name), self.expr(given).code))
        for name, given in call.hypers.items():
            out.append((local_name(name), self.hyper_value(call, name, given)))
        return out

    def call_sizes(self, e: s.Call, call: CallInfo, fn: str) -> list[tuple[str, ir.Expr]]:
        """Sizes a function takes that the call does not give by name: those the check
        matched to the caller's (the N_V of the tokens it is handed)."""
        callee = self.low.checker.info(call.callee).sig
        out: list[tuple[str, ir.Expr]] = []
        for name in self.low.passed_sizes.get(fn, ()):
            if name in call.hypers:
                continue
            size = call.bind.get(name)
            if size is not None and not any(sym.startswith("|") for sym in size.symbols):
                out.append((local_name(name), self.dim(size)))
            elif name not in callee.defaults:
                self.fail(e, f"'{call.callee.name}' needs its size '{display(name)}', which "
                             "no argument of this call gives",
                          hint=f"give it: '{call.callee.name}(… | {display(name)} = …)'")
        return out

    def bundle_members(self, given: s.Expr) -> list[ir.Expr]:
        entry = self.info.types.get(id(given))
        if isinstance(entry, FamilyTy):
            entry = entry.entry
        if not isinstance(entry, BundleTy) or not isinstance(given, s.Name):
            return self.fail(given, "expected a parameter bundle")
        out = []
        for member, _ in self.low.flat_tensors(entry):
            out.append(self.expr(s.Name(member, span=given.span)).code)
        return out

    def hyper_value(self, call: CallInfo, name: str, given: s.Expr) -> ir.Expr:
        self.low.masking.give(call.callee, name, self.mask_given(call, given))
        if isinstance(given, s.Arg) and isinstance(given.target, s.Index):
            return self.mask_rule(call, name, given).code
        value = given.value if isinstance(given, s.Arg) else given
        if isinstance(given, s.Arg) and given.op == "≡":
            return self.constant_mask(call, name, value).code
        return self.expr(value).code

    def mask_given(self, call: CallInfo, given: s.Expr) -> bool | tuple[int, str]:
        """What a call gives a hyperparameter, as a mask (cardc.lower.analysis): a rule that
        hides later keys (True), or this card's own mask passed on, or anything else (False)."""
        if isinstance(given, s.Arg) and isinstance(given.target, s.Index):
            key_first = self.low.checker.info(call.callee).sig.layout == "column"
            return hides_later(given, key_first)
        hyper = self.info.sig.hypers.get(given.id) if isinstance(given, s.Name) else None
        return (id(self.alg), given.id) if hyper is not None and hyper.shape else False

    def mask_rule(self, call: CallInfo, name: str, rule: s.Arg) -> Val:
        """`Mask[t, t′] = [[t′ ≤ t]]`: the boolean tensor the rule describes."""
        shape = self.callee_shape(call, name)
        vars_ = [i.id for i in rule.target.items if isinstance(i, s.Name)]
        if len(vars_) != len(shape):
            self.fail(rule, f"'{display(name)}' has {len(shape)} axes")
        rank = len(shape)
        flip = self.column and rank == 2  # stored flipped, like every matrix of the card
        outer, self.point = self.point, {
            v: (rank - 1 - k if flip else k, rank, shape[k]) for k, v in enumerate(vars_)}
        try:
            return replace(self.expr(rule.value), flipped=flip)
        finally:
            self.point = outer

    def constant_mask(self, call: CallInfo, name: str, value: s.Expr) -> Val:
        dims = self.callee_shape(call, name)
        shape = tuple(self.dim(d) for d in dims)
        flip = self.column and len(shape) == 2
        fill = "True" if isinstance(value, s.Num) and value.value else "False"
        code = _call("torch.full", ir.Seq(shape[::-1] if flip else shape), ir.Lit(fill),
                     device=self.device_expr())
        return Val(code, Ty(dims, "𝔹"), False, flip)

    def callee_shape(self, call: CallInfo, name: str) -> tuple[Dim, ...]:
        hyper = self.low.checker.info(call.callee).sig.hypers[name]
        return substitute(hyper, call.bind).shape
