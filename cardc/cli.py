"""The `cardc` command line. Bad input ends in one clear message and a non-zero exit."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from . import __version__
from .diagnostics import CardError, Diagnostics
from .library import card_paths, library_roots, load, shown_folders
from .runtime.errors import RuntimeInputError
from .spelling import canonical_name

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
MAX_TOKENS = 100_000  # `sample --tokens`: more is hours of decoding, never what was meant


class UsageError(Exception):
    pass


class _Help(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it has none or says it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (action.option_strings and action.default not in (None, False, argparse.SUPPRESS)
                and "default" not in text):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # argparse exits 2 with usage; keep it, minus noise
        self.print_usage(sys.stderr)
        print(f"cardc: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _count(least: int, most: int | None = None):
    """An argparse type: a whole number in [least, most]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
        if value < least or (most is not None and value > most):
            bound = f"between {least:,} and {most:,}" if most is not None else f">= {least}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value
    return parse


def _finite(least: float, inclusive: bool = True):
    """An argparse type: a finite number >= least (> least unless inclusive)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
        if not math.isfinite(value) or value < least or (value == least and not inclusive):
            raise argparse.ArgumentTypeError(
                f"must be a finite number {'>=' if inclusive else '>'} {least:g}, got {text}")
        return value
    return parse


def _unit(one: bool) -> Callable[[str], float]:
    """An argparse type: a number in (0, 1] (`one`: a probability mass P) or in (0, 1) (a
    share of something, both parts non-empty)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
        if not (0 < value <= 1 if one else 0 < value < 1):  # NaN too
            raise argparse.ArgumentTypeError(
                f"must be a number in (0, 1{']' if one else ')'}, got {text}")
        return value
    return parse


def _require_cards(paths: list[str]) -> list[Path]:
    found = card_paths(paths)
    missing = [str(p) for p in found if not p.exists()]
    if missing:
        raise UsageError(f"no such card file: {missing[0]}")
    if not found:
        raise UsageError(f"no .card files under {', '.join(paths)}")
    return found


def _library(args: argparse.Namespace, paths: list[str]) -> list[str]:
    """The library folders a verb searches after the cards' own: --library, in order, else the
    cards/ folder each card lives in; the shipped library comes after either."""
    for folder in args.library or []:
        if not Path(folder).is_dir():
            raise UsageError(f"--library {folder}: no such folder")
    return library_roots(paths, args.library)


def _report(diags: Diagnostics) -> int:
    if diags.items:
        print(diags.render(), file=sys.stderr)
    errors = len(diags.errors)
    if errors:
        print(f"\n{errors} error{'s' if errors > 1 else ''}", file=sys.stderr)
    return EXIT_ERROR if errors else EXIT_OK


# ------------------------------------------------------------------ commands


def cmd_check(args: argparse.Namespace) -> int:
    from .checker import check

    _require_cards(args.paths)
    lib, targets = load(args.paths, root=_library(args, args.paths), lazy=True)  # as called
    _, diags = check(lib)
    wanted = {str(Path(t)) for t in targets}
    shown = Diagnostics([d for d in diags.items if d.span.file in wanted], diags.sources)
    code = _report(shown)
    if code == EXIT_OK and not args.quiet:
        cards = sum(len(f.algorithms) for f in lib.files if f.path in wanted)
        print(f"ok: {cards} card{'s' if cards != 1 else ''} in {len(targets)} file"
              f"{'s' if len(targets) != 1 else ''}")
    return code


def cmd_fmt(args: argparse.Namespace) -> int:
    from .parser import read_card
    from .render.text import format_source

    changed, diags = [], Diagnostics()
    for path in _require_cards(args.paths):
        text = read_card(path, diags)
        if text is None:
            continue
        pretty, d = format_source(text, str(path))
        diags.extend(d)
        if d.errors or pretty == text:
            continue
        changed.append(path)
        if not args.check:
            _write(path, pretty)
    code = _report(diags)
    if code:
        return code
    if args.check and changed:
        for p in changed:
            print(f"would reformat {p}", file=sys.stderr)
        return EXIT_ERROR
    if not args.check:
        for p in changed:
            print(f"reformatted {p}")
    return EXIT_OK


def _write(path: Path, text: str) -> None:
    """Write a file atomically, or end in one line saying why it cannot be written."""
    from .atomic import write_text_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)
    except OSError as err:
        raise RuntimeInputError(f"cannot write '{path}': {err.strerror or err}") from None


def cmd_render(args: argparse.Namespace) -> int:
    from .parser import parse_file
    from .render.text import render_card

    if args.standalone and args.to != "latex":
        raise UsageError("--standalone goes with --to latex")
    paths = _require_cards(args.paths)
    if args.to in ("latex", "md", "html"):
        return _render_typeset(args, paths)
    diags = Diagnostics()
    out = []
    for path in paths:
        out.append(render_card(parse_file(path, diags)))
    code = _report(diags)
    if code == EXIT_OK:
        sys.stdout.write("\n".join(out))
    return code


def _render_typeset(args: argparse.Namespace, paths: list[Path]) -> int:
    """LaTeX, Markdown or HTML of the cards, typeset from the checker's types where they check
    (a card that does not check still renders, its names in their letters' own style); an HTML
    page holds the cards, then the cards they call from other files."""
    from .checker import check
    from .render.html import render_cards
    from .render.latex import render_latex
    from .render.markdown import render_markdown

    lib, targets = load([str(p) for p in paths], root=_library(args, [str(p) for p in paths]))
    parse_errors = Diagnostics([d for d in lib.diags.items if d.span.file in set(targets)],
                               lib.diags.sources)
    if _report(parse_errors):
        return EXIT_ERROR
    checker, _ = check(lib)
    files = {str(Path(f.path)): f for f in lib.files}
    if args.to == "md":
        sys.stdout.write("\n---\n\n".join(render_markdown(files[str(Path(t))], checker)
                                            for t in targets))
        return EXIT_OK
    if args.to == "html":
        sys.stdout.write(render_cards([files[str(Path(t))] for t in targets], checker))
        return EXIT_OK
    out = [render_latex(files[str(Path(t))], checker, args.standalone and len(targets) == 1)
           for t in targets]
    if args.standalone and len(targets) > 1:
        from .render.latex import standalone

        out = [standalone("\n".join(out))]
    sys.stdout.write("\n".join(out))
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    """`cardc diff A B`: the architecture difference of two model cards, step by step."""
    from .build import checked, find_card
    from .diff import diff_cards

    _require_cards([args.a, args.b])
    lib, checker, _ = checked([args.a, args.b], _library(args, [args.a]))
    a = find_card(lib, checker, args.a, args.name_a)
    b = find_card(lib, checker, args.b, args.name_b)
    print("\n".join(diff_cards(checker, a, b)))
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    from .build import files_used
    from .checker import check
    from .flops import card_cost
    from .info import PresetError, summarize
    from .presets import validate

    _require_cards([args.card])
    lib, _ = load([args.card], root=_library(args, [args.card]))
    checker, diags = check(lib)
    used = files_used(lib, checker, {str(Path(args.card))})
    if _report(Diagnostics([d for d in diags.items if d.span.file in used], diags.sources)):
        return EXIT_ERROR
    card_file = next(f for f in lib.files if Path(f.path) == Path(args.card))
    algs = [a for a in card_file.algorithms if a.label and (args.name in (None, a.name, a.label))]
    if not algs:
        raise UsageError(f"no card named '{args.name}' in {args.card}")
    alg = algs[0]
    try:
        overrides = _overrides(args.set)
        validate(checker, alg, args.preset, overrides, _set_flags(args.set))
        summary = summarize(checker.infos[id(alg)].sig, args.preset, overrides,
                            card_cost(checker, alg), args.seq, args.batch)
    except PresetError as err:
        return _report(err.card_error(diags.sources).diagnostics)
    print(summary.text())
    return EXIT_OK


