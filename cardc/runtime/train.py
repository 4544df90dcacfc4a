"""The harness around a training card: data, device, evaluation, progress and checkpoints.

The card's generated function is the recipe: its loss, optimizer, learning-rate schedule and
minibatches. This module hands it a dataset, is handed its optimizer through `start` (and
restores it, to resume), watches every update through `report(loss, η)`, measures a held-out
loss, writes metrics.jsonl, a checkpoint every `save_every` updates and when SIGINT or SIGTERM
asks it to stop, and at the end loss.png and model.safetensors.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cardc.atomic import write_text_atomic
from cardc.runtime.checkpoint import CHECKPOINT_NAME, save_checkpoint
from cardc.runtime.data import (
    DataFolder,
    TokenArray,
    TokenWindows,
    corpus_splits,
    get_batch,
    is_data_folder,
    load_corpus,
)
from cardc.runtime.distributed import (
    Shard,
    World,
    anyone,
    gathered,
    join,
    leave,
    load_whole_optimizer,
    mean,
    replicate,
    shard,
    whole_optimizer,
    whole_weights,
    world_from_env,
)
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.plot import plot_losses
from cardc.runtime.progress import ProgressBar, format_duration
from cardc.runtime.resume import Snapshot, restore_optimizer, restore_rng, save_snapshot
from cardc.runtime.runs import METRICS, TENSORBOARD, RunFolder, new_run_id, training_run
from cardc.runtime.tasks import reversal_pairs, windows
from cardc.runtime.tokenizer import TOKENIZER_FILE, ByteTokenizer, Tokenizer
from cardc.syntax import FORMATS

PRECISIONS = ("bf16", "float32")  # on CUDA: bf16 autocast over float32 weights, or none
BAR_EVERY = 10  # updates between progress-bar redraws; each one costs a device sync
# The CPU threads a run computes with unless it records or is given another count: the count
# torch chose for this machine when it was loaded (its cores), not whatever count a caller has
# set since. A sum split over another count of threads rounds differently, so a run's count is
# fixed and recorded (meta "threads"), and a resumed run takes the count it recorded.
DEFAULT_THREADS = torch.get_num_threads()
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
    save_every: int = 500  # updates between checkpoints (runtime.resume); 0: only when stopped
    keep: int = 2  # the newest checkpoints kept
    fsdp: bool = False  # shard the model over the processes (runtime.distributed.shard)
    threads: int = 0  # CPU threads the run computes with; 0: as recorded, else DEFAULT_THREADS
    weights: str = "float32"  # the number format the parameters (and so AdamW's moments) are in
    precision: str = "bf16"  # on CUDA, the forward under bf16 autocast, or all in "float32"

    def __post_init__(self) -> None:
        if self.weights not in FORMATS:
            raise RuntimeInputError(f"invalid number format {self.weights!r} for the weights")
        if self.precision not in PRECISIONS:
            raise RuntimeInputError(f"invalid precision {self.precision!r} (use "
                                    f"{' or '.join(PRECISIONS)})")
        if self.threads < 0:
            raise RuntimeInputError(f"invalid training setting threads={self.threads!r}")
        if self.save_every < 0:
            raise RuntimeInputError(f"invalid training setting save_every={self.save_every!r}")
        for name in ("examples", "length", "eval_every", "eval_iters", "eval_batch", "keep"):
            if getattr(self, name) < 1:
                raise RuntimeInputError(f"invalid training setting {name}={getattr(self, name)!r}")


def resolve_device(name: str, world: World | None = None) -> torch.device:
    """``auto`` → cuda when available, else cpu; refuse devices this machine lacks. Each of
    several processes on a machine takes the GPU of its local rank."""
    if world is not None and world.launched and name in ("auto", "cuda") and \
            torch.cuda.is_available():
        if world.local_rank >= torch.cuda.device_count():
            raise RuntimeInputError(f"LOCAL_RANK={world.local_rank}, but this machine has "
                                    f"{torch.cuda.device_count()} CUDA device(s)")
        torch.cuda.set_device(world.local_rank)
        return torch.device("cuda", world.local_rank)
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


def predicts_next_token(model: nn.Module) -> bool:
    """A causal language model: forward(x, targets), and no position's scores read a later
    token (an encoder such as ETransformer also scores every position, but reads the whole
    sequence), as lowering its card found (cardc.lower.analysis, `model.analysis`)."""
    analysis = getattr(model, "analysis", None)
    return bool(getattr(analysis, "causal", False))


def dataset_inputs(recipe: Recipe, hypers: dict[str, Any]) -> int:
    """How many datasets the card reads: they precede θ, the hyperparameters, report and
    start."""
    code = recipe.__code__
    callbacks = sum(n in ("report", "start") for n in code.co_varnames[:code.co_argcount])
    return code.co_argcount - 1 - len(hypers) - callbacks


@dataclass
class Plan:
    """The shape of a run, read off the card's hyperparameters."""

    examples: int
    length: int
    per_update: int  # examples in one update: B for a minibatch card, else 1
    updates: int | None  # known in advance when the card counts them
    per_example: int = 1  # updates per example of a card that updates per example

    @classmethod
    def of(cls, hypers: dict[str, Any], cfg: TrainConfig, model: nn.Module,
           up_front: bool = True, per_example: int | None = 1) -> Plan:
        """`up_front`: the examples are made before training, so their size is bounded.
        `per_example`: the card's updates per example it visits (its function's
        `updates_per_example`; None: not a fixed number, and the updates are not counted)."""
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
                       None if epochs is None or per_example is None
                       else int(epochs) * cfg.examples * per_example, per_example or 1)
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


