"""Every value a card names, read and replaced by its path: `run_with_cache`, `run_with_hooks`.

A model built from a card runs its fused forward (SDPA, joined projections, a KV cache), which
forms few of the card's values. Asked to observe, cardc builds the model's *observed twin* once:
the card lowered literally, heads side by side on one axis, with every value its steps name
shown to an observer (cardc.lower.observe). The twin holds the model's own parameters (the same
tensors, so gradients reach them) and computes what the card says, value by value.

A value's key is its module's path in the model, as `named_modules` names it (`block.3.attn`,
counted from 0 as PyTorch counts layers), then the card it is in where that card is a function
(`AttentionHead`), then the name as the generated code spells it (`S`, `Y_h` for `Y^h`, `X_tilde`
for `X̃`). A name written at several steps of its card is keyed by the step's number (`X@1`,
`X@2`; its value on entry `X@0`), a function called at several steps likewise (`LayerNorm@1`):

    block.3.attn.AttentionHead.S@5     the scores after the mask, (B, H, T, T)
    block.3.X@1                        the residual stream after the attention
    block.3.LayerNorm@2.e_hat          the MLP's normalised input

What one forward computes more than once (a loop's steps) is numbered by occurrence, from 1:
`E@3[2]`. `cache.line(key)` is the card line that computed a value.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..build import checked, find_card, generated, identifier, load_module, lowered, recorded_cards

Hook = Callable[[torch.Tensor, "Site"], torch.Tensor | None]

_RUNNING: ContextVar[Observer | None] = ContextVar("cardc_observer", default=None)
_TWINS: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()
_OCCURRENCE = re.compile(r"^(.*)\[(\d+)\]$")


@dataclass(frozen=True)
class Site:
    """Where a hook is called: the value's key, the card line that computed it, and which
    time this forward computed it (from 1)."""

    key: str
    line: str
    occurrence: int


class Observer:
    """One observed forward: it records values and calls hooks."""

    def __init__(self, paths: dict[int, str], hooks: Mapping[str, Hook] | None = None,
                 keep: Callable[[str], bool] | None = None):
        self.paths = paths  # id(module) → its path in the model
        self.hooks = dict(hooks or {})
        self.keep = keep
        self.values: dict[str, list[torch.Tensor]] = {}
        self.lines: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self.matched: set[str] = set()  # the hooks' keys that met a value

    def seen(self, key: str, value: Any, line: str) -> Any:
        if not isinstance(value, torch.Tensor):
            return value  # a list the lowering builds, not a value of the card
        n = self.counts[key] = self.counts.get(key, 0) + 1
        self.lines.setdefault(key, line)
        for pattern, hook in self.hooks.items():
            if _matches(pattern, key, n):
                self.matched.add(pattern)
                value = _replaced(value, hook(value, Site(key, line, n)), key)
        if self.keep is None or self.keep(key):
            self.values.setdefault(key, []).append(value)
        return value

    def unmatched(self) -> list[str]:
        return [p for p in self.hooks if p not in self.matched]


class At:
    """A place in the observed model: `see` shows a value there, `call` enters a function."""

    __slots__ = ("observer", "path")

    def __init__(self, observer: Observer, path: str):
        self.observer, self.path = observer, path

    def call(self, card: str) -> At:
        return At(self.observer, _join(self.path, card))

    def see(self, name: str, value: Any, line: str) -> Any:
        return self.observer.seen(_join(self.path, name), value, line)


def observing(module: nn.Module) -> At:
    """The `at` of a module of an observed twin: called first by each of its forwards."""
    observer = _RUNNING.get()
    if observer is None:
        raise RuntimeError("an observed model runs only inside cardc.run_with_cache or "
                           "cardc.run_with_hooks")
    return At(observer, observer.paths.get(id(module), type(module).__name__))


class Cache(Mapping[str, torch.Tensor]):
    """The values one observed forward computed, by key (see the module's doc)."""

    def __init__(self, observer: Observer):
        self._values, self._lines = observer.values, observer.lines

    def _split(self, key: str) -> tuple[str, int | None]:
        m = _OCCURRENCE.match(key)
        return (m.group(1), int(m.group(2))) if m and m.group(1) in self._values else (key, None)

    def __getitem__(self, key: str) -> torch.Tensor:
        base, n = self._split(key)
        found = self._values.get(base)
        if found is None:
            raise KeyError(_unknown(key, list(self)))
        if n is None and len(found) > 1:
            raise KeyError(f"{key!r} was computed {len(found)} times in this forward: ask for "
                           f"{key}[1] … {key}[{len(found)}]")
        if n is not None and not 1 <= n <= len(found):
            raise KeyError(f"{base!r} was computed {len(found)} times in this forward, not {n}")
        return found[-1 if n is None else n - 1]

    def __iter__(self) -> Iterator[str]:
        for key, found in self._values.items():
            yield from ([key] if len(found) == 1 else
                        (f"{key}[{i}]" for i in range(1, len(found) + 1)))

    def __len__(self) -> int:
        return sum(len(found) for found in self._values.values())

    def line(self, key: str) -> str:
        """The card line that computed the value of `key` (`attention.card:12`)."""
        base, _ = self._split(key)
        if base not in self._lines:
            raise KeyError(_unknown(key, list(self)))
        return self._lines[base]

    def __repr__(self) -> str:
        rows = [f"  {k}  {tuple(self[k].shape)}  [{self.line(k)}]" for k in self]
        return "\n".join([f"Cache of {len(rows)} values:", *rows])


def run_with_cache(model: nn.Module, *inputs: Any, names: Callable[[str], bool] | str | None = None,
                   hooks: Mapping[str, Hook] | None = None, **kwargs: Any) -> tuple[Any, Cache]:
    """`model(*inputs)` computed as its card says, and every value the card names, by key
    (`names`: only the keys this glob (`block.*.attn.*`) or predicate keeps). `hooks` may
    replace values on the way, as in `run_with_hooks`."""
    keep = (lambda k: fnmatch.fnmatchcase(k, names)) if isinstance(names, str) else names
    out, observer = _run(model, inputs, kwargs, hooks, keep)
    return out, Cache(observer)


def run_with_hooks(model: nn.Module, *inputs: Any, hooks: Mapping[str, Hook],
                   **kwargs: Any) -> Any:
    """`model(*inputs)` with values replaced: `hooks` maps a key (a glob matches several;
    `key[2]`, only its second occurrence) to `hook(value, site)`, which returns the value the
    steps after read (None: the value unchanged). A key that names no value is an error."""
    return _run(model, inputs, kwargs, hooks, lambda _: False)[0]


def observed(model: nn.Module) -> nn.Module:
    """The observed twin of a model built from a card (made once per model): the card's
    literal lowering, sharing the model's parameters."""
    twin = _TWINS.get(model)
    if twin is None:
        twin = _TWINS[model] = _twin(model)
    twin.train(model.training)
    return twin


# ------------------------------------------------------------------ internals


def _run(model, inputs, kwargs, hooks, keep) -> tuple[Any, Observer]:
    twin = observed(model)
    observer = Observer({id(m): name for name, m in twin.named_modules()}, hooks, keep)
    token = _RUNNING.set(observer)
    try:
        out = twin(*inputs, **kwargs)
    finally:
        _RUNNING.reset(token)
    missing = observer.unmatched()
    if missing:
        raise KeyError(_unknown(missing[0], list(observer.counts)))
    return out, observer


def _twin(model: nn.Module) -> nn.Module:
    meta = getattr(model, "card_meta", None)
    if not isinstance(meta, dict):
        raise ValueError("only a model built from a card (cardc.model, a cardc checkpoint) "
                         "can be observed: this one records no card")
    with recorded_cards(meta) as tmp:
        lib, checker, _ = checked([str(tmp / meta["card"])], str(tmp))
        alg = find_card(lib, checker, str(tmp / meta["card"]), meta["name"])
        program = lowered(checker, alg, fuse=False, observe=True)
        module = load_module(generated(checker, alg, program),
                             f"{identifier(alg.label).lower()}_observed")
    module.observing = observing
    twin = getattr(module, identifier(alg.label))(**meta["hyperparameters"])
    _share_parameters(twin, model)
    return twin.to(next(iter(model.parameters()), torch.empty(0)).device)


def _share_parameters(twin: nn.Module, model: nn.Module) -> None:
    """Make `twin` hold `model`'s own parameter tensors, name for name."""
    theirs = dict(model.named_parameters())
    for path, module in twin.named_modules():
        for name, mine in list(module._parameters.items()):
            full = f"{path}.{name}" if path else name
            given = theirs.get(full)
            if given is None or given.shape != mine.shape:
                raise ValueError(f"the observed model's parameter {full} {tuple(mine.shape)} "
                                 f"has no twin in the model")
            module._parameters[name] = given


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _matches(pattern: str, key: str, occurrence: int) -> bool:
    m = _OCCURRENCE.match(pattern)
    if m and int(m.group(2)) != occurrence:
        return False
    return fnmatch.fnmatchcase(key, m.group(1) if m else pattern)


def _replaced(value: torch.Tensor, new: Any, key: str) -> torch.Tensor:
    if new is None:
        return value
    if not isinstance(new, torch.Tensor) or new.shape != value.shape:
        got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
        raise ValueError(f"the hook on {key} returned {got}; the value is {tuple(value.shape)}")
    return new


def _unknown(key: str, known: list[str]) -> str:
    """The error for a key no value has: the keys below the same path with the same name
    (`block.3.attn.S` → `block.3.attn.AttentionHead.S@5`), else the closest spellings."""
    path, _, name = key.rpartition(".")
    stem = re.split(r"[@\[]", name)[0]
    named = [k for k in known if re.split(r"[@\[]", k.rpartition(".")[2])[0] == stem]
    here = [k for k in named if k.rpartition(".")[0] == path]
    below = [k for k in named if k.startswith(f"{path}.") and k not in here]
    near = (here + below)[:4] or difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    return f"no value is keyed {key!r}" + (f"; did you mean {', '.join(near)}?" if near else "")
