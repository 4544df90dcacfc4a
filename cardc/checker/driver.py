"""The driver: checks each card once, its declarations into a signature and then its steps,
and keeps every card's results for the cards that call it and for the lowering."""

from __future__ import annotations

from .. import syntax as s
from ..diagnostics import Diagnostics
from ..library import Library
from ..spelling import display
from .declarations import DeclEnv, _decls, _layout
from .results import MAX_CALL_DEPTH, SCALAR, CardInfo, CheckError, Signature
from .shapes import _flat_names, fits_model
from .steps import StepChecker


class Checker:
    """Checks cards on demand, each once: a card's results are ready when a caller needs them."""

    def __init__(self, lib: Library, diags: Diagnostics | None = None):
        self.lib = lib
        self.diags = diags if diags is not None else lib.diags
        self.infos: dict[int, CardInfo] = {}
        self.active: set[int] = set()
        self._decls: dict[int, list[s.Decl]] = {}  # by id(alg): read once, not per declaration
        # (id(recipe), M) → the model card a card-valued hyperparameter stands for in this run
        self.bindings: dict[tuple[int, str], s.Algorithm] = {}

    def decls(self, alg: s.Algorithm) -> list[s.Decl]:
        """Every declaration of a card, bundles and families opened."""
        found = self._decls.get(id(alg))
        if found is None:
            found = self._decls[id(alg)] = _decls(alg)
        return found

    # ------------------------------------------------------------------ cards
    def check_all(self) -> Diagnostics:
        for card_file in self.lib.files:  # titled cards (Algorithm 1: Token embedding.) too
            for alg in card_file.algorithms:
                self.info(alg)
        return self.diags

    def info(self, alg: s.Algorithm) -> CardInfo:
        key = id(alg)
        if key in self.infos:
            return self.infos[key]
        if key in self.active:
            self.diags.error(alg.span, f"'{alg.name}' calls itself")
            raise CheckError
        self.active.add(key)
        try:
            sig = self.signature(alg)
            self.adopt_scalars(alg, sig)
            info = CardInfo(sig)
            self.infos[key] = info
            StepChecker(self, alg, info).run()
            return info
        finally:
            self.active.discard(key)

    def adopt_scalars(self, alg: s.Algorithm, sig: Signature) -> None:
        """A scalar hyperparameter that a call to a card leaves unset (no argument, no default)
        is the caller's own, of the type its callee declares (`s ∈ (0, ∞)` stays a number,
        not a size): the signature says so before any step of the caller is checked."""
        own = {*sig.hypers, *sig.models, *sig.run, *_flat_names(sig.tree), *alg.outputs,
               *(name for name, _ in sig.inputs)}
        functions = {n.target.func for n in s.nodes(alg.steps)
                     if isinstance(n, s.Assign) and isinstance(n.target, s.Call)}
        file = self.lib.file_of(alg)
        for call in (n for n in s.nodes(alg.steps) if isinstance(n, s.Call)):
            if call.func in own or call.func in functions:
                continue
            callee = self.lib.find(call.func, file)
            if callee is None or id(callee) in self.active or len(self.active) >= MAX_CALL_DEPTH:
                continue  # a builtin, or a call the steps report
            try:
                theirs = self.info(callee).sig
            except CheckError:
                continue
            given = _given_hypers(call, theirs)
            for name, ty in theirs.hypers.items():
                if ty.value is None and not ty.shape and name not in theirs.defaults \
                        and name not in given and name not in own:
                    sig.hypers.setdefault(name, ty)

    def bind_model(self, alg: s.Algorithm, name: str, model: s.Algorithm) -> bool:
        """Let the card-valued hyperparameter `name` of `alg` stand for the card `model`, whose
        signature must fit its declared one (else a diagnostic at `model`, and False); `alg` is
        checked again with calls to `name` made to `model`."""
        want = self.info(alg).sig.models[name]
        sig = self.info(model).sig
        if not fits_model(want, sig):
            shown = ", ".join(str(ty) for _, ty in sig.inputs)
            self.diags.error(model.span, f"'{model.name}' is not a card {display(name)} of "
                             f"{alg.name} can stand for: it maps {shown or 'nothing'} to "
                             f"{sig.output}, and {alg.name} needs {want}",
                             hint="a recipe's model takes token IDs and returns one row of "
                                  "scores per token",
                             notes=((want.decl.span, f"{display(name)} is declared here"),))
            return False
        self.bindings[(id(alg), name)] = model
        self.infos.pop(id(alg), None)  # checked again, its calls now made to `model`
        return True

    def signature(self, alg: s.Algorithm) -> Signature:
        env = DeclEnv(self, alg)
        for kind in ("Hyperparameters", "Input", "Output", "Parameters"):
            for item in alg.decls(kind):
                env.declare(kind, item)
        env.link_datasets()
        env.declare_implicit_dims()
        env.check_formatted()
        inputs = []
        for name in alg.args:
            if name not in env.inputs:
                self.diags.error(alg.span, f"argument '{display(name)}' is not declared in Input",
                                 hint=env.dataset_hint(name))
            inputs.append((name, env.inputs.get(name, SCALAR)))
        if alg.name is None:  # a titled card has no header: its inputs are those it declares
            inputs = list(env.inputs.items())
        outs = [env.outputs.get(o) for o in alg.outputs]
        if alg.name is None and len(env.outputs) == 1:  # a titled card returns its one Output
            outs = list(env.outputs.values())
        params = []
        for name in alg.params:
            if name in env.models:  # the recipe's model: bound by whoever runs it
                continue
            entry = env.params.members.get(name) or env.hypers.get(name)
            if entry is None:
                self.diags.error(alg.span, f"parameter '{display(name)}' is not declared",
                                 hint="declare it under Parameters: or Hyperparameters:")
                entry = SCALAR
            params.append((name, entry))
        if len(outs) > 1:  # a card of several outputs: each must be declared
            for name, out in zip(alg.outputs, outs, strict=True):
                if out is None:
                    self.diags.error(alg.span, f"output '{display(name)}' is not declared in "
                                               "Output", hint=f"declare it: 'Output: "
                                                              f"{display(name)} ∈ ℝ^{{…}}'")
        return Signature(alg, inputs, outs[0] if outs else None, params, env.hypers,
                         env.defaults, env.definitions, env.params, _layout(alg, env),
                         env.elements, env.model_types(), env.run, outs[1:])


def _given_hypers(call: s.Call, sig: Signature) -> set[str]:
    """The callee's hyperparameters a call sets, by position after '|' or by name."""
    positional = [p for p in call.params if not isinstance(p, s.Arg)]
    given = {name for _, (name, _) in zip(positional, sig.params, strict=False)
             if name in sig.hypers}
    for p in call.params:
        if isinstance(p, s.Arg):
            target = p.target.base if isinstance(p.target, s.Index) else p.target
            if isinstance(target, s.Name):
                given.add(target.id)
    return given