class Stopped(Exception):  # noqa: N818 (not an error: the run did as it was asked)
    """A run stopped by SIGINT or SIGTERM, after saving its checkpoint."""

    def __init__(self, signum: int, update: int, checkpoint: str, folder: str) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} after update {update}")
        self.signum, self.update, self.checkpoint, self.folder = signum, update, checkpoint, folder


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
    folder: RunFolder | None  # where the run is written (staged until its first checkpoint);
    # None in a process other than rank 0, which writes nothing
    meta: dict[str, Any]  # the weights' metadata
    fingerprint: dict[str, Any]  # what a resumed run must share with this one
    log: Callable[[str], Any] = print
    world: World = field(default_factory=World)
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
    progress: bool = True  # a progress bar
    optimizer: torch.optim.Optimizer | None = None  # the training card's, handed over by start
    saved: int = -1  # the update of the newest checkpoint
    saved_path: str = ""  # and its folder
    stop: int = 0  # the signal asking the run to stop at its next update

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return autocast(self.device, self.cfg.precision)

    @property
    def path(self) -> str:
        assert self.folder is not None, "only rank 0 writes the run"
        return str(self.folder.path)


def autocast(device: torch.device, precision: str = "bf16"
             ) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on CUDA at precision "bf16"; nothing elsewhere, or at "float32"."""
    if device.type == "cuda" and precision == "bf16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(model: nn.Module, recipe: Recipe, hypers: dict[str, Any], cfg: TrainConfig,
          meta: dict[str, Any], log: Callable[[str], Any] = print, *,
          progress: bool = True, tokenizer: Tokenizer | None = None,
          resume: Snapshot | None = None) -> list[dict[str, Any]]:
    """Train ``model`` in place with the card's function; write the run to ``cfg.out_dir``,
    with ``tokenizer`` (bytes by default), which the corpus is read with, beside the weights.
    A prepared data folder's tokens must be its tokenizer's; the checkpoint records the
    folder. With ``resume`` (a checkpoint of the run in ``cfg.out_dir``), the run goes on from
    it exactly as if it had never stopped. A model whose ``analysis.causal`` holds (as lowering
    records it of a generated one) gets its held-out next-token loss at every evaluation."""
    tokenizer = tokenizer or ByteTokenizer()
    model.to(dtype=getattr(torch, cfg.weights))  # before the card's optimizer takes θ
    meta = {**meta, "tokenizer": tokenizer.record()}
    json.dumps(meta)  # fail now, not after a long run, if the checkpoint metadata can't be saved
    if cfg.tensorboard:
        summary_writer()  # and now if it cannot be logged as asked
    world = world_from_env()
    device = resolve_device(cfg.device, world)
    plan = Plan.of(hypers, cfg, model, up_front=not is_data_folder(cfg.data_path),
                   per_example=getattr(recipe, "updates_per_example", 1))
    data, train_split, val_split = data_splits(cfg, tokenizer)
    if data is not None:
        meta["data"] = data.record()
    meta["world_size"] = world.size
    meta["threads"] = run_threads(cfg, resume)
    mark = fingerprint(recipe, hypers, cfg, meta)
    if resume is not None:
        check_fingerprint(resume, mark)
    inputs = dataset_inputs(recipe, hypers)
    train_data = make_data(model, inputs, plan.examples, plan.length, train_split, cfg.seed,
                           device)
    val_data = make_data(model, inputs, max(50, cfg.examples // 10), plan.length, val_split,
                         cfg.seed + 1, device)
    if cfg.fsdp and not world.launched:
        raise RuntimeInputError("--fsdp shards the model over the processes torchrun starts; "
                                "run under torchrun --nproc-per-node N")
    if world.distributed:
        hypers, train_data = _sharded(hypers, plan, train_data, world)
    join(world, device, sharded=cfg.fsdp)
    try:
        with reproducible(meta["threads"], device), training_run(cfg.out_dir, resume=resume is not None) if world.main else \
                contextlib.nullcontext() as folder:
            run = _Run(cfg, model, recipe, hypers, plan, device, (train_split, val_split),
                       val_data, folder, meta, mark, log if world.main else _quiet,
                       world=world, progress=progress and world.main,
                       causal=predicts_next_token(model),
                       tokens_per_example=tokens_per_example(train_data, plan.examples))
            if resume is not None:
                _resumed(run, resume)
            elif world.main:
                tokenizer.save(folder.path)
            with _tensorboard(run):
                _run(run, train_data, resume)
    finally:
        leave(world)
    wall = time.perf_counter() - run.start
    if not world.main:
        return run.records
    first, last = run.records[0]["val_loss"], run.records[-1]["val_loss"]
    run.log(f"val loss {first:.4f} -> {last:.4f} after {run.updates} updates in "
            f"{format_duration(wall)} ({wall:.1f}s); saved "
            f"{os.path.join(cfg.out_dir, CHECKPOINT_NAME)}")
    return run.records


def run_threads(cfg: TrainConfig, resume: Snapshot | None) -> int:
    """The CPU threads a run computes with: as asked, else as the resumed run recorded, else
    DEFAULT_THREADS."""
    recorded = resume.meta.get("threads") if resume is not None else None
    if cfg.threads:
        return cfg.threads
    return recorded if type(recorded) is int and recorded >= 1 else DEFAULT_THREADS


@contextlib.contextmanager
def reproducible(threads: int, device: torch.device) -> Iterator[None]:
    """Meanwhile, torch's CPU work is split over exactly `threads` threads and, on a CPU run,
    takes its deterministic algorithms: the same command and seed give the same weights bit
    for bit whatever else the machine runs. What was set before is set back after."""
    before = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(threads)
    if device.type == "cpu":  # an op torch has no such path for warns, as it says why
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def _quiet(_line: str) -> None:
    """The log of a process other than rank 0."""


def _sharded(hypers: dict[str, Any], plan: Plan, data: list[Dataset],
             world: World) -> tuple[dict[str, Any], list[Dataset]]:
    """Each process's share of every update: B/N of the minibatch's examples (the card's B is
    its minibatch size, as Plan reads it), every N-th example of the dataset."""
    if plan.per_update == 1 or "B" not in hypers:
        raise RuntimeInputError("training on several processes needs a training card that "
                                "updates on minibatches of B examples (N_steps, B)")
    if plan.per_update % world.size:
        raise RuntimeInputError(f"a minibatch of B = {plan.per_update} examples does not split "
                                f"evenly over {world.size} processes")
    local = {**hypers, "B": plan.per_update // world.size}
    return local, [Shard(d, world) for d in data]


def fingerprint(recipe: Recipe, hypers: dict[str, Any], cfg: TrainConfig,
                meta: dict[str, Any]) -> dict[str, Any]:
    """What decides a run's updates and records: a resumed run must share every item."""
    cards = hashlib.sha256(json.dumps(meta.get("cards"), sort_keys=True).encode()).hexdigest()
    return {"recipe": recipe.__name__, "recipe_source": _source_digest(recipe),
            "recipe_values": hypers, "model": meta.get("name"),
            "model_values": meta.get("hyperparameters"), "cards": cards, "seed": cfg.seed,
            "weights": cfg.weights,
            "precision": cfg.precision,
            "examples": cfg.examples, "length": cfg.length, "eval_every": cfg.eval_every,
            "eval_iters": cfg.eval_iters, "eval_batch": cfg.eval_batch,
            "data": meta.get("data"), "tokenizer": meta.get("tokenizer"),
            "world_size": meta.get("world_size", 1)}


