"""Training a card as `cardc train` does: the training card (the model's recipe, or the one
named), its hyperparameters, the tokenizer, the model's vocabulary, a resumed or fine-tuned
start, then the runtime's training loop. `train` is `cardc.train`."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .. import build  # called through the module, which tests may patch
from ..diagnostics import CardError, Diagnostics
from ..dims import Dim
from ..info import preset_values
from ..interop.transfer import CARD_PATH_KEY
from ..library import shown_folders
from ..lower.values import card_names
from ..presets import OverrideError, PresetError, find_preset, run_values, validate
from ..runtime.checkpoint import CHECKPOINT_NAME, load_state, read_checkpoint
from ..runtime.data import DataFolder, check_corpus_path, is_data_folder, load_corpus, text_splits
from ..runtime.errors import RuntimeInputError
from ..runtime.resume import Snapshot, latest, read_snapshot
from ..runtime.runs import check_destination
from ..runtime.tokenizer import ByteTokenizer, Tokenizer, parse_spec, run_tokenizer, train_bpe
from ..runtime.train import (
    TrainConfig,
    dataset_inputs,
    predicts_next_token,
    resolve_device,
    summary_writer,
)
from ..runtime.train import train as run_training
from ..spelling import canonical_name
from .inputs import (
    DEFAULT_SEED,
    Overrides,
    UsageError,
    library_folders,
    parse_overrides,
    require_cards,
    set_flags,
    set_pairs,
    shown_path,
    typed,
)

# options of `train` that set a hyperparameter of the training card
RECIPE_FLAGS = {"steps": "N_steps", "batch_size": "B", "block_size": "ℓ", "lr": "η"}


@dataclass(frozen=True)
class TrainOptions:
    """Everything `train` is asked, as `cardc train`'s flags spell it (see `train`)."""

    card: str
    preset: str | None = None
    name: str | None = None
    overrides: tuple[str, ...] = ()  # NAME=VALUE, as --set
    recipe: str | None = None
    steps: int | None = None
    examples: int = 2000
    out: str | None = None
    device: str = "auto"
    data: str | None = None
    batch_size: int | None = None
    block_size: int | None = None
    lr: float | None = None
    eval_every: int = 100
    seed: int | None = None
    compile: bool = False
    tensorboard: bool = False
    pad_vocab: bool = False
    tokenizer: str | None = None
    resume: str | None = None
    finetune: str | None = None
    save_every: int = 500
    fsdp: bool = False
    keep_checkpoints: int = 2
    precision: str = "bf16"
    library: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TrainedRun:
    """A finished run: its folder, and the records of its evaluations (metrics.jsonl's)."""

    out: Path
    records: list[dict[str, Any]]


