"""Training loop: AdamW with warmup + cosine decay, periodic evaluation, checkpoint and plot."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from cardc.runtime.atomic import write_text_atomic
from cardc.runtime.checkpoint import save_checkpoint
from cardc.runtime.data import get_batch, load_corpus, split
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.plot import plot_losses
from cardc.runtime.progress import ProgressBar, format_duration

BAR_EVERY = 10  # steps between progress-bar updates; each one costs a device sync


@dataclass(kw_only=True)
class TrainConfig:
    """Hyper-parameters of one run; ``out_dir`` receives metrics, checkpoint and plot."""

    out_dir: str
    steps: int = 1000
    batch_size: int = 16
    block_size: int = 128
    lr: float = 1e-3  # peak, reached at the end of warmup
    min_lr_ratio: float = 0.1  # final lr = lr * min_lr_ratio
    warmup: int = 50
    weight_decay: float = 0.1  # matrices only; biases and norm gains are not decayed
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0  # <= 0 disables clipping
    eval_every: int = 100
    eval_iters: int = 20
    device: str = "auto"
    seed: int = 1337
    data_path: str | None = None
    compile: bool = False

    def __post_init__(self) -> None:
        checks = {
            "steps": self.steps >= 0,
            "batch_size": self.batch_size >= 1,
            "block_size": self.block_size >= 1,
            "lr": self.lr > 0,
            "min_lr_ratio": 0 <= self.min_lr_ratio <= 1,
            "warmup": self.warmup >= 0,
            "weight_decay": self.weight_decay >= 0,
            "eval_every": self.eval_every >= 1,
            "eval_iters": self.eval_iters >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise RuntimeInputError(f"invalid training setting {name}={getattr(self, name)!r}")


def resolve_device(name: str) -> torch.device:
    """``auto`` → cuda when available, else cpu; refuse devices this machine lacks."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise RuntimeInputError(f"unknown device '{name}' (use auto, cpu, cuda or cuda:N)") from e
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeInputError(f"device '{name}' requested but CUDA is not available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise RuntimeInputError(
                f"device '{name}' requested but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise RuntimeInputError(f"device '{name}' requested but MPS is not available")
    elif device.type != "cpu":
        raise RuntimeInputError(f"unsupported device '{name}' (use auto, cpu, cuda or cuda:N)")
    return device


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to ``cfg.lr``, then cosine decay to ``cfg.lr * cfg.min_lr_ratio``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    min_lr = cfg.lr * cfg.min_lr_ratio
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - min_lr)


def effective_block_size(model: nn.Module, block_size: int) -> int:
    """The configured block size, capped at the model's ``max_seq_len`` when it has one."""
    limit = getattr(model, "max_seq_len", None)
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(block_size, limit)
    return block_size


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW decaying only matrices (ndim >= 2): decaying gains and biases hurts."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise RuntimeInputError("model has no trainable parameters")
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=cfg.lr,
        betas=cfg.betas,
        fused=True if device.type == "cuda" else None,
    )


