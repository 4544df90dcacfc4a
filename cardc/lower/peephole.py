"""Peephole rewrites: local patterns of the lowered IR that one PyTorch call does faster.

`X @ W + b`, a product by a parameter matrix plus a parameter vector, becomes
`F.linear(X, W.T, b)`: one `addmm`, which adds the bias inside the matrix product instead of in
a second pass over its output (and sums the bias's gradient in the same backward). The
parameters keep the card's layout: `W.T` is a view, and `addmm` reads it as `W`.
"""

from __future__ import annotations

from .. import ir


def fold_bias(program: ir.Program) -> None:
    """Every module's `X @ W + b` (or `b + X @ W`) → `F.linear(X, W.T, b)`."""
    for m in program.modules:
        _fold_module(m)


def _fold_module(m: ir.Module) -> None:
    ranks = {f"self.{p.name}": len(p.shape) for p in m.params}

    def param(e: ir.Expr, rank: int) -> bool:
        return isinstance(e, ir.Ref) and ranks.get(e.id) == rank

    def fold(e):
        if not (isinstance(e, ir.Bin) and e.op == "+"):
            return None
        for prod, bias in ((e.left, e.right), (e.right, e.left)):
            if isinstance(prod, ir.Bin) and prod.op == "@" and param(prod.right, 2) and \
                    param(bias, 1):
                x = ir.rewrite(prod.left, fold)
                return ir.Call(ir.Ref("F.linear"), (x, ir.Attr(prod.right, "T"), bias))
        return None

    m.body = [ir.rewrite(st, fold) for st in m.body]
