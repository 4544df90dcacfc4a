"""Compute and memory a card implies, counted from its math.

FLOPs are those of the card's matrix products, 2 per multiply-add, as the scaling-law
literature counts them (Kaplan et al. 2020, arXiv:2001.08361, section 2.1): a product of an
m×k and a k×n value is 2mkn. Elementwise steps, norms and softmaxes are left out, as there.
A step inside `for ℓ = 1, …, N` or a map `for h ∈ [H] : …` counts N or H times, and a call
counts its card's products in the caller's sizes, once per row it is mapped over. The count
is a polynomial in the card's hyperparameters and its sequence length; divided by the sequence
length it is per token. A sum over the set argtop_k(r | k) chooses, `Σ_{e ∈ I} c_e ·
Expert(x | θ^e)`, counts its body k times: the FLOPs of the experts a token is routed to, not
of all E (the active FLOPs of a sparse mixture of experts). A training step costs three forwards (the backward pass computes two
products per forward one), the usual estimate.

Activation memory is estimated as every value the card's steps compute (each step's result, at
every level of calls), what backpropagation through the card's math keeps. The generated code
keeps about as much (tests/test_flops.py measures it within 25%): SDPA keeps no score matrix,
but a norm keeps its statistics and a product its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import syntax as s
from .builtins import ARGTOP
from .checker import CardInfo, Checker, expr_dim
from .dims import Dim
from .types import Ty, subst_dim

ZERO = Dim.const(0)
PRODUCTS = (" ", "·")


@dataclass(frozen=True)
class Cost:
    """Per call of a card, in its own symbols."""

    flops: Dim  # the forward pass's
    values: Dim  # entries of every value its steps compute


def card_cost(checker: Checker, alg: s.Algorithm, depth: int = 0) -> Cost:
    """The forward FLOPs and computed values of one call of `alg`."""
    info = checker.info(alg)
    sets = _chosen(alg, info)
    total = Cost(ZERO, ZERO)
    for step in alg.steps:
        total = _add(total, _step(checker, info, step, depth, sets))
    return total


def _chosen(alg: s.Algorithm, info: CardInfo) -> dict[str, Dim]:
    """The sets the card's steps make with argtop_k, by name: how many members each holds."""
    out = {}
    for node in s.nodes(alg.steps):
        if isinstance(node, s.Assign) and isinstance(node.target, s.Name):
            k = _argtop_k(node.value, info)
            if k is not None:
                out[node.target.id] = k
    return out


def _argtop_k(e: s.Expr, info: CardInfo) -> Dim | None:
    """k of argtop_k(r | k), where it is a size of the card."""
    if isinstance(e, s.Call) and e.func == ARGTOP and len(e.params) == 1 and \
            id(e) not in info.calls:
        return expr_dim(e.params[0], info.sig.definitions)
    return None


def _weights(st: s.Stmt, info: CardInfo, sets: dict[str, Dim]) -> dict[int, Dim]:
    """How many times each node of a step counts: k times under a sum over a chosen set."""
    out: dict[int, Dim] = {}
    for node in s.nodes(st):
        if not isinstance(node, s.Sum) or node.over is None:
            continue
        k = sets.get(node.over.id) if isinstance(node.over, s.Name) else \
            _argtop_k(node.over, info)
        if k is None:
            continue
        for inner in s.nodes(node.body):
            out[id(inner)] = out.get(id(inner), Dim.const(1)) * k
    return out


def _step(checker: Checker, info: CardInfo, step: s.Step, depth: int,
          sets: dict[str, Dim]) -> Cost:
    st = step.stmt
    if isinstance(st, s.For):
        inner = Cost(ZERO, ZERO)
        for sub in st.body:
            inner = _add(inner, _step(checker, info, sub, depth, sets))
        times = _times(st.over, info)
        return Cost(inner.flops * times, inner.values * times)
    flops, values = ZERO, ZERO
    weights = _weights(st, info, sets)
    for node in s.nodes(st):
        if isinstance(node, s.BinOp) and node.op in PRODUCTS:
            flops = flops + _product(info, node) * weights.get(id(node), Dim.const(1))
        elif isinstance(node, s.Call) and id(node) in info.calls and depth < 32:
            call = info.calls[id(node)]
            inner = card_cost(checker, call.callee, depth + 1)
            times = weights.get(id(node), Dim.const(1))
            for d in call.lift:
                times = times * d
            flops = flops + subst_dim(inner.flops, call.bind) * times
            values = values + subst_dim(inner.values, call.bind) * times
    result = getattr(st, "value", None)
    ty = info.types.get(id(result)) if result is not None else None
    if isinstance(ty, Ty) and ty.shape and not isinstance(result, (s.Call, s.Name)):
        values = values + _size(ty)  # a call's result is its card's last value, a name computes none
    return Cost(flops, values)


def _product(info: CardInfo, e: s.BinOp) -> Dim:
    """2mkn for (m×k)(k×n); vectors are 1×k or k×1; a product by a number is elementwise."""
    a, b = info.types.get(id(e.left)), info.types.get(id(e.right))
    if not (isinstance(a, Ty) and isinstance(b, Ty)) or not a.shape or not b.shape or \
            len(a.shape) > 2 or len(b.shape) > 2 or None in a.shape or None in b.shape:
        return ZERO
    k = a.shape[-1]
    if b.shape[0] != k:
        return ZERO  # not a matrix product (⊙ is written otherwise; this is a scaling)
    m = a.shape[0] if len(a.shape) == 2 else Dim.const(1)
    n = b.shape[1] if len(b.shape) == 2 else Dim.const(1)
    return Dim.const(2) * m * k * n


def _times(over: s.Expr | s.Range, info: CardInfo) -> Dim:
    """How many times a loop's body runs: N of `1, …, N` or of `[N]`."""
    defs = info.sig.definitions
    if isinstance(over, s.Range):
        last = expr_dim(over.last, defs)
        first = expr_dim(over.first[0], defs) if over.first else Dim.const(1)
        if last is not None and first is not None:
            return last - first + Dim.const(1)
    elif isinstance(over, s.Concat) and len(over.items) == 1:
        size = expr_dim(over.items[0], defs)
        if size is not None:
            return size
    return Dim.const(1)


def _size(ty: Ty) -> Dim:
    total = Dim.const(1)
    for d in ty.shape:
        total = total * (d if d is not None else Dim.const(1))
    return total


def _add(a: Cost, b: Cost) -> Cost:
    return Cost(a.flops + b.flops, a.values + b.values)
