"""A language model's log-likelihood without every logit at once.

Training reads `Σ_t log softmax(M(x)[t, :])[x[t + 1]]`: for a long sequence and a large
vocabulary, the logits of every position (B·T·V numbers, and as many again for their
log-softmax) are most of a step's activation memory. Where the model's last step, its head
(`P = E W_e^⊺`, Gemma 2's soft cap `c · tanh(E W_e^⊺ / c)`), acts on each row of one value alone,
forward(x, nll=(rows, targets)) returns that sum per example through `log_likelihood`
(cardc.runtime.modelkit), which applies the head to a few rows at a time. Whether a head acts row
by row is read off its expression, conservatively: operations that act along its last axis only
(products with parameters, elementwise functions, softmax over that axis), anything else not.
"""

from __future__ import annotations

from .. import ir

LOGITS_AT_ONCE = 1 << 24  # as cardc.runtime.modelkit's log_likelihood holds at most

# elementwise: each output entry reads the entry at its place alone
ELEMENTWISE = frozenset({"torch.tanh", "torch.sigmoid", "torch.exp", "torch.log", "torch.sqrt",
                         "torch.rsqrt", "torch.erf", "torch.relu", "torch.abs", "F.gelu", "F.silu",
                         "F.relu", "F.softplus"})
OVER_LAST = frozenset({"torch.softmax", "torch.log_softmax"})  # with dim=-1: a row alone


def likelihood_step(head: ir.Expr, width: ir.Expr) -> ir.If | None:
    """`if nll is not None: return log_likelihood(lambda h: head, h, *nll, width)`, where the
    head reads one local value, row by row; None where it reads more, or may mix rows."""
    local = _locals(head)
    if len(set(local)) != 1 or not _row_wise(head, local[0]):
        return None
    h = local[0]
    call = ir.Call(ir.Ref("log_likelihood"),
                   (ir.Lambda(head, "head", (h,)), ir.Ref(h), ir.Un("*", ir.Ref("nll")), width))
    note = ir.Note(text="training's loss: the targets' log-likelihood, a few rows at a time")
    ret = ir.Return(call, ir.Note("(B,)"))
    return ir.If(ir.Bin("is not", ir.Ref("nll"), ir.Lit("None")), (ret,), (), note)


def _locals(e: ir.Expr) -> list[str]:
    """The local names an expression reads: not attributes (`self.W_e`) nor modules (`F.gelu`)."""
    found: list[str] = []

    def visit(n):
        if isinstance(n, ir.Ref) and "." not in n.id and n.id not in ("...", "None"):
            found.append(n.id)
        return None

    ir.rewrite(e, visit)
    return found


def _row_wise(e: ir.Expr, h: str) -> bool:
    """Whether each row of `e` reads the same row of `h` alone (and parameters)."""
    if isinstance(e, (ir.Ref, ir.Lit)):
        return True
    if isinstance(e, ir.Un):
        return _row_wise(e.operand, h)
    if isinstance(e, ir.Bin) and e.op in ("+", "-", "*", "/", "**"):
        return _row_wise(e.left, h) and _row_wise(e.right, h)
    if isinstance(e, ir.Bin) and e.op == "@":  # (…, T, D) @ (D, V): rows stay rows
        return _row_wise(e.left, h) and h not in _locals(e.right)
    if isinstance(e, ir.Attr):  # W.T, W.mT: of a parameter
        return e.name in ("T", "mT") and h not in _locals(e.obj)
    if isinstance(e, ir.Call) and isinstance(e.func, ir.Ref):
        if e.func.id in OVER_LAST and e.kwargs != (("dim", ir.Lit("-1")),):
            return False
        if e.func.id not in ELEMENTWISE | OVER_LAST:
            return False
        return all(_row_wise(a, h) for a in e.args) and \
            all(isinstance(v, ir.Lit) for k, v in e.kwargs if k != "dim")
    return False
