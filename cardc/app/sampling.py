"""Sampling from a run as `cardc sample` does: the inference card (the one the run recorded,
or the one named) bound to the run's model, its hyperparameters, the prompts read with the
run's tokenizer and run in batches of one length, and what is shown of each continuation.
`sample` is `cardc.sample`."""

from __future__ import annotations

import inspect
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import build  # called through the module, which tests may patch
from .. import syntax as s
from ..checker import FILTERS
from ..diagnostics import Diagnostics
from ..info import PresetError, preset_values
from ..library import shipped_library
from ..lower.values import card_names
from ..names import identifier
from ..parser import parse_file
from ..runtime.errors import RuntimeInputError
from ..runtime.sample import Stops, ids_text
from ..runtime.tokenizer import ByteTokenizer, Tokenizer, continuation, run_tokenizer
from ..spelling import display
from ..types import Ty
from .inputs import (
    Overrides,
    UsageError,
    library_folders,
    parse_overrides,
    require_cards,
    set_pairs,
    shown_path,
    typed,
)
from .runs import trained_context, trained_model

# top_k and top_p set the bound of the card's top_k(w | k) and top_p(w | p) steps
FILTER_FLAGS = {"top_k": "--top-k", "top_p": "--top-p"}


@dataclass(frozen=True)
class SampleOptions:
    """Everything `sample` is asked, as `cardc sample`'s flags spell it (see `sample`)."""

    dir: str
    prompt: tuple[str, ...] = ()
    tokens: int = 200
    temperature: float = 0.8
    top_k: int | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int = 1337
    device: str = "auto"
    card: str | None = None
    overrides: tuple[str, ...] = ()  # NAME=VALUE, as --set
    library: tuple[str, ...] | None = None


def sample(run: str | os.PathLike[str], *, prompt: str | Sequence[str] | None = None,
           tokens: int = 200, temperature: float = 0.8, top_k: int | None = None,
           top_p: float | None = None, stop: Sequence[str] = (), seed: int = 1337,
           device: str = "auto", card: str | None = None, overrides: Overrides = (),
           library: Sequence[str] | None = None) -> list[str]:
    """Continue each prompt with a trained run, as `cardc sample RUN` does; what it prints for
    each prompt, in order.

    `run` is a run folder (or its model.safetensors). A prompt of integers separated by spaces
    is token IDs (and so is its output), any other text the run's tokenizer encodes (default:
    one newline). The inference card is the one the run recorded, or `card`'s: `tokens`,
    `temperature`, `top_k` and `top_p` set its ℓ_gen, τ and the bounds of its top_k and top_p
    steps, `overrides` ({name: value}, or "NAME=VALUE" strings as --set) any hyperparameter
    of it. A continuation ends before the first of `stop`'s texts. Prompts of one length run as
    one batch; the batches draw in turn from one random stream seeded with `seed`, so each
    prompt's continuation is a draw of its own, the same for the same call.

    Bad arguments raise `UsageError`, bad cards `CardError`, bad files `RuntimeInputError`."""
    prompts = [prompt] if isinstance(prompt, str) else list(prompt or [])
    return sample_with(SampleOptions(
        dir=str(run), prompt=tuple(prompts), tokens=tokens, temperature=temperature,
        top_k=top_k, top_p=top_p, stop=tuple(stop), seed=seed, device=device, card=card,
        overrides=tuple(set_pairs(overrides)),
        library=tuple(library) if library is not None else None))


def sample_with(o: SampleOptions) -> list[str]:
    """`sample`, from its options."""
    _check_options(o)
    meta, model, device = trained_model(o.dir, o.device)
    _note_recomputing(model, meta)
    if o.card:
        require_cards([o.card])
        return _sample_with_card(o, model, meta, device, o.card, None, echo=False)
    with build.recorded_cards(meta) as root:  # the inference card recorded when it was trained
        sampler = meta.get("sampler")
        card = str(root / sampler["card"]) if isinstance(sampler, dict) and "card" in sampler \
            else _generic_sampler(o.dir, meta)
        return _sample_with_card(o, model, meta, device, card, [str(root)], echo=True)