def _source_digest(recipe: Recipe) -> str | None:
    """The generated function's code, hashed: a changed training card is another recipe."""
    code = getattr(recipe, "__code__", None)
    return None if code is None else hashlib.sha256(_code_bytes(code)).hexdigest()


def _code_bytes(code: types.CodeType) -> bytes:
    """A code object's instructions, names and constants, nested code included (whose repr
    would hold a memory address)."""
    consts = b"".join(_code_bytes(c) if isinstance(c, types.CodeType) else repr(c).encode()
                      for c in code.co_consts)
    return code.co_code + repr(code.co_names).encode() + consts


def check_fingerprint(snap: Snapshot, mark: dict[str, Any]) -> None:
    """Refuse to resume a checkpoint under other settings than it was trained with."""
    # a checkpoint saved before the precision setting existed was trained in bf16
    differs = _first_difference({"precision": "bf16", **snap.state["fingerprint"]}, mark)
    if differs is not None:
        key, was, now = differs
        raise RuntimeInputError(f"cannot resume {snap.path}: it was trained with {key} = "
                                f"{_short(was)}, this run has {_short(now)}; resume with the "
                                "command that started it")


def _first_difference(was: Any, now: Any, key: str = "") -> tuple[str, Any, Any] | None:
    """The first item (a dotted key) where two JSON values differ, with both values."""
    if isinstance(was, dict) and isinstance(now, dict):
        for k in sorted(set(was) | set(now)):
            found = _first_difference(was.get(k), now.get(k), f"{key}.{k}" if key else k)
            if found is not None:
                return found
        return None
    same = json.dumps(was, sort_keys=True) == json.dumps(now, sort_keys=True)
    return None if same else (key, was, now)


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _resumed(run: _Run, snap: Snapshot) -> None:
    """Take up a run where its checkpoint left it: its id, weights, update count, clock, and
    its records up to the checkpoint (those after it are made again)."""
    from cardc.runtime.checkpoint import load_state

    run.run_id = str(snap.meta.get("run") or run.run_id)
    load_state(run.model, snap.weights)
    run.updates = run.saved = snap.update
    elapsed = snap.state.get("elapsed_s", 0.0)
    run.start -= elapsed if isinstance(elapsed, int | float) else 0.0
    seen = snap.tensors.get("seen")  # (processes, updates): each process's own losses
    ok = seen is not None and seen.ndim == 2 and seen.shape[0] == run.world.size \
        and seen.is_floating_point()  # untrusted: anything else is dropped, not averaged
    # on the run's device, as the losses appended after it are (a checkpoint's are on the CPU)
    run.seen = list(seen[run.world.rank].to(run.device).unbind(0)) if ok else []
    metrics = os.path.join(run.cfg.out_dir, METRICS)
    run.records = _records_until(metrics, snap.update, run.run_id, cut=run.world.main)


