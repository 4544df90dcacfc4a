"""What every bench worker shares: the timed training step, FLOPs per token, and the protocol.

A worker is run as `python bench/worker_NAME.py SPEC_JSON`; it builds its model from the spec's
hyperparameters (the card's names: V, D, H, H_kv, D_f, N, ctx, eps, theta_base), times training
steps on one fixed batch (an encoder–decoder reads it reversed as its source), and prints one
line of JSON. This module needs only torch and the
standard library, so that it runs in every peer's environment alike.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# peak dense bf16 tensor-core throughput, no sparsity, by a word of the device's name (the
# vendors' data sheets: H100 and H200 SXM 989 TFLOP/s, A100 312, L40S 362, L4 121)
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}


def peak_bf16_flops(device_name: str) -> float | None:
    """The peak of the device named, None for one not in the table (then no MFU is shown)."""
    words = device_name.replace("-", " ").split()
    return next((peak for key, peak in PEAK_BF16_FLOPS.items() if key in words), None)

# what a worker's build function returns: the model, and how many of its parameters are
# position embeddings (a lookup, no matrix product: left out of the FLOPs count)
Built = tuple[nn.Module, int]


def flops_per_token(params: int, layers: int, heads: int, head_dim: int, block: int) -> float:
    """Training FLOPs per token, forward and backward: 6·N for the matrix products of the weights
    and 12·L·H·Q·T for attention's scores and weighted sums (PaLM's appendix B; nanoGPT's MFU)."""
    return 6 * params + 12 * layers * heads * head_dim * block


def adamw(model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """The same optimizer for every implementation: AdamW, fused kernel on every device."""
    return torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                             fused=True)


def fixed_batch(spec: dict[str, Any], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets, the same for every worker given the same seed: tokens and the next
    ones, or (a spec with an input `shape`) examples and class labels."""
    g = torch.Generator().manual_seed(spec["seed"])
    if "shape" in spec:
        x = torch.randn(spec["batch"], *spec["shape"], generator=g)
        y = torch.randint(0, spec["classes"], (spec["batch"],), generator=g)
        return x.to(device), y.to(device)
    x = torch.randint(0, spec["hp"]["V"], (spec["batch"], spec["block"] + 1), generator=g)
    return x[:, :-1].to(device), x[:, 1:].to(device)


def encodes(model: nn.Module) -> bool:
    """Whether a generated model is an encoder–decoder: its generate takes a source first."""
    import inspect

    return hasattr(model, "generate") and \
        next(iter(inspect.signature(model.generate).parameters)) != "idx"


def source_of(x: torch.Tensor) -> torch.Tensor:
    """An encoder–decoder's source for the batch x: x reversed, the same in every worker."""
    return x.flip(-1)


def time_steps(model: nn.Module, logits_of: Callable[[nn.Module, torch.Tensor], torch.Tensor],
               spec: dict[str, Any]) -> dict[str, Any]:
    """Seconds per training step (forward, cross-entropy, backward, AdamW step, zero_grad),
    after `warmup` untimed steps; bf16 autocast on CUDA, fp32 on the CPU."""
    device = torch.device(spec["device"])
    model = model.to(device).train()
    opt = adamw(model, device)
    step_model: nn.Module = torch.compile(model) if spec["compile"] else model  # type: ignore[assignment]
    x, y = fixed_batch(spec, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step() -> None:
        with autocast:
            logits = logits_of(step_model, x)
            loss = F.cross_entropy(logits.flatten(0, -2), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(spec["warmup"]):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(spec["steps"]):
        step()
    sync()
    seconds = (time.perf_counter() - start) / spec["steps"]
    result = {"step_s": seconds, "tokens_per_s": spec["batch"] * spec["block"] / seconds}
    if spec.get("profile"):
        result["profile"] = where_time_goes(step, sync, device)
    if device.type == "cuda":
        result["device_name"] = torch.cuda.get_device_name(device)
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def where_time_goes(step: Callable[[], None], sync: Callable[[], None], device: torch.device,
                    steps: int = 3, top: int = 6) -> list[tuple[str, float]]:
    """The operators that take the most of a few more steps, each with its share of the time
    every operator takes itself (on CUDA the device's time, else the CPU's): the kernels a
    step is made of, and how much falls between them."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    field = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    spent = sorted(((e.key, getattr(e, field)) for e in prof.key_averages()),
                   key=lambda kv: -kv[1])
    total = sum(t for _, t in spent) or 1
    return [(key, t / total) for key, t in spent[:top]]


def unique_params(model: nn.Module) -> int:
    """Parameters counted once each, tied ones too."""
    return sum(p.numel() for p in model.parameters())


def worker_main(impl: str, build: Callable[[dict[str, Any]], Built],
                logits_of: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> None:
    """Run one timed round as the spec in argv[1] says, and print its result as JSON."""
    spec = json.loads(sys.argv[1])
    torch.manual_seed(spec["seed"])
    model, positions = build(spec)
    params = unique_params(model)
    result = time_steps(model, logits_of, spec)
    print(json.dumps({"impl": impl, "params": params, "position_params": positions,
                      "torch": torch.__version__, **result}))