def _note_recomputing(model: torch.nn.Module, meta: dict) -> None:
    """Say so where the run's model decodes without a KV cache (its lowering proved none for
    some attention, cardc.lower.analysis): each token then recomputes its whole context. The
    model rebuilt from the run's cards says so, not the metadata beside them."""
    if not model.analysis.decodes:
        print(f"note: {meta.get('name', 'the model')} decodes without a KV cache: each token "
              "recomputes every position of its context", file=sys.stderr)


def _check_options(o: SampleOptions) -> None:
    """The counts and bounds `cardc sample`'s flags take, for a caller that gives no flags."""
    if o.tokens < 1:
        raise UsageError(f"tokens: must be >= 1, got {o.tokens}")
    if not (math.isfinite(o.temperature) and o.temperature >= 0):
        raise UsageError(f"temperature: must be a finite number >= 0, got {o.temperature}")
    if o.top_k is not None and o.top_k < 1:
        raise UsageError(f"top_k: must be >= 1, got {o.top_k}")
    if o.top_p is not None and not 0 < o.top_p <= 1:
        raise UsageError(f"top_p: must be a number in (0, 1], got {o.top_p}")


@dataclass(frozen=True)
class _Prompt:
    """One prompt: as typed, and its token IDs; a prompt of integers is token IDs, and so is
    what is printed for it."""

    text: str
    ids: list[int]
    numeric: bool


def _read_prompt(tokenizer: Tokenizer, prompt: str) -> _Prompt:
    words = prompt.split()
    if words and all(w.isdigit() for w in words):
        return _Prompt(prompt, [int(w) for w in words], True)
    return _Prompt(prompt, _prompt_ids(tokenizer, prompt)[1], False)


def _prompt_ids(tokenizer: Tokenizer, prompt: str) -> tuple[str, list[int]]:
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
    found = [p for root in shipped_library() for p in sorted(root.rglob("*.card"))
             if "sampling" in p.stem]
    if not found:
        raise UsageError(f"{run} records no sampling card and the library has none; name one "
                         "with --card")
    print(f"note: {run} records no sampling card; sampling {meta.get('name')} with the "
          f"library's {shown_path(str(found[0]))}", file=sys.stderr)
    return str(found[0])


def _vocabulary(checker, model_card, meta: dict) -> int | None:
    """The vocabulary of the model's token inputs at the run's sizes (None: not known)."""
    sig = checker.info(model_card).sig
    env = build.recorded_values(meta.get("hyperparameters"), sig.hypers)
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


def _check_decodable(run: str, tokenizer: Tokenizer, prompts: list[_Prompt],
                     vocab: int | None) -> None:
    """Refuse, before the model runs, text prompts whose continuation could not be shown: a
    run without tokenizer.json reads and writes UTF-8 bytes, 256 token IDs, and a model of
    more tokens (an import from a folder without its tokenizer) may draw any of them."""
    if not isinstance(tokenizer, ByteTokenizer) or vocab is None or \
            vocab <= tokenizer.vocab_size or all(p.numeric for p in prompts):
        return
    raise UsageError(f"{run} has no tokenizer.json, so text is read and shown as UTF-8 bytes "
                     f"(token IDs 0 to {tokenizer.vocab_size - 1}), but its model draws from "
                     f"{vocab:,} tokens; import the model again from a folder that holds its "
                     "tokenizer (tokenizer.json, or vocab.json and merges.txt), or give the "
                     "--prompt as token IDs separated by spaces")