def _records_until(path: str, update: int, run_id: str, cut: bool = True
                   ) -> list[dict[str, Any]]:
    """metrics.jsonl's records of `run_id` up to `update`; with `cut`, the file is cut to
    them."""
    kept = []
    with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut short when the run was killed
            if not isinstance(record, dict) or record.get("run") != run_id or \
                    not isinstance(record.get("step"), int) or record["step"] > update:
                break
            kept.append(record)
    if not kept:
        raise RuntimeInputError(f"'{path}' has no records of run {run_id}: the run folder is "
                                "damaged")
    if cut:
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


def _run(run: _Run, train_data: list[Dataset], resume: Snapshot | None) -> None:
    """Train, recording as the card reports updates, then save the weights and plot. From the
    first record on, SIGINT and SIGTERM ask for a checkpoint and a stop."""
    run.model.to(run.device).train()
    total = run.plan.updates
    run.bar = ProgressBar(total, initial=run.updates) if run.progress and total else None
    with _stop_on_signals(run):
        if resume is None:
            # Dropout, masks and any other randomness of the recipe; each process its own.
            torch.manual_seed(run.cfg.seed + run.world.rank)
            _record(run)
        theta = shard(run.model) if run.cfg.fsdp else \
            replicate(run.model, run.world, run.device)
        theta = compiled(theta) if run.cfg.compile else theta
        run.segment = (time.perf_counter(), run.updates)
        with run.autocast():
            _call_recipe(run, theta, train_data, resume)
    if run.bar is not None:
        run.bar.close()
    if run.records[-1]["step"] != run.updates or len(run.records) == 1:
        _record(run)
    _finish(run)


