"""The builtins of cardc/builtins.py as the interpreter computes them: each from its
mathematical definition on concrete tensors, not from the fused torch function a lowering
picks (GELU from erf or tanh, softmax from exp and a sum, var with the population's 1/n)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import syntax as s
from ..spelling import display


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1/(1 + e^{−x}), written as e^{x}/(1 + e^{x}) where x < 0: neither exponential can
    overflow, so σ keeps its relative precision far from 0 and its gradient stays a number."""
    up, down = torch.exp(-x.clamp(min=0)), torch.exp(x.clamp(max=0))
    return torch.where(x >= 0, 1 / (1 + up), down / (1 + down))


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """exp(x_i) / Σ_j exp(x_j), shifted by the largest entry (the same value, without
    overflow); an axis of −∞ alone stays as softmax leaves it, not a number."""
    shifted = x - x.amax(dim=dim, keepdim=True).detach()
    e = torch.exp(shifted)
    return e / e.sum(dim=dim, keepdim=True)


def log_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """log σ(x) = min(x, 0) − log(1 + e^{−|x|}): the logarithm of σ taken before σ rounds
    to 0, so it stays a number (−x, not −∞) far below 0."""
    return x.clamp(max=0) - torch.log1p(torch.exp(-x.abs()))


def log_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """log softmax(x)_i = x_i − log Σ_j exp(x_j), shifted by the largest entry: a number
    where softmax's entry rounds to 0."""
    shifted = x - x.amax(dim=dim, keepdim=True).detach()
    return shifted - torch.log(torch.exp(shifted).sum(dim=dim, keepdim=True))


def patches(x: torch.Tensor, p: int) -> torch.Tensor:
    """patches(X | p) from its definition, one entry at a time: X ∈ ℝ^{C×H×W} (a matrix is
    one channel) cut into p×p blocks; row (i − 1)·W/p + j, column (c − 1)·p² + (a − 1)·p + b
    is X[c, (i − 1)·p + a, (j − 1)·p + b] (counted from 0 below)."""
    x = x if x.dim() == 3 else x.unsqueeze(0)
    channels, height, width = x.shape
    rows, cols = height // p, width // p
    out = []
    for i in range(rows):
        for j in range(cols):
            out.append(torch.stack([x[c, i * p + a, j * p + b] for c in range(channels)
                                    for a in range(p) for b in range(p)]))
    return torch.stack(out)


def argtop(x: torch.Tensor, k: int) -> list[int]:
    """The indices (from 1) of the k largest entries of the vector x, in increasing order:
    of equal entries the first is larger; k ≥ the entries keeps them all."""
    values = [float(v) for v in x.detach().reshape(-1)]
    best = sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]
    return sorted(i + 1 for i in best)


ELEMENTWISE = {
    "GELU": gelu,
    "GELU_tanh": gelu_tanh,
    "ReLU": lambda x: torch.where(x > 0, x, torch.zeros_like(x)),
    "SiLU": lambda x: x * sigmoid(x),
    "σ": sigmoid,
    "exp": torch.exp,
    "log": torch.log,
    "tanh": torch.tanh,
    "cos": torch.cos,
    "sin": torch.sin,
}


def whole(x: Any) -> bool:
    """Whether a value is a whole number or a tensor of them (not a truth value)."""
    if isinstance(x, torch.Tensor):
        return not x.is_floating_point() and x.dtype != torch.bool
    return isinstance(x, int) and not isinstance(x, bool)


def log_of(name: str, x: torch.Tensor, column: bool) -> torch.Tensor:
    """log(σ(x)) or log(softmax(x)) (`name`: the inner builtin) as one function of x."""
    return log_sigmoid(x) if name == "σ" else log_softmax(x, 0 if column else -1)


LOG_OF = ("σ", "softmax")  # the builtins whose logarithm is taken whole


def apply(ev: Any, e: s.Expr, name: str, args: list[Any], frame: Any) -> Any:
    """`name(args…)` for a builtin (`ev`, `frame`: the evaluator and the card's frame): element-wise, reducing over the last axis, softmax over
    the first index of a column-major card (the paper's eq. 2) and the last of a row-major one."""
    if name in ("max", "min") and len(args) == 2:
        a, b = args
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            f = torch.maximum if name == "max" else torch.minimum
            if whole(a) and whole(b):  # whole numbers stay whole: they may index
                return f(torch.as_tensor(a), torch.as_tensor(b))
            return f(ev.real(a), ev.real(b))
        return max(a, b) if name == "max" else min(a, b)
    if len(args) != 1:
        return ev.unsupported(e, f"'{display(name)}' with {len(args)} arguments")
    (x,) = args
    if name in ("cos", "sin", "exp", "log", "tanh", "log2") and not isinstance(x, torch.Tensor):
        return getattr(math, name)(x)
    if name in ("floor", "ceil"):  # a whole number: an int, or a tensor of integers
        if isinstance(x, torch.Tensor):
            return x if whole(x) else getattr(torch, name)(x).long()
        return getattr(math, name)(x)
    if name == "abs":  # the argument's kind of number
        return x.abs() if isinstance(x, torch.Tensor) else abs(x)
    if name == "log2":
        return torch.log2(ev.real(x))
    if name == "length":
        return x.shape[0] if isinstance(x, torch.Tensor) else len(x)
    if name in ELEMENTWISE:
        return ELEMENTWISE[name](ev.real(x))
    x = ev.real(x)
    if name == "softmax":
        return softmax(x, 0 if frame.column else -1)
    if name == "mean":
        return x.sum(-1) / x.shape[-1]
    if name == "var":
        m = x.sum(-1, keepdim=True) / x.shape[-1]
        return ((x - m) ** 2).sum(-1) / x.shape[-1]
    if name in ("max", "min"):
        return x.amax(-1) if name == "max" else x.amin(-1)
    return ev.unsupported(e, f"the builtin '{display(name)}'")