def _sample_with_card(o: SampleOptions, model: torch.nn.Module, meta: dict,
                      device: torch.device, card: str, library: list[str] | None,
                      echo: bool) -> list[str]:
    """What the inference card in `card` makes of each prompt, e.g. for
    `cardc sample RUN --card cards/paper/dinference.card`.

    tokens, temperature, top_k and top_p set the card's ℓ_gen, τ and the bounds of its top_k
    and top_p steps, and hyperparameters it shares with the model (its context, ctx) take the
    model's values; a prompt of integers is read as token IDs (the reversal task's), any other
    prompt as text the run's tokenizer encodes (UTF-8 bytes unless it keeps a tokenizer.json).
    `echo` shows a text prompt before the card's output."""
    if library is None and _generic(card):  # --card names a generic sampler: it needs the model
        with build.recorded_cards(meta) as root:
            return _sample_with_card(o, model, meta, device, card, [str(root)], echo)
    lib, checker, alg, window, runs_on = _sampling_card(o, meta, card, library)
    tokenizer = run_tokenizer(o.dir, meta)
    prompts = [_read_prompt(tokenizer, p) for p in o.prompt or ["\n"]]
    vocab = _vocabulary(checker, runs_on, meta) if runs_on is not None else None
    for p in prompts:
        _check_token_ids(p.ids, vocab)
    _check_decodable(o.dir, tokenizer, prompts, vocab)
    hypers = _sampling_values(o, lib, checker, alg, window, model, meta, prompts, vocab)
    stops = _stops(list(o.stop), prompts, tokenizer)
    sampler = build.procedure_function(checker, alg, model)  # the model is not lowered again
    outs = _run_batches(o, sampler, alg, model, device, hypers, prompts, stops)
    return [_shown_sample(p, out, tokenizer, stops, echo)
            for p, out in zip(prompts, outs, strict=True)]


def _sampling_card(o: SampleOptions, meta: dict, card: str, library: list[str] | None):
    """The inference card of `card`, checked, bound to the run's model: with the
    hyperparameter that bounds its model's input, if it states one, and that model's card."""
    lib, checker, _ = build.checked([card], library or library_folders(o.library, [card]))
    file = next(f.path for f in lib.files if Path(f.path) == Path(card))
    cards = [a for a in build.procedure_cards(lib, checker, [file])
             if isinstance(checker.info(a).sig.output, Ty)]
    if not cards:
        raise UsageError(f"{card} holds no inference card (one that is handed θ̂)")
    alg = cards[0]
    window = _bind_sampler(lib, checker, alg, meta, library)
    runs_on = build.called_model(checker, alg)
    callee = runs_on.name if runs_on else None
    if callee != meta.get("name"):
        raise UsageError(f"{alg.name} samples from {callee}, but {o.dir} holds "
                         f"{meta.get('name')}")
    return lib, checker, alg, window, runs_on


def _sampling_values(o: SampleOptions, lib, checker, alg, window: str | None,
                     model: torch.nn.Module, meta: dict, prompts: list[_Prompt],
                     vocab: int | None) -> dict[str, int | float]:
    """The inference card's hyperparameters: the model's where it shares them, the options',
    the overrides', its first preset's; a top_k or top_p bound nothing sets keeps every token
    of the model's vocabulary (of `vocab`)."""
    info = checker.info(alg)
    declared = card_names(info.sig)
    shared = {n: meta["hyperparameters"][identifier(n)] for n in _shared_with_model(info.sig, declared)
              if identifier(n) in meta.get("hyperparameters", {})}
    if window is not None:  # the longest input the card states M is handed
        limits = [n for n in (getattr(model, "max_seq_len", None), trained_context(meta))
                  if isinstance(n, int) and n > 0]  # positions the run never trained are noise
        shared[window] = min(limits) if limits else \
            max(len(p.ids) for p in prompts) + o.tokens
    bounds = build.filter_bounds(checker, alg)
    given = {**shared, "ℓ_gen": o.tokens, "τ": o.temperature,
             **_filter_flags(o, alg, bounds), **parse_overrides(o.overrides)}
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
    return typed(info.sig, declared, values)


def _shared_with_model(sig, declared: list[str]) -> list[str]:
    """The hyperparameters a run's model hands the sampler: for a card that takes its model
    as a hyperparameter, only the sizes of the model's type (V of `{1..V}^{T} → ℝ^{T×V}`), so
    that a model's own `k` (experts per token) never becomes the sampler's top-k; for a card
    that calls its model by name, every name the two share."""
    if not sig.models:
        return declared
    sizes: set[str] = set()
    for m in sig.models.values():
        for ty in (m.input, m.output):
            sizes.update(sym for d in ty.shape if d is not None for sym in d.symbols)
            if ty.vocab is not None:
                sizes.update(ty.vocab.symbols)
    return [n for n in declared if n in sizes]