def train(card: str | os.PathLike[str], *, preset: str | None = None, name: str | None = None,
          overrides: Overrides = (), recipe: str | None = None, steps: int | None = None,
          examples: int = 2000, out: str | None = None, device: str = "auto",
          data: str | None = None, batch_size: int | None = None,
          block_size: int | None = None, lr: float | None = None, eval_every: int = 100,
          seed: int | None = None, compile: bool = False, tensorboard: bool = False,
          pad_vocab: bool = False, tokenizer: str | None = None, resume: str | None = None,
          finetune: str | None = None, save_every: int = 500, fsdp: bool = False,
          keep_checkpoints: int = 2, precision: str = "bf16",
          library: Sequence[str] | None = None) -> TrainedRun:
    """Train a card as `cardc train CARD` does, and return the finished run.

    `card` is a model card file (trained by the training card that trains it, its recipe, or
    by `recipe`'s) or a training card file; `name` picks a card of the file. `preset` sets the
    model's and the training card's hyperparameters, `overrides` ({name: value}, or
    "NAME=VALUE" strings as --set) any of them; `steps`, `batch_size`, `block_size` and `lr`
    set the training card's N_steps, B, ℓ and η. `out` is the run folder (default
    runs/CARD-PRESET), replaced when the run finishes. `data` is a text file or a prepared data
    folder (default: the embedded corpus); `tokenizer` is "bytes" or "bpe:N". `resume` goes on
    with a stopped run in its folder; `finetune` starts a new run from a checkpoint's weights.
    `seed` sets the recipe's seed (default: the recipe's, else 1337). The remaining options
    are `cardc train`'s flags of the same names.

    Bad arguments raise `UsageError`, bad cards `CardError`, bad files or data
    `RuntimeInputError`; a run stopped by SIGINT or SIGTERM raises the runtime's `Stopped`
    after saving the checkpoint it resumes from."""
    return train_with(TrainOptions(
        card=str(card), preset=preset, name=name, overrides=tuple(set_pairs(overrides)),
        recipe=recipe, steps=steps, examples=examples, out=out, device=device, data=data,
        batch_size=batch_size, block_size=block_size, lr=lr, eval_every=eval_every, seed=seed,
        compile=compile, tensorboard=tensorboard, pad_vocab=pad_vocab, tokenizer=tokenizer,
        resume=resume, finetune=finetune, save_every=save_every, fsdp=fsdp,
        keep_checkpoints=keep_checkpoints, precision=precision,
        library=tuple(library) if library is not None else None))


def train_with(o: TrainOptions, checked: Callable[[], object] = lambda: None) -> TrainedRun:
    """`train`, from its options. `checked` is called once the options and files are checked,
    before the cards are compiled and the run starts (where the command line has SIGTERM
    end the run as Ctrl-C does)."""
    require_cards([o.card])
    out = run_folder(o)
    _check_counts(o)
    bpe = _tokenizer_spec(o)
    cfg = _config(o, out)
    resolve_device(cfg.device)  # before any output: a missing GPU is reported up front
    if cfg.tensorboard:
        summary_writer()  # and a missing tensorboard package
    data = _data_folder(o.data)
    snapshot = _snapshot(o.resume) if o.resume else None
    if snapshot is None:
        check_destination(out)  # and an --out that cannot hold the run, before it trains
    checked()
    lib, checker, recipe = _recipe(o)
    model_card = build.called_model(checker, recipe)
    hypers, model_overrides, run = _recipe_values(o, lib, checker, recipe)
    cfg = replace(cfg, seed=run.seed, weights=run.weights)
    torch.manual_seed(cfg.seed)  # the initial weights too: a run is reproducible from its seed
    origin = o.resume or o.finetune
    started = _started(origin, snapshot, checker, model_card) if origin else None
    if started is not None:  # the checkpoint's sizes, unless --set changes one
        model_overrides = {**started[0], **model_overrides}
        tokenizer = started[2]
        _same_tokenizer(o, bpe, tokenizer)
    elif data is not None:
        tokenizer = _folder_tokenizer(o, data, checker, recipe, hypers)
    else:
        tokenizer = _new_tokenizer(o, bpe, checker, recipe, hypers)
    if data is not None:
        data.check_tokenizer(tokenizer)  # a resumed run reads only tokens of its own tokenizer
    model_overrides = _tokenizer_vocab(tokenizer, started is None, o.preset,
                                       model_overrides, checker, model_card)
    if o.pad_vocab:
        if o.finetune:
            raise UsageError("--pad-vocab changes the model's shapes; a fine-tuned model keeps "
                             "its checkpoint's")
        model_overrides = _padded_vocab(o.preset, model_overrides, checker, model_card)
    validated(lib, checker, model_card, o.preset, model_overrides, set_flags(o.overrides))
    model = build.build_model(lib.file_of(model_card).path, o.preset, model_overrides,
                        library_folders(o.library, [o.card]), model_card.name)
    if checker.info(recipe).sig.models:
        _require_causal(model, model_card, recipe)
    if o.finetune:
        load_state(model, started[1])
    # where the card lives, so that export finds the mapping file a user keeps beside it
    model.card_meta[CARD_PATH_KEY] = os.path.abspath(lib.file_of(model_card).path)
    build.record_sampler(model.card_meta, lib, checker, model_card)
    params = sum(p.numel() for p in model.parameters())
    start = f"update {snapshot.update} of {o.resume}" if snapshot else \
        f"the weights of {o.finetune}" if o.finetune else o.preset or "no preset"
    print(f"training {model_card.name} ({start}, {params:,} parameters) "
          f"with {recipe.name} ({shown_path(lib.file_of(recipe).path)}); writing {out}/")
    records = run_training(model, build.procedure_function(checker, recipe, model), hypers, cfg,
                           model.card_meta, tokenizer=tokenizer, resume=snapshot)
    return TrainedRun(Path(out), records)


