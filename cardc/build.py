"""Code generation end to end: which cards are models, their Python source, and the modules."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import linecache
import os
import re
import tempfile
import traceback
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from . import ir
from . import syntax as s
from .checker import Checker, check
from .checker.reach import files_used, require_clean
from .codegen import generate
from .diagnostics import CardError, Diagnostics
from .library import Library, Roots, library_roots, load, shipped_library
from .lower import LowerError, Lowering
from .names import identifier
from .types import BundleTy


def model_cards(lib: Library, checker: Checker, files: list[str] | None = None) -> list[s.Algorithm]:
    """Cards nobody calls that own parameters: the models."""
    called = {id(ci.callee) for info in checker.infos.values() if info.sig.tree.members
              for ci in info.calls.values()}  # a training card calls its model; a model calls parts
    out = []
    for card_file, alg in ((f, a) for f in lib.files for a in f.algorithms):
        if files is not None and card_file.path not in files:
            continue
        info = checker.infos.get(id(alg))
        if alg.label is None or info is None or id(alg) in called or not info.sig.tree.members:
            continue
        out.append(alg)
    return out


def procedure_cards(lib: Library, checker: Checker,
                    files: list[str] | None = None) -> list[s.Algorithm]:
    """Training and inference cards: handed a model's parameters θ as an input."""
    out = []
    for card_file, alg in lib.algorithms():
        info = checker.infos.get(id(alg))
        if info is None or files is not None and card_file.path not in files:
            continue
        if any(isinstance(ty, BundleTy) for _, ty in info.sig.inputs):
            out.append(alg)
    return out


def unbound_models(checker: Checker, alg: s.Algorithm) -> list[str]:
    """A recipe's card-valued hyperparameters that no model card is bound to yet."""
    return [n for n in checker.info(alg).sig.models if (id(alg), n) not in checker.bindings]


def bind_recipe(checker: Checker, alg: s.Algorithm, model: s.Algorithm) -> None:
    """Bind a generic recipe's model M to `model`: its calls to M become calls to that card."""
    for name in unbound_models(checker, alg):
        if not checker.bind_model(alg, name, model):
            raise CardError(Diagnostics(checker.diags.errors[-1:], checker.diags.sources))
        checker.info(alg)
    errors = [d for d in checker.diags.errors if d.span.file == checker.lib.file_of(alg).path]
    if errors:
        raise CardError(Diagnostics(errors, checker.diags.sources))


def recipe_for(lib: Library, checker: Checker, model: s.Algorithm,
               training: bool) -> s.Algorithm:
    """The training (or inference) card `cardc train` (or `cardc sample`) runs for `model`,
    a generic one bound to it."""
    found = procedures_for(lib, checker, model, training)
    if not found:
        raise ValueError(f"no {'training' if training else 'inference'} card runs "
                         f"{model.label}")
    if unbound_models(checker, found[0]):
        bind_recipe(checker, found[0], model)
    return found[0]


def serves(checker: Checker, alg: s.Algorithm, model: s.Algorithm) -> bool:
    """A generic recipe (one model, unbound) whose signature `model` fits."""
    from .checker import fits_model

    names = unbound_models(checker, alg)
    return len(names) == 1 and fits_model(checker.info(alg).sig.models[names[0]],
                                          checker.info(model).sig)


def trains(checker: Checker, alg: s.Algorithm) -> bool:
    """A training card hands back the parameters θ̂; an inference card hands back tokens."""
    return isinstance(checker.info(alg).sig.output, BundleTy)


def procedures_for(lib: Library, checker: Checker, model: s.Algorithm,
                   training: bool) -> list[s.Algorithm]:
    """The training (or inference) cards that run `model`, those in its own folder first; then
    the generic ones whose model `model` can be, nearest in the lookup order first."""
    folder = Path(lib.file_of(model).path).parent
    found = [a for a in procedure_cards(lib, checker)
             if trains(checker, a) == training and called_model(checker, a) is model]
    generic = [a for a in procedure_cards(lib, checker)
               if trains(checker, a) == training and serves(checker, a, model)]
    return sorted(found, key=lambda a: (Path(lib.file_of(a).path).parent != folder,
                                        lib.file_of(a).path)) + \
        sorted(generic, key=lambda a: (lib.rank.get(lib.file_of(a).path, 0), lib.file_of(a).path))


def called_model(checker: Checker, alg: s.Algorithm) -> s.Algorithm | None:
    """The model a training or inference card runs: the card it calls that owns parameters."""
    return next((c.callee for c in checker.info(alg).calls.values()
                 if checker.info(c.callee).sig.tree.members), None)