def _filter_flags(o: SampleOptions, alg, bounds: dict[str, str]) -> dict[str, float]:
    """top_k and top_p by the hyperparameter they set; refused for a card without the step."""
    out = {}
    for func, flag in FILTER_FLAGS.items():
        value = getattr(o, func)
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
    for func, name in bounds.items():
        if name not in values:
            values[name] = (vocab or sys.maxsize) if func == "top_k" else 1.0
        value = values[name]
        if func == "top_k" and value < 1:
            raise UsageError(f"{display(name)} = {value:g}: top_k keeps at least one token")
        if func == "top_p" and not 0 < value <= 1:
            raise UsageError(f"{display(name)} = {value:g}: the mass of top_p lies in (0, 1]")


def _stops(texts: list[str], prompts: list[_Prompt], tokenizer: Tokenizer) -> dict:
    """The stops, by the kind of prompt they stop (numeric or not): texts where a text prompt's
    continuation ends; for prompts of token IDs, runs of token IDs."""
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


def _run_batches(o: SampleOptions, fn, alg, model: torch.nn.Module, device: torch.device,
                 hypers: dict, prompts: list[_Prompt], stops: dict) -> list[list[int]]:
    """Each prompt's output: prompts of one length (and kind) as one batch, one forward per
    token for all of them. One random stream, seeded once, runs through every batch in turn:
    reseeding each batch would hand two prompts the same draws, and a small model would then
    continue both alike, as if the prompt were ignored."""
    if stops and "stop" not in inspect.signature(fn).parameters:
        raise UsageError(f"{alg.name} draws no token in a loop: --stop has nothing to stop")
    batches: dict[tuple[bool, int], list[int]] = {}
    for n, p in enumerate(prompts):
        batches.setdefault((p.numeric, len(p.ids)), []).append(n)
    outs: list[list[int]] = [[] for _ in prompts]
    model.eval()
    torch.manual_seed(o.seed)  # once: the batches draw one after another from one stream
    for (numeric, _), rows in batches.items():
        x = torch.tensor([prompts[n].ids for n in rows], dtype=torch.long, device=device)
        watch = {"stop": stops[numeric].watch(len(rows))} if stops else {}
        with torch.inference_mode():  # as generate(): no autograd bookkeeping per decoded token
            try:
                out = fn(x, model, **hypers, **watch)
            except ValueError as err:  # the model's positions ran out before the card stopped
                raise RuntimeInputError(f"{alg.name} did not finish: {err}") from None
        for row, n in enumerate(rows):
            outs[n] = out[row].tolist()
    return outs


def _shown_sample(prompt: _Prompt, out: list[int], tokenizer: Tokenizer, stops: dict,
                  echo: bool) -> str:
    """What is shown for a prompt: token IDs for token IDs, else the text prompt (`echo`)
    and its continuation decoded; either up to the first stop."""
    stop = stops.get(prompt.numeric)
    if prompt.numeric:
        text = ids_text(out)
        return (stop.cut(text) if stop is not None else text).strip()
    text = continuation(tokenizer, prompt.ids, out)
    return (prompt.text if echo else "") + (stop.cut(text) if stop is not None else text)


def _generic(card: str) -> bool:
    """Whether a card file holds a recipe that takes its model as a hyperparameter (read off
    its text, before the library is loaded)."""
    parsed = parse_file(Path(card), Diagnostics())
    return any(isinstance(d.type, s.CardType) for a in parsed.algorithms
               for d in a.decls("Hyperparameters") if isinstance(d, s.Decl))


def _bind_sampler(lib, checker, alg, meta: dict, library: list[str] | None) -> str | None:
    """Bind a generic sampler's model to the checkpoint's card (recorded under `library`);
    the hyperparameter that bounds the model's input, if the card states one."""
    names = build.unbound_models(checker, alg)
    if names:
        path = Path(library[0]) / str(meta.get("card")) if library else None
        model = next((a for f in lib.files if path is not None and Path(f.path) == path
                      for a in f.algorithms if a.label == meta.get("name")), None)
        if model is None:
            raise UsageError(f"{alg.name} samples whichever model it is given, and the run "
                             "records no card of its model")
        build.bind_recipe(checker, alg, model)
    return next((m.window for m in checker.info(alg).sig.models.values()), None)
