"""The verbs that train and measure models: train (with --resume and --finetune), prepare and
eval. A thin layer over `cardc.app.training`; torch is imported when one of them runs."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import sys

from ..app.inputs import UsageError
from .common import EXIT_OK

# train's flags that are TrainOptions fields of the same name
FLAGS = ("preset", "name", "recipe", "steps", "examples", "out", "device", "data", "batch_size",
         "block_size", "lr", "eval_every", "seed", "compile", "tensorboard", "pad_vocab",
         "tokenizer", "resume", "finetune", "save_every", "fsdp", "keep_checkpoints",
         "precision")


def cmd_train(args: argparse.Namespace) -> int:
    """`cardc train MODEL.card` runs the training card that trains the model (its recipe);
    `cardc train TRAINING.card` runs that card on the model it calls."""
    from ..app.training import TrainOptions, run_folder, train_with
    from ..runtime.distributed import world_from_env
    from ..runtime.train import Stopped

    if not world_from_env().main:  # rank 0 alone speaks; every process reports its errors
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
    flags = {f: getattr(args, f) for f in FLAGS}
    options = TrainOptions(
        card=args.card, overrides=tuple(args.set), **flags,
        library=tuple(args.library) if args.library is not None else None)
    try:
        train_with(options, _exit_on_sigterm)
    except Stopped as stop:
        print(f"cardc: {stop}; saved {stop.checkpoint}\nresume with: "
              f"{_resume_command(run_folder(options))}", file=sys.stderr)
        return 128 + stop.signum
    return EXIT_OK


def _exit_on_sigterm() -> None:
    """`kill` ends a run as Ctrl-C does: its staging folder is removed, the previous run
    stays."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def _resume_command(out: str) -> str:
    """This command line again, resuming the run in `out`."""
    argv = sys.argv[1:]
    if "--resume" in argv or any(a.startswith("--resume=") for a in argv):
        return shlex.join(["cardc", *argv])
    return shlex.join(["cardc", *argv, "--resume", out])


def cmd_eval(args: argparse.Namespace) -> int:
    """`cardc eval RUN`: a causal language model's held-out next-token loss and perplexity."""
    from ..app.runs import trained_model
    from ..runtime.evaluate import eval_tokens, held_out_loss
    from ..runtime.train import predicts_next_token

    meta, model, device = trained_model(args.dir, args.device)
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
    from ..runtime.prepare import prepare
    from ..runtime.tokenizer import parse_spec

    try:
        parse_spec(args.tokenizer)
    except ValueError as err:
        raise UsageError(str(err)) from None
    _exit_on_sigterm()  # the previous folder stays
    prepare(args.inputs, args.out, args.tokenizer, args.val_fraction)
    return EXIT_OK
