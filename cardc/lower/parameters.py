"""Where a module's parameters live: its own tensors (with their initial values), submodules
built from the cards it calls, and families of tensors stacked into one storage tensor per
group of members of equal shape (a layer's own tensors, or the heads of a map)."""

from __future__ import annotations

from .. import ir
from .. import syntax as s
from ..checker import CallInfo, instance, split_name
from ..dims import Dim
from ..names import number
from ..spelling import display
from ..types import BundleTy, Entry, FamilyTy, Ty
from .values import LowerError, ModuleSlot, Scope, Stacked, attr_name, dim_expr, local_name, num_lit


class Parameters:
    """The parameters of a module's card (part of `cardc.lower.cards.Lowering`)."""

    def store(self, alg, calls, name: str, entry: Entry, m: ir.Module, scope: Scope,
              var: str | None) -> None:
        if isinstance(entry, Ty):
            attr = attr_name(name)
            shape = tuple(_ctor_dim(d) for d in entry.shape)
            m.params.append(ir.Param(attr, shape, _init(name, entry, shape),
                                     ir.Note(_shape(entry.shape), self.decl_line(alg, name))))
            scope.tensors[name] = ir.Ref(f"self.{attr}")
        elif isinstance(entry, BundleTy) and entry.card is None:
            for sub, e in entry.members.items():
                self.store(alg, calls, sub, e, m, scope, var)
        elif isinstance(entry, BundleTy):
            self.submodule(alg, calls, name, entry, m, scope, None, None)
        elif isinstance(entry.entry, BundleTy) and entry.entry.card is not None:
            self.submodule(alg, calls, name, entry.entry, m, scope, entry.var, entry.over)
        else:
            self.stack(alg, name, entry, m, scope)

    def submodule(self, alg, calls, name, bundle: BundleTy, m, scope, var, over) -> None:
        callee = self.lib.find(bundle.card, self.lib.file_of(alg))
        call = self.call_passing(alg, calls, name, var)
        cls = self.module(callee)
        attr = attr_name(name, var)
        names = self.ctor_names(alg, call, name, var)
        kwargs = tuple((local_name(a), v) for a in self.ctor_args(callee)
                       if (v := self.ctor_kwarg(callee, call, a, names)) is not None)
        count = None if over is None else _ctor_dim(over)
        index = LAYER if any(_reads(v, LAYER) for _, v in kwargs) else None
        if any(_reads(v, "math.") for _, v in kwargs):  # ⌈·⌉ of a layer's value
            self.program.imports.add("math")
        m.submodules.append(ir.Submodule(attr, cls.name, kwargs, count,
                                         ir.Note(None, self.decl_line(alg, name)), index))
        scope.modules[name] = ModuleSlot(attr, callee, var, over)

    def ctor_names(self, alg, call: CallInfo, name: str, var: str | None) -> dict[str, ir.Expr]:
        """What the names a call's hyperparameters may read are in the caller's constructor:
        its arguments, its derived sizes, and the index of the layer a stack builds."""
        sig = self.checker.info(alg).sig
        names: dict[str, ir.Expr] = {n: ir.Ref(local_name(n)) for n in self.ctor_args(alg)}
        names.update({n: _ctor_dim(d) for n, d in sig.definitions.items()})
        layer = _layer_index(call, name, var)
        if layer is not None:
            names[layer] = ir.Bin("+", ir.Ref(LAYER), ir.Lit("1"))
        return names

    def call_passing(self, alg, calls: dict[int, CallInfo], name: str, var) -> CallInfo:
        for call in calls.values():
            for given in call.params.values():
                if isinstance(given, s.Name) and (given.id == name or var is not None and
                                                  instance(name, var, given.id) is not None):
                    return call
        raise LowerError(alg.span, f"the parameters '{name}' are never passed to a card")

    def ctor_kwarg(self, callee, call: CallInfo, arg: str,
                   names: dict[str, ir.Expr] | None = None) -> ir.Expr | None:
        """The value the call hands the callee's constructor for `arg`; `names`: what each
        name it may read is in the caller's constructor."""
        sig = self.checker.info(callee).sig
        if arg in call.hypers:
            given = call.hypers[arg]
            value = given.value if isinstance(given, s.Arg) else given
            want = sig.hypers.get(arg)
            if want is not None and want.elem in ("ℕ", "ℤ"):
                _whole(value)
            return _ctor_expr(value, names or {})
        if arg in call.bind:
            return _ctor_dim(call.bind[arg])
        if arg in sig.defaults:
            return None
        return ir.Ref(local_name(arg))

    def stack(self, alg, name: str, fam: FamilyTy, m: ir.Module, scope: Scope) -> None:
        """A family of tensors for a map: members of equal shape share one storage tensor."""
        members = self.flat_tensors(fam.entry) if isinstance(fam.entry, BundleTy) \
            else [(name, fam.entry)]
        axis = "lead" if _layer_family(self.walk(alg, _do_loops), name, fam.var) else \
            "first" if self.checker.info(alg).sig.layout == "column" else "last"
        groups: dict[tuple, list[tuple[str, Ty]]] = {}
        for member, ty in members:  # column-major: one nn.Linear-shaped tensor per member
            groups.setdefault(ty.shape if axis == "last" else (member,), []).append((member, ty))
        for group in groups.values():
            shape = group[0][1].shape
            if not shape:
                raise LowerError(alg.span, f"'{name}': scalar families are not supported yet")
            attr = _stem([g[0] for g in group], fam.var)
            count = Dim.const(len(group))
            if axis == "lead":
                full = (count * fam.over, *shape) if len(group) > 1 else (fam.over, *shape)
            elif axis == "first":
                full = (count * fam.over * shape[0], *shape[1:])
            else:
                full = shape[:-1] + (count * fam.over * shape[-1],)
            dims = tuple(_ctor_dim(d) for d in full)
            first, ty = group[0]
            m.params.append(ir.Param(attr, dims, _init(first, ty, dims),
                                     ir.Note(_shape(full), self.decl_line(alg, first))))
            for k, (member, ty) in enumerate(group):
                scope.stacked[member] = Stacked(f"self.{attr}", k, len(group), fam.over,
                                                ty.shape, fam.var, axis)

    def flat_tensors(self, bundle: BundleTy) -> list[tuple[str, Ty]]:
        out: list[tuple[str, Ty]] = []
        for name, entry in bundle.members.items():
            if isinstance(entry, Ty):
                out.append((name, entry))
            elif isinstance(entry, BundleTy):
                out += self.flat_tensors(entry)
            else:
                raise LowerError(s.NOWHERE, f"'{name}': a family inside a bundle argument")
        return out

    def decl_line(self, alg: s.Algorithm, name: str) -> str | None:
        file = self.lib.file_of(alg).path.rsplit("/", 1)[-1]

        def find(items) -> int | None:
            for item in items:
                if isinstance(item, s.Decl) and name in item.names:
                    return item.span.line
                if isinstance(item, s.Bundle) and item.name == name:
                    return item.span.line
                inner = getattr(item, "items", None)
                if inner and (line := find(inner)) is not None:
                    return line
            return None

        line = find(alg.decls("Parameters"))
        return f"{file}:{line}" if line else None