def compiled(model: nn.Module) -> nn.Module:
    """torch.compile's wrapper of the model, whose zero_grad is the model's own: a sharded
    model's empties its shards (runtime.distributed.shard), where the wrapper's would empty
    whatever the model has registered at the time (FSDP's gathered copies, mid-update)."""
    wrapper = torch.compile(model)
    wrapper.zero_grad = model.zero_grad  # type: ignore[method-assign]
    return wrapper  # type: ignore[return-value]


def _call_recipe(run: _Run, theta: nn.Module, train_data: list[Dataset],
                 resume: Snapshot | None) -> None:
    """The training card's function on the data, told of each update (`report`), handing
    over its optimizer (`start`), which a resumed run's checkpoint is restored into."""
    def start(optimizer: torch.optim.Optimizer) -> int:
        run.optimizer = optimizer
        if resume is None:
            return 0
        sharded = load_whole_optimizer(run.model, optimizer) if run.cfg.fsdp else None
        restore_optimizer(resume, optimizer, sharded)
        restore_rng(resume, run.world.rank, run.device)  # last: nothing may draw after it
        return resume.update

    handover = {"start": start} if _takes(run.recipe, "start") else {}
    try:
        run.recipe(*train_data, theta, **run.hypers,
                   report=lambda loss, lr: _on_update(run, loss, lr), **handover)
    except (ArithmeticError, RuntimeError, ValueError, IndexError) as err:
        raise RuntimeInputError(_failure(run.recipe, err)) from None


def _takes(recipe: Recipe, name: str) -> bool:
    """Whether a training function takes an argument (code generated before checkpoints did
    not take `start`; such a run saves no checkpoint, and says so if asked to)."""
    code = recipe.__code__
    return name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]


@contextlib.contextmanager
def _stop_on_signals(run: _Run) -> Iterator[None]:
    """SIGINT and SIGTERM ask the run to save a checkpoint and stop after the update under
    way; a second one stops it at once. (Only the main thread may handle signals.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ask(signum: int, _frame: Any) -> None:
        if run.stop:
            raise KeyboardInterrupt
        run.stop = signum

    old = {sig: signal.signal(sig, ask) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _failure(recipe: Recipe, err: Exception) -> str:
    """One line naming the card step that failed, for an error inside the generated code."""
    from cardc.build import card_line

    where = card_line(err)
    return f"{where + ': ' if where else ''}{recipe.__name__} failed: {err}"


def _on_update(run: _Run, loss: torch.Tensor, lr: Any) -> None:
    """The card's report after each update: progress, every eval_every a record, every
    save_every a checkpoint, and a checkpoint and a stop when a signal asked for one."""
    run.updates += 1
    run.seen.append(loss.float())
    run.lr = float(lr) if lr is not None else None
    if run.bar is not None and run.updates % BAR_EVERY == 0:
        run.bar.update(run.updates, run.seen[-1].item(), _throughput(run))
    if run.updates % run.cfg.eval_every == 0:
        _record(run, evaluate=run.causal or run.updates == run.plan.updates)
    run.stop = anyone(run.stop, run.world)  # all stop at one update, whichever was signalled
    every = run.cfg.save_every
    if every and run.updates % every == 0 and run.updates != run.plan.updates or run.stop:
        _save(run)
    if run.stop:
        raise Stopped(run.stop, run.updates, run.saved_path, run.cfg.out_dir)


def _save(run: _Run) -> None:
    """A checkpoint of this update, which also puts a staged run in its folder's place."""
    if run.optimizer is None:  # a recipe that does not hand over its optimizer (no `start`)
        if run.stop:
            raise KeyboardInterrupt  # nothing to resume from: stop as an unstaged run does
        return
    generators = {"cpu": gathered(torch.get_rng_state(), run.world)}  # every process's
    if run.device.type == "cuda":
        generators["cuda"] = gathered(torch.cuda.get_rng_state(run.device), run.world)
    seen = torch.stack(gathered(torch.stack(run.seen).cpu(), run.world)) if run.seen else None
    weights, optimizer = run.model, run.optimizer
    if run.cfg.fsdp:  # gathered whole from every process's shards, onto rank 0
        weights, optimizer = whole_weights(run.model), whole_optimizer(run.model, optimizer)
    if not run.world.main:
        run.saved = run.updates
        return
    run.folder.publish()
    state = {"elapsed_s": round(time.perf_counter() - run.start, 3)}
    tokenizer = Path(run.path) / TOKENIZER_FILE
    path = save_snapshot(run.path, weights, _weights_meta(run), optimizer, run.updates,
                         run.fingerprint, run.cfg.keep, extra=state, seen=seen,
                         beside=(tokenizer,) if tokenizer.is_file() else (),
                         generators=generators)
    run.saved, run.saved_path = run.updates, str(path)


