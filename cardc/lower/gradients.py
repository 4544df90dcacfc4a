"""Gradients a training card names: `g ← ∇loss(θ)`, their sums over micro-batches and their
scaling in place (clipping by the global norm, `g ← g · min(1, c/‖g‖)`).

A named gradient lives where PyTorch keeps it, in the `.grad` of θ's parameters:
- `g ← ∇loss(θ)` is `θ.zero_grad()` and `loss.backward()`;
- `g ← 0`, where the card later sums into g (`g ← g + ∇loss(θ)`), is `θ.zero_grad()`, and each
  term of the sum one more `backward()`: autograd adds into `.grad`;
- `g ← g · s` (or `g/s`) multiplies every tensor of it in place, one fused kernel per device
  and dtype (`torch._foreach_mul_`, as `clip_grad_norm_` does);
- reading g lists those tensors, `‖g‖` is their global norm (`get_total_norm`, a 0-d tensor:
  no wait for its value), and `θ ← AdamW(θ, g | …)` steps with them (`Body.update`).
θ's `.grad` holds one gradient at a time: reading a gradient that a later one took over is
refused, with both steps named.
"""

from __future__ import annotations

from .. import ir
from .. import syntax as s
from ..spelling import display
from ..types import Ty
from .context import Steps
from .values import Gradient, Val, local_name

_SCALES = {"·": "_foreach_mul_", " ": "_foreach_mul_", "/": "_foreach_div_"}


def gradient_of(e: s.Expr) -> tuple[str, str] | None:
    """`∇f(θ)`: f and θ."""
    if isinstance(e, s.Unary) and e.op == "∇" and isinstance(e.operand, s.Call) \
            and len(e.operand.args) == 1 and isinstance(e.operand.args[0], s.Name):
        return e.operand.func, e.operand.args[0].id
    return None


def _sum_term(e: s.Expr, name: str) -> s.Expr | None:
    """`g + ∇f(θ)` (or `∇f(θ) + g`): the term added to g."""
    if isinstance(e, s.BinOp) and e.op == "+":
        for own, other in ((e.left, e.right), (e.right, e.left)):
            if isinstance(own, s.Name) and own.id == name and gradient_of(other):
                return other
    return None


def summed(alg: s.Algorithm) -> dict[str, str]:
    """The gradients a card sums into, `g ← g + ∇f(θ)`: g → θ."""
    out: dict[str, str] = {}
    for node in s.nodes(alg.steps):
        if isinstance(node, s.Assign) and isinstance(node.target, s.Name):
            term = _sum_term(node.value, node.target.id)
            if term is not None:
                out.setdefault(node.target.id, gradient_of(term)[1])
    return out


def gradient_step(body: Steps, st: s.Assign, step: s.Step) -> bool:
    """Lower `st` if it makes or changes a named gradient; False for any other step."""
    if not isinstance(st.target, s.Name):
        return False
    name = st.target.id
    fresh = gradient_of(st.value)
    if fresh is not None:
        _backward(body, name, fresh, step, None)
        return True
    term = _sum_term(st.value, name)
    if term is not None:
        _backward(body, name, gradient_of(term), step, current(body, name, st.value))
        return True
    if isinstance(st.value, s.Num) and st.value.text == "0" and name in body.low.walk(body.alg, summed):
        _zero(body, name, body.low.walk(body.alg, summed)[name], step)
        return True
    if isinstance(body.scope.values.get(name), Gradient):
        return _scale(body, name, st, step)
    return False


def current(body: Steps, name: str, node: s.Expr) -> Gradient:
    """The gradient `name` holds, which must still be its parameters' `.grad`."""
    grad = body.scope.values.get(name)
    if not isinstance(grad, Gradient):
        body.fail(node, f"'{display(name)}' is not a gradient here",
                  hint=f"start it as '{display(name)} ← 0' or '{display(name)} ← ∇loss(θ)'")
    if grad.replaced is not None:
        body.fail(node, f"'{display(name)}' was replaced by another gradient of "
                        f"'{display(grad.theta)}' at line {grad.replaced.span.line}: generated "
                        f"code keeps one gradient of '{display(grad.theta)}' at a time, in its "
                        "parameters' .grad",
                  hint="use each gradient before taking the next")
    return grad


def _model(body: Steps, theta: str, node: object) -> ir.Ref:
    val = body.scope.values.get(theta)
    if not body.is_model(val) or not isinstance(val.code, ir.Ref):
        body.fail(node, f"code generation takes gradients of a model's parameters, not of "
                        f"'{display(theta)}'")
    return val.code


def take_over(body: Steps, name: str, theta: str, step: s.Step) -> None:
    """θ's `.grad` now holds `name`'s gradient: any other gradient of θ is gone."""
    for other, val in body.scope.values.items():
        if isinstance(val, Gradient) and val.theta == theta and other != name:
            val.replaced = val.replaced or step