def validated(lib, checker, alg, preset: str | None, overrides: dict[str, float],
              flags: dict[str, str]) -> dict:
    """A card's values at a preset and the caller's overrides, checked through every card it
    calls; a bad value ends in one message naming its flag (or its preset line), and a value
    that follows a flag's (a warm-up scaled with the run) is said on a line of its own."""
    notices: list[str] = []
    try:
        values = validate(checker, alg, preset, overrides, flags, notices=notices)
    except PresetError as err:
        raise err.card_error(lib.diags.sources) from None
    for notice in notices:
        print(f"note: {notice}")
    return values


def run_folder(o: TrainOptions) -> str:
    """The run folder: --out, else the resumed run, else runs/CARD-PRESET."""
    if o.resume and o.finetune:
        raise UsageError("--resume goes on with a run's own optimizer; --finetune starts a new "
                         "run from its weights: give one")
    if o.resume:
        if o.out and Path(o.out).resolve() != Path(o.resume).resolve():
            raise UsageError(f"--resume goes on in the run's own folder ({o.resume}), not "
                             f"in --out {o.out}; to start a new run from its weights, use "
                             "--finetune")
        return o.resume
    return o.out or str(Path("runs") / (Path(o.card).stem +
                                        (f"-{o.preset}" if o.preset else "")))


def _check_counts(o: TrainOptions) -> None:
    """The counts and the learning rate a run is given, each at least what makes sense."""
    for flag, least in (("steps", 0), ("batch_size", 1), ("block_size", 2), ("examples", 1),
                        ("eval_every", 1)):
        if getattr(o, flag) is not None and getattr(o, flag) < least:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= {least}")
    if o.lr is not None and o.lr <= 0:
        raise UsageError("--lr must be > 0")


def _config(o: TrainOptions, out: str) -> TrainConfig:
    """What the harness decides, from the options; a bad setting is a usage error."""
    try:
        return TrainConfig(out_dir=out, examples=o.examples, length=o.block_size or 128,
                           eval_every=o.eval_every, device=o.device, data_path=o.data,
                           compile=o.compile, tensorboard=o.tensorboard,
                           save_every=o.save_every, keep=o.keep_checkpoints, fsdp=o.fsdp,
                           precision=o.precision)
    except RuntimeInputError as err:
        raise UsageError(str(err)) from None


def _snapshot(run: str) -> Snapshot:
    """The newest checkpoint of an unfinished run, to resume."""
    if not Path(run).is_dir():
        raise UsageError(f"--resume {run}: not a run folder")
    found = latest(run)
    if (Path(run) / CHECKPOINT_NAME).is_file():
        raise UsageError(f"--resume {run}: the run has finished; to train on from its weights "
                         "with a fresh optimizer, use --finetune")
    if found is None:
        raise UsageError(f"--resume {run}: the run saved no checkpoint to resume from")
    return read_snapshot(found)