def _ctor_dim(d: Dim) -> ir.Expr:
    """A dimension inside `__init__`, where hyperparameters are the constructor's arguments."""
    return dim_expr(d, lambda sym: ir.Ref(local_name(sym.lstrip("?"))))


LAYER = "_layer"  # a stack's 0-based index in the generator that builds its layers: no card
# name starts with "_", so none is shadowed
_CTOR_OPS = {"+": "+", "−": "-", "·": "*", " ": "*", "/": "/", "mod": "%", "≤": "<=", "<": "<",
             "≥": ">=", ">": ">", "=": "==", "≠": "!="}


def _ctor_value(e: s.Expr) -> ir.Expr:
    if isinstance(e, s.Num):
        return num_lit(e.text, e.span)
    if isinstance(e, s.Name):
        return ir.Ref(local_name(e.id))
    if isinstance(e, s.Unary) and e.op == "−":
        return ir.Un("-", _ctor_value(e.operand))
    raise LowerError(e.span, "expected a number or a hyperparameter")


def _ctor_expr(e: s.Expr, names: dict[str, ir.Expr]) -> ir.Expr:
    """A hyperparameter a call hands its callee, in `__init__`: numbers, the caller's
    hyperparameters (`names`: each one's value there) and their arithmetic, and in a stack of
    layers the layer's index (w = [[ℓ mod p = 0]] ctx + [[ℓ mod p ≠ 0]] w),
    computed once per layer."""
    def expr(x: s.Expr) -> ir.Expr:
        return _ctor_expr(x, names)

    if isinstance(e, s.Num):
        return num_lit(e.text, e.span)
    if isinstance(e, s.Name) and e.id in names:
        return names[e.id]
    if isinstance(e, s.Name):
        raise LowerError(e.span, f"'{display(e.id)}' is a value of the steps: a hyperparameter "
                                 "a call hands its callee is computed from hyperparameters")
    if isinstance(e, s.Unary) and e.op == "−":
        return ir.Un("-", expr(e.operand))
    if isinstance(e, s.BinOp) and e.op in _CTOR_OPS:
        return ir.Bin(_CTOR_OPS[e.op], expr(e.left), expr(e.right))
    if isinstance(e, s.Iverson):
        return ir.Call(ir.Ref("int"), (expr(e.cond),))
    if isinstance(e, s.Call) and e.func in ("floor", "ceil") and len(e.args) == 1 and not e.params:
        inner = e.args[0]
        if e.func == "floor" and isinstance(inner, s.BinOp) and inner.op == "/":
            return ir.Bin("//", expr(inner.left), expr(inner.right))
        return ir.Call(ir.Ref(f"math.{e.func}"), (expr(inner),))
    if isinstance(e, s.Call) and e.func in ("min", "max") and e.args and not e.params:
        return ir.Call(ir.Ref(e.func), tuple(expr(a) for a in e.args))
    raise LowerError(e.span, "expected a number, a hyperparameter, their arithmetic or, in a "
                             "loop over layers, the layer's index")


