"""The harness around a training card: data, device, evaluation, progress and checkpoint.

The card's generated function is the recipe: its loss, optimizer, learning-rate schedule and
minibatches. This module hands it a dataset, watches every update through the function's
`report(loss, η)` callback, measures a held-out loss and writes metrics.jsonl, loss.png and
model.safetensors.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from cardc.runtime.checkpoint import CHECKPOINT_NAME, save_checkpoint
from cardc.runtime.data import (
    DataFolder,
    TokenArray,
    TokenWindows,
    get_batch,
    is_data_folder,
    load_corpus,
)
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.plot import plot_losses
from cardc.runtime.progress import ProgressBar, format_duration
from cardc.runtime.runs import METRICS, TENSORBOARD, new_run_id, staged_run
from cardc.runtime.sample import is_language_model
from cardc.runtime.tasks import reversal_pairs, windows
from cardc.runtime.tokenizer import ByteTokenizer, Tokenizer, corpus_splits

BAR_EVERY = 10  # updates between progress-bar redraws; each one costs a device sync
# Tokens of a dataset the harness makes up front (int64: 2 GiB); a run asking for more is refused
# (a prepared data folder's windows are cut as they are read: it has no such bound).
MAX_DATASET_TOKENS = 2**28
# A record's numbers that --tensorboard plots, each against the update it was taken at.
TB_SCALARS = ("train_loss", "val_loss", "card_loss", "tokens_per_s", "lr")

Recipe = Callable[..., Any]  # a training card's function: (datasets…, θ, hypers…, report=…)
Split = torch.Tensor | TokenArray  # a corpus split: read whole, or a token file read by window
Dataset = list[torch.Tensor] | TokenWindows  # what a training card reads as {x_n}


@dataclass(kw_only=True)
class TrainConfig:
    """What the harness decides; the card decides everything about the updates."""

    out_dir: str
    examples: int = 2000  # dataset size for a card that does not fix it (N_steps · B)
    length: int = 128  # tokens per example for a card that does not fix it (ℓ)
    eval_every: int = 100  # updates between held-out evaluations
    eval_iters: int = 20
    eval_batch: int = 16
    device: str = "auto"
    seed: int = 1337
    data_path: str | None = None  # a text file, or a prepared data folder
    compile: bool = False
    tensorboard: bool = False  # each record also as TensorBoard scalars, under the run's tb/

    def __post_init__(self) -> None:
        for name in ("examples", "length", "eval_every", "eval_iters", "eval_batch"):
            if getattr(self, name) < 1:
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
    elif device.type != "cpu":
        raise RuntimeInputError(f"unsupported device '{name}' (use auto, cpu, cuda or cuda:N)")
    return device


@torch.no_grad()
def predicts_next_token(model: nn.Module) -> bool:
    """A causal language model: forward(x, targets), and no position sees a later token (an
    encoder such as ETransformer also scores every position, but reads the whole sequence)."""
    if not is_language_model(model):
        return False
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        vocab = model(torch.zeros(1, 1, dtype=torch.long, device=device)).shape[-1]
        length = min(8, getattr(model, "max_seq_len", None) or 8)
        x = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(0))
        changed = x.clone()
        changed[0, -1] = (changed[0, -1] + 1) % vocab
        before, after = model(x.to(device)), model(changed.to(device))
        return torch.allclose(before[:, :-1], after[:, :-1])
    finally:
        model.train(was_training)


def dataset_inputs(recipe: Recipe, hypers: dict[str, Any]) -> int:
    """How many datasets the card reads: they precede θ, the hyperparameters and report."""
    return recipe.__code__.co_argcount - 2 - len(hypers)


@dataclass
class Plan:
    """The shape of a run, read off the card's hyperparameters."""

    examples: int
    length: int
    per_update: int  # examples in one update: B for a minibatch card, else 1
    updates: int | None  # known in advance when the card counts them

    @classmethod
    def of(cls, hypers: dict[str, Any], cfg: TrainConfig, model: nn.Module,
           up_front: bool = True) -> Plan:
        """`up_front`: the examples are made before training, so their size is bounded."""
        limit = getattr(model, "max_seq_len", None)
        length = int(hypers.get("l", min(cfg.length, limit or cfg.length)))
        if isinstance(limit, int) and length > limit:
            raise RuntimeInputError(f"sequences of ℓ = {length} tokens do not fit the model's "
                                    f"context of {limit}")
        if "N_steps" in hypers and "B" in hypers:  # a minibatch card reads N_steps · B examples
            steps, batch = int(hypers["N_steps"]), int(hypers["B"])
            plan = cls(steps * batch, length, batch, steps)
        else:
            epochs = hypers.get("N_epochs")
            plan = cls(cfg.examples, length, 1,
                       None if epochs is None else int(epochs) * cfg.examples)
        if up_front and plan.examples * length > MAX_DATASET_TOKENS:
            raise RuntimeInputError(f"{plan.examples:,} examples of {length} tokens are "
                                    f"{plan.examples * length:,} tokens, more than the "
                                    f"{MAX_DATASET_TOKENS:,} a run holds; ask for fewer "
                                    "updates or smaller minibatches")
        return plan