def _started(origin: str, snapshot: Snapshot | None, checker, model_card
             ) -> tuple[dict, dict, Tokenizer]:
    """A checkpoint's hyperparameters (by card name), tensors and tokenizer, if it holds
    `model_card`'s model: a resumed run's newest checkpoint, or the weights to fine-tune."""
    meta, state = (snapshot.meta, snapshot.weights) if snapshot else read_checkpoint(origin)
    tokenizer = run_tokenizer(origin, meta)
    if meta.get("name") != model_card.label:
        raise UsageError(f"'{origin}' holds {meta.get('name')}, but the training card trains "
                         f"{model_card.label}")
    try:
        sizes = build.recorded_values(meta.get("hyperparameters"),
                                      checker.info(model_card).sig.hypers)
    except ValueError as err:
        raise RuntimeInputError(f"{origin}: {err}") from None
    return sizes, state, tokenizer


def _same_tokenizer(o: TrainOptions, bpe: int | None, tokenizer: Tokenizer) -> None:
    """A resumed run's --tokenizer, if given again, must be the one it reads with."""
    if o.tokenizer is not None and (bpe or 0) != (0 if tokenizer.kind == "bytes" else
                                                 tokenizer.vocab_size):
        raise UsageError(f"--tokenizer {o.tokenizer}: {o.resume} reads text with its "
                         f"own tokenizer ({tokenizer.kind}, {tokenizer.vocab_size:,} tokens)")


def _require_causal(model: torch.nn.Module, model_card, recipe) -> None:
    """A generic recipe's model is a causal language model: no row of its scores may change
    with a later token (its card type states the shapes; its attention's masks, the analysis
    recorded when it was lowered)."""
    if not predicts_next_token(model):
        raise UsageError(f"{recipe.name} trains a causal language model, and {model_card.label}"
                         " reads ahead: its scores for a position change with a later token")


def _vocab_name(checker, model_card, flag: str) -> str:
    """The hyperparameter the model's token input is drawn from (V of x ∈ {1..V}^{T})."""
    sig = checker.info(model_card).sig
    vocab = sig.inputs[0][1].vocab if sig.inputs else None
    name = next((n for n in sig.hypers if Dim.sym(n) == vocab), None)
    if name is None:
        raise UsageError(f"{flag}: {model_card.label}'s vocabulary is not a "
                         "hyperparameter the card lets training choose")
    return name


def _tokenizer_spec(o: TrainOptions) -> int | None:
    """N of `--tokenizer bpe:N`; None for bytes, or for a resumed run, which keeps its own."""
    if o.tokenizer is None:
        return None
    if o.finetune:
        raise UsageError("--tokenizer: a fine-tuned model reads text with its checkpoint's "
                         "tokenizer")
    try:
        return parse_spec(o.tokenizer)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _data_folder(path: str | None) -> DataFolder | None:
    """The prepared data folder `--data` names, checked; None for a text file (checked to be
    a regular one) or no --data."""
    if path is None:
        return None
    if is_data_folder(path):
        return DataFolder.open(path)
    check_corpus_path(path)
    return None


def _folder_tokenizer(o: TrainOptions, data: DataFolder, checker, recipe,
                      hypers: dict) -> Tokenizer:
    """The tokenizer a prepared data folder's tokens were made with; `--tokenizer`, if given,
    must be the one it was prepared with."""
    if o.tokenizer is not None and o.tokenizer != data.spec:
        raise UsageError(f"--tokenizer {o.tokenizer}: '{o.data}' holds tokens of "
                         f"{data.spec}; prepare it again with --tokenizer {o.tokenizer}, or "
                         "leave the flag out")
    if dataset_inputs(build.procedure_function(checker, recipe), hypers) != 1:
        raise UsageError(f"--data {o.data}: {recipe.name} trains on synthetic token pairs, "
                         "not on text")
    meta = data.meta
    print(f"data: {o.data}: {meta['train_tokens']:,} training and {meta['val_tokens']:,} "
          f"held-out tokens of {data.spec}")
    return data.tokenizer()