def _throughput(run: _Run) -> float:
    """Tokens per second of training since the last record."""
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)  # kernels run asynchronously
    since, at = run.segment
    tokens = (run.updates - at) * run.plan.per_update * run.tokens_per_example \
        / run.plan.per_example
    return tokens / max(time.perf_counter() - since, 1e-9)


def _record(run: _Run, evaluate: bool = True) -> None:
    """Evaluate, append to metrics.jsonl (and TensorBoard) and log one line. A card's own
    objective is measured only first and last: it costs an update per held-out example."""
    tokens_per_s = _throughput(run) if run.updates else 0.0
    card_loss = mean(torch.stack(run.seen).mean(), run.world).item() if run.seen else None
    run.seen.clear()
    if not run.world.main:  # rank 0 evaluates, logs and writes
        if evaluate and run.cfg.fsdp:
            _evaluate(run)  # a sharded model runs only when every process runs it
        run.records.append({"step": run.updates})
        run.segment = (time.perf_counter(), run.updates)
        return
    train_loss, val_loss = _evaluate(run) if evaluate else (None, None)
    record = {"run": run.run_id, "step": run.updates, "train_loss": _finite(train_loss),
              "val_loss": _finite(val_loss), "card_loss": card_loss,
              "tokens_per_s": round(tokens_per_s, 1), "lr": run.lr,
              "elapsed_s": round(time.perf_counter() - run.start, 3),
              "world_size": run.world.size}
    run.records.append(record)
    append_record(os.path.join(run.path, METRICS), record)
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
    if not run.cfg.tensorboard or not run.world.main:
        yield
        return
    # A resumed run's writer drops what the killed one logged after its checkpoint.
    purge = {"purge_step": run.updates + 1} if run.updates else {}
    run.tb = summary_writer()(log_dir=os.path.join(run.path, TENSORBOARD), **purge)
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
                           run.plan.length - 1, run.cfg.seed + 1, run.device,
                           run.cfg.precision)


@torch.no_grad()
def next_token_loss(model: nn.Module, data: Split, batches: int, batch_size: int,
                    block: int, seed: int, device: torch.device, precision: str = "bf16"
                    ) -> float:
    """Mean next-token cross-entropy of a causal language model over `batches` minibatches of
    random windows of `block` tokens (drawn from `seed`: the same ones each time), at the
    training's precision. The model's mode is the caller's."""
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(batches):
        x, y = get_batch(data, batch_size, block, gen, device)
        with autocast(device, precision):
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


def _finish(run: _Run) -> None:
    """Plot, then save the weights: a run folder with model.safetensors has finished."""
    weights = whole_weights(run.model) if run.cfg.fsdp else run.model
    if not run.world.main:
        return
    plot_losses(run.records, os.path.join(run.path, "loss.png"))
    save_checkpoint(run.path, weights, _weights_meta(run))


def _weights_meta(run: _Run) -> dict[str, Any]:
    """The weights' metadata, at the end and in each checkpoint. `context` is how many
    positions the run trained (an example of ℓ tokens trains the predictions of its first
    ℓ − 1), the longest window `cardc sample` then feeds the model."""
    return {**run.meta, "run": run.run_id, "train_config": asdict(run.cfg),
            "recipe": run.fingerprint["recipe_values"], "block_size": run.plan.length,
            "context": run.plan.length - 1, "val_loss": run.records[-1]["val_loss"]}