@dataclass
class _Run:
    """Everything the step and eval helpers share."""

    cfg: TrainConfig
    model: nn.Module
    forward: Callable[..., Any]
    device: torch.device
    block: int
    train_data: torch.Tensor
    val_data: torch.Tensor
    log: Callable[[str], Any] = print
    bar: ProgressBar | None = None
    start: float = field(default_factory=time.perf_counter)
    records: list[dict[str, Any]] = field(default_factory=list)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def loss(self, data: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        x, y = get_batch(data, self.cfg.batch_size, self.block, generator, self.device)
        with self.autocast():
            _, loss = self.forward(x, y)
        return loss


def _prepare(
    model: nn.Module, cfg: TrainConfig, log: Callable[[str], Any], bar: ProgressBar | None
) -> _Run:
    device = resolve_device(cfg.device)
    train_data, val_data = split(load_corpus(cfg.data_path))
    block = effective_block_size(model, cfg.block_size)
    for name, data in (("training", train_data), ("validation", val_data)):
        if len(data) <= block:
            raise RuntimeInputError(
                f"corpus too small: {name} split has {len(data)} bytes, need more than {block}"
            )
    model.to(device).train()
    forward = torch.compile(model) if cfg.compile else model
    # The corpus is small (bytes), so keeping it on the device avoids a copy per batch.
    data = train_data.to(device), val_data.to(device)
    return _Run(cfg, model, forward, device, block, *data, log=log, bar=bar)


@torch.no_grad()
def _evaluate(run: _Run) -> tuple[float, float]:
    """Mean train and val loss over ``eval_iters`` batches each."""
    run.model.eval()
    means = []
    for data in (run.train_data, run.val_data):
        # Same seed every time: every evaluation sees the same batches, so curves are comparable.
        gen = torch.Generator().manual_seed(run.cfg.seed + 1)
        losses = torch.stack([run.loss(data, gen).float() for _ in range(run.cfg.eval_iters)])
        means.append(losses.mean())
    run.model.train()
    train_loss, val_loss = torch.stack(means).tolist()  # one sync for both
    return train_loss, val_loss


def train(
    model: nn.Module,
    cfg: TrainConfig,
    meta: dict[str, Any],
    log: Callable[[str], Any] = print,
    *,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Train ``model`` in place; write metrics, checkpoint and loss plot to ``cfg.out_dir``."""
    json.dumps(meta)  # fail now, not after a long run, if the checkpoint metadata can't be saved
    run = _prepare(model, cfg, log, ProgressBar(cfg.steps) if progress and cfg.steps else None)
    torch.manual_seed(cfg.seed)  # dropout and any other in-model randomness
    opt = make_optimizer(model, cfg, run.device)
    gen = torch.Generator().manual_seed(cfg.seed)
    tokens_per_step = cfg.batch_size * run.block
    _eval_and_log(run, step=0, lr=lr_at(0, cfg), tokens_per_s=0.0)
    seg_start, seg_step = time.perf_counter(), 0
    for step in range(cfg.steps):
        lr = lr_at(step, cfg)
        loss = _train_step(run, opt, gen, lr)
        done = step + 1
        if run.bar is not None and (done % BAR_EVERY == 0 or done == cfg.steps):
            seconds = max(time.perf_counter() - seg_start, 1e-9)
            run.bar.update(done, loss.item(), (done - seg_step) * tokens_per_step / seconds)
        if done % cfg.eval_every == 0 or done == cfg.steps:
            _sync(run.device)
            seconds = max(time.perf_counter() - seg_start, 1e-9)
            _eval_and_log(
                run, step=done, lr=lr, tokens_per_s=(done - seg_step) * tokens_per_step / seconds
            )
            seg_start, seg_step = time.perf_counter(), done
    if run.bar is not None:
        run.bar.close()
    _finish(run, meta)
    return run.records


def _train_step(
    run: _Run, opt: torch.optim.Optimizer, gen: torch.Generator, lr: float
) -> torch.Tensor:
    for group in opt.param_groups:
        group["lr"] = lr
    loss = run.loss(run.train_data, gen)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if run.cfg.grad_clip > 0:
        nn.utils.clip_grad_norm_(run.model.parameters(), run.cfg.grad_clip)
    opt.step()
    return loss.detach()


def _sync(device: torch.device) -> None:
    # Kernels run asynchronously on CUDA; without a sync the throughput would be overstated.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _eval_and_log(run: _Run, *, step: int, lr: float, tokens_per_s: float) -> None:
    """Evaluate, append to metrics.jsonl (rewritten atomically) and log one line."""
    train_loss, val_loss = _evaluate(run)
    record = {
        "step": step,
        "train_loss": _finite(train_loss),
        "val_loss": _finite(val_loss),
        "tokens_per_s": round(tokens_per_s, 1),
        "lr": lr,
        "elapsed_s": round(time.perf_counter() - run.start, 3),
    }
    run.records.append(record)
    lines = "".join(json.dumps(r) + "\n" for r in run.records)
    write_text_atomic(os.path.join(run.cfg.out_dir, "metrics.jsonl"), lines)
    if run.bar is not None:
        run.bar.clear()
    run.log(
        f"step {step:>{len(str(run.cfg.steps))}}/{run.cfg.steps} | train {train_loss:.4f}"
        f" | val {val_loss:.4f} | lr {lr:.2e} | {tokens_per_s:,.0f} tok/s"
        f" | {record['elapsed_s']:.1f}s"
    )
    if record["train_loss"] is None or record["val_loss"] is None:
        raise RuntimeInputError(
            f"training diverged at step {step} (loss is not finite); try a lower learning rate"
        )


def _finite(x: float) -> float | None:
    # JSON has no NaN/Infinity; null keeps metrics.jsonl parseable by strict readers.
    return x if math.isfinite(x) else None


def _finish(run: _Run, meta: dict[str, Any]) -> None:
    """Save the checkpoint and plot, then log the run summary."""
    first, last = run.records[0]["val_loss"], run.records[-1]["val_loss"]
    saved = {**meta, "train_config": asdict(run.cfg), "block_size": run.block, "val_loss": last}
    path = save_checkpoint(run.cfg.out_dir, run.model, saved)
    plot_losses(run.records, os.path.join(run.cfg.out_dir, "loss.png"))
    wall = time.perf_counter() - run.start
    run.log(
        f"val loss {first:.4f} -> {last:.4f} in {format_duration(wall)} ({wall:.1f}s); saved {path}"
    )