def filter_bounds(checker: Checker, alg: s.Algorithm) -> dict[str, str]:
    """The hyperparameters a card's top_k and top_p steps take: {"top_k": "k", "top_p": "p"}
    for `top_p(top_k(w | k) | p)` (`cardc sample --top-k` sets k, whatever its name)."""
    from .checker import FILTERS

    info = checker.info(alg)
    return {e.func: e.params[0].id for e in s.nodes(alg.steps)
            if isinstance(e, s.Call) and e.func in FILTERS and id(e) not in info.calls
            and len(e.params) == 1 and isinstance(e.params[0], s.Name)
            and e.params[0].id in info.sig.hypers}


def procedure_function(checker: Checker, alg: s.Algorithm, model: Any = None):
    """A training or inference card's generated function, ready to call. `model`: the built
    module it runs, whose recorded analysis (`model.analysis`) its lowering reads instead of
    lowering that model's card once more."""
    name = identifier(alg.label)
    runs_on = called_model(checker, alg)
    known = {} if model is None or runs_on is None else {runs_on: model.analysis}
    return getattr(load_module(source(checker, alg, analyses=known), name.lower()), name)


def generated_cards(lib: Library, checker: Checker,
                    files: list[str] | None = None) -> list[s.Algorithm]:
    """Everything `cardc build` writes a file for: models, then training and inference cards
    (a generic recipe has code only once a model is bound to it, when it runs)."""
    return model_cards(lib, checker, files) + [
        a for a in procedure_cards(lib, checker, files) if not unbound_models(checker, a)]


def module_path(lib: Library, alg: s.Algorithm, out_dir: str | Path,
                root: str | Path | list | None) -> Path:
    """generated/<the card's folder under the library root>/<card name>.py."""
    if isinstance(root, list):
        root = root[0] if root else None
    folder = Path(lib.file_of(alg).path).parent
    try:
        sub = folder.resolve().relative_to(Path(root).resolve()) if root else Path()
    except ValueError:
        sub = Path()
    return Path(out_dir) / sub / f"{identifier(alg.label).lower()}.py"


def checked(paths: list[str], library: Roots, lazy: bool = False
            ) -> tuple[Library, Checker, list[str]]:
    """The library, checked; errors in the given cards or anything they call are fatal, errors
    elsewhere in the library (a card the given ones never call) are not. `lazy`: the library's
    cards are parsed and checked only as the given ones call them (`load`'s)."""
    lib, targets = load(paths, root=library, lazy=lazy)
    checker, diags = check(lib)
    require_clean(lib, checker, diags, {str(Path(t)) for t in targets})
    return lib, checker, targets


Analyses = dict[s.Algorithm, ir.Analysis]


def source(checker: Checker, alg: s.Algorithm, fuse: bool = True,
           analyses: Analyses | None = None, observe: bool = False) -> str:
    """The generated Python module for a card."""
    return generated(checker, alg, lowered(checker, alg, fuse, analyses, observe))


def lowered(checker: Checker, alg: s.Algorithm, fuse: bool = True,
            analyses: Analyses | None = None, observe: bool = False) -> ir.Program:
    """A card lowered to its program; a model's carries its analysis (`ir.Analysis`).
    `analyses`: what lowering the models it calls found, when they were built already.
    `observe`: the observed twin (cardc.lower.observe), whose modules show every value their
    cards name to `cardc.runtime.observe`."""
    unbound = unbound_models(checker, alg)
    if unbound:
        decl = checker.info(alg).sig.models[unbound[0]].decl
        diags = Diagnostics(sources=checker.lib.diags.sources)
        diags.error(decl.span, f"{alg.name} has code only for a model card bound to "
                               f"{unbound[0]}", "run it on a model: 'cardc train MODEL.card "
                               f"--recipe {checker.lib.file_of(alg).path}'")
        raise CardError(diags)
    try:
        lowering = Lowering(checker, fuse, analyses or {}, observe)
        inputs = checker.info(alg).sig.inputs
        program = lowering.procedure(alg) if any(isinstance(ty, BundleTy) for _, ty in inputs) \
            else lowering.model(alg)
    except LowerError as err:
        diags = Diagnostics(sources=checker.lib.diags.sources)
        diags.error(err.span, err.message, err.hint)
        raise CardError(diags) from None
    return program