def make_data(model: nn.Module, inputs: int, count: int, length: int, tokens: Split,
              seed: int, device: torch.device) -> list[Dataset]:
    """One dataset per input of the card: corpus windows (from a token file, each read when the
    card reads it), or (z_n, x_n) reversal pairs."""
    if inputs == 2:
        vocab = int(model.card_meta["hyperparameters"].get("N_V", 0)) or 32
        pairs = reversal_pairs(count, vocab, 2, max(2, min(length, 6)), seed)
        return [[z.to(device) for z, _ in pairs], [x.to(device) for _, x in pairs]]
    if isinstance(tokens, TokenArray):
        return [TokenWindows(tokens, count, length, seed, device)]
    return [[w.to(device) for w in windows(tokens, count, length, seed)]]


def tokens_per_example(data: list[Dataset], examples: int) -> float:
    """All the datasets' tokens per example, for the throughput (a lazy dataset's windows are
    all of one length, and are not cut to be counted)."""
    return sum(d.length if isinstance(d, TokenWindows) else
               sum(x.numel() for x in d) / max(1, examples) for d in data)


def data_splits(cfg: TrainConfig, tokenizer: Tokenizer) -> tuple[DataFolder | None, Split, Split]:
    """The corpus's training and held-out splits: a prepared folder's token files, read a
    window at a time (their tokens must be `tokenizer`'s), else a text file (or the built-in
    corpus) read whole and tokenised."""
    if not is_data_folder(cfg.data_path):
        return None, *corpus_splits(load_corpus(cfg.data_path), tokenizer)
    folder = DataFolder.open(cfg.data_path)
    folder.check_tokenizer(tokenizer)
    return folder, folder.tokens("train"), folder.tokens("val")


@dataclass
class _Run:
    """Everything the callbacks of one run share."""

    cfg: TrainConfig
    model: nn.Module
    recipe: Recipe
    hypers: dict[str, Any]
    plan: Plan
    device: torch.device
    splits: tuple[Split, Split]
    val_data: list[Dataset]
    folder: str  # where the run is written until it has finished (staged_run)
    log: Callable[[str], Any] = print
    bar: ProgressBar | None = None
    tb: Any = None  # a SummaryWriter, with cfg.tensorboard
    start: float = field(default_factory=time.perf_counter)
    records: list[dict[str, Any]] = field(default_factory=list)
    seen: list[torch.Tensor] = field(default_factory=list)  # the card's losses since the last record
    tokens_per_example: float = 0.0  # all its datasets' tokens, for the throughput
    causal: bool = False  # a causal language model: held-out next-token loss, often
    updates: int = 0
    lr: float | None = None
    segment: tuple[float, int] = (0.0, 0)  # (time, updates) where throughput is measured from
    run_id: str = field(default_factory=new_run_id)  # in every file of the run

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return autocast(self.device)


def autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on CUDA, nothing elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(model: nn.Module, recipe: Recipe, hypers: dict[str, Any], cfg: TrainConfig,
          meta: dict[str, Any], log: Callable[[str], Any] = print, *,
          progress: bool = True, tokenizer: Tokenizer | None = None) -> list[dict[str, Any]]:
    """Train ``model`` in place with the card's function; write the run to ``cfg.out_dir``,
    with ``tokenizer`` (bytes by default), which the corpus is read with, beside the weights.
    A prepared data folder's tokens must be its tokenizer's; the checkpoint records the
    folder."""
    tokenizer = tokenizer or ByteTokenizer()
    meta = {**meta, "tokenizer": tokenizer.record()}
    json.dumps(meta)  # fail now, not after a long run, if the checkpoint metadata can't be saved
    if cfg.tensorboard:
        summary_writer()  # and now if it cannot be logged as asked
    device = resolve_device(cfg.device)
    plan = Plan.of(hypers, cfg, model, up_front=not is_data_folder(cfg.data_path))
    data, train_split, val_split = data_splits(cfg, tokenizer)
    if data is not None:
        meta["data"] = data.record()
    inputs = dataset_inputs(recipe, hypers)
    train_data = make_data(model, inputs, plan.examples, plan.length, train_split, cfg.seed,
                           device)
    val_data = make_data(model, inputs, max(50, cfg.examples // 10), plan.length, val_split,
                         cfg.seed + 1, device)
    with staged_run(cfg.out_dir) as folder:
        tokenizer.save(folder)
        run = _Run(cfg, model, recipe, hypers, plan, device, (train_split, val_split), val_data,
                   str(folder), log, causal=predicts_next_token(model),
                   tokens_per_example=tokens_per_example(train_data, plan.examples))
        with _tensorboard(run):
            _run(run, train_data, meta, progress)
    wall = time.perf_counter() - run.start
    first, last = run.records[0]["val_loss"], run.records[-1]["val_loss"]
    run.log(f"val loss {first:.4f} -> {last:.4f} after {run.updates} updates in "
            f"{format_duration(wall)} ({wall:.1f}s); saved "
            f"{os.path.join(cfg.out_dir, CHECKPOINT_NAME)}")
    return run.records


def _run(run: _Run, train_data: list[Dataset], meta: dict[str, Any],
         progress: bool) -> None:
    """Train, recording as the card reports updates, then save the checkpoint and plot."""
    run.model.to(run.device).train()
    run.bar = ProgressBar(run.plan.updates) if progress and run.plan.updates else None
    torch.manual_seed(run.cfg.seed)  # dropout, masks and any other randomness of the recipe
    theta = torch.compile(run.model) if run.cfg.compile else run.model
    _record(run)
    run.segment = (time.perf_counter(), 0)
    with run.autocast():
        try:
            run.recipe(*train_data, theta, **run.hypers,
                       report=lambda loss, lr: _on_update(run, loss, lr))
        except (ArithmeticError, RuntimeError, ValueError, IndexError) as err:
            raise RuntimeInputError(_failure(run.recipe, err)) from None
    if run.bar is not None:
        run.bar.close()
    if run.records[-1]["step"] != run.updates or len(run.records) == 1:
        _record(run)
    _finish(run, meta)


def _failure(recipe: Recipe, err: Exception) -> str:
    """One line naming the card step that failed, for an error inside the generated code."""
    from cardc.build import card_line

    where = card_line(err)
    return f"{where + ': ' if where else ''}{recipe.__name__} failed: {err}"


def _on_update(run: _Run, loss: torch.Tensor, lr: Any) -> None:
    """The card's report after each update: progress, and every eval_every a record."""
    run.updates += 1
    run.seen.append(loss.float())
    run.lr = float(lr) if lr is not None else None
    if run.bar is not None and run.updates % BAR_EVERY == 0:
        run.bar.update(run.updates, run.seen[-1].item(), _throughput(run))
    if run.updates % run.cfg.eval_every == 0:
        _record(run, evaluate=run.causal or run.updates == run.plan.updates)


def _throughput(run: _Run) -> float:
    """Tokens per second of training since the last record."""
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)  # kernels run asynchronously
    since, at = run.segment
    tokens = (run.updates - at) * run.plan.per_update * run.tokens_per_example
    return tokens / max(time.perf_counter() - since, 1e-9)


def _record(run: _Run, evaluate: bool = True) -> None:
    """Evaluate, append to metrics.jsonl (and TensorBoard) and log one line. A card's own
    objective is measured only first and last: it costs an update per held-out example."""
    tokens_per_s = _throughput(run) if run.updates else 0.0
    train_loss, val_loss = _evaluate(run) if evaluate else (None, None)
    card_loss = torch.stack(run.seen).mean().item() if run.seen else None
    run.seen.clear()
    record = {"run": run.run_id, "step": run.updates, "train_loss": _finite(train_loss),
              "val_loss": _finite(val_loss), "card_loss": card_loss,
              "tokens_per_s": round(tokens_per_s, 1), "lr": run.lr,
              "elapsed_s": round(time.perf_counter() - run.start, 3)}
    run.records.append(record)
    append_record(os.path.join(run.folder, METRICS), record)
    if run.tb is not None:
        for key in TB_SCALARS:
            if record[key] is not None:
                run.tb.add_scalar(key, record[key], run.updates)
        run.tb.flush()
    if run.bar is not None:
        run.bar.clear()
    total = f"/{run.plan.updates}" if run.plan.updates else ""
    lr = f" | lr {run.lr:.2e}" if run.lr is not None else ""
    shown = "".join(f"{k} {v:.4f} | " for k, v in (("train", train_loss), ("val", val_loss),
                                                   ("card", card_loss)) if v is not None)
    run.log(f"step {run.updates}{total} | {shown}{tokens_per_s:,.0f} tok/s{lr} | "
            f"{record['elapsed_s']:.1f}s")
    if any(v is not None and not math.isfinite(v) for v in (train_loss, val_loss, card_loss)):
        raise RuntimeInputError(f"training diverged at update {run.updates} (loss is not "
                                "finite); try a lower learning rate")
    run.segment = (time.perf_counter(), run.updates)


