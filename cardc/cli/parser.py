"""The command line's grammar: one argparse subparser per verb, each built by a function of
its own, and the argument types that refuse a bad number with one line. Which function runs
a verb is handed in (`commands`), so the parser knows no verb's code."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping

from .. import __version__
from ..app.inputs import DEFAULT_SEED
from .common import EXIT_USAGE
from .sampling import MAX_TOKENS

Command = Callable[[argparse.Namespace], int]


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


def _count(least: int, most: int | None = None) -> Callable[[str], int]:
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


def _finite(least: float, inclusive: bool = True) -> Callable[[str], float]:
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


def build_parser(commands: Mapping[str, Command]) -> argparse.ArgumentParser:
    """The `cardc` parser; each verb's namespace has `run`, its function in `commands`."""
    p = _Parser(prog="cardc", description="Check, render and compile algorithm cards.")
    p.add_argument("--version", action="version", version=f"cardc {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    with_library = [*_source_verbs(sub), _train(sub), _sample(sub)]
    _eval(sub)
    _prepare(sub)
    with_library.append(_import(sub))
    _export(sub)
    sub.add_parser("lsp", help="a language server for editors, over stdin and stdout: "
                               "diagnostics, hover, definitions, completion, formatting")
    for sp in with_library:
        sp.add_argument("--library", action="append", metavar="PATH",
                        help="a folder of cards that calls resolve against after the card's own "
                             "folder and those above it, before the library cardc ships; "
                             "repeat for more (default: ./cards)")
    for name, sp in sub.choices.items():
        sp.set_defaults(run=commands[name])
    return p


def _source_verbs(sub) -> list[argparse.ArgumentParser]:
    """check, fmt, render, info, diff, build and docs; those that take --library."""
    c = sub.add_parser("check", help="report errors in cards (exit 1 on any)")
    c.add_argument("paths", nargs="+", help="card files or folders")
    c.add_argument("-q", "--quiet", action="store_true", help="print nothing when all is well")

    f = sub.add_parser("fmt", help="rewrite cards in canonical form")
    f.add_argument("paths", nargs="+", help="card files or folders")
    f.add_argument("--check", action="store_true", help="report, do not rewrite; exit 1 if any would change")

    r = sub.add_parser("render", help="print cards as pseudocode")
    r.add_argument("paths", nargs="+", help="card files or folders")
    r.add_argument("--to", default="text", choices=["text", "latex", "html", "md"],
                   help="the output format")
    r.add_argument("--standalone", action="store_true",
                   help="with --to latex: a whole document pdflatex compiles (default: the "
                        "algorithms only, for a document whose preamble has "
                        "cardc.render.latex.PREAMBLE)")
    return [c, r, _info(sub), _diff(sub), _build(sub), _docs(sub)]  # in the order of --help


def _info(sub) -> argparse.ArgumentParser:
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
    return i


def _diff(sub) -> argparse.ArgumentParser:
    d = sub.add_parser("diff", help="how two cards' architectures differ, step by step")
    d.add_argument("a", help="a card file")
    d.add_argument("b", help="the card file to compare it with")
    d.add_argument("--name-a", help="which card of the first file (default: its model card)")
    d.add_argument("--name-b", help="which card of the second file (default: its model card)")
    d.add_argument("--to", default="text", choices=["text", "html"],
                   help="the output format: text, or an HTML page of both cards' pseudocode "
                        "with the steps that differ boxed (default: text)")
    return d


def _build(sub) -> argparse.ArgumentParser:
    b = sub.add_parser("build", help="generate PyTorch modules for the model cards")
    b.add_argument("paths", nargs="*", default=["cards"], help="card files or folders (default: cards)")
    b.add_argument("--out", default="generated", help="output folder")
    b.add_argument("--check", action="store_true", help="write nothing; exit 1 if any module is out of date")
    return b


def _docs(sub) -> argparse.ArgumentParser:
    dc = sub.add_parser("docs", help="a static site of the cards: pseudocode, generated code, "
                                     "presets, callers and diffs")
    dc.add_argument("paths", nargs="*", default=["cards"],
                    help="card files or folders (default: cards)")
    dc.add_argument("--out", default="site", help="output folder, replaced whole (default: site)")
    return dc


def _train(sub) -> argparse.ArgumentParser:
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
    t.add_argument("--precision", choices=("bf16", "float32"), default="bf16",
                   help="on CUDA, the forward and loss under bf16 autocast over float32 weights "
                        "(default), or all in float32; the CPU computes in float32 either way")
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
    _run_flags(t)
    return t


def _run_flags(t: argparse.ArgumentParser) -> None:
    """`train`'s flags for where a run starts and how it saves: resume, fine-tune, checkpoints,
    sharding."""
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


def _sample(sub) -> argparse.ArgumentParser:
    sa = sub.add_parser("sample", help="continue prompts with a trained checkpoint, by its "
                                       "inference card")
    sa.add_argument("dir", help="a run folder (or its model.safetensors)")
    sa.add_argument("--prompt", action="append", metavar="TEXT",
                    help="text to continue, or token IDs separated by spaces; repeat for more, "
                         "each printed under '==> prompt N <=='. Prompts of the same length in "
                         "tokens run as one batch (one forward per token for all), others as "
                         "batches of their own; the batches draw in turn from one random "
                         "stream seeded with --seed, so each prompt's continuation is a draw "
                         "of its own, the same for the same command; at temperature 0 each "
                         "continues as it would alone (default: a newline)")
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
    return sa


def _eval(sub) -> None:
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


def _prepare(sub) -> None:
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


def _import(sub) -> argparse.ArgumentParser:
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
    return im


def _export(sub) -> None:
    ex = sub.add_parser("export", help="a cardc checkpoint as a Hugging Face model folder")
    ex.add_argument("dir", help="a run folder (or its model.safetensors)")
    ex.add_argument("--to", required=True, metavar="PATH", help="the folder to write")
    ex.add_argument("--library", action="append", help="where to find the mapping of a "
                    "trained checkpoint, <card>.hf.json beside its card; repeat for more "
                    "(default: cards)")
    ex.add_argument("--mapping", metavar="FILE",
                    help="the mapping file to export by (default: the one an import recorded, "
                         "else <card>.hf.json beside the card the run was trained from, else "
                         "beside its card under --library)")