def written_source(checker: Checker, alg: s.Algorithm, base: str | os.PathLike[str]) -> str:
    """The module of a card as `cardc build` and `cardc docs` write it: `source`, with each
    card file it names (the banner, each class's `Card:` line) as `shown_card_path` shows
    it from `base`, so no file written holds a path of the machine that wrote it."""
    program = relocated(lowered(checker, alg), lambda path: shown_card_path(path, base))
    return generated(checker, alg, program)


def shown_card_path(path: str, base: str | os.PathLike[str]) -> str:
    """A card file's path as a written file names it: relative to `base` when it lies below
    it (`cards/gpt2.card`), else as the shipped library's (`library/nn/mlp.card`), else
    relative to the working folder when it lies below that (whichever folder the output goes
    to), else relative to `base` still (`../my/foo.card`); never absolute."""
    full, root = os.path.abspath(path), os.path.abspath(base)
    if Path(full).is_relative_to(root):
        return Path(os.path.relpath(full, root)).as_posix()
    shipped = shipped_name(path)
    if shipped is not None:
        return shipped
    if Path(full).is_relative_to(os.getcwd()):
        return Path(os.path.relpath(full, os.getcwd())).as_posix()
    try:
        return Path(os.path.relpath(full, root)).as_posix()
    except ValueError:  # another drive: no relative path exists
        return Path(path).name


def relocated(program: ir.Program, shown: Callable[[str], str]) -> ir.Program:
    """`program` with the card files it names (its sources and each part's origin,
    `path:line`) as `shown` writes them."""
    def at(origin: str) -> str:
        path, _, line = origin.rpartition(":")
        return f"{shown(path)}:{line}"

    return dataclasses.replace(
        program, sources=[shown(p) for p in program.sources],
        functions=[dataclasses.replace(f, origin=at(f.origin)) for f in program.functions],
        modules=[dataclasses.replace(m, origin=at(m.origin)) for m in program.modules])


def generated(checker: Checker, alg: s.Algorithm, program: ir.Program) -> str:
    """The Python module of a lowered card, parsed before it is returned."""
    try:
        return generate(program)
    except SyntaxError as err:  # a compiler bug: name the card, not a generated line
        diags = Diagnostics(sources=checker.lib.diags.sources)
        diags.error(alg.span, f"internal error: the code generated for this card does not "
                    f"parse ({err.msg}, line {err.lineno})", "please report this card")
        raise CardError(diags) from None


def find_card(lib: Library, checker: Checker, card: str, name: str | None) -> s.Algorithm:
    file = next((f for f in lib.files if Path(f.path) == Path(card)), None)
    algs = [a for a in (file.algorithms if file else ()) if a.label]
    if name is not None:
        algs = [a for a in algs if name in (a.name, a.label)]
    models = [a for a in model_cards(lib, checker, [file.path]) if a in algs] if file else []
    chosen = models or algs
    if not chosen:
        raise ValueError(f"no model card{f' named {name!r}' if name else ''} in {card}")
    return chosen[0]


def load_module(text: str, name: str) -> types.ModuleType:
    filename = f"<cardc:{name}>"
    # registered so tracebacks and card_line() can show the generated source
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    module = types.ModuleType(name)
    exec(compile(text, filename, "exec"), module.__dict__)  # noqa: S102
    return module


def card_line(err: BaseException) -> str | None:
    """`gpt2_training.card:11`: the card step that generated the innermost line of generated
    code an error passed through."""
    found = None
    for frame, line in traceback.walk_tb(err.__traceback__):
        if frame.f_code.co_filename.startswith("<cardc:"):
            match = re.search(r"\[([^\[\]]+\.card:\d+)\]",
                              linecache.getline(frame.f_code.co_filename, line))
            found = match.group(1) if match else found
    return found


class ZeroSize(ValueError):
    """Hyperparameters of value 0 where the model divides by one of them."""

    def __init__(self, names: list[str]):
        self.names = names
        them = "it" if len(names) == 1 else "one of them"
        super().__init__(f"{' and '.join(f'{n} = 0' for n in names)}: the model divides by "
                         f"{them} (as d = D/H divides by H); make {them} a positive whole number")