def _new_tokenizer(o: TrainOptions, size: int | None, checker, recipe,
                   hypers: dict) -> Tokenizer:
    """Bytes, or for `--tokenizer bpe:N` a byte-level BPE trained on the corpus's training
    split (the text the model trains on; the held-out text stays unseen)."""
    if size is None:
        return ByteTokenizer()
    if dataset_inputs(build.procedure_function(checker, recipe), hypers) != 1:
        raise UsageError(f"--tokenizer: {recipe.name} trains on synthetic token pairs, not on "
                         "text")
    text = text_splits(load_corpus(o.data))[0]
    tokenizer = train_bpe(text, size)
    print(f"tokenizer: byte-level BPE of {tokenizer.vocab_size:,} tokens, trained on "
          f"{len(text):,} characters of the training split")
    return tokenizer


def _tokenizer_vocab(tokenizer: Tokenizer, trained: bool, preset: str | None, overrides: dict,
                     checker, model_card) -> dict:
    """The model's vocabulary set to a trained tokenizer's size; a resumed run's tokenizer must
    fit the vocabulary of its weights. Bytes are left as they always were."""
    if tokenizer.kind == "bytes":
        return overrides
    name = _vocab_name(checker, model_card, "--tokenizer")
    if trained:
        if name in overrides:
            raise UsageError(f"--set {name} and --tokenizer both set the vocabulary size; "
                             f"--tokenizer makes {name} the tokenizer's size")
        print(f"{name} = {tokenizer.vocab_size}, the tokenizer's size")
        return {**overrides, name: tokenizer.vocab_size}
    size = int(preset_values(checker.info(model_card).sig, preset, overrides)[name])
    if tokenizer.vocab_size > size:
        raise RuntimeInputError(f"the checkpoint's tokenizer has {tokenizer.vocab_size:,} "
                                f"tokens, more than its model's vocabulary ({name} = {size:,})")
    return overrides


