"""The reference interpreter: the executable definition of the card language.

It runs a checked card straight from its AST on concrete tensors, with the paper's semantics:
indices count from 1, `a : b` includes both ends, loops, `∀` and sums run one value at a time as
written, `[[c]]` is 1 or 0, softmax normalises over the first index of a column-major card (the
paper's eq. 2) and over the last of a row-major one, a card declared on vectors and handed a
matrix runs row by row, and a call runs the callee's own steps with its parameters and
hyperparameters bound as the checker bound them. It shares nothing with lowering or code
generation but the checker's results (`cardc.checker.results`): signatures, the types of
expressions, the bindings of calls. It is slow on purpose; it is what the generated modules are
tested against (tests/test_interpret.py).

    program = Program("cards/gpt2.card")              # checked; errors raise CardError
    env = program.hyperparameters("tiny", N=1)         # defaults, preset, overrides
    shapes = program.parameter_shapes(env)             # {"θ": {"W_e": (V, D), …}}
    params = program.random_parameters(env, torch.Generator().manual_seed(0))
    P = program(x, params=params, hypers=env)          # x: token IDs counted from 1

or in one call, `interpret(card, preset, inputs=(x,), params=params, **overrides)`.

Parameters are a nested structure by the card's own names, as its `Parameters:` block declares
them: a bundle is a dict (`params["θ"]["W_e"]`), a family `For l ∈ [L]` a list whose entry
l − 1 is member l (`params["θ"]["θ^block_ℓ"][0]["γ^1"]`). Inputs are single examples (no batch
axis), in the card's own layout; token IDs count from 1, as the card does. Values are real in
`dtype` (float64 unless asked); the card runs as in evaluation (dropout passes its input on).
A construct the interpreter does not run (random steps, gradients, training) raises
`InterpretError` naming it and its place in the card — never a silent wrong answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .. import syntax as s
from ..checker import Checker, check
from ..checker.reach import require_clean
from ..info import PresetError, preset_values
from ..library import Library, Roots, library_roots, load
from ..types import BundleTy, Entry, FamilyTy, Ty
from .evaluate import Evaluator, InterpretError

__all__ = ["InterpretError", "Program", "interpret"]


class Program:
    """One card of a checked library, ready to run (`name`: which card of the file; by
    default its model, the card nobody in it calls that owns parameters)."""

    def __init__(self, card: str | Path, name: str | None = None, library: Roots = None):
        card = str(card)
        self.lib, self.checker = _checked(card, library_roots([card], library))
        self.alg = _find(self.lib, self.checker, card, name)
        self.sig = self.checker.info(self.alg).sig

    @classmethod
    def of(cls, lib: Library, checker: Checker, alg: s.Algorithm) -> Program:
        """A card of a library already checked (without errors where it reaches)."""
        program = cls.__new__(cls)
        program.lib, program.checker, program.alg = lib, checker, alg
        program.sig = checker.info(alg).sig
        return program

    def hyperparameters(self, preset: str | None = None, **overrides: Any) -> dict[str, Any]:
        """Defaults, then the preset, then `overrides` (by the card's names); definitions
        (`d = D/H`) derived."""
        try:
            return preset_values(self.sig, preset, overrides)
        except PresetError as err:
            raise err.card_error(self.lib.diags.sources) from None

    def parameter_shapes(self, hypers: dict[str, Any]) -> dict[str, Any]:
        """Every parameter's shape at these hyperparameters, nested as `params` is."""
        return {name: _shapes(entry, hypers, self.alg.span)
                for name, entry in self.sig.tree.members.items()}

    def random_parameters(self, hypers: dict[str, Any], generator: torch.Generator | None = None,
                          dtype: torch.dtype = torch.float64) -> dict[str, Any]:
        """Parameters drawn from 𝒩(0, 1), whatever the card's initialisation says."""
        def draw(shape: Any) -> Any:
            if isinstance(shape, dict):
                return {k: draw(v) for k, v in shape.items()}
            if isinstance(shape, list):
                return [draw(v) for v in shape]
            return torch.randn(shape, generator=generator, dtype=dtype)

        return draw(self.parameter_shapes(hypers))

    def __call__(self, *inputs: Any, params: dict[str, Any], hypers: dict[str, Any],
                 dtype: torch.dtype = torch.float64) -> Any:
        ev = Evaluator(self.checker, dtype)
        args = [_input(x, ty, dtype) for x, (_, ty) in zip(inputs, self.sig.inputs, strict=True)]
        given = {}
        for name, entry in self.sig.tree.members.items():
            if name not in params:
                raise InterpretError(self.alg.span, f"no value for the parameters '{name}'")
            given.update(ev.bundle_view(name, entry, params[name]))
        return ev.run(self.alg, args, given, dict(hypers))


def interpret(card: str | Path, preset: str | None = None, library: Roots = None, *,
              inputs: tuple[Any, ...], params: dict[str, Any], name: str | None = None,
              dtype: torch.dtype = torch.float64, **overrides: Any) -> Any:
    """Run `card` (its model, or the card `name`) at a preset on one example."""
    program = Program(card, name, library)
    return program(*inputs, params=params, hypers=program.hyperparameters(preset, **overrides),
                   dtype=dtype)


def _checked(card: str, roots: Roots) -> tuple[Library, Checker]:
    """The library, checked as far as the card calls it: errors in the card's file or anything
    it calls raise."""
    lib, targets = load([card], root=roots, lazy=True)
    checker, diags = check(lib)
    require_clean(lib, checker, diags, {card, *(str(Path(t)) for t in targets)})
    return lib, checker


def _find(lib: Library, checker: Checker, card: str, name: str | None) -> s.Algorithm:
    file = next((f for f in lib.files if Path(f.path) == Path(card)), None)
    algs = [a for a in (file.algorithms if file else ()) if a.label and id(a) in checker.infos]
    if name is not None:
        algs = [a for a in algs if name in (a.name, a.label)]
    called = {id(c.callee) for a in algs for c in checker.infos[id(a)].calls.values()}
    models = [a for a in algs if id(a) not in called and checker.infos[id(a)].sig.tree.members]
    chosen = models or algs
    if not chosen:
        raise ValueError(f"no card{f' named {name!r}' if name else ''} in {card}")
    return chosen[0]


def _shapes(entry: Entry, hypers: dict[str, Any], span: s.Span) -> Any:
    if isinstance(entry, Ty):
        env = {k: v for k, v in hypers.items() if isinstance(v, (int, float))}
        try:
            return tuple(int(d.evaluate(env)) for d in entry.shape)
        except KeyError as err:
            raise InterpretError(span, f"hyperparameter '{err.args[0]}' has no value") from None
    if isinstance(entry, FamilyTy):
        n = int(entry.over.evaluate({k: v for k, v in hypers.items()
                                     if isinstance(v, (int, float))}))
        return [_shapes(entry.entry, hypers, span) for _ in range(n)]
    assert isinstance(entry, BundleTy)
    return {k: _shapes(v, hypers, span) for k, v in entry.members.items()}


def _input(x: Any, ty: Any, dtype: torch.dtype) -> Any:
    if isinstance(ty, Ty) and ty.elem == "ℝ" and isinstance(x, torch.Tensor):
        return x.to(dtype)
    if isinstance(ty, Ty) and ty.elem == "ℝ" and isinstance(x, list):  # a family e_t
        return [v.to(dtype) if isinstance(v, torch.Tensor) else v for v in x]
    return x