def cmd_build(args: argparse.Namespace) -> int:
    from .build import files_used, generated_cards, module_path, require_clean, source
    from .checker import check

    _require_cards(args.paths)
    if not args.check:
        from .runtime.runs import check_writable_folder

        check_writable_folder(args.out)
    roots = _library(args, args.paths)
    lib, targets = load(args.paths, root=roots)
    checker, diags = check(lib)
    # Cards named one by one must check; a folder's cards that do not are skipped with a note.
    require_clean(lib, checker, diags, {str(Path(p)) for p in args.paths if not Path(p).is_dir()})
    wanted = [f.path for f in lib.files if f.path in {str(Path(t)) for t in targets}]
    broken = {d.span.file for d in diags.errors}
    stale, written = [], []
    expected = set()
    for alg in generated_cards(lib, checker, wanted):
        if files_used(lib, checker, {lib.file_of(alg).path}) & broken:
            print(f"note: skipped {alg.name} ({lib.file_of(alg).path}): it does not check "
                  "(see 'cardc check')", file=sys.stderr)
            continue
        path = module_path(lib, alg, args.out, roots)
        expected.add(path)
        text = source(checker, alg)
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(f"{path} is out of date with {lib.file_of(alg).path}")
        else:
            _write(path, text)
            written.append(path)
    up_to_date = f"ok: {len(expected)} generated module{'s' if len(expected) != 1 else ''} up to date"
    if args.check:
        for path in sorted(Path(args.out).rglob("*.py")) if Path(args.out).is_dir() else []:
            if path not in expected and "Code generated by cardc" in path.read_text(encoding="utf-8")[:200]:
                stale.append(f"{path} was generated from a card that is no longer a model")
        for line in stale:
            print(f"cardc: {line}", file=sys.stderr)
        if stale:
            print("run 'cardc build' to regenerate", file=sys.stderr)
            return EXIT_ERROR
        print(up_to_date)
        return EXIT_OK
    for path in written:
        print(f"wrote {path}")
    if not written:
        print(up_to_date)
    return EXIT_OK


# flags of `cardc train` that set a hyperparameter of the training card
RECIPE_FLAGS = {"steps": "N_steps", "batch_size": "B", "block_size": "ℓ", "lr": "η"}
DEFAULT_SEED = 1337  # a run's seed when neither its recipe nor --seed gives one


def cmd_docs(args: argparse.Namespace) -> int:
    """`cardc docs`: a static site of the cards and every card they call; a card that does not
    check gets a page saying so (a card that does not parse stops the site)."""
    from .checker import check
    from .docs.site import write_site

    paths = [str(p) for p in _require_cards(args.paths)]
    lib, targets = load(paths, root=_library(args, paths))
    parse_errors = Diagnostics([d for d in lib.diags.items if d.span.file in set(targets)],
                               lib.diags.sources)
    if _report(parse_errors):
        return EXIT_ERROR
    checker, diags = check(lib)
    pages = write_site(lib, checker, diags, targets, args.out)
    broken = sum(not p.checked for p in pages)
    note = f" ({broken} that do not check)" if broken else ""
    print(f"ok: {len(pages)} card pages{note} in {args.out}; open {Path(args.out) / 'index.html'}")
    return EXIT_OK


def cmd_train(args: argparse.Namespace) -> int:
    """`cardc train MODEL.card` runs the training card that trains the model (its recipe);
    `cardc train TRAINING.card` runs that card on the model it calls."""
    from .build import build_model, called_model, procedure_function, record_sampler
    from .runtime.distributed import world_from_env
    from .runtime.runs import check_destination
    from .runtime.train import Stopped, TrainConfig, resolve_device, summary_writer, train

    _require_cards([args.card])
    if not world_from_env().main:  # rank 0 alone speaks; every process reports its errors
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
    out = _train_out(args)
    for flag, least in (("steps", 0), ("batch_size", 1), ("block_size", 2), ("examples", 1),
                        ("eval_every", 1)):
        if getattr(args, flag) is not None and getattr(args, flag) < least:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= {least}")
    if args.lr is not None and args.lr <= 0:
        raise UsageError("--lr must be > 0")
    bpe = _tokenizer_spec(args)
    try:
        cfg = TrainConfig(out_dir=out, examples=args.examples, length=args.block_size or 128,
                          eval_every=args.eval_every, device=args.device,
                          data_path=args.data, compile=args.compile, tensorboard=args.tensorboard,
                          save_every=args.save_every, keep=args.keep_checkpoints,
                          fsdp=args.fsdp)
    except RuntimeInputError as err:
        raise UsageError(str(err)) from None
    resolve_device(cfg.device)  # before any output: a missing GPU is reported up front
    if cfg.tensorboard:
        summary_writer()  # and a missing tensorboard package
    data = _data_folder(args.data)
    snapshot = _snapshot(args.resume) if args.resume else None
    if snapshot is None:
        check_destination(out)  # and an --out that cannot hold the run, before it trains
    import torch

    # `kill` ends a run as Ctrl-C does: its staging folder is removed, the previous run stays
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    lib, checker, recipe = _recipe(args)
    model_card = called_model(checker, recipe)
    hypers, model_overrides, run = _recipe_values(args, lib, checker, recipe)
    cfg = replace(cfg, seed=run.seed, weights=run.weights)
    torch.manual_seed(cfg.seed)  # the initial weights too: a run is reproducible from its seed
    origin = args.resume or args.finetune
    started = _started(origin, snapshot, checker, model_card) if origin else None
    if started is not None:  # the checkpoint's sizes, unless --set changes one
        model_overrides = {**started[0], **model_overrides}
        tokenizer = started[2]
        _same_tokenizer(args, bpe, tokenizer)
    elif data is not None:
        tokenizer = _folder_tokenizer(args, data, checker, recipe, hypers)
    else:
        tokenizer = _new_tokenizer(args, bpe, checker, recipe, hypers)
    if data is not None:
        data.check_tokenizer(tokenizer)  # a resumed run reads only tokens of its own tokenizer
    model_overrides = _tokenizer_vocab(tokenizer, started is None, args.preset,
                                       model_overrides, checker, model_card)
    if args.pad_vocab:
        if args.finetune:
            raise UsageError("--pad-vocab changes the model's shapes; a fine-tuned model keeps "
                             "its checkpoint's")
        model_overrides = _padded_vocab(args.preset, model_overrides, checker, model_card)
    _validated(lib, checker, model_card, args.preset, model_overrides, _set_flags(args.set))
    model = build_model(lib.file_of(model_card).path, args.preset, model_overrides,
                        _library(args, [args.card]), model_card.name)
    if checker.info(recipe).sig.models:
        _require_causal(model, model_card, recipe)
    if args.finetune:
        from .runtime.checkpoint import load_state

        load_state(model, started[1])
    record_sampler(model.card_meta, lib, checker, model_card)
    params = sum(p.numel() for p in model.parameters())
    start = f"update {snapshot.update} of {args.resume}" if snapshot else \
        f"the weights of {args.finetune}" if args.finetune else args.preset or "no preset"
    print(f"training {model_card.name} ({start}, {params:,} parameters) "
          f"with {recipe.name} ({_shown_path(lib.file_of(recipe).path)}); writing {out}/")
    try:
        train(model, procedure_function(checker, recipe), hypers, cfg, model.card_meta,
              tokenizer=tokenizer, resume=snapshot)
    except Stopped as stop:
        print(f"cardc: {stop}; saved {stop.checkpoint}\nresume with: "
              f"{_resume_command(out)}", file=sys.stderr)
        return 128 + stop.signum
    return EXIT_OK