def _padded_vocab(preset: str | None, overrides: dict, checker, model_card) -> dict:
    """The vocabulary size rounded up to a multiple of 64, for faster unembedding matmuls: the
    data never asks for the extra tokens, so training only learns to give them no weight."""
    sig = checker.info(model_card).sig
    name = _vocab_name(checker, model_card, "--pad-vocab")
    size = int(preset_values(sig, preset, overrides)[name])
    padded = -(-size // 64) * 64
    if padded != size:
        print(f"{name} = {size} padded to {padded}, a multiple of 64")
    return {**overrides, name: padded}


def _recipe(o: TrainOptions):
    """The training card to run: the one in the file, or else the library's card that trains
    the file's model (--recipe names another)."""
    library = library_folders(o.library, [o.card])
    lib, checker, _ = build.checked([o.card, *([o.recipe] if o.recipe else [])], library)
    file = next(f.path for f in lib.files if Path(f.path) == Path(o.card))
    here = [a for a in build.procedure_cards(lib, checker, [file]) if o.name in (None, a.name)]
    if here:
        return lib, checker, _training_card(o, checker, here)
    model = build.find_card(lib, checker, o.card, o.name)
    found = build.procedures_for(lib, checker, model, training=True)
    if o.recipe:
        found = [a for a in found if Path(lib.file_of(a).path) == Path(o.recipe)]
        generic = [a for a in build.procedure_cards(lib, checker, [str(Path(o.recipe))])
                   if build.trains(checker, a) and build.unbound_models(checker, a)]
        if not found and generic:  # one that cannot run this model: say why, where
            build.bind_recipe(checker, generic[0], model)
    if o.recipe and not found:
        raise UsageError(f"{o.recipe} holds no training card for {model.label}")
    if not found:  # the card given is the input at fault, not the command line: located
        diags = Diagnostics(sources=lib.diags.sources)
        diags.error(model.span, f"no training card trains {model.label}: none calls it, and no "
                                f"generic one (as LMTraining trains any card {{1..V}}^{{T}} → "
                                f"ℝ^{{T×V}}) fits it",
                    f"searched {', '.join(shown_folders(lib.roots))}; write a training card "
                    f"that calls {model.label}, or give one with --recipe")
        raise CardError(diags)
    if build.unbound_models(checker, found[0]):
        build.bind_recipe(checker, found[0], model)
    build.require_clean(lib, checker, checker.diags, {lib.file_of(found[0]).path})
    return lib, checker, found[0]


def _training_card(o: TrainOptions, checker, here: list):
    """The training card of a file of procedures, which must name the model it trains."""
    training = [a for a in here if build.trains(checker, a)]
    if not training:
        raise UsageError(f"{here[0].name} is an inference card: sample with it, "
                         f"'cardc sample RUN --card {o.card}'")
    if build.unbound_models(checker, training[0]):
        raise UsageError(f"{training[0].name} trains whichever model it is given: "
                         f"'cardc train MODEL.card --recipe {o.card}'")
    return training[0]


def _recipe_values(o: TrainOptions, lib, checker, recipe):
    """The training card's hyperparameters (preset, options, overrides) and the model's
    overrides."""
    info = checker.info(recipe)
    names = card_names(info.sig)
    run_pairs = [p for p in o.overrides
                 if canonical_name(p.partition("=")[0].strip()) in info.sig.run]
    overrides = parse_overrides([p for p in o.overrides if p not in run_pairs])
    flags = set_flags(o.overrides)
    mine = {k: v for k, v in overrides.items() if k in names}  # the rest are the model's
    for flag, name in RECIPE_FLAGS.items():
        value = getattr(o, flag)
        if value is None:
            continue
        if name not in names and flag == "block_size":
            continue  # the harness cuts examples of this length for a card without ℓ
        if name not in names:
            raise UsageError(f"--{flag.replace('_', '-')} sets {name}, which {recipe.name} "
                             f"does not have; set its hyperparameters with --set NAME=VALUE")
        mine[name] = value
        flags[name] = f"--{flag.replace('_', '-')} {value}"
    values = validated(lib, checker, recipe, o.preset, mine, flags)
    missing = [n for n in names if n not in values]
    if missing:
        raise UsageError(f"{recipe.name} needs {', '.join(missing)}: set it with --set NAME=VALUE")
    hypers = typed(info.sig, names, values)
    run = _run_values(o, lib, info.sig, run_pairs)
    return hypers, {k: v for k, v in overrides.items() if k not in mine}, run


@dataclass(frozen=True)
class _RunValues:
    """The seed and the weights' number format of a run: the recipe's own (its `seed of every
    random draw` and `number format of θ` hyperparameters) or the harness's defaults."""

    seed: int = DEFAULT_SEED
    weights: str = "float32"


def _run_values(o: TrainOptions, lib, sig, pairs: list[str]) -> _RunValues:
    """--set NAME=VALUE of the recipe's seed and number formats, and --seed, which sets the
    recipe's seed when it has one."""
    given = {canonical_name(p.partition("=")[0].strip()): p.partition("=")[2] for p in pairs}
    flags = {canonical_name(p.partition("=")[0].strip()): f"--set {p}" for p in pairs}
    seed = next((n for n, v in sig.run.items() if v.seed), None)
    if o.seed is not None and seed is not None:
        if seed in given:
            raise UsageError(f"--seed {o.seed} and {flags[seed]} both set the seed: give one")
        given[seed], flags[seed] = str(o.seed), f"--seed {o.seed}"
    try:
        values = run_values(sig, find_preset(sig.alg, o.preset), given, flags)
    except PresetError as err:
        raise err.card_error(lib.diags.sources) from None
    except OverrideError as err:
        raise UsageError(str(err)) from None
    formats = [values[n] for n, v in sig.run.items() if v.of is not None and n in values]
    chosen = values.get(seed) if seed is not None else o.seed
    return _RunValues(DEFAULT_SEED if chosen is None else int(chosen),
                      str(formats[0]) if formats else "float32")