def _zero(body: Steps, name: str, theta: str, step: s.Step) -> None:
    """`g ← 0` before a sum of gradients: θ's `.grad` emptied; the loss summed alongside."""
    model = _model(body, theta, step)
    take_over(body, name, theta, step)
    body.emit(ir.Assign((), ir.Call(ir.Attr(model, "zero_grad")), body.note(step)))
    told = body.fresh(local_name(name) + "_loss")
    body.emit(ir.Assign((told,), ir.Call(ir.Ref("torch.zeros"), (ir.Seq(()),)),
                        ir.Note(None, None, f"the loss whose gradient {display(name)} sums")))
    body.scope.values[name] = Gradient(model, theta, ir.Ref(told))


def _backward(body: Steps, name: str, grad: tuple[str, str], step: s.Step,
              into: Gradient | None) -> None:
    """`g ← ∇f(θ)` (`into` None) or `g ← g + ∇f(θ)`: f's backward pass, into θ's `.grad`."""
    func, theta = grad
    model = _model(body, theta, step)
    if into is not None and into.theta != theta:
        body.fail(step, f"'{display(name)}' is a gradient of '{display(into.theta)}', not of "
                        f"'{display(theta)}'")
    loss = body.expr(s.Name(func, span=step.stmt.value.span))
    total = ir.Call(ir.Attr(loss.code, "sum"))
    take_over(body, name, theta, step)
    if into is None:
        body.emit(ir.Assign((), ir.Call(ir.Attr(model, "zero_grad")), body.note(step)))
    body.emit(ir.Assign((), ir.Call(ir.Attr(total, "backward")),
                        body.note(step) if into is not None else ir.Note()))
    told: ir.Expr = ir.Call(ir.Attr(total, "detach"))
    if into is not None:  # the sum's loss, as its gradient is the sum's
        told = ir.Bin("+", into.told, told)
    if into is not None or name in body.low.walk(body.alg, summed):
        var = into.told.id if into is not None and isinstance(into.told, ir.Ref) else \
            body.fresh(local_name(name) + "_loss")
        body.emit(ir.Assign((var,), told))
        told = ir.Ref(var)
    body.scope.values[name] = Gradient(model, theta, told)


def listed(body: Steps, name: str, node: s.Expr) -> Val:
    """A gradient read as a value: its tensors, listed once per step that reads them."""
    grad = current(body, name, node)
    local = local_name(name)
    if grad.listed != id(body.at_step):
        listing = ir.Lit(f"[p.grad for p in {grad.model.id}.parameters() if p.grad is not None]")
        body.emit(ir.Assign((local,), listing, ir.Note(
            None, None, f"{display(name)}: the gradients of {display(grad.theta)}, in place")))
        grad.listed = id(body.at_step)
    return Val(ir.Ref(local), body.ty(node))


def _scale(body: Steps, name: str, st: s.Assign, step: s.Step) -> bool:
    """`g ← g · s`, `g ← s · g`, `g ← g/s`: every tensor of g scaled in place by the number s."""
    v = st.value
    if not (isinstance(v, s.BinOp) and v.op in _SCALES):
        return body.fail(st, f"code generation changes a gradient in place only by scaling it: "
                             f"'{display(name)} ← {display(name)} · s'")
    own_left = isinstance(v.left, s.Name) and v.left.id == name
    own_right = v.op != "/" and isinstance(v.right, s.Name) and v.right.id == name
    if own_left == own_right:
        return body.fail(st, f"code generation scales a gradient by a number: "
                             f"'{display(name)} ← {display(name)} · s'")
    factor = body.expr(v.right if own_left else v.left)
    if factor.lifted or factor.rows or factor.ty.shape:
        body.fail(v, "a gradient scales by one number")
    grads = listed(body, name, v.left if own_left else v.right)
    body.emit(ir.Assign((), ir.Call(ir.Ref(f"torch.{_SCALES[v.op]}"), (grads.code, factor.code)),
                        body.note(step)))
    return True


def norm(body: Steps, e: s.Norm) -> Val:
    """‖x‖: a gradient's global norm, or the L2 norm of a tensor's card axes (its entries)."""
    if isinstance(e.operand, s.Name) and isinstance(body.scope.values.get(e.operand.id), Gradient):
        grads = listed(body, e.operand.id, e.operand)
        code = ir.Call(ir.Ref("torch.nn.utils.get_total_norm"), (grads.code,))
        return Val(code, body.ty(e), tensor=True)
    x = body.expr(e.operand)
    if not isinstance(x.ty, Ty):
        body.fail(e, "code generation takes the norm of a tensor or of a named gradient",
                  hint="name the gradient first: 'g ← ∇loss(θ)', then ‖g‖")
    rank = len(x.ty.shape)
    if not rank:
        if x.lifted or x.rows or x.tensor:
            return Val(ir.Call(ir.Ref("torch.abs"), (x.code,)), body.ty(e), x.lifted, rows=x.rows,
                       tensor=x.tensor)
        return Val(ir.Call(ir.Ref("abs"), (x.code,)), body.ty(e))
    dims = ir.Seq(tuple(ir.Lit(str(-k)) for k in range(rank, 0, -1)))
    code = ir.Call(ir.Ref("torch.linalg.vector_norm"), (x.code,), (("dim", dims),))
    return Val(code, body.ty(e), x.lifted, rows=x.rows, tensor=not (x.lifted or x.rows))