def _train_out(args: argparse.Namespace) -> str:
    """The run folder: --out, else the resumed run, else runs/CARD-PRESET."""
    if args.resume and args.finetune:
        raise UsageError("--resume goes on with a run's own optimizer; --finetune starts a new "
                         "run from its weights: give one")
    if args.resume:
        if args.out and Path(args.out).resolve() != Path(args.resume).resolve():
            raise UsageError(f"--resume goes on in the run's own folder ({args.resume}), not "
                             f"in --out {args.out}; to start a new run from its weights, use "
                             "--finetune")
        return args.resume
    return args.out or str(Path("runs") / (Path(args.card).stem +
                                           (f"-{args.preset}" if args.preset else "")))


def _resume_command(out: str) -> str:
    """This command line again, resuming the run in `out`."""
    import shlex

    argv = sys.argv[1:]
    if "--resume" in argv or any(a.startswith("--resume=") for a in argv):
        return shlex.join(["cardc", *argv])
    return shlex.join(["cardc", *argv, "--resume", out])


def _snapshot(run: str):
    """The newest checkpoint of an unfinished run, to resume."""
    from .runtime.checkpoint import CHECKPOINT_NAME
    from .runtime.resume import latest, read_snapshot

    if not Path(run).is_dir():
        raise UsageError(f"--resume {run}: not a run folder")
    found = latest(run)
    if (Path(run) / CHECKPOINT_NAME).is_file():
        raise UsageError(f"--resume {run}: the run has finished; to train on from its weights "
                         "with a fresh optimizer, use --finetune")
    if found is None:
        raise UsageError(f"--resume {run}: the run saved no checkpoint to resume from")
    return read_snapshot(found)


def _started(origin: str, snapshot, checker, model_card) -> tuple[dict, dict, object]:
    """A checkpoint's hyperparameters (by card name), tensors and tokenizer, if it holds
    `model_card`'s model: a resumed run's newest checkpoint, or the weights to fine-tune."""
    from .build import recorded_values
    from .runtime.checkpoint import read_checkpoint
    from .runtime.tokenizer import run_tokenizer

    meta, state = (snapshot.meta, snapshot.weights) if snapshot else read_checkpoint(origin)
    tokenizer = run_tokenizer(origin, meta)
    if meta.get("name") != model_card.label:
        raise UsageError(f"'{origin}' holds {meta.get('name')}, but the training card trains "
                         f"{model_card.label}")
    try:
        sizes = recorded_values(meta.get("hyperparameters"), checker.info(model_card).sig.hypers)
    except ValueError as err:
        raise RuntimeInputError(f"{origin}: {err}") from None
    return sizes, state, tokenizer


def _same_tokenizer(args: argparse.Namespace, bpe: int | None, tokenizer) -> None:
    """A resumed run's --tokenizer, if given again, must be the one it reads with."""
    if args.tokenizer is not None and (bpe or 0) != (0 if tokenizer.kind == "bytes" else
                                                    tokenizer.vocab_size):
        raise UsageError(f"--tokenizer {args.tokenizer}: {args.resume} reads text with its "
                         f"own tokenizer ({tokenizer.kind}, {tokenizer.vocab_size:,} tokens)")


def _require_causal(model, model_card, recipe) -> None:
    """A generic recipe's model is a causal language model: no row of its scores may change
    with a later token (its card type states the shapes; this, the running model shows)."""
    from .runtime.train import predicts_next_token

    if not predicts_next_token(model):
        raise UsageError(f"{recipe.name} trains a causal language model, and {model_card.label}"
                         " reads ahead: its scores for a position change with a later token")


def _vocab_name(checker, model_card, flag: str) -> str:
    """The hyperparameter the model's token input is drawn from (V of x ∈ {1..V}^{T})."""
    from .dims import Dim

    sig = checker.info(model_card).sig
    vocab = sig.inputs[0][1].vocab if sig.inputs else None
    name = next((n for n in sig.hypers if Dim.sym(n) == vocab), None)
    if name is None:
        raise UsageError(f"{flag}: {model_card.label}'s vocabulary is not a "
                         "hyperparameter the card lets training choose")
    return name


def _tokenizer_spec(args: argparse.Namespace) -> int | None:
    """N of `--tokenizer bpe:N`; None for bytes, or for a resumed run, which keeps its own."""
    from .runtime.tokenizer import parse_spec

    if args.tokenizer is None:
        return None
    if args.finetune:
        raise UsageError("--tokenizer: a fine-tuned model reads text with its checkpoint's "
                         "tokenizer")
    try:
        return parse_spec(args.tokenizer)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _data_folder(path: str | None):
    """The prepared data folder `--data` names, checked; None for a text file (checked to be
    a regular one) or no --data."""
    from .runtime.data import DataFolder, check_corpus_path, is_data_folder

    if path is None:
        return None
    if is_data_folder(path):
        return DataFolder.open(path)
    check_corpus_path(path)
    return None


def _folder_tokenizer(args: argparse.Namespace, data, checker, recipe, hypers: dict):
    """The tokenizer a prepared data folder's tokens were made with; `--tokenizer`, if given,
    must be the one it was prepared with."""
    from .build import procedure_function
    from .runtime.train import dataset_inputs

    if args.tokenizer is not None and args.tokenizer != data.spec:
        raise UsageError(f"--tokenizer {args.tokenizer}: '{args.data}' holds tokens of "
                         f"{data.spec}; prepare it again with --tokenizer {args.tokenizer}, or "
                         "leave the flag out")
    if dataset_inputs(procedure_function(checker, recipe), hypers) != 1:
        raise UsageError(f"--data {args.data}: {recipe.name} trains on synthetic token pairs, "
                         "not on text")
    meta = data.meta
    print(f"data: {args.data}: {meta['train_tokens']:,} training and {meta['val_tokens']:,} "
          f"held-out tokens of {data.spec}")
    return data.tokenizer()


def _new_tokenizer(args: argparse.Namespace, size: int | None, checker, recipe, hypers: dict):
    """Bytes, or for `--tokenizer bpe:N` a byte-level BPE trained on the corpus's training
    split (the text the model trains on; the held-out text stays unseen)."""
    from .build import procedure_function
    from .runtime.data import load_corpus, text_splits
    from .runtime.tokenizer import ByteTokenizer, train_bpe
    from .runtime.train import dataset_inputs

    if size is None:
        return ByteTokenizer()
    if dataset_inputs(procedure_function(checker, recipe), hypers) != 1:
        raise UsageError(f"--tokenizer: {recipe.name} trains on synthetic token pairs, not on "
                         "text")
    text = text_splits(load_corpus(args.data))[0]
    tokenizer = train_bpe(text, size)
    print(f"tokenizer: byte-level BPE of {tokenizer.vocab_size:,} tokens, trained on "
          f"{len(text):,} characters of the training split")
    return tokenizer