def instantiate(checker: Checker, alg: s.Algorithm, values: dict[str, float], fuse: bool = True):
    """Generate `alg`'s module, then build its class; `values` are keyed by Python name."""
    program = lowered(checker, alg, fuse)
    module = load_module(generated(checker, alg, program), identifier(alg.label).lower())
    cls = getattr(module, identifier(alg.label))
    wanted = inspect.signature(cls).parameters
    kwargs = {py: int(v) if wanted[py].annotation in (int, "int") else float(v)
              for py, v in values.items() if py in wanted}
    missing = [p for p, v in wanted.items() if v.default is v.empty and p not in kwargs]
    if missing:
        raise ValueError(f"'{alg.label}' needs values for {', '.join(missing)}: "
                         "choose a preset or set them")
    try:
        model = cls(**kwargs)
    except ZeroDivisionError:  # a size the card divides by (d = D/H), given as 0
        raise ZeroSize([k for k, v in kwargs.items() if v == 0]) from None
    model.analysis = program.analysis  # what its lowering found (cardc.lower.analysis)
    return model, kwargs




def build_model(card: str, preset: str | None = None, overrides: dict[str, Any] | None = None,
                library: Roots = None, name: str | None = None, fuse: bool = True):
    """The `nn.Module` of a model card at a preset, generated fresh from the card.

    `model.card_meta` records the card sources and hyperparameters, so a checkpoint can
    rebuild the same model later without the card files at hand.
    """
    from .info import PresetError, preset_values

    lib, checker, _ = checked([card], library_roots([card], library), lazy=True)
    alg = find_card(lib, checker, card, name)
    try:
        values = preset_values(checker.info(alg).sig, preset, dict(overrides or {}))
    except PresetError as err:
        raise err.card_error(lib.diags.sources) from None
    model, kwargs = instantiate(checker, alg, {identifier(k): v for k, v in values.items()}, fuse)
    files = [f.path for f in lib.files if f.path in lib.diags.sources]
    own = [p for p in files if shipped_name(p) is None]
    base = os.path.commonpath([os.path.abspath(p) for p in [*own, card]])
    base = base if os.path.isdir(base) else os.path.dirname(base)
    rel = lambda p: Path(os.path.relpath(os.path.abspath(p), base)).as_posix()  # noqa: E731
    used = files_used(lib, checker, {lib.file_of(alg).path})
    cards = {}
    for p in files:
        inside = not rel(p).startswith("../")
        if inside or p in used:  # the shipped library: only what the model calls
            cards[rel(p) if inside else shipped_name(p)] = lib.diags.sources[p]
    model.card_meta = {"card": rel(card), "name": alg.label, "preset": preset,
                       "hyperparameters": kwargs, "cards": cards,
                       "analysis": dataclasses.asdict(model.analysis)}
    return model


LIBRARY_PREFIX = "library"  # where a checkpoint records cards of the shipped library


def shipped_name(path: str) -> str | None:
    """`library/nn/rms_norm.card` for a card of the shipped library, else None."""
    full = Path(os.path.abspath(path)).resolve()
    for root in shipped_library():
        if full.is_relative_to(root.resolve()):
            return f"{LIBRARY_PREFIX}/{root.name}/{full.relative_to(root.resolve()).as_posix()}"
    return None


_UNSAFE = re.compile(r"[\\:\x00-\x1f\x7f]")  # a backslash, a drive's colon, control characters


def recorded_card_name(path: object) -> str:
    """A card file's name as a checkpoint records it: `cards/gpt2.card`, relative, folder
    names joined by `/`; anything else (absolute, `.` or `..`, a backslash, a drive) is
    refused, so what a checkpoint names is always a file it carries, never one read from disk."""
    parts = path.split("/") if isinstance(path, str) else []
    if not parts or not path.endswith(".card") or _UNSAFE.search(path) or \
            any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"checkpoint metadata names an unsafe card path {path!r}")
    return path


@contextlib.contextmanager
def recorded_cards(meta: dict[str, Any]) -> Iterator[Path]:
    """The card files a checkpoint records, written out to a temporary folder. The model's
    card (and the sampler's, where one is recorded) must be among them."""
    try:
        cards, wanted = meta["cards"], [meta["card"]]
    except (KeyError, TypeError) as err:
        raise ValueError(f"checkpoint metadata lacks {err}") from None
    if not isinstance(cards, dict):
        raise ValueError("checkpoint metadata's 'cards' is not a table of card files")
    sampler = meta.get("sampler")
    if isinstance(sampler, dict) and "card" in sampler:
        wanted.append(sampler["card"])
    for path in [*cards, *wanted]:
        recorded_card_name(path)
    for path in wanted:
        if path not in cards:
            raise ValueError(f"checkpoint metadata names card {path!r} but does not record it")
    if not all(isinstance(text, str) for text in cards.values()):
        raise ValueError("checkpoint metadata records a card that is not text")
    with tempfile.TemporaryDirectory() as tmp:
        for path, text in cards.items():
            try:  # `a.card` beside `a.card/b.card`: one path cannot be a file and a folder
                (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / path).write_text(text, encoding="utf-8")
            except (OSError, UnicodeEncodeError) as err:
                raise ValueError(f"checkpoint metadata records card {path!r} that cannot be "
                                 f"written out: {err.__class__.__name__}") from None
        yield Path(tmp)