def _whole(e: s.Expr) -> None:
    """A whole-number hyperparameter's value divides only inside ⌊·⌋ or ⌈·⌉, where what it
    does with a remainder is written."""
    if isinstance(e, s.Call) and e.func in ("floor", "ceil"):
        return
    if isinstance(e, s.BinOp) and e.op == "/":
        raise LowerError(e.span, "a whole number's value divides only inside ⌊·⌋ or ⌈·⌉")
    for child in (e.left, e.right) if isinstance(e, s.BinOp) else \
            (e.operand,) if isinstance(e, s.Unary) else ():
        _whole(child)


def _layer_index(call: CallInfo, name: str, var: str | None) -> str | None:
    """The loop variable a call names its layer by (ℓ of θ^block_ℓ), where it is a name."""
    if var is None:
        return None
    for given in call.params.values():
        if isinstance(given, s.Name) and (idx := instance(name, var, given.id)) is not None:
            return idx if idx.isidentifier() else None
    return None


def _reads(e: ir.Expr, name: str) -> bool:
    """Whether a constructor's value reads `name` (or, ending in a dot, a name of that module)."""
    found: list[str] = []
    ir.rewrite(e, lambda x: found.append(x.id) if isinstance(x, ir.Ref) else None)
    return any(r == name or name.endswith(".") and r.startswith(name) for r in found)


def _shape(dims) -> str:
    return "(" + ", ".join(display(str(d)).replace("?", "") for d in dims) + \
        ("," if len(dims) == 1 else "") + ")"


def _stem(members: list[str], var: str) -> str:
    """W^h_q, W^h_k, W^h_v → W_qkv: the shared base and the members' joined subscripts."""
    if len(members) == 1:
        return attr_name(members[0], var)
    parts = []
    base = None
    for m in members:
        b, decor = split_name(m)
        base = base or b
        rest = [v for _, v in decor if v != var]
        parts.append("".join(rest))
    joined = "".join(parts) if all(len(p) == 1 for p in parts) else "_".join(parts)
    return local_name(f"{base}_{joined}") if base else local_name(joined)


def _layer_family(loops: tuple[tuple[str, frozenset[str]], ...], name: str, var: str) -> bool:
    """Whether a `for … do` loop over layers indexes the family `name` by its variable."""
    return any(instance(name, var, n) == loop_var for loop_var, names in loops for n in names)


def _do_loops(alg: s.Algorithm) -> tuple[tuple[str, frozenset[str]], ...]:
    """Each `for … do` loop of a card: its variable and the names in its body."""
    return tuple((loop.var, frozenset(n.id for n in s.nodes(loop.body) if isinstance(n, s.Name)))
                 for loop in s.nodes(alg.steps) if isinstance(loop, s.For) and loop.style == "do")


def _init(name: str, ty: Ty, shape: tuple[ir.Expr, ...]) -> ir.Expr:
    """Declared `= c` or `~ 𝒩(μ, σ²)`; otherwise 𝒩(0, 0.02²) for matrices, γ = 1, others 0."""
    dims = ir.Seq(shape)
    shape = shape or (dims,)  # a number: torch.zeros(()), which torch.zeros() is not
    if ty.init is not None and isinstance(ty.init, s.Num):
        value = ty.init.value
        if value in (0.0, 1.0):
            return ir.Call(ir.Ref("torch.ones" if value else "torch.zeros"), shape)
        return ir.Call(ir.Ref("torch.full"), (dims, num_lit(ty.init.text, ty.init.span)))
    mean, std = ir.Lit("0.0"), ir.Lit("0.02")
    dist = ty.init_dist
    if isinstance(dist, s.Call) and dist.func == "𝒩" and len(dist.args) == 2:
        mean = _init_value(dist.args[0])
        var = dist.args[1]
        if isinstance(var, s.Power) and isinstance(var.exponent, s.Num) and var.exponent.text == "2":
            std = _init_value(var.base)
        else:
            std = ir.Bin("**", _init_value(var), ir.Lit("0.5"))
    elif len(ty.shape) < 2 and dist is None:
        base = split_name(name)[0]
        return ir.Call(ir.Ref("torch.ones" if base == "γ" else "torch.zeros"), shape)
    empty = ir.Call(ir.Ref("torch.empty"), shape)
    return ir.Call(ir.Attr(empty, "normal_"), (mean, std))


def _init_value(e: s.Expr) -> ir.Expr:
    """A number of an initial distribution, `𝒩(0, σ²)`: written out, or a hyperparameter of the
    card (an argument of its constructor): a preset or a flag sets the scale."""
    return ir.Lit(_literal(e)) if isinstance(e, s.Num) else _ctor_value(e)


def _literal(e: s.Expr) -> str:
    if isinstance(e, s.Num):
        try:
            return number(float(e.value))
        except ValueError as err:
            raise LowerError(e.span, f"the number {e.text} cannot be represented: {err}") from None
    raise LowerError(e.span, "expected a number")