def _tokenizer_vocab(tokenizer, trained: bool, preset: str | None, overrides: dict, checker,
                     model_card) -> dict:
    """The model's vocabulary set to a trained tokenizer's size; a resumed run's tokenizer must
    fit the vocabulary of its weights. Bytes are left as they always were."""
    from .info import preset_values

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
        raise RuntimeInputError(f"the checkpoint's tokenizer has {tokenizer.vocab_size:,} tokens, more "
                         f"than its model's vocabulary ({name} = {size:,})")
    return overrides


def _padded_vocab(preset: str | None, overrides: dict, checker, model_card) -> dict:
    """The vocabulary size rounded up to a multiple of 64, for faster unembedding matmuls: the
    data never asks for the extra tokens, so training only learns to give them no weight."""
    from .info import preset_values

    sig = checker.info(model_card).sig
    name = _vocab_name(checker, model_card, "--pad-vocab")
    size = int(preset_values(sig, preset, overrides)[name])
    padded = -(-size // 64) * 64
    if padded != size:
        print(f"{name} = {size} padded to {padded}, a multiple of 64")
    return {**overrides, name: padded}


def _shown_path(path: str) -> str:
    """A path relative to the working directory when it lies below it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _recipe(args: argparse.Namespace):
    """The training card to run: the one in the file, or else the library's card that trains
    the file's model (--recipe names another)."""
    from .build import (
        bind_recipe,
        checked,
        find_card,
        procedure_cards,
        procedures_for,
        require_clean,
        trains,
        unbound_models,
    )

    library = _library(args, [args.card])
    lib, checker, _ = checked([args.card, *([args.recipe] if args.recipe else [])], library)
    file = next(f.path for f in lib.files if Path(f.path) == Path(args.card))
    here = [a for a in procedure_cards(lib, checker, [file]) if args.name in (None, a.name)]
    if here:
        training = [a for a in here if trains(checker, a)]
        if not training:
            raise UsageError(f"{here[0].name} is an inference card: sample with it, "
                             f"'cardc sample RUN --card {args.card}'")
        if unbound_models(checker, training[0]):
            raise UsageError(f"{training[0].name} trains whichever model it is given: "
                             f"'cardc train MODEL.card --recipe {args.card}'")
        return lib, checker, training[0]
    model = find_card(lib, checker, args.card, args.name)
    found = procedures_for(lib, checker, model, training=True)
    if args.recipe:
        found = [a for a in found if Path(lib.file_of(a).path) == Path(args.recipe)]
        generic = [a for a in procedure_cards(lib, checker, [str(Path(args.recipe))])
                   if trains(checker, a) and unbound_models(checker, a)]
        if not found and generic:  # one that cannot run this model: say why, where
            bind_recipe(checker, generic[0], model)
    if args.recipe and not found:
        raise UsageError(f"{args.recipe} holds no training card for {model.label}")
    if not found:
        searched = ", ".join(shown_folders(lib.roots))
        raise UsageError(f"no training card trains {model.label}: none calls it, and no "
                         f"generic one (as LMTraining trains any card {{1..V}}^{{T}} → "
                         f"ℝ^{{T×V}}) fits it; searched {searched}")
    if unbound_models(checker, found[0]):
        bind_recipe(checker, found[0], model)
    require_clean(lib, checker, checker.diags, {lib.file_of(found[0]).path})
    return lib, checker, found[0]


def _recipe_values(args: argparse.Namespace, lib, checker, recipe):
    """The training card's hyperparameters (preset, flags, --set) and the model's overrides."""
    from .lower.values import card_names

    info = checker.info(recipe)
    names = card_names(info.sig)
    run_pairs = [p for p in args.set if canonical_name(p.partition("=")[0].strip()) in info.sig.run]
    overrides = _overrides([p for p in args.set if p not in run_pairs])
    flags = _set_flags(args.set)
    mine = {k: v for k, v in overrides.items() if k in names}  # the rest are the model's
    for flag, name in RECIPE_FLAGS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if name not in names and flag == "block_size":
            continue  # the harness cuts examples of this length for a card without ℓ
        if name not in names:
            raise UsageError(f"--{flag.replace('_', '-')} sets {name}, which {recipe.name} "
                             f"does not have; set its hyperparameters with --set NAME=VALUE")
        mine[name] = value
        flags[name] = f"--{flag.replace('_', '-')} {value}"
    values = _validated(lib, checker, recipe, args.preset, mine, flags)
    missing = [n for n in names if n not in values]
    if missing:
        raise UsageError(f"{recipe.name} needs {', '.join(missing)}: set it with --set NAME=VALUE")
    hypers = _typed(info.sig, names, values)
    run = _run_values(args, lib, info.sig, run_pairs)
    return hypers, {k: v for k, v in overrides.items() if k not in mine}, run


@dataclass(frozen=True)
class _RunValues:
    """The seed and the weights' number format of a run: the recipe's own (its `seed of every
    random draw` and `number format of θ` hyperparameters) or the harness's defaults."""

    seed: int = DEFAULT_SEED
    weights: str = "float32"


def _run_values(args: argparse.Namespace, lib, sig, pairs: list[str]) -> _RunValues:
    """--set NAME=VALUE of the recipe's seed and number formats, and --seed, which sets the
    recipe's seed when it has one."""
    from .presets import OverrideError, PresetError, find_preset, run_values

    given = {canonical_name(p.partition("=")[0].strip()): p.partition("=")[2] for p in pairs}
    flags = {canonical_name(p.partition("=")[0].strip()): f"--set {p}" for p in pairs}
    seed = next((n for n, v in sig.run.items() if v.seed), None)
    if args.seed is not None and seed is not None:
        if seed in given:
            raise UsageError(f"--seed {args.seed} and {flags[seed]} both set the seed: give one")
        given[seed], flags[seed] = str(args.seed), f"--seed {args.seed}"
    try:
        values = run_values(sig, find_preset(sig.alg, args.preset), given, flags)
    except PresetError as err:
        raise err.card_error(lib.diags.sources) from None
    except OverrideError as err:
        raise UsageError(str(err)) from None
    formats = [values[n] for n, v in sig.run.items() if v.of is not None and n in values]
    chosen = values.get(seed) if seed is not None else args.seed
    return _RunValues(DEFAULT_SEED if chosen is None else int(chosen),
                      str(formats[0]) if formats else "float32")


def cmd_sample(args: argparse.Namespace) -> int:
    """`cardc sample RUN`: each --prompt continued by the inference card the run recorded (or
    --card's)."""
    meta, model, device = _trained_model(args.dir, args.device)
    if args.card:
        _require_cards([args.card])
        return _sample_with_card(args, model, meta, device, args.card, None, echo=False)
    from .build import recorded_cards

    with recorded_cards(meta) as root:  # the inference card recorded when it was trained
        sampler = meta.get("sampler")
        card = str(root / sampler["card"]) if isinstance(sampler, dict) and "card" in sampler \
            else _generic_sampler(args.dir, meta)
        return _sample_with_card(args, model, meta, device, card, [str(root)], echo=True)


@dataclass(frozen=True)
class _Prompt:
    """One --prompt: as typed, and its token IDs; a prompt of integers is token IDs, and so is
    what is printed for it."""

    text: str
    ids: list[int]
    numeric: bool


def _read_prompt(tokenizer, prompt: str) -> _Prompt:
    words = prompt.split()
    if words and all(w.isdigit() for w in words):
        return _Prompt(prompt, [int(w) for w in words], True)
    return _Prompt(prompt, _prompt_ids(tokenizer, prompt)[1], False)


def _prompt_ids(tokenizer, prompt: str) -> tuple[str, list[int]]:
    """The prompt's text and token IDs; an empty prompt is a newline, as it always was."""
    ids = tokenizer.prompt(prompt)
    text = prompt if ids else "\n"
    ids = ids or tokenizer.prompt(text)
    if not ids:
        raise UsageError("the prompt is no tokens, and neither is a newline, for the run's "
                         "tokenizer; give another --prompt")
    return text, ids


def _generic_sampler(run: str, meta: dict) -> str:
    """The shipped library's sampling card, for a run that records none; said on stderr, so
    what samples is never a silent choice."""
    from .library import shipped_library

    found = [p for root in shipped_library() for p in sorted(root.rglob("*.card"))
             if "sampling" in p.stem]
    if not found:
        raise UsageError(f"{run} records no sampling card and the library has none; name one "
                         "with --card")
    print(f"note: {run} records no sampling card; sampling {meta.get('name')} with the "
          f"library's {_shown_path(str(found[0]))}", file=sys.stderr)
    return str(found[0])


def _trained_model(folder: str, device_name: str):
    """A run's metadata, and its model rebuilt from the checkpoint's cards with its weights, on
    the device asked for."""
    from .build import rebuild_model
    from .runtime.checkpoint import load_state
    from .runtime.train import resolve_device

    meta, state = _read_run(folder)
    try:
        model = rebuild_model(meta, stored=sum(t.numel() for t in state.values()))
    except ValueError as err:
        raise RuntimeInputError(f"{folder}: {err}") from None
    load_state(model, state)
    device = resolve_device(device_name)
    return meta, model.to(device), device


def _read_run(folder: str):
    """A checkpoint's metadata and tensors, from a folder that holds one run."""
    from .runtime.checkpoint import checkpoint_file, read_checkpoint
    from .runtime.runs import check_one_run, interrupted

    if not os.path.isfile(checkpoint_file(folder)):
        from .runtime.resume import latest

        saved = latest(folder) if os.path.isdir(folder) else None
        if saved is not None:
            raise RuntimeInputError(f"'{folder}' holds a run that has not finished; resume it "
                                    f"(cardc train … --resume {folder}), or read its newest "
                                    f"checkpoint, '{saved}'")
        if interrupted(folder):
            raise RuntimeInputError(f"'{folder}' holds no finished run: a run into it is under "
                                    "way or was stopped before it finished")
    meta, state = read_checkpoint(folder)
    check_one_run(folder, meta)
    return meta, state


def _trained_context(meta: dict) -> int | None:
    """The positions the run trained, which a sampler's window keeps within (None: all the
    model's, as for an imported checkpoint)."""
    context = meta.get("context")
    return context if isinstance(context, int) and not isinstance(context, bool) \
        and context >= 1 else None


def _vocabulary(checker, model_card, meta: dict) -> int | None:
    """The vocabulary of the model's token inputs at the run's sizes (None: not known)."""
    from .build import recorded_values

    sig = checker.info(model_card).sig
    env = recorded_values(meta.get("hyperparameters"), sig.hypers)
    for _, ty in sig.inputs:
        vocab = getattr(ty, "vocab", None)
        try:
            return int(vocab.evaluate(env)) if vocab is not None else None
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None
    return None


def _check_token_ids(ids: list[int], size: int | None) -> None:
    """Refuse token IDs outside the vocabulary of the model's token inputs (of `size`)."""
    bad = [i for i in ids if size is not None and i >= size]
    if bad:
        raise UsageError(f"the prompt's token ID {bad[0]} lies outside the model's "
                         f"vocabulary (IDs 0 to {size - 1})")


def _sample_with_card(args: argparse.Namespace, model, meta, device, card: str,
                      library: list[str] | None, echo: bool) -> int:
    """`cardc sample RUN --card cards/paper/dinference.card`: the inference card samples.

    --tokens, --temperature, --top-k and --top-p set the card's ℓ_gen, τ and the bounds of its
    top_k and top_p steps, and hyperparameters it shares with the model (its context, ctx)
    take the model's values; a prompt of integers is read as token IDs (the reversal task's),
    any other prompt as text the run's tokenizer encodes (UTF-8 bytes unless it keeps a
    tokenizer.json). `echo` prints a text prompt before the card's output."""
    from .build import procedure_function
    from .runtime.tokenizer import run_tokenizer

    if library is None and _generic(card):  # --card names a generic sampler: it needs the model
        from .build import recorded_cards

        with recorded_cards(meta) as root:
            return _sample_with_card(args, model, meta, device, card, [str(root)], echo)
    lib, checker, alg, window, runs_on = _sampling_card(args, meta, card, library)
    tokenizer = run_tokenizer(args.dir, meta)
    prompts = [_read_prompt(tokenizer, p) for p in args.prompt or ["\n"]]
    vocab = _vocabulary(checker, runs_on, meta) if runs_on is not None else None
    for p in prompts:
        _check_token_ids(p.ids, vocab)
    hypers = _sampling_values(args, lib, checker, alg, window, model, meta, prompts, vocab)
    stops = _stops(args.stop, prompts, tokenizer)
    outs = _run_batches(args, procedure_function(checker, alg), alg, model, device, hypers,
                        prompts, stops)
    for n, (p, out) in enumerate(zip(prompts, outs, strict=True), 1):
        if len(prompts) > 1:  # each continuation under a header of its own, as head(1) does
            print(("\n" if n > 1 else "") + f"==> prompt {n} <==")
        print(_shown_sample(p, out, tokenizer, stops, echo))
    return EXIT_OK


def _sampling_card(args: argparse.Namespace, meta: dict, card: str,
                   library: list[str] | None):
    """The inference card of `card`, checked, bound to the run's model: with the
    hyperparameter that bounds its model's input, if it states one, and that model's card."""
    from .build import called_model, checked, procedure_cards
    from .types import Ty

    lib, checker, _ = checked([card], library or _library(args, [card]))
    file = next(f.path for f in lib.files if Path(f.path) == Path(card))
    cards = [a for a in procedure_cards(lib, checker, [file])
             if isinstance(checker.info(a).sig.output, Ty)]
    if not cards:
        raise UsageError(f"{card} holds no inference card (one that is handed θ̂)")
    alg = cards[0]
    window = _bind_sampler(lib, checker, alg, meta, library)
    runs_on = called_model(checker, alg)
    callee = runs_on.name if runs_on else None
    if callee != meta.get("name"):
        raise UsageError(f"{alg.name} samples from {callee}, but {args.dir} holds "
                         f"{meta.get('name')}")
    return lib, checker, alg, window, runs_on


# --top-k K and --top-p P set the bound of the card's top_k(w | k) and top_p(w | p) steps
FILTER_FLAGS = {"top_k": "--top-k", "top_p": "--top-p"}


def _sampling_values(args: argparse.Namespace, lib, checker, alg, window: str | None, model,
                     meta: dict, prompts: list[_Prompt],
                     vocab: int | None) -> dict[str, int | float]:
    """The inference card's hyperparameters: the model's where it shares them, the flags',
    --set's, its first preset's; a top_k or top_p bound nothing sets keeps every token of
    the model's vocabulary (of `vocab`)."""
    from .build import filter_bounds
    from .info import PresetError, preset_values
    from .lower.values import card_names
    from .names import identifier

    info = checker.info(alg)
    declared = card_names(info.sig)
    shared = {n: meta["hyperparameters"][identifier(n)] for n in declared
              if identifier(n) in meta.get("hyperparameters", {})}
    if window is not None:  # the longest input the card states M is handed
        limits = [n for n in (getattr(model, "max_seq_len", None), _trained_context(meta))
                  if isinstance(n, int) and n > 0]  # positions the run never trained are noise
        shared[window] = min(limits) if limits else \
            max(len(p.ids) for p in prompts) + args.tokens
    bounds = filter_bounds(checker, alg)
    given = {**shared, "ℓ_gen": args.tokens, "τ": args.temperature,
             **_filter_flags(args, alg, bounds), **_overrides(args.set)}
    preset = alg.presets[0].name if alg.presets else None  # the card's own defaults, if any
    try:
        # τ = 0 is the limit τ → 0 the sampler implements (arg-max), so intervals are not
        # enforced here; --temperature is never negative
        values = preset_values(info.sig, preset, {n: v for n, v in given.items() if n in declared})
    except PresetError as err:
        raise err.card_error(lib.diags.sources) from None
    _filter_values(values, bounds, vocab)
    missing = [n for n in declared if n not in values]
    if missing:
        raise UsageError(f"{alg.name} needs {', '.join(missing)}: set it with --set NAME=VALUE")
    return _typed(info.sig, declared, values)


def _filter_flags(args: argparse.Namespace, alg, bounds: dict[str, str]) -> dict[str, float]:
    """--top-k and --top-p by the hyperparameter they set; refused for a card without the step."""
    from .checker import FILTERS

    out = {}
    for func, flag in FILTER_FLAGS.items():
        value = getattr(args, func)
        if value is None:
            continue
        if func not in bounds:
            bound = FILTERS[func][0]
            raise UsageError(f"{flag} sets {bound} in a step {func}(w | {bound}) of the sampling "
                             f"card, and {alg.name} has none; sample with a card that has one, "
                             "as cardc's recipes/lm_sampling.card")
        out[bounds[func]] = value
    return out


def _filter_values(values: dict, bounds: dict[str, str], vocab: int | None) -> None:
    """The bounds of top_k and top_p: unset, k = V and p = 1 keep every token (any k ≥ V does,
    where V is not known); k ≥ 1, p in (0, 1]."""
    from .spelling import display

    for func, name in bounds.items():
        if name not in values:
            values[name] = (vocab or sys.maxsize) if func == "top_k" else 1.0
        value = values[name]
        if func == "top_k" and value < 1:
            raise UsageError(f"{display(name)} = {value:g}: top_k keeps at least one token")
        if func == "top_p" and not 0 < value <= 1:
            raise UsageError(f"{display(name)} = {value:g}: the mass of top_p lies in (0, 1]")


def _stops(texts: list[str], prompts: list[_Prompt], tokenizer) -> dict:
    """--stop, by the kind of prompt it stops (numeric or not): texts where a text prompt's
    continuation ends; for prompts of token IDs, runs of token IDs."""
    from .runtime.sample import Stops

    if any(not t for t in texts):
        raise UsageError("--stop needs a text to stop at, not an empty one")
    if not texts:
        return {}
    out = {False: Stops.texts(texts, tokenizer.decode)}
    if any(p.numeric for p in prompts):
        runs = [t.split() for t in texts]
        if not all(run and all(w.isdigit() for w in run) for run in runs):
            raise UsageError("a prompt of token IDs stops at token IDs: give each --stop as "
                             "integers separated by spaces")
        out[True] = Stops.token_ids([[int(w) for w in run] for run in runs])
    return out


def _run_batches(args: argparse.Namespace, fn, alg, model, device, hypers: dict,
                 prompts: list[_Prompt], stops: dict) -> list[list[int]]:
    """Each prompt's output: prompts of one length (and kind) as one batch, one forward per
    token for all of them; each batch drawn from --seed afresh."""
    import inspect

    import torch

    if stops and "stop" not in inspect.signature(fn).parameters:
        raise UsageError(f"{alg.name} draws no token in a loop: --stop has nothing to stop")
    batches: dict[tuple[bool, int], list[int]] = {}
    for n, p in enumerate(prompts):
        batches.setdefault((p.numeric, len(p.ids)), []).append(n)
    outs: list[list[int]] = [[] for _ in prompts]
    model.eval()
    for (numeric, _), rows in batches.items():
        x = torch.tensor([prompts[n].ids for n in rows], dtype=torch.long, device=device)
        watch = {"stop": stops[numeric].watch(len(rows))} if stops else {}
        torch.manual_seed(args.seed)
        with torch.inference_mode():  # as generate(): no autograd bookkeeping per decoded token
            try:
                out = fn(x, model, **hypers, **watch)
            except ValueError as err:  # the model's positions ran out before the card stopped
                raise RuntimeInputError(f"{alg.name} did not finish: {err}") from None
        for row, n in enumerate(rows):
            outs[n] = out[row].tolist()
    return outs


def _shown_sample(prompt: _Prompt, out: list[int], tokenizer, stops: dict, echo: bool) -> str:
    """What is printed for a prompt: token IDs for token IDs, else the text prompt (`echo`)
    and its continuation decoded; either up to the first --stop."""
    from .runtime.sample import ids_text
    from .runtime.tokenizer import continuation

    stop = stops.get(prompt.numeric)
    if prompt.numeric:
        text = ids_text(out)
        return (stop.cut(text) if stop is not None else text).strip()
    text = continuation(tokenizer, prompt.ids, out)
    return (prompt.text if echo else "") + (stop.cut(text) if stop is not None else text)


def _generic(card: str) -> bool:
    """Whether a card file holds a recipe that takes its model as a hyperparameter (read off
    its text, before the library is loaded)."""
    from . import syntax as s
    from .parser import parse_file

    parsed = parse_file(Path(card), Diagnostics())
    return any(isinstance(d.type, s.CardType) for a in parsed.algorithms
               for d in a.decls("Hyperparameters") if isinstance(d, s.Decl))


def _bind_sampler(lib, checker, alg, meta: dict, library: list[str] | None) -> str | None:
    """Bind a generic sampler's model to the checkpoint's card (recorded under `library`);
    the hyperparameter that bounds the model's input, if the card states one."""
    from .build import bind_recipe, unbound_models

    names = unbound_models(checker, alg)
    if names:
        path = Path(library[0]) / str(meta.get("card")) if library else None
        model = next((a for f in lib.files if path is not None and Path(f.path) == path
                      for a in f.algorithms if a.label == meta.get("name")), None)
        if model is None:
            raise UsageError(f"{alg.name} samples whichever model it is given, and the run "
                             "records no card of its model")
        bind_recipe(checker, alg, model)
    return next((m.window for m in checker.info(alg).sig.models.values()), None)


def cmd_eval(args: argparse.Namespace) -> int:
    """`cardc eval RUN`: a causal language model's held-out next-token loss and perplexity."""
    from .runtime.evaluate import eval_tokens, held_out_loss
    from .runtime.train import predicts_next_token

    meta, model, device = _trained_model(args.dir, args.device)
    if not predicts_next_token(model):
        raise UsageError(f"{meta.get('name')} is not a causal language model: eval measures "
                         "the loss of predicting each next token")
    tokens, source = eval_tokens(args.dir, meta, args.data)
    loss, drawn = held_out_loss(model, meta, tokens, args.batches, device)
    print(f"{args.dir}: loss {loss:.4f}, perplexity {math.exp(loss):.4f} on {source} "
          f"({drawn})")
    return EXIT_OK


def cmd_prepare(args: argparse.Namespace) -> int:
    """`cardc prepare INPUT… --out DIR`: text tokenised once into a data folder."""
    from .runtime.prepare import prepare
    from .runtime.tokenizer import parse_spec

    try:
        parse_spec(args.tokenizer)
    except ValueError as err:
        raise UsageError(str(err)) from None
    # `kill` ends it as Ctrl-C does: its staging folder is removed, the previous folder stays
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    prepare(args.inputs, args.out, args.tokenizer, args.val_fraction)
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    from .interop import import_checkpoint

    _require_cards([args.card])
    model, path = import_checkpoint(args.card, args.source, args.out, args.preset,
                                    _overrides(args.set), args.name, _library(args, [args.card]))
    params = sum(p.numel() for p in model.parameters())
    tokenizer = Path(args.out) / "tokenizer.json"
    said = f" and {tokenizer}" if tokenizer.is_file() else \
        " (the source has no tokenizer: prompts are read as bytes)"
    print(f"imported {args.source} as {model.card_meta['name']} ({params:,} parameters); "
          f"wrote {path}{said}")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from .interop import export_hf

    mapping, dest = export_hf(args.dir, args.to, args.library or ["cards"])
    print(f"exported {args.dir} as {mapping.architecture}; wrote {dest}/")
    return EXIT_OK


def _typed(sig, names: list[str], values: dict[str, float]) -> dict[str, int | float]:
    """Hyperparameter values by Python name, whole numbers for ℕ: a generated function's
    keyword arguments."""
    from .names import identifier

    return {identifier(n): int(values[n]) if sig.hypers[n].elem == "ℕ" else float(values[n])
            for n in names}


def _set_flags(pairs: list[str]) -> dict[str, str]:
    """Each `--set NAME=VALUE` as typed, by the name it sets: errors name the flag."""
    return {pair.partition("=")[0].strip(): f"--set {pair}" for pair in pairs}


def _validated(lib, checker, alg, preset: str | None, overrides: dict[str, float],
               flags: dict[str, str]) -> dict:
    """A card's values at a preset and the command line's overrides, checked through every card
    it calls; a bad value ends in one message naming its flag (or its preset line), and a
    value that follows a flag's (a warm-up scaled with the run) is said on a line of its own."""
    from .presets import PresetError, validate

    notices: list[str] = []
    try:
        values = validate(checker, alg, preset, overrides, flags, notices=notices)
    except PresetError as err:
        raise err.card_error(lib.diags.sources) from None
    for notice in notices:
        print(f"note: {notice}")
    return values


def _overrides(pairs: list[str]) -> dict[str, float]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            out[name.strip()] = float(value) if sep else float("nan")
        except ValueError:
            raise UsageError(f"expected NAME=NUMBER, got '{pair}'") from None
        if not sep:
            raise UsageError(f"expected NAME=NUMBER, got '{pair}'")
    return out


# ------------------------------------------------------------------ entry point


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="cardc", description="Check, render and compile algorithm cards.")
    p.add_argument("--version", action="version", version=f"cardc {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("check", help="report errors in cards (exit 1 on any)")
    c.add_argument("paths", nargs="+", help="card files or folders")
    c.add_argument("-q", "--quiet", action="store_true", help="print nothing when all is well")
    c.set_defaults(run=cmd_check)

    f = sub.add_parser("fmt", help="rewrite cards in canonical form")
    f.add_argument("paths", nargs="+", help="card files or folders")
    f.add_argument("--check", action="store_true", help="report, do not rewrite; exit 1 if any would change")
    f.set_defaults(run=cmd_fmt)

    r = sub.add_parser("render", help="print cards as pseudocode")
    r.add_argument("paths", nargs="+", help="card files or folders")
    r.add_argument("--to", default="text", choices=["text", "latex", "html", "md"],
                   help="the output format")
    r.add_argument("--standalone", action="store_true",
                   help="with --to latex: a whole document pdflatex compiles (default: the "
                        "algorithms only, for a document whose preamble has "
                        "cardc.render.latex.PREAMBLE)")
    r.set_defaults(run=cmd_render)

    i = sub.add_parser("info", help="hyperparameters, parameters, FLOPs and memory at a preset")
    i.add_argument("card", help="a card file")
    i.add_argument("--preset", help="the card's preset to evaluate (default: none, the card's "
                                    "own defaults and --set)")
    i.add_argument("--name", help="which card of the file (default: the first)")
    i.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="set a hyperparameter; repeat for more (default: none)")
    i.add_argument("--seq", type=_count(1, 2**31), help="sequence length for FLOPs per token and "
                                                 "activation memory (default: a formula in it)")
    i.add_argument("--batch", type=_count(1, 2**31), default=1,
                   help="sequences per batch for activation memory (default: 1)")
    i.set_defaults(run=cmd_info)

    d = sub.add_parser("diff", help="how two cards' architectures differ, step by step")
    d.add_argument("a", help="a card file")
    d.add_argument("b", help="the card file to compare it with")
    d.add_argument("--name-a", help="which card of the first file (default: its model card)")
    d.add_argument("--name-b", help="which card of the second file (default: its model card)")
    d.set_defaults(run=cmd_diff)

    b = sub.add_parser("build", help="generate PyTorch modules for the model cards")
    b.add_argument("paths", nargs="*", default=["cards"], help="card files or folders (default: cards)")
    b.add_argument("--out", default="generated", help="output folder")
    b.add_argument("--check", action="store_true", help="write nothing; exit 1 if any module is out of date")
    b.set_defaults(run=cmd_build)

    dc = sub.add_parser("docs", help="a static site of the cards: pseudocode, generated code, "
                                     "presets, callers and diffs")
    dc.add_argument("paths", nargs="*", default=["cards"],
                    help="card files or folders (default: cards)")
    dc.add_argument("--out", default="site", help="output folder, replaced whole (default: site)")
    dc.set_defaults(run=cmd_docs)

    t = sub.add_parser("train", help="train a model card from scratch")
    t.add_argument("card", help="a model card file, or a training card file")
    t.add_argument("--preset", help="the preset of the model and of its training card "
                                    "(default: none)")
    t.add_argument("--name", help="which card of the file (default: its model card)")
    t.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="set a hyperparameter of the model or the training card; repeat for "
                        "more (default: none)")
    t.add_argument("--recipe", help="the training card to run (default: the library's card "
                                    "that trains the model)")
    t.add_argument("--steps", type=int, help="updates: the training card's N_steps "
                                             "(default: the preset's)")
    t.add_argument("--examples", type=int, default=2000,
                   help="examples in the dataset of a card that visits them one at a time")
    t.add_argument("--out", help="run folder, replaced when the run finishes "
                                 "(default: runs/CARD-PRESET)")
    t.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where to train (auto: cuda if there is one)")
    t.add_argument("--data", help="a text file to train on, or a data folder cardc prepare "
                                  "wrote (default: the embedded corpus)")
    t.add_argument("--batch-size", type=int, help="the training card's minibatch size B "
                                                  "(default: the preset's)")
    t.add_argument("--block-size", type=int,
                   help="tokens per training sequence: the training card's ℓ (default: the "
                        "preset's, else 128)")
    t.add_argument("--lr", type=_finite(0, inclusive=False),
                   help="the training card's (peak) learning rate η (default: the preset's)")
    t.add_argument("--eval-every", type=int, default=100,
                   help="updates between held-out evaluations")
    t.add_argument("--seed", type=_count(0, 2**63 - 1),
                   help="seed of every random draw: the recipe's seed hyperparameter when it "
                        f"has one (default: the recipe's, else {DEFAULT_SEED})")
    t.add_argument("--compile", action="store_true", help="torch.compile the model")
    t.add_argument("--tensorboard", action="store_true",
                   help="also write the records as TensorBoard scalars, in the run folder's tb/ "
                        "(needs the tensorboard package)")
    t.add_argument("--pad-vocab", action="store_true",
                   help="round the model's vocabulary size up to a multiple of 64 (faster "
                        "matmuls; 50257 → 50304 for GPT-2)")
    t.add_argument("--tokenizer", metavar="SPEC",
                   help="how text becomes tokens: 'bytes' (256 IDs, one per byte) or 'bpe:N' (a "
                        "byte-level BPE of N tokens trained on the training split, which sets "
                        "the model's vocabulary size and is kept as tokenizer.json in the run); "
                        "a resumed run keeps its own (default: bytes)")
    t.add_argument("--resume", metavar="RUN",
                   help="go on with a stopped run from its newest checkpoint, in its folder, "
                        "exactly as if it had not stopped (give the command that started it)")
    t.add_argument("--finetune", metavar="CHECKPOINT",
                   help="start a new run from the weights of a checkpoint (a run, one of its "
                        "checkpoints/, or a cardc import) with a fresh optimizer and schedule")
    t.add_argument("--save-every", type=_count(0, 2**31), default=500, metavar="N",
                   help="updates between checkpoints in the run's checkpoints/; a run also "
                        "saves one when SIGINT (Ctrl-C) or SIGTERM stops it (0: only then; "
                        "default: 500)")
    t.add_argument("--fsdp", action="store_true",
                   help="under torchrun: shard the parameters, gradients and optimizer state "
                        "over the processes (torch's FSDP) instead of replicating the model, "
                        "for a model that does not fit one device")
    t.add_argument("--keep-checkpoints", type=_count(1, 2**31), default=2, metavar="K",
                   help="the newest checkpoints kept (default: 2)")
    t.set_defaults(run=cmd_train)

    sa = sub.add_parser("sample", help="continue prompts with a trained checkpoint, by its "
                                       "inference card")
    sa.add_argument("dir", help="a run folder (or its model.safetensors)")
    sa.add_argument("--prompt", action="append", metavar="TEXT",
                    help="text to continue, or token IDs separated by spaces; repeat for more, "
                         "each printed under '==> prompt N <=='. Prompts of the same length in "
                         "tokens run as one batch (one forward per token for all), others as "
                         "batches of their own; each batch draws from --seed afresh, so a "
                         "prompt of a length of its own, and any prompt at temperature 0, "
                         "continues as it would alone, while the rows of a batch share one "
                         "random stream (default: a newline)")
    sa.add_argument("--tokens", type=_count(1, MAX_TOKENS), default=200,
                    help="tokens to add")
    sa.add_argument("--temperature", type=_finite(0), default=0.8,
                    help="sampling temperature; 0 picks the most probable token")
    sa.add_argument("--top-k", type=_count(1), metavar="K",
                    help="sample among the K most probable tokens (ties with the K-th too): "
                         "sets k of the card's step top_k(w | k) (default: the vocabulary's "
                         "size, every token)")
    sa.add_argument("--top-p", type=_unit(one=True), metavar="P",
                    help="sample among the fewest most probable tokens whose probabilities sum "
                         "to P or more (nucleus sampling, 0 < P <= 1): sets p of the card's "
                         "step top_p(w | p) (default: 1, every token)")
    sa.add_argument("--stop", action="append", default=[], metavar="TEXT",
                    help="end a continuation before the first TEXT it holds (token IDs "
                         "separated by spaces, for a prompt of token IDs); repeat for more. "
                         "Decoding ends once every prompt of a batch has stopped (default: "
                         "none)")
    sa.add_argument("--seed", type=_count(0, 2**63 - 1), default=1337,
                    help="seed of the sampling")
    sa.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="where to run (auto: cuda if there is one)")
    sa.add_argument("--card", help="an inference card to sample with, as DInference or "
                                   "EDInference (default: the one the run recorded)")
    sa.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a hyperparameter of the inference card; repeat for more "
                         "(default: none)")
    sa.set_defaults(run=cmd_sample)

    ev = sub.add_parser("eval", help="held-out next-token loss and perplexity of a trained "
                                     "causal language model")
    ev.add_argument("dir", help="a run folder (or its model.safetensors)")
    ev.add_argument("--data", help="a text file to measure, whole, or a prepared data folder, "
                                   "its held-out tokens (default: the held-out split of the "
                                   "run's training corpus)")
    ev.add_argument("--batches", type=_count(1, 100_000),
                    help="minibatches of random windows to average over (default: as many as "
                         "the run's evaluations, 20 for an imported checkpoint)")
    ev.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="where to run (auto: cuda if there is one)")
    ev.set_defaults(run=cmd_eval)

    pr = sub.add_parser("prepare", help="tokenise text once into a data folder that cardc "
                                        "train --data reads")
    pr.add_argument("inputs", nargs="+", metavar="INPUT",
                    help="text files, folders of them (every file below, hidden ones aside), "
                         "and .jsonl files (a JSON object with a 'text' field a line)")
    pr.add_argument("--out", required=True, metavar="DIR",
                    help="the data folder to write (train.bin, val.bin, meta.json), replaced "
                         "whole")
    pr.add_argument("--tokenizer", default="bytes", metavar="SPEC",
                    help="'bytes' (256 IDs, one per byte) or 'bpe:N' (a byte-level BPE of N "
                         "tokens trained on the training part, kept as tokenizer.json)")
    pr.add_argument("--val-fraction", type=_unit(one=False), default=0.1, metavar="F",
                    help="the share of the text held out for evaluation, from its end")
    pr.set_defaults(run=cmd_prepare)

    im = sub.add_parser("import", help="a Hugging Face checkpoint as a cardc checkpoint")
    im.add_argument("card", help="the card file of the model")
    im.add_argument("--preset", help="hyperparameters (default: from the source's config.json)")
    im.add_argument("--name", help="which card of the file (default: the one whose mapping "
                                   "fits the source's config.json)")
    im.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="set a hyperparameter; repeat for more (default: none)")
    im.add_argument("--from", dest="source", required=True, metavar="PATH",
                    help="a Hugging Face model folder or its model.safetensors")
    im.add_argument("--out", required=True, metavar="DIR", help="the cardc run folder to write")
    im.set_defaults(run=cmd_import)

    ex = sub.add_parser("export", help="a cardc checkpoint as a Hugging Face model folder")
    ex.add_argument("dir", help="a run folder (or its model.safetensors)")
    ex.add_argument("--to", required=True, metavar="PATH", help="the folder to write")
    ex.add_argument("--library", action="append", help="where to find the mapping of a "
                    "trained checkpoint, <card>.hf.json beside its card; repeat for more "
                    "(default: cards)")
    ex.set_defaults(run=cmd_export)

    for sp in (c, r, i, b, dc, d, t, sa, im):
        sp.add_argument("--library", action="append", metavar="PATH",
                        help="a folder of cards that calls resolve against after the card's own "
                             "folder and those above it, before the library cardc ships; "
                             "repeat for more (default: ./cards)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except UsageError as err:
        print(f"cardc: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except CardError as err:
        return _report(err.diagnostics) or EXIT_ERROR
    except (RuntimeInputError, ValueError) as err:
        print(f"cardc: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as err:  # a file that cannot be read or written, named by the system
        where = f": '{err.filename}'" if err.filename else ""
        print(f"cardc: error: {err.strerror or err}{where}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("cardc: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a last resort: one line, never a traceback
        print(f"cardc: internal error: {type(err).__name__}: {err} (please report this, with "
              "the command that caused it)", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