def rebuild_model(meta: dict[str, Any], stored: int | None = None):
    """The model a checkpoint's metadata describes, compiled again from its recorded cards;
    `stored`: how many values the checkpoint's tensors hold, which its sizes must not exceed."""
    try:
        card, name = meta["card"], meta["name"]
        hypers = meta["hyperparameters"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"checkpoint metadata lacks {err}") from None
    if not isinstance(hypers, dict):
        raise ValueError("checkpoint metadata's 'hyperparameters' is not a table of numbers")
    if not isinstance(name, str):
        raise ValueError(f"checkpoint metadata names no card: {name!r}")
    with recorded_cards(meta) as tmp:
        lib, checker, _ = checked([str(tmp / card)], str(tmp))
        alg = find_card(lib, checker, str(tmp / card), name)
        try:
            _check_recorded(checker, alg, hypers, stored)
        except ValueError as err:  # name the recorded cards as the checkpoint does
            raise ValueError(str(err).replace(f"{tmp}{os.sep}", "")) from None
        model, _ = instantiate(checker, alg, hypers)
    # what build_model records, so the rebuilt model can be rebuilt again (cardc.run_with_cache)
    model.card_meta = {k: meta[k] for k in ("card", "name", "preset", "hyperparameters", "cards")
                       if k in meta}
    return model


def recorded_values(recorded: Any, declared: Iterable[str]) -> dict[str, float]:
    """A checkpoint's hyperparameters (keyed by Python name) by the card names `declared`:
    numbers only, whatever else the untrusted record holds."""
    if not isinstance(recorded, dict):
        raise ValueError("checkpoint metadata's 'hyperparameters' is not a table of numbers")
    out: dict[str, float] = {}
    for name in declared:
        value = recorded.get(identifier(name))
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"checkpoint metadata records {identifier(name)} = {value!r}, "
                             "not a number")
        out[name] = value
    return out


def _check_recorded(checker: Checker, alg: s.Algorithm, hypers: dict[str, Any],
                    stored: int | None) -> None:
    """Recorded hyperparameters pass the card's own checks, and make no more parameters than
    the checkpoint stores, before anything is allocated (metadata is untrusted input)."""
    from .info import count
    from .presets import PresetError, validate

    sig = checker.info(alg).sig
    given = recorded_values(hypers, sig.hypers)
    flags = {n: f"recorded {identifier(n)} = {v!r}" for n, v in given.items()}
    try:
        env = validate(checker, alg, None, given, flags)
        params = count(sig.tree, env, alg.span) if isinstance(sig.tree, BundleTy) else 0
    except PresetError as err:
        raise ValueError(f"checkpoint metadata: {err.message}") from None
    if stored is not None and params > stored:
        raise ValueError(f"its recorded sizes make {params:,} parameters, but its tensors hold "
                         f"{stored:,} values")


def record_sampler(meta: dict[str, Any], lib: Library, checker: Checker,
                   model: s.Algorithm) -> None:
    """Record in a model's checkpoint metadata the inference card that samples it (the one
    nearest the model's card, else the library's generic one, bound to the model) with the
    cards it calls, so `cardc sample` runs it anywhere."""
    model_file = lib.file_of(model).path
    samplers = procedures_for(lib, checker, model, training=False)
    if not samplers:
        return
    if unbound_models(checker, samplers[0]):
        bind_recipe(checker, samplers[0], model)
    sampler = lib.file_of(samplers[0]).path
    base = Path(os.path.abspath(model_file)).parents[len(Path(meta["card"]).parts) - 1]

    def recorded(path: str) -> str | None:
        rel = Path(os.path.relpath(os.path.abspath(path), base))
        return rel.as_posix() if ".." not in rel.parts else shipped_name(path)

    cards = {}
    for path in sorted(files_used(lib, checker, {sampler})):
        name = recorded(path)
        if name is None:
            return  # outside the folder the checkpoint's cards are recorded from
        cards[name] = lib.diags.sources[path]
    meta["cards"] = {**cards, **meta["cards"]}
    meta["sampler"] = {"card": recorded(sampler), "name": samplers[0].label}