def append_record(path: str, record: dict[str, Any]) -> None:
    """One more line of metrics.jsonl: a record costs its own size, not the whole run's so
    far. Appending is safe because the run's folder is staged, published only once finished
    (staged_run); a file of whole lines is left at any moment."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def summary_writer() -> type:
    """torch's TensorBoard SummaryWriter, or one clear error naming the package it needs."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise RuntimeInputError("--tensorboard needs the tensorboard package: pip install "
                                "tensorboard (or pip install 'cardc[tensorboard]')") from None
    return SummaryWriter


@contextlib.contextmanager
def _tensorboard(run: _Run) -> Iterator[None]:
    """With cfg.tensorboard, a writer of the run's records under its tb/, closed before the
    run's folder is published."""
    if not run.cfg.tensorboard:
        yield
        return
    run.tb = summary_writer()(log_dir=os.path.join(run.folder, TENSORBOARD))
    try:
        yield
    finally:
        run.tb.close()


def _evaluate(run: _Run) -> tuple[float | None, float]:
    """Held-out loss: the mean next-token cross-entropy of a causal language model on both
    splits, else the card's own objective on held-out examples with its learning rate at 0."""
    was_training = run.model.training
    run.model.eval()
    try:
        if run.causal:
            train_loss, val_loss = (_next_token_loss(run, data) for data in run.splits)
            return train_loss, val_loss
        return None, _card_objective(run)
    finally:
        run.model.train(was_training)


def _next_token_loss(run: _Run, data: Split) -> float:
    # The same batches at every evaluation, so the curve compares like with like.
    return next_token_loss(run.model, data, run.cfg.eval_iters, run.cfg.eval_batch,
                           run.plan.length - 1, run.cfg.seed + 1, run.device)


@torch.no_grad()
def next_token_loss(model: nn.Module, data: Split, batches: int, batch_size: int,
                    block: int, seed: int, device: torch.device) -> float:
    """Mean next-token cross-entropy of a causal language model over `batches` minibatches of
    random windows of `block` tokens (drawn from `seed`: the same ones each time); bf16 on CUDA
    as in training. The model's mode is the caller's."""
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(batches):
        x, y = get_batch(data, batch_size, block, gen, device)
        with autocast(device):
            losses.append(model(x, y)[1].float())
    return torch.stack(losses).mean().item()


def _card_objective(run: _Run) -> float:
    """The card's loss over the held-out examples, one update per example at η = 0."""
    losses: list[float] = []
    rng = torch.get_rng_state()
    torch.manual_seed(0)  # the same masks each time it is measured
    frozen = {k: (0.0 if k.startswith("eta") else v) for k, v in run.hypers.items()}
    if "N_epochs" in frozen:
        frozen["N_epochs"] = 1
    if "N_steps" in frozen:  # a minibatch card: as many minibatches as the examples fill
        frozen["N_steps"] = max(1, len(run.val_data[0]) // int(frozen["B"]))
    run.recipe(*run.val_data, run.model, **frozen,
               report=lambda loss, lr: losses.append(loss.item()))
    torch.set_rng_state(rng)
    return sum(losses) / max(1, len(losses))


def _finite(x: float | None) -> float | None:
    # JSON has no NaN/Infinity; null keeps metrics.jsonl parseable by strict readers.
    return x if x is not None and math.isfinite(x) else None


def _finish(run: _Run, meta: dict[str, Any]) -> None:
    """Save the checkpoint and plot into the run's folder. `context` is how many positions
    the run trained (an example of ℓ tokens trains the predictions of its first ℓ − 1), the
    longest window `cardc sample` then feeds the model."""
    saved = {**meta, "run": run.run_id, "train_config": asdict(run.cfg), "recipe": run.hypers,
             "block_size": run.plan.length, "context": run.plan.length - 1,
             "val_loss": run.records[-1]["val_loss"]}
    save_checkpoint(run.folder, run.model, saved)
    plot_losses(run.records, os.path.join(run.folder, "loss.png"))
