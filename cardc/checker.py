"""Name resolution and shape checking with symbolic dimensions.

Each card is checked in its own symbols. A call unifies the callee's declared shapes with the
caller's, rewrites the callee's output and parameters in the caller's symbols, and lets a
callee's input of shape ℝ^{D} take an ℝ^{T×D} argument row by row (row lifting).
Tokens carry the size of their vocabulary, so a token indexes a vocabulary axis and nothing else.
A parameter bundle declared by prose alone takes the structure of the card it is passed to, and
training steps do arithmetic on bundles (θ − η · ∇loss(θ)).
Errors are collected as diagnostics; checking goes on after each one.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from . import syntax as s
from .diagnostics import Diagnostics
from .dims import ONE, Dim, solve
from .library import Library
from .render.text import render_expr
from .spelling import canonical_name, display
from .types import BundleTy, Entry, FamilyTy, FuncTy, SetTy, Ty, subst_dim, substitute

ELEMENTWISE = {"GELU", "GELU_tanh", "ReLU", "SiLU", "σ", "exp", "log", "tanh", "cos", "sin"}
REDUCING = {"mean", "var", "max", "min"}
# min(a, b) and max(a, b) of two numbers, as a learning-rate schedule writes them
PAIRWISE = {"min", "max"}
# top_k(w | k), top_p(w | p): the distribution ∝ w on its k largest entries (ties with the k-th
# kept), or on the fewest largest whose share of Σ w reaches p; k ≥ the entries or p = 1 keeps
# every entry. Name → (the bound's name in messages, what it is)
FILTERS = dict(zip(s.FILTERS, (("k", "how many of the largest entries it keeps"),
                               ("p", "the share of the weights its largest entries must reach")),
                   strict=True))
BUILTINS = ELEMENTWISE | REDUCING | PAIRWISE | {"softmax", "length"} | set(FILTERS)
# dropout(X | p): while a model trains, each entry of X zeroed with probability p and the others
# scaled by 1/(1 − p); in evaluation (and sampling) X itself
DROPOUT = "dropout"
CONSTANTS = {"π": "math.pi"}
# θ ← AdamW(θ, ∇loss(θ) | η, β_1, β_2, λ): an update a training card may name instead of
# writing θ − η · ∇loss(θ); its hyperparameters are the learning rate, the two decay rates of
# the moment estimates and the weight decay (Loshchilov & Hutter), any trailing ones omitted
OPTIMIZERS = {"AdamW": 4}
# the paper's special tokens (§4) are the last IDs of the vocabulary V: N_V − 2, N_V − 1, N_V
SPECIAL_TOKENS = {"mask_token": 2, "bos_token": 1, "eos_token": 0}
SCALAR = Ty()


@dataclass
class Signature:
    """A card as its callers see it, in the card's own symbols."""

    alg: s.Algorithm
    inputs: list[tuple[str, Ty]]
    output: Ty | None
    params: list[tuple[str, Entry]]  # in header order; hyperparameters may appear here too
    hypers: dict[str, Ty]  # ℕ hyperparameters carry value = their symbol
    defaults: dict[str, s.Expr]
    definitions: dict[str, Dim]
    tree: BundleTy  # every parameter, for counting and code generation
    layout: str | None  # "row", "column" or None when the card does not say
    elements: dict[str, FamilyTy] = field(default_factory=dict)  # x_n of a dataset x_{1:N}
    models: dict[str, ModelTy] = field(default_factory=dict)  # cards taken as values (M)
    run: dict[str, RunValue] = field(default_factory=dict)  # the seed, number formats


@dataclass(frozen=True)
class RunValue:
    """A hyperparameter the run takes and the steps do not: the seed of every random draw
    (`formats` empty) or the number format of the input `of` (one of `formats`)."""

    decl: s.Decl
    formats: tuple[str, ...] = ()
    of: str | None = None
    default: int | str | None = None

    @property
    def seed(self) -> bool:
        return not self.formats


@dataclass
class ModelTy:
    """A card-valued hyperparameter `M ∈ {1..V}^{T} → ℝ^{T×V} for T ≤ T_max`: the signature
    the card bound to it must have; `window` names the hyperparameter bounding its input."""

    input: Ty
    output: Ty
    decl: s.Decl
    window: str | None = None

    def __str__(self) -> str:
        t = self.decl.type
        return f"{render_expr(t.input)} → {render_expr(t.output)}" \
            if isinstance(t, s.CardType) else f"{self.input} → {self.output}"


@dataclass
class CardInfo:
    """What checking a card found out: types of expressions, the signature, call bindings."""

    sig: Signature
    types: dict[int, Ty | Entry] = field(default_factory=dict)
    calls: dict[int, CallInfo] = field(default_factory=dict)


@dataclass
class CallInfo:
    callee: s.Algorithm
    bind: dict[str, Dim]
    lift: tuple[Dim, ...]  # leading dimensions the call is mapped over
    params: dict[str, s.Expr]  # callee parameter name → caller expression
    hypers: dict[str, s.Expr]  # callee hyperparameter → caller expression (or a mask rule)


class CheckError(Exception):
    """Internal: abandons one expression after its diagnostic was recorded."""


MAX_CALL_DEPTH = 32  # cards checking cards recurse; the deepest in cards/ is 5 levels


class Checker:
    def __init__(self, lib: Library, diags: Diagnostics | None = None):
        self.lib = lib
        self.diags = diags if diags is not None else lib.diags
        self.infos: dict[int, CardInfo] = {}
        self._active: set[int] = set()
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
        if key in self._active:
            self.diags.error(alg.span, f"'{alg.name}' calls itself")
            raise CheckError
        self._active.add(key)
        try:
            sig = self.signature(alg)
            info = CardInfo(sig)
            self.infos[key] = info
            _Body(self, alg, info).run()
            return info
        finally:
            self._active.discard(key)

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
        env = _DeclEnv(self, alg)
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
        return Signature(alg, inputs, outs[0] if outs else None, params, env.hypers,
                         env.defaults, env.definitions, env.params, _layout(alg, env),
                         env.elements, env.model_types(), env.run)


# ------------------------------------------------------------------ declarations


class _DeclEnv:
    def __init__(self, checker: Checker, alg: s.Algorithm):
        self.c = checker
        self.alg = alg
        self.hypers: dict[str, Ty] = {}
        self.defaults: dict[str, s.Expr] = {}
        self.definitions: dict[str, Dim] = {}
        self.inputs: dict[str, Entry] = {}
        self.outputs: dict[str, Entry] = {}
        self.params = BundleTy()
        self.datasets: list[s.Dataset] = []
        self.elements: dict[str, FamilyTy] = {}
        self.models: dict[str, s.Decl] = {}
        self.run: dict[str, RunValue] = {}

    def error(self, span, msg, hint=None):
        self.c.diags.error(span, msg, hint)

    def model_types(self) -> dict[str, ModelTy]:
        """Card-valued hyperparameters, their types read once every hyperparameter is known."""
        out = {}
        for name, d in self.models.items():
            t = d.type
            assert isinstance(t, s.CardType)
            window = t.window
            if window is not None and (window not in self.hypers or
                                       self.hypers[window].elem != "ℕ"):
                self.error(t.span, f"the window '{display(window)}' of {display(name)} is not "
                                   "a hyperparameter of this card in ℕ",
                           hint=f"declare it: 'Hyperparameters: {display(window)} ∈ ℕ'")
                window = None
            inp, outp = (self.decl_type(s.Decl((name,), x)) for x in (t.input, t.output))
            if window is not None and (t.length is None or Dim.sym(t.length) not in inp.shape):
                self.error(t.span, f"'{t.length}' is not the length of {display(name)}'s input "
                                   f"{render_expr(t.input)}",
                           hint="write the window as 'for T ≤ T_max', T the input's length")
            out[name] = ModelTy(inp, outp, d, window)
        return out

    def declare(self, kind: str, item: s.Item) -> None:
        if isinstance(item, s.Sentence):
            self.sentence(kind, item)
            return
        if isinstance(item, s.Dataset):
            if kind != "Input":
                self.error(item.span, f"a dataset belongs under Input, not {kind}")
                return
            self.dataset(item)
            return
        if kind == "Parameters":
            self.params.members.update(self.param_entries(item, {}))
            return
        if not isinstance(item, s.Decl):
            self.error(item.span, f"bundles belong under Parameters, not {kind}")
            return
        if isinstance(item.type, s.CardType):
            if kind != "Hyperparameters":
                self.error(item.span, f"a card taken as a value belongs under Hyperparameters, "
                                      f"not {kind}",
                           hint="the recipe's model is a hyperparameter, as DTraining's "
                                "transformer is in the paper")
                return
            self.models.update({name: item for name in item.names})
            return
        if item.pad is not None:
            self.error(item.span, f"a padding row belongs to a parameter, not to {kind}",
                       hint="declare it on the embedding matrix under Parameters")
        if item.seed or item.format_of is not None or isinstance(item.type, s.Formats):
            if kind == "Hyperparameters":
                self.run_value(item)
            else:
                what = {"Input": "an input", "Output": "an output"}.get(kind, "a parameter")
                self.error(item.span, f"a seed or a number format is a hyperparameter, not "
                                      f"{what}",
                           hint="declare it under Hyperparameters")
            return
        for name in item.names:
            ty = self.decl_type(item, name)
            if kind != "Hyperparameters" and item.type is None and item.value is None:
                ty = BundleTy()  # `θ, initial parameters`: its structure comes from its use
            if kind == "Hyperparameters":
                self.hyper(name, item, ty)
            elif kind == "Input":
                self.inputs[name] = ty
            else:
                self.outputs[name] = ty

    def run_value(self, item: s.Decl) -> None:
        """`s ∈ ℕ = 1337, seed of every random draw`; `φ ∈ {float32, bfloat16} = float32,
        number format of θ`: values the run takes, which no step may read."""
        if len(item.names) != 1:
            self.error(item.span, "declare a seed or a number format on its own",
                       hint=f"'{display(item.names[0])} ∈ …' alone on its line")
            return
        name = item.names[0]
        if item.seed:
            self.seed(name, item)
        else:
            self.number_format(name, item)

    def seed(self, name: str, item: s.Decl) -> None:
        if not (isinstance(item.type, s.Scalar) and item.type.set == "ℕ"):
            self.error(item.span, "a seed is a whole number",
                       hint=f"declare it as '{display(name)} ∈ ℕ = 1337, seed of every "
                            "random draw'")
            return
        other = next((v for v in self.run.values() if v.seed), None)
        if other is not None:
            self.error(item.span, f"a card has one seed: '{display(other.decl.names[0])}' is "
                                  "already seed of every random draw")
            return
        default = item.value
        if default is not None and not (isinstance(default, s.Num)
                                        and re.fullmatch(r"\d+", default.text)
                                        and int(default.text) < 2**63):
            self.error(default.span, f"the seed '{display(name)}' is a whole number from 0 to "
                                     "2^63 − 1", hint=f"'{display(name)} ∈ ℕ = 1337'")
            return
        self.run[name] = RunValue(item, default=None if default is None else int(default.text))

    def number_format(self, name: str, item: s.Decl) -> None:
        hint = f"'{display(name)} ∈ {{float32, bfloat16}} = float32, number format of θ'"
        if not isinstance(item.type, s.Formats):
            self.error(item.span, "a number format is one of a set of formats", hint=hint)
            return
        if item.format_of is None:
            self.error(item.span, f"'{display(name)}' names a number format: say of what",
                       hint=hint)
            return
        default = item.value
        if default is not None and not (isinstance(default, s.Name)
                                        and default.id in item.type.names):
            self.error(default.span, f"'{display(name)}' is one of "
                                     f"{{{', '.join(item.type.names)}}}", hint=hint)
            return
        self.run[name] = RunValue(item, item.type.names, item.format_of,
                                  None if default is None else default.id)

    def check_formatted(self) -> None:
        """A card that takes the run's values trains (it takes a dataset); what a number format
        formats is an input holding parameters, once each."""
        seen: dict[str, str] = {}
        for name, value in self.run.items():
            if not self.datasets:
                self.error(value.decl.span, f"'{display(name)}' is the run's, and this card does "
                                            "not train: it takes no dataset",
                           hint="declare the seed and the number format in the training card")
                continue
            if value.of is None:
                continue
            if not isinstance(self.inputs.get(value.of), BundleTy):
                self.error(value.decl.span, f"'{display(value.of)}' is not an input of "
                                            "parameters: a number format formats parameters",
                           hint="name the parameters the card takes, as 'number format of θ'")
            elif value.of in seen:
                self.error(value.decl.span, f"'{display(value.of)}' already has a number format, "
                                            f"'{display(seen[value.of])}'")
            seen.setdefault(value.of, name)

    def sentence(self, kind: str, item: s.Sentence) -> None:
        """A block written as a sentence declares the header's symbols that it mentions."""
        header = [*self.alg.outputs, *self.alg.args, *self.alg.params]
        words = {canonical_name(w.rstrip(".")) for w in re.findall(r"[^\s,;:()]+", item.text)}
        named = [n for n in header if n in words]
        if not named:
            self.error(item.span, "this sentence declares nothing: it names no symbol of the header",
                       hint="name what it declares, as in 'Input: Trained transformer parameters θ̂.'")
        table: dict[str, Entry] = {"Input": self.inputs, "Output": self.outputs,
                                   "Parameters": self.params.members,
                                   "Hyperparameters": self.hypers}[kind]
        for name in named:
            table.setdefault(name, Ty() if kind == "Hyperparameters" else BundleTy())

    def dataset(self, item: s.Dataset) -> None:
        """{x_n}_{n=1}^{N}: each x_n is a sequence of tokens of V, with a length of its own."""
        lo, hi = self.dim(item.lo), self.dim(item.hi)
        size = hi - lo + ONE if lo is not None and hi is not None else ONE
        vocab = self.set_size("V")
        for elem in item.elems:
            seq = Ty((Dim.sym(f"|{elem}|"),), "ℕ", vocab=vocab)
            self.elements[elem] = FamilyTy(item.index, size, seq)
        self.datasets.append(item)

    def link_datasets(self) -> None:
        """The header names a dataset's elements as x_{1:N}: each such argument is an input."""
        for item in self.datasets:
            span = f"{_flat(item.lo)}:{_flat(item.hi)}"
            for elem in item.elems:
                arg = next((a for a in self.alg.args
                            if (instance(elem, item.index, a) or "").replace(" ", "") == span), None)
                if arg is None:
                    if not any(split_name(a)[0] == split_name(elem)[0] for a in self.alg.args):
                        self.error(item.span, f"the header takes no argument for '{display(elem)}'",
                                   hint=f"name it in the header as {display(_whole(elem, item))}")
                    continue  # else the header's misspelled argument is reported
                self.inputs.setdefault(arg, self.elements[elem])

    def dataset_hint(self, arg: str) -> str | None:
        for item in self.datasets:
            for elem in item.elems:
                if split_name(elem)[0] == split_name(arg)[0]:
                    return f"the dataset declares {display(elem)}: write {display(_whole(elem, item))}"
        return None

    def declare_implicit_dims(self) -> None:
        """Symbols used in declared shapes are dimensions of the card even when undeclared."""
        entries = [*self.inputs.values(), *self.outputs.values(), *_members(self.params).values()]
        for entry in entries:
            ty = entry.entry if isinstance(entry, FamilyTy) else entry
            if isinstance(entry, FamilyTy):
                self.implicit(entry.over)
            if isinstance(ty, Ty):
                for d in (*ty.shape, ty.vocab):
                    if d is not None:
                        self.implicit(d)

    def implicit(self, d: Dim) -> None:
        for sym in d.symbols:
            if sym not in self.hypers and not sym.startswith("|"):
                self.hypers[sym] = Ty(elem="ℕ", value=Dim.sym(sym))

    def hyper(self, name: str, item: s.Decl, ty: Ty) -> None:
        if item.value is not None and item.type is None:
            dim = self.dim(item.value) if _is_integral_expr(item.value) else None
            if dim is not None:
                self.definitions[name] = dim
                self.hypers[name] = Ty(elem="ℕ", value=dim)
                return
            self.defaults[name] = item.value
            self.hypers[name] = Ty()
            return
        if item.value is not None:
            self.defaults[name] = item.value
        if ty.elem == "ℕ" and not ty.shape:
            ty = Ty(elem="ℕ", value=Dim.sym(name))
        self.hypers[name] = ty

    def param_entries(self, item: s.Item, outer: dict[str, str]) -> dict[str, Entry]:
        if isinstance(item, s.Bundle):
            members: dict[str, Entry] = {}
            for sub in item.items:
                members.update(self.param_entries(sub, outer))
            return {item.name: BundleTy(members)}
        if isinstance(item, s.Family):
            over = self.range_dim(item.over)
            out: dict[str, Entry] = {}
            for sub in item.items:
                if isinstance(sub, s.Family):  # code generation stacks one index at a time
                    self.error(sub.span, "a family cannot hold another family directly",
                               hint="declare the inner family in a card of its own and give "
                                    "the outer family a bundle of that card's parameters")
                    continue
                for name, entry in self.param_entries(sub, outer).items():
                    out[name] = FamilyTy(item.index, over or ONE, entry)
            return out
        out = {}
        for name in item.names:
            if item.type is None and item.value is None:
                out[name] = BundleTy()  # structure comes from the card it is passed to
            else:
                out[name] = replace(self.decl_type(item, name), init=item.value,
                                    init_dist=self.init_scale(item), pad=self.padding_row(item))
        return out

    def init_scale(self, item: s.Decl) -> s.Expr | None:
        """`W ~ 𝒩(0, σ²)`: the distribution's numbers are numbers or the card's scalar
        hyperparameters (a preset sets the scale)."""
        for n in s.nodes(item.init):
            hyper = self.hypers.get(n.id) if isinstance(n, s.Name) else SCALAR
            if hyper is None or hyper.shape:
                self.error(n.span if n.span.line else item.span,
                           f"the initial distribution names '{display(n.id)}', which is not a "
                           "scalar hyperparameter of this card",
                           hint=f"declare it: 'Hyperparameters: {display(n.id)} ∈ (0, ∞) = 0.02'")
                return None
        return item.init

    def padding_row(self, item: s.Decl) -> str | None:
        """`W_e ∈ ℝ^{V×D}, padding row v_pad`: v_pad must be a whole-number hyperparameter of
        the card (token IDs count from 1, so 0 says there is none) and W_e a matrix of rows."""
        if item.pad is None:
            return None
        hyper = self.hypers.get(item.pad)
        if hyper is None or hyper.elem != "ℕ" or hyper.shape or item.pad in self.definitions:
            self.error(item.span, f"the padding row '{display(item.pad)}' is not a "
                                  "whole-number hyperparameter of this card",
                       hint=f"declare it: 'Hyperparameters: {display(item.pad)} ∈ ℕ = 0', the "
                            "ID of the padding token (0: none)")
            return None
        if not isinstance(item.type, s.Tensor) or len(item.type.dims) != 2:
            self.error(item.span, "a padding row belongs to a matrix that tokens index",
                       hint="declare it on the embedding matrix, as 'W_e ∈ ℝ^{V×D}, padding "
                            "row v_pad'")
            return None
        return item.pad

    def range_dim(self, expr: s.Expr) -> Dim | None:
        if isinstance(expr, s.Concat) and len(expr.items) == 1:
            return self.dim(expr.items[0])
        self.error(expr.span, "expected a range such as [N]")
        return None

    def decl_type(self, d: s.Decl, name: str | None = None) -> Ty:
        """The type of `name` (by default the first name) as `d` declares it."""
        t = d.type
        if t is None:
            return Ty()
        if isinstance(t, s.Tensor):
            dims = tuple(self.dim(x) or Dim.sym("?") for x in t.dims)
            return Ty(dims, _elem(t.elem), vocab=self.vocab(t.elem))
        if isinstance(t, s.Sequences):  # z, x ∈ V*: |z| and |x|
            return Ty((Dim.sym(f"|{name or d.names[0]}|"),), "ℕ", vocab=self.set_size(t.of))
        if isinstance(t, s.Simplex):  # Δ(V): a vector of probabilities, one per element of V
            return Ty((self.set_size(t.over),), "ℝ")
        return Ty((), _elem(t), vocab=self.vocab(t))

    def vocab(self, t: s.Type) -> Dim | None:
        """Token IDs: {1..N} and V ≅ [N] are vocabularies ([N] alone may number positions)."""
        if isinstance(t, s.IntRange):
            lo, hi = _dim(t.lo, self.definitions, None), _dim(t.hi, self.definitions, None)
            return hi - lo + ONE if lo is not None and hi is not None else None
        if isinstance(t, s.Iso):
            return self.set_size(t.name)
        return None

    def set_size(self, name: str) -> Dim:
        """|V|: from a declaration `V ≅ [N]` in this card, else the paper's own name N_V."""
        for item in self.c.decls(self.alg):
            t = item.type
            if isinstance(t, s.Iso) and t.name == name and isinstance(t.of, s.Finite):
                return self.dim(t.of.size) or Dim.sym(f"N_{name}")
        return Dim.sym(f"N_{name}")

    def dim(self, expr: s.Expr) -> Dim | None:
        """A dimension expression in this card's hyperparameters (definitions substituted)."""
        return _dim(expr, self.definitions, self.c.diags)


def _elem(t: s.Type) -> str:
    if isinstance(t, s.Bits):
        return "𝔹"
    if isinstance(t, (s.IntRange, s.Finite, s.Iso)) or (isinstance(t, s.Scalar) and t.set == "ℕ"):
        return "ℕ"
    return "ℝ"


def _decls(alg: s.Algorithm) -> list[s.Decl]:
    """Every declaration of a card, bundles and families opened."""
    out: list[s.Decl] = []

    def go(item: s.Item) -> None:
        if isinstance(item, s.Decl):
            out.append(item)
        elif isinstance(item, (s.Bundle, s.Family)):
            for sub in item.items:
                go(sub)

    for block in alg.blocks:
        for item in block.items:
            go(item)
    return out


def _flat(e: s.Expr) -> str:
    """An expression as a name's subscript spells it: x_{1:N_data}."""
    return unicodedata.normalize("NFD", render_expr(e)).replace(" ", "")


def _whole(elem: str, item: s.Dataset) -> str:
    """x_n of {x_n}_{n=1}^{N} as the header names the whole dataset: x_{1:N}."""
    base, decor = split_name(elem)
    parts = [f"{k}{{{_flat(item.lo)}:{_flat(item.hi)}}}" if v == item.index else
             f"{k}{v}" if len(v) == 1 else f"{k}{{{v}}}" for k, v in decor]
    return base + "".join(parts)


def _is_integral_expr(e: s.Expr) -> bool:
    if isinstance(e, s.Num):
        return e.text.isdigit()
    if isinstance(e, s.Name):
        return True
    if isinstance(e, s.BinOp):
        return e.op in "+−/· " and _is_integral_expr(e.left) and _is_integral_expr(e.right)
    return False


def _dim(expr: s.Expr, definitions: dict[str, Dim], diags: Diagnostics | None,
         values: dict[str, Dim] | None = None) -> Dim | None:
    def go(e: s.Expr) -> Dim:
        if isinstance(e, s.Num) and e.text.isdigit():
            return Dim.const(int(e.text))
        if isinstance(e, s.Name):
            if values and e.id in values:
                return values[e.id]
            return definitions.get(e.id, Dim.sym(e.id))
        if isinstance(e, s.BinOp) and e.op in ("+", "−", "·", " ", "/"):
            a, b = go(e.left), go(e.right)
            if e.op == "+":
                return a + b
            if e.op == "−":
                return a - b
            if e.op == "/":
                q = a / b
                if q is None:
                    raise CheckError
                return q
            return a * b
        if isinstance(e, s.Call) and e.func == "length" and len(e.args) == 1:
            arg = e.args[0]
            return Dim.sym(f"|{arg.id}|") if isinstance(arg, s.Name) else Dim.sym("|?|")
        raise CheckError

    try:
        return go(expr)
    except CheckError:
        if diags is not None:
            diags.error(expr.span, "expected a dimension: a whole number or a product or sum of hyperparameters")
        return None


def expr_dim(expr: s.Expr, definitions: dict[str, Dim]) -> Dim | None:
    """A dimension written in a card (`D/H`, `ℓ + 1`), or None when it is not one."""
    return _dim(expr, definitions, None)


def _layout(alg: s.Algorithm, env: _DeclEnv) -> str | None:
    """Row-major cards multiply parameters from the right (X W), column-major from the left."""
    params = set(_flat_names(env.params))
    found: set[str] = set()
    stack: list = list(alg.steps)
    while stack:  # products under the steps, through fields and tuples of nodes
        e = stack.pop()
        if isinstance(e, s.BinOp):
            if e.op in (" ", "·"):
                left, right = _root_name(e.left), _root_name(e.right)
                if left in params and right not in params:
                    found.add("column")
                elif right in params and left not in params:
                    found.add("row")
            stack += (e.left, e.right)
        elif hasattr(e, "__dataclass_fields__"):
            for name in s.child_fields(type(e)):
                value = getattr(e, name)
                stack += [v for v in (value if isinstance(value, tuple) else (value,))
                          if hasattr(v, "__dataclass_fields__")]
    return found.pop() if len(found) == 1 else None


def _root_name(e: s.Expr) -> str | None:
    while isinstance(e, (s.Transpose, s.Index)):
        e = e.operand if isinstance(e, s.Transpose) else e.base
    return e.id if isinstance(e, s.Name) else None


def _flat_names(b: BundleTy) -> list[str]:
    out = []
    for name, entry in b.members.items():
        out.append(name)
        inner = entry.entry if isinstance(entry, FamilyTy) else entry
        if isinstance(inner, BundleTy):
            out += _flat_names(inner)
    return out


# ------------------------------------------------------------------ names with indices

_DECOR = re.compile(r"([_^])(\{[^{}]*\}|[^_^{}]+)")


def split_name(name: str) -> tuple[str, list[tuple[str, str]]]:
    base, decor = _split_name(name)
    return base, list(decor)


@lru_cache(maxsize=4096)  # a card's names are split over and over, by checker and lowering
def _split_name(name: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    m = re.match(r"[^_^]+", name)
    base = m.group(0) if m else ""
    return base, tuple((k, v.strip("{}")) for k, v in _DECOR.findall(name[len(base):]))


@lru_cache(maxsize=4096)
def instance(pattern: str, var: str, name: str) -> str | None:
    """The index text of `name` as an instance of family `pattern` over `var` (e_t, e_ℓ → ℓ)."""
    pb, pd = _split_name(pattern)
    nb, nd = _split_name(name)
    if pb != nb or len(pd) != len(nd) or not any(v == var for _, v in pd):
        return None
    found = None
    for (pk, pv), (nk, nv) in zip(pd, nd, strict=False):
        if pk != nk:
            return None
        if pv == var:
            if found is not None and found != nv:
                return None
            found = nv
        elif pv != nv:
            return None
    return found


# ------------------------------------------------------------------ steps and expressions


class _Body:
    """Checks the steps of one card."""

    def __init__(self, checker: Checker, alg: s.Algorithm, info: CardInfo):
        self.c = checker
        self.alg = alg
        self.info = info
        self.sig = info.sig
        self.file = checker.lib.file_of(alg)
        self.scopes: list[dict[str, Entry]] = [self.base_scope()]
        self.loop_vars: dict[str, Dim] = {}
        self.families: dict[str, tuple[str, Dim, Ty]] = {}  # e_t defined in a loop over t
        self.solved: dict[str, Dim] = {}  # inference variables of callees' free dimensions
        self.returned = False
        self.declared = {n: d.span for d in checker.decls(alg) for n in d.names}  # for notes
        self.assigned: dict[str, s.Span] = {}  # the step that last gave a name its value
        # names whose step failed, or already reported unknown: their later uses stay quiet
        self.failed: set[str] = set()

    def base_scope(self) -> dict[str, Entry]:
        vocab = _DeclEnv(self.c, self.alg).set_size("V")  # special tokens belong to V
        scope: dict[str, Entry] = {
            name: Ty(elem="ℕ", value=vocab - Dim.const(back), vocab=vocab)
            for name, back in SPECIAL_TOKENS.items()}
        scope.update(self.sig.hypers)
        scope.update(self.sig.elements)
        scope.update({n: t for n, t in self.sig.inputs})
        scope.update(self.sig.tree.members)
        for _name, entry in self.sig.tree.members.items():
            if isinstance(entry, BundleTy):  # members of a bundle are in scope by their names
                scope.update(_members(entry))
        return scope

    def error(self, span, msg, hint=None, notes=()):
        self.c.diags.error(span, msg, hint, notes)

    def run(self) -> None:
        if not self.alg.steps:
            self.error(self.alg.span, f"'{self.alg.label or 'this card'}' has no steps",
                       hint="write its steps after the blocks: '1 Y ← …', '2 return …'")
        for step in self.alg.steps:
            self.step(step)
        for call in self.info.calls.values():  # sizes no step fixes become the card's own
            for d in call.bind.values():
                for sym in d.symbols:
                    if sym.startswith("?") and sym not in self.solved:
                        self.solved[sym] = Dim.sym(sym[1:])
                        self.sig.hypers.setdefault(sym[1:], Ty(elem="ℕ", value=Dim.sym(sym[1:])))
        if self.solved:
            solved = substitute(self.sig.tree, self.solved)
            self.sig.tree.members.update(solved.members)
            for call in self.info.calls.values():  # a callee's free sizes, as the card fixed them
                call.bind = {k: subst_dim(v, self.solved) for k, v in call.bind.items()}
        self.adopt_sizes()

    def adopt_sizes(self) -> None:
        """A bundle declared `see (4)` has the callee's shapes in the callee's symbols; the call
        that receives it says what they are here."""
        def adopt(members: dict[str, Entry], given: str, bind: dict[str, Dim]) -> None:
            for key, entry in members.items():
                if isinstance(entry, BundleTy) and entry.card is None:
                    adopt(entry.members, given, bind)
                elif isinstance(entry, BundleTy) and key == given:
                    members[key] = substitute(entry, bind)
                elif isinstance(entry, FamilyTy) and isinstance(entry.entry, BundleTy) and \
                        entry.entry.card and instance(key, entry.var, given) is not None:
                    members[key] = FamilyTy(entry.var, entry.over, substitute(entry.entry, bind))

        for call in self.info.calls.values():
            for given in call.params.values():
                if isinstance(given, s.Name):
                    adopt(self.sig.tree.members, given.id, call.bind)
        if self.alg.name and self.alg.outputs and not self.returned:
            self.error(self.alg.span, f"'{self.alg.name}' never returns its output",
                       hint="end the card with 'return …'")

    # --- scopes
    def lookup(self, name: str, span: s.Span) -> Entry:
        for scope in reversed(self.scopes):
            if name in scope:
                return self.enter_family(scope[name], name, span)
        for pattern, (var, _over, ty) in self.families.items():
            if self.known_index(instance(pattern, var, name)):
                return ty
        for scope in reversed(self.scopes):
            for key, entry in scope.items():
                if isinstance(entry, FamilyTy) and self.known_index(instance(key, entry.var, name)):
                    return entry.entry
        if name in CONSTANTS:
            return SCALAR
        if name in self.failed:  # a consequence of an error already reported
            raise CheckError
        self.failed.add(name)
        if name in self.sig.run:
            what = "seed" if self.sig.run[name].seed else "number format"
            self.error(span, f"'{display(name)}' is the run's {what}, which no step reads",
                       hint="the run takes it; the steps' math cannot")
            raise CheckError
        hint = _spelling_hint(name) or _read_as_prose(self.alg, name) or \
            _suggest(name, [k for sc in self.scopes for k in sc])
        self.error(span, f"unknown name '{display(name)}'", hint)
        raise CheckError

    def known_index(self, idx: str | None) -> bool:
        """e_1, W_{l+1}, x_m: a member of a family where the index is a number or names in scope."""
        if idx is None:
            return False
        words = re.findall(r"[^\W\d][\w\u0302\u0303′]*", idx)
        return all(w in self.loop_vars or self.try_lookup(w) is not None for w in words)

    def enter_family(self, entry: Entry, name: str, span: s.Span) -> Entry:
        if isinstance(entry, FamilyTy):
            if entry.var not in self.loop_vars:
                self.error(span, f"'{display(name)}' is indexed by '{display(entry.var)}', "
                                 "which no enclosing loop binds",
                           hint=f"use it inside 'for {display(entry.var)} ∈ …'")
                raise CheckError
            return entry.entry
        return entry

    def bind(self, name: str, entry: Entry) -> None:
        self.scopes[-1][name] = entry

    # --- steps
    def step(self, step: s.Step) -> None:
        try:
            ty = self.stmt(step.stmt)
        except CheckError:
            self.failed.update(_targets(step.stmt))
            return
        if step.annotation is not None and isinstance(ty, Ty) and step.annotation.type is not None:
            want = _DeclEnv(self.c, self.alg)
            want.definitions = self.sig.definitions
            declared = want.decl_type(step.annotation)
            if not same_shape(declared, ty):
                self.error(step.annotation.span,
                           f"annotation says {declared} but the value is {ty}")

    def stmt(self, st: s.Stmt) -> Ty | None:
        return getattr(self, "stmt_" + type(st).__name__.lower())(st)

    def stmt_assign(self, st: s.Assign) -> Ty | None:
        value = self.expr(st.value)
        target = st.target
        if isinstance(target, s.Name):
            self.reassign(target, value)
            self.assign_name(target.id, value)
            self.assigned[target.id] = st.span
            return value
        if isinstance(target, s.Index) and isinstance(target.base, s.Name):
            return self.assign_indexed(target, self.as_tensor(st.value, value))
        if isinstance(target, s.Call):  # P(θ) ← …, loss(θ) = …: functions of the parameters
            self.define_function(target, st.value, value)
            return value
        self.error(target.span, "cannot assign to this expression")
        raise CheckError

    def reassign(self, target: s.Name, value: Entry) -> None:
        """Parameters stay parameters of one card; a sequence of tokens stays one (it may grow)."""
        old = self.try_lookup(target.id)
        name = display(target.id)
        if isinstance(old, BundleTy):
            if not isinstance(value, BundleTy) or not old.same_kind(value):
                self.error(target.span, f"'{name}' is {old}; cannot assign {value} to it")
                raise CheckError
            _adopt(old, value)
        elif _is_sequence(old) and not (_is_sequence(value) and _same_vocab(old, value)):
            self.error(target.span, f"'{name}' is a sequence of tokens; cannot assign {value} to it",
                       hint="a sequence may be reassigned a sequence of the same vocabulary, "
                            "such as [x, y]")
            raise CheckError

    def define_function(self, target: s.Call, body: s.Expr, value: Entry) -> None:
        """`P(θ) ← DTransformer(x | θ)`: P is the value, as a function of θ."""
        params = []
        for arg in target.args:
            if not isinstance(arg, s.Name) or target.params:
                self.error(arg.span, f"the parameters of '{display(target.func)}' must be names")
                raise CheckError
            self.expr(arg)  # the parameter must be in scope
            if not any(n.id == arg.id for n in _names(body)):
                self.error(arg.span, f"'{display(target.func)}({display(arg.id)})' is defined by an "
                                     f"expression that does not use '{display(arg.id)}'")
            params.append(arg.id)
        self.bind(target.func, FuncTy(tuple(params), value))
        self.info.types[id(target)] = value

    def assign_name(self, name: str, value: Entry) -> None:
        for var in self.loop_vars:
            if any(v == var for _, v in split_name(name)[1]):
                self.families[name] = (var, self.loop_vars[var], value)
                return
        self.bind(name, value)

    def assign_indexed(self, target: s.Index, value: Ty) -> Ty:
        name = target.base.id
        existing = self.try_lookup(name)
        if existing is None:  # X̃[:, t] ← v inside a loop over t builds X̃ column by column
            shape: list[Dim | None] = []
            rest = list(value.shape)
            for item in target.items:
                if isinstance(item, s.Slice):
                    shape.append(rest.pop(0) if rest else None)
                elif isinstance(item, s.Name) and item.id in self.loop_vars:
                    shape.append(self.loop_vars[item.id])
                else:
                    self.error(item.span, "cannot infer the size of this axis")
                    raise CheckError
            ty = Ty(tuple(shape) + tuple(rest), value.elem, vocab=value.vocab)
            self.bind(name, ty)
            self.info.types[id(target)] = ty
            return ty
        got = self.index(existing, target)
        if not broadcastable(value, got):
            self.error(target.span, f"cannot store {value} into {got}")
        return got

    def try_lookup(self, name: str) -> Entry | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def stmt_return(self, st: s.Return) -> Entry:
        self.returned = True
        value = self.expr(st.value)
        out = self.sig.output
        if st.name and self.alg.outputs and st.name not in self.alg.outputs:
            self.error(st.span, f"returns '{display(st.name)}' but the header promises "
                                f"'{display(self.alg.outputs[0])}'")
        if isinstance(out, BundleTy):  # θ̂, the trained parameters: those of the card trained
            if not isinstance(value, BundleTy) or not out.same_kind(value):
                self.error(st.value.span, f"returns {value} but Output declares {out}")
            else:
                _adopt(out, value)
            return value
        if out is None:
            return value
        if not isinstance(value, Ty):
            self.error(st.value.span, f"returns {value} but Output declares {out}")
        elif not same_shape(self.free_length(out, value), value):
            self.error(st.value.span, f"returns {value} but Output declares {out}",
                       hint="the returned value must have the declared output shape")
        elif not _same_vocab(out, value):
            self.error(st.value.span, f"returns tokens of a vocabulary of {_d(value.vocab)}, "
                                      f"but Output declares one of {_d(out.vocab)}")
        return value

    def free_length(self, out: Ty, value: Ty) -> Ty:
        """An Output y ∈ V* has whatever length the card gives it: |y| is free."""
        own = {Dim.sym(f"|{o}|") for o in self.alg.outputs}
        if out.rank == 1 and out.shape[0] in own and value.rank == 1:
            return replace(out, shape=value.shape)
        return out

    def stmt_sample(self, st: s.Sample) -> Ty:
        """sample a token y from q ∝ w: q is the distribution w normalised, y a token of it."""
        weights = self.tensor(st.weights)
        size = weights.shape[0] if weights.rank == 1 else None
        if size is None:  # y is still a token, of a vocabulary not known here
            self.error(st.weights.span, f"a token is sampled from a vector of weights, not {weights}",
                       hint="index one column: p ← P[:, t]")
            size = Dim.sym("?N_V")
        self.bind(st.dist, Ty((size,), "ℝ"))
        token = Ty(elem="ℕ", vocab=size)
        self.reassign(s.Name(st.var, span=st.span), token)
        self.assign_name(st.var, token)
        self.assigned[st.var] = st.span
        return token

    def stmt_for(self, st: s.For) -> None:
        self.loop_body(st)
        over = self.dim_of(st.over.last) if isinstance(st.over, s.Range) else self.set_size(st.over)
        bound = [st.var]
        alias = self.misnamed_loop_var(st)
        if alias is not None:  # reported once at the loop; its body is checked as if it bound both
            bound.append(alias)
        self.scopes.append({})
        for var in bound:
            self.loop_vars[var] = over
            self.bind(var, Ty(elem="ℕ", value=Dim.sym(var)))
        self.grow_sequences(st.body)
        for step in st.body:
            self.step(step)
        inner = self.scopes.pop()
        for var in bound:
            self.loop_vars.pop(var, None)
        for name, entry in inner.items():  # a loop's assignments are visible after it
            if name not in bound:
                self.bind(name, entry)

    def misnamed_loop_var(self, st: s.For) -> str | None:
        """`for i = 1, …, L do` whose body never says i but indexes parameters by an unbound l
        (the paper's Algorithm 8): one diagnostic at the loop, not one per step. Returns l."""
        names = _names(st.body)
        if any(n.id == st.var or st.var in (v for _, v in split_name(n.id)[1]) for n in names):
            return None
        nested = _bound_vars(st.body)  # x_n in a loop over n inside this one is bound there
        free: dict[str, s.Name] = {}
        for n in names:
            entry = self.try_lookup(n.id)
            if isinstance(entry, FamilyTy) and entry.var not in self.loop_vars.keys() | nested:
                free.setdefault(entry.var, n)
        if len(free) != 1:
            return None
        ((var, use),) = free.items()
        header = f"for {var} {st.binder} {render_expr(st.over)}" + (" do" if st.style == "do" else " :")
        self.error(st.var_span, f"the loop binds '{display(st.var)}' but its body indexes by "
                                f"'{display(var)}'",
                   hint=f"did you mean '{display(header)}'?",
                   notes=((use.span, f"'{display(use.id)}' is indexed by '{display(var)}'"),))
        return var

    def stmt_forall(self, st: s.ForAll) -> None:
        # ∀t binds t as a loop does (k_t ← … defines the family k_t), over a set left unsaid
        outer = {v: self.loop_vars[v] for v in st.vars if v in self.loop_vars}
        self.loop_vars.update({v: Dim.sym(f"|{v}|") for v in st.vars})
        self.scopes.append({v: Ty(elem="ℕ") for v in st.vars})
        try:
            self.stmt(st.body)
        finally:
            self.scopes.pop()
            for v in st.vars:
                self.loop_vars.pop(v, None)
            self.loop_vars.update(outer)

    def stmt_if(self, st: s.If) -> None:
        cond = self.expr(st.cond)
        if cond.shape:
            self.error(st.cond.span, f"a condition must be a single truth value, not {cond}")
        self.stmt(st.then)

    def loop_body(self, st: s.For | s.While) -> None:
        if not st.body:
            block = "indent the steps of the loop under it" if getattr(st, "style", "") == \
                "block" else "put the steps of the loop between its head and 'end'"
            kind = "while" if isinstance(st, s.While) else "for"
            self.error(st.span, f"this '{kind}' loop has no steps", hint=block)

    def stmt_while(self, st: s.While) -> None:
        self.loop_body(st)
        cond = self.tensor(st.cond)
        if cond.shape:
            self.error(st.cond.span, f"a condition must be a single truth value, not {cond}")
        self.grow_sequences(st.body)
        for step in st.body:
            self.step(step)

    def grow_sequences(self, body: tuple[s.Step, ...]) -> None:
        """A sequence the loop appends to (x ← [x, y]) has a new length on each pass: |x|′."""
        for name in _appended(body):
            entry = self.try_lookup(name)
            if _is_sequence(entry):
                self.bind(name, replace(entry, shape=(Dim.sym(f"|{name}|′"),)))

    def set_size(self, e: s.Expr) -> Dim:
        """The n of a set of indices: [n], or a subset of [n] built as {t ∈ [n] : …}."""
        if isinstance(e, s.Concat) and len(e.items) == 1:
            return self.dim_of(e.items[0])
        ty = self.expr(e)
        if isinstance(ty, SetTy):
            return ty.of
        self.error(e.span, f"expected a set such as [ℓ] or {{t ∈ [ℓ] : …}}, not {ty}")
        raise CheckError

    def dim_of(self, e: s.Expr) -> Dim:
        values = {}
        for scope in self.scopes:
            for k, v in scope.items():
                if isinstance(v, Ty) and v.value is not None:
                    values[k] = v.value
        d = _dim(e, self.sig.definitions, self.c.diags, values)
        if d is None:
            raise CheckError
        return d

    # --- expressions
    def expr(self, e: s.Expr) -> Ty:
        ty = getattr(self, "expr_" + type(e).__name__.lower())(e)
        self.info.types[id(e)] = ty
        return ty

    def tensor(self, e: s.Expr) -> Ty:
        return self.as_tensor(e, self.expr(e))

    def as_tensor(self, e: s.Expr, ty: Entry) -> Ty:
        if not isinstance(ty, Ty):
            hint = None
            if isinstance(ty, FuncTy):
                hint = f"write {display(_text(e))}({', '.join(map(display, ty.params))})"
            self.error(e.span, f"'{_text(e)}' is {ty}, not a tensor", hint)
            raise CheckError
        return substitute(ty, self.solved) if self.solved else ty

    def operand(self, e: s.Expr) -> Ty | BundleTy:
        """A tensor, or a parameter bundle: θ − η · ∇loss(θ) is arithmetic on bundles."""
        ty = self.expr(e)
        return ty if isinstance(ty, BundleTy) else self.as_tensor(e, ty)

    def solve(self, a: tuple, b: tuple) -> bool:
        """Bind inference variables (?d_out) so that two shapes agree; False if they cannot."""
        if len(a) != len(b):
            return False
        for x, y in zip(a, b, strict=False):
            for u, v in ((x, y), (y, x)):
                if u is not None and v is not None and u != v and _is_var(u):
                    self.solved[next(iter(u.symbols))] = v
                    break
        return True

    def expr_name(self, e: s.Name) -> Ty:
        entry = self.lookup(e.id, e.span)
        return entry

    def expr_num(self, e: s.Num) -> Ty:
        if e.text.isdigit():
            return Ty(elem="ℕ", value=Dim.const(int(e.text)))
        return Ty()

    def expr_binop(self, e: s.BinOp) -> Ty:
        if e.op in ("≤", "<", "≥", ">", "≠", "=", "≡"):
            self.tensor(e.left)
            self.tensor(e.right)
            return Ty(elem="𝔹")
        if e.op == "∧":  # both sides are conditions
            for side in (e.left, e.right):
                ty = self.tensor(side)
                if ty.elem != "𝔹" or ty.shape:
                    self.error(side.span, f"'∧' joins conditions; this is {ty}")
                    raise CheckError
            return Ty(elem="𝔹")
        if e.op == " " and isinstance(e.left, s.Name) and e.left.id in BUILTINS \
                and self.try_lookup(e.left.id) is None:
            return self.apply_builtin(e.left.id, [self.tensor(e.right)], e)
        if e.op == " " and isinstance(e.left, s.Unary) and e.left.op == "−" \
                and isinstance(e.left.operand, s.Name) and e.left.operand.id in BUILTINS \
                and self.try_lookup(e.left.operand.id) is None:  # −log p reads as −(log p)
            return self.apply_builtin(e.left.operand.id, [self.tensor(e.right)], e)
        a, b = self.operand(e.left), self.operand(e.right)
        if isinstance(a, BundleTy) or isinstance(b, BundleTy):
            return self.bundle_arithmetic(e, a, b)
        if e.op in ("+", "−", "⊙"):
            return self.broadcast(a, b, e)
        if e.op == "/":
            if b.shape and not broadcastable(b, a):
                self.error(e.span, f"cannot divide {a} by {b}")
                raise CheckError
            return Ty(a.shape, "ℝ")
        return self.product(a, b, e)

    def bundle_arithmetic(self, e: s.BinOp, a: Ty | BundleTy, b: Ty | BundleTy) -> BundleTy:
        """Bundles of one card add and subtract; a scalar scales one (θ − η · ∇loss(θ)); 0 is
        every bundle's zero, so that a gradient accumulates from `g ← 0` (g ← g + ∇loss(θ))."""
        if e.op == "+" and any(isinstance(x, Ty) and not x.shape and x.value == Dim.const(0)
                               for x in (a, b)):
            return b if isinstance(b, BundleTy) else a
        if e.op in ("+", "−", "⊙") and isinstance(a, BundleTy) and isinstance(b, BundleTy):
            if a.same_kind(b):
                return a if a.members else b
            self.error(e.span, f"cannot {_WORDS[e.op]} {a} and {b}",
                       hint="parameters of different cards do not match")
            raise CheckError
        scaled, scale = (b, a) if isinstance(b, BundleTy) else (a, b)
        if e.op in ("·", " ", "/") and isinstance(scale, Ty) and not scale.shape \
                and (e.op != "/" or scale is b):
            return scaled
        self.error(e.span, f"cannot {_WORDS.get(e.op, 'combine')} {a} and {b}",
                   hint="bundles add to bundles of the same card and scale by scalars")
        raise CheckError

    def broadcast(self, a: Ty, b: Ty, e: s.BinOp) -> Ty:
        shape = broadcast_shape(a.shape, b.shape)
        if shape is None and self.solve(a.shape, b.shape):
            a, b = substitute(a, self.solved), substitute(b, self.solved)
            shape = broadcast_shape(a.shape, b.shape)
        if shape is None:
            self.error(e.span, f"cannot {_WORDS[e.op]} {a} and {b}",
                       hint="shapes must match, or one must be a scalar or a trailing part of the other")
            raise CheckError
        elem = "ℝ" if "ℝ" in (a.elem, b.elem) else a.elem
        value = None
        if a.value is not None and b.value is not None and not shape:
            value = a.value + b.value if e.op == "+" else a.value - b.value if e.op == "−" else None
        return Ty(shape, elem, value)

    def product(self, a: Ty, b: Ty, e: s.BinOp) -> Ty:
        """Juxtaposition and `·`: scaling, matrix–matrix, matrix–vector, outer products."""
        if not a.shape or not b.shape:
            value = a.value * b.value if a.value is not None and b.value is not None else None
            return Ty(a.shape or b.shape, "ℝ" if "ℝ" in (a.elem, b.elem) else a.elem, value)
        if a.rank == 1 and b.rank == 2 and b.shape[0] == ONE:  # b 1^⊺: an outer product
            return Ty((a.shape[0], b.shape[1]))
        inner_a = a.shape[-1]
        inner_b = b.shape[0] if b.rank <= 2 else b.shape[-2]
        if not dims_equal(inner_a, inner_b):
            transpose = _product_hint(e, a, b)  # else: say where each shape came from
            self.error(e.span, f"cannot multiply {a} by {b}: inner dimensions "
                               f"{_d(inner_a)} and {_d(inner_b)} differ",
                       hint=transpose or self.redeclare_hint(e, a, b),
                       notes=() if transpose else self.origin_notes(e, a, b))
            raise CheckError
        if a.rank == 2 and a.shape[0] == ONE and b.rank == 1:  # q^⊺ k: a row times a column
            return Ty()
        shape = a.shape[:-1] + (b.shape[1:] if b.rank <= 2 else b.shape[:-2] + b.shape[-1:])
        return Ty(shape)

    def redeclare_hint(self, e: s.BinOp, a: Ty, b: Ty) -> str | None:
        """A parameter matrix times a computed value: the declaration may be what is wrong."""
        params = _members(self.sig.tree)
        left, right = e.left, e.right
        if isinstance(left, s.Name) and left.id in params and not _is_param(right, params) \
                and a.rank == 2 and b.rank >= 1:
            want = Ty((a.shape[0], b.shape[0]), a.elem)
        elif isinstance(right, s.Name) and right.id in params and not _is_param(left, params) \
                and b.rank == 2 and a.rank >= 1:
            want = Ty((a.shape[-1], b.shape[1]), b.elem)
            left = right
        else:
            return None
        return f"did you mean to declare {display(left.id)} ∈ {want}?"

    def origin_notes(self, e: s.BinOp, *tys: Ty) -> tuple[tuple[s.Span, str], ...]:
        """Where each named operand got its shape: its declaration, or the step that assigned it."""
        notes = []
        for operand, ty in zip((e.left, e.right), tys, strict=True):
            if not isinstance(operand, s.Name):
                continue
            name = display(operand.id)
            if operand.id in self.assigned:
                notes.append((self.assigned[operand.id], f"'{name}' is {ty} from this step"))
            elif operand.id in self.declared:
                notes.append((self.declared[operand.id], f"'{name}' is declared {ty} here"))
        return tuple(notes)

    def expr_unary(self, e: s.Unary) -> Entry:
        if e.op == "∇":
            return self.gradient(e)
        ty = self.tensor(e.operand)
        if e.op == "¬":
            return Ty(ty.shape, "𝔹")
        value = -ty.value if e.op == "−" and ty.value is not None else None
        return Ty(ty.shape, "ℝ" if e.op == "√" else ty.elem, value)

    def gradient(self, e: s.Unary) -> Entry:
        """∇loss(θ): the gradient of a scalar function of θ with respect to θ, shaped like θ."""
        f = e.operand
        if not isinstance(f, s.Call) or len(f.args) != 1 or f.params:
            self.error(e.span, "∇ takes the gradient of a function of one variable",
                       hint="define the function first, as 'loss(θ) = …', then write ∇loss(θ)")
            raise CheckError
        value = self.tensor(f)
        if value.shape:
            self.error(e.span, f"∇ needs a scalar to differentiate; {display(render_expr(f))} is {value}")
            raise CheckError
        return self.expr(f.args[0])

    def expr_power(self, e: s.Power) -> Ty:
        ty = self.tensor(e.base)
        exponent = self.tensor(e.exponent)
        if exponent.shape:
            self.error(e.exponent.span, f"an exponent must be a scalar, not {exponent}")
        return Ty(ty.shape)

    def expr_transpose(self, e: s.Transpose) -> Ty:
        ty = self.tensor(e.operand)
        if isinstance(e.operand, s.Num) and e.operand.text == "1":
            return Ty((ONE, None))  # 1^⊺: a row of ones as long as its partner needs
        if ty.rank == 1:
            return Ty((ONE, ty.shape[0]), ty.elem)
        if ty.rank != 2:
            self.error(e.span, f"cannot transpose {ty}: only matrices and vectors")
            raise CheckError
        return Ty((ty.shape[1], ty.shape[0]), ty.elem)

    def expr_index(self, e: s.Index) -> Ty:
        return self.index(self.tensor(e.base), e)

    def index(self, base: Ty, e: s.Index) -> Ty:
        if len(e.items) > base.rank:
            self.error(e.span, f"{len(e.items)} indices into {base}, which has {base.rank} axes")
            raise CheckError
        shape: list[Dim | None] = []
        for axis, item in enumerate(e.items):
            size = base.shape[axis]
            if isinstance(item, s.Progression):
                shape.append(self.progression_size(item))
                continue
            if isinstance(item, s.Slice):
                if item.lo is None and item.hi is None:
                    shape.append(size)
                    continue
                lo = self.dim_of(item.lo) if item.lo is not None else ONE
                hi = self.dim_of(item.hi) if item.hi is not None else size
                shape.append(hi - lo + ONE)
                continue
            ity = self.tensor(item)
            if ity.elem not in ("ℕ", "𝔹") and not isinstance(item, s.Name):
                self.error(item.span, f"an index must be a whole number, not {ity}")
            if not dims_equal(ity.vocab, size) and not _is_var(size) and not _is_var(ity.vocab):
                self.error(item.span, f"a token of a vocabulary of {_d(ity.vocab)} indexes an axis "
                                      f"of {_d(size)}", hint="tokens index the vocabulary axis")
            shape += list(ity.shape)  # a vector of token IDs gathers rows
        return Ty(tuple(shape) + base.shape[len(e.items):], base.elem, vocab=base.vocab)

    def progression_size(self, p: s.Progression) -> Dim:
        """How many entries `a, b, …, c` picks: (c − a)/(b − a) + 1, its step b − a a whole
        number from 1 up."""
        first, second, last = self.dim_of(p.first), self.dim_of(p.second), self.dim_of(p.last)
        step = (second - first).constant()
        if step is None or step < 1 or step.denominator != 1:
            self.error(p.second.span, f"the step of a progression must be a whole number from "
                                      f"1 up, not {_d(second - first)}",
                       hint="the odd columns of X are 'X[:, 1, 3, …, d − 1]', a step of 2")
            raise CheckError
        return (last - first) * Dim.const(1 / step) + ONE

    def expr_progression(self, e: s.Progression) -> Ty:
        self.error(e.span, "a progression 'a, b, …, c' picks entries of an index only",
                   hint="write it inside the brackets of an index: 'X[:, 1, 3, …, d − 1]'")
        raise CheckError

    def expr_concat(self, e: s.Concat) -> Ty:
        items = [x for x in e.items if not isinstance(x, s.Ellipsis_)]
        tys = [self.tensor(x) for x in items]
        first = tys[0]
        if e.sep == "," and any(ty.vocab is not None and ty.rank <= 1 for ty in tys):
            return self.tokens(e, items, tys)
        if first.rank >= 2 and len(items) > 1 and len(items) == len(e.items):
            return self.join_parts(e, items, tys)
        for x, ty in zip(items[1:], tys[1:], strict=False):
            if not same_shape(first, ty):
                self.error(x.span, f"cannot concatenate {ty} with {first}")
                raise CheckError
        count = self.concat_count(e, items)
        if len(e.items) == 1 and not first.shape:
            return Ty((first.value or Dim.sym("?"),), "ℕ")  # [N]: the set 1..N
        if not first.shape:
            self.error(e.span, "cannot concatenate scalars",
                       hint="[a, b] joins vectors or matrices, [x, y] tokens")
            raise CheckError
        if first.rank == 1:
            return Ty((count, first.shape[0]) if e.sep == ";" else (first.shape[0], count))
        if e.sep == ";":
            return Ty((count * first.shape[0],) + first.shape[1:])
        return Ty(first.shape[:-1] + (count * first.shape[-1],))

    def join_parts(self, e: s.Concat, items: list[s.Expr], tys: list[Ty]) -> Ty:
        """[A, B] side by side (the last axes add up), [A; B] one above the other (the first
        axes do): parts written out one by one may differ in width, ℝ^{T×a} and ℝ^{T×b}
        making ℝ^{T×(a + b)}; every other axis must agree."""
        first = tys[0]
        axis = 0 if e.sep == ";" else first.rank - 1
        hint = ("parts side by side may differ in width only" if e.sep == ","
                else "parts one above the other may differ in height only")
        total: Dim | None = Dim.const(0)
        for x, ty in zip(items, tys, strict=True):
            if ty.rank != first.rank or not all(
                    i == axis or dims_equal(a, b)
                    for i, (a, b) in enumerate(zip(ty.shape, first.shape, strict=True))):
                self.error(x.span, f"cannot concatenate {ty} with {first}", hint=hint)
                raise CheckError
            size = ty.shape[axis]
            total = None if size is None or total is None else total + size
        shape = list(first.shape)
        shape[axis] = total
        return Ty(tuple(shape), first.elem)

    def tokens(self, e: s.Concat, items: list[s.Expr], tys: list[Ty]) -> Ty:
        """[x, y], [bos_token]: tokens and sequences joined into one sequence."""
        if any(isinstance(x, s.Ellipsis_) for x in e.items):
            self.error(e.span, "cannot tell how many tokens '…' stands for")
            raise CheckError
        vocab = next(ty.vocab for ty in tys if ty.vocab is not None)
        length = Dim.const(0)
        for x, ty in zip(items, tys, strict=True):
            if ty.rank > 1 or ty.vocab is None or not _same_vocab(ty, Ty(vocab=vocab)):
                self.error(x.span, f"cannot join {ty} into a sequence of tokens of a vocabulary "
                                   f"of {_d(vocab)}", hint="join tokens and sequences of tokens")
                raise CheckError
            length = length + (ty.shape[0] if ty.shape and ty.shape[0] is not None else ONE)
        return Ty((length,), "ℕ", vocab=vocab)

    def concat_count(self, e: s.Concat, items: list[s.Expr]) -> Dim:
        if not any(isinstance(x, s.Ellipsis_) for x in e.items):
            return Dim.const(len(items))
        first, last = items[0], items[-1]
        lo, hi = self.family_index(first), self.family_index(last)
        if lo is None or hi is None:
            self.error(e.span, "cannot tell how many items '…' stands for",
                       hint="write the first and last items of a family, as [e_1, e_2, …, e_ℓ]")
            raise CheckError
        return hi - lo + ONE

    def family_index(self, e: s.Expr) -> Dim | None:
        if not isinstance(e, s.Name):
            return None
        for pattern, (var, _, _) in self.families.items():
            idx = instance(pattern, var, e.id)
            if idx is not None:
                return self.dim_of(s.Name(idx)) if not idx.isdigit() else Dim.const(int(idx))
        return None

    def expr_iverson(self, e: s.Iverson) -> Ty:
        self.expr(e.cond)
        return Ty(elem="𝔹")

    def expr_norm(self, e: s.Norm) -> Ty:
        """‖x‖: the L2 norm of a tensor's entries, or of a bundle's (a gradient's global norm)."""
        value = self.operand(e.operand)
        if isinstance(value, Ty) and value.elem == "𝔹":
            self.error(e.span, f"‖·‖ measures numbers, not {value}")
            raise CheckError
        return Ty()

    def expr_sum(self, e: s.Sum) -> Ty:
        # Σ_{t∈T̃} is over a set of indices; the index also binds members of families, as
        # x_n of a dataset under Σ_{n=a}^{b} (a minibatch)
        size = self.set_size(e.over) if e.over is not None else Dim.sym(e.index)
        outer = self.loop_vars.get(e.index)
        self.loop_vars[e.index] = size
        self.scopes.append({e.index: Ty(elem="ℕ", value=Dim.sym(e.index))})
        try:
            body = self.tensor(e.body)
        finally:
            self.scopes.pop()
            self.loop_vars.pop(e.index)
            if outer is not None:
                self.loop_vars[e.index] = outer
        return Ty(body.shape)

    def expr_call(self, e: s.Call) -> Ty:
        model = self.sig.models.get(e.func)  # a card-valued hyperparameter shadows the library
        if model is not None:
            bound = self.c.bindings.get((id(self.alg), e.func))
            return self.call_card(bound, e) if bound is not None else self.call_model(e, model)
        local = self.try_lookup(e.func)
        if isinstance(local, FuncTy):  # the card's own loss(θ) shadows a library card 'loss'
            return self.apply_function(e, local)
        if e.func in OPTIMIZERS and self.c.lib.find(e.func, self.file) is None:
            return self.apply_optimizer(e)
        if e.func in FILTERS and self.c.lib.find(e.func, self.file) is None:
            return self.apply_filter(e)
        if e.func == DROPOUT and self.c.lib.find(e.func, self.file) is None:
            return self.apply_dropout(e)
        if e.func in BUILTINS and self.c.lib.find(e.func, self.file) is None:
            return self.apply_builtin(e.func, [self.tensor(a) for a in e.args], e)
        callee = self.c.lib.find(e.func, self.file)
        if callee is None:
            local = self.try_lookup(e.func)
            if isinstance(local, FuncTy):  # P(θ): a value written as a function of θ
                return self.apply_function(e, local)
            if local is not None:
                self.error(e.span, f"'{display(e.func)}' is {local}, not a function",
                           hint=f"define it as a function of its parameters: "
                                f"{display(e.func)}(θ) ← …")
                raise CheckError
            cards = [a.name for _, a in self.c.lib.algorithms() if a.name]
            others = sorted(BUILTINS) + [
                k for sc in self.scopes for k, v in sc.items() if isinstance(v, FuncTy)]
            hint = _spelling_hint(e.func) or _join_hints(
                _suggest(e.func, cards) or (None if _card_like(e.func) else
                                            _suggest(e.func, others)), self.searched())
            self.error(e.span, f"unknown card or function '{display(e.func)}'", hint)
            raise CheckError
        return self.call_card(callee, e)

    def searched(self) -> str:
        """Where a card name was looked for, in order."""
        from .library import shown_folders

        here = str(Path(self.file.path).parent)
        folders = ", ".join(shown_folders([here, *self.c.lib.roots]))
        return f"Cards are looked for in {folders} (and the folders above the card's); add a " \
               "folder with --library."

    def apply_optimizer(self, e: s.Call) -> Entry:
        """AdamW(θ, ∇loss(θ) | η, …): parameters and their gradient in, parameters out."""
        if len(e.args) != 2:
            self.error(e.span, f"{e.func} takes the parameters and their gradient",
                       hint=f"write {e.func}(θ, ∇loss(θ) | η)")
            raise CheckError
        theta, grad = (self.expr(a) for a in e.args)
        if not isinstance(theta, BundleTy) or not _same_entry(theta, grad):
            self.error(e.span, f"{e.func} updates parameters with their gradient; given "
                               f"{theta} and {grad}")
            raise CheckError
        if len(e.params) > OPTIMIZERS[e.func]:
            self.error(e.span, f"{e.func} takes at most {OPTIMIZERS[e.func]} hyperparameters "
                               "(η, β_1, β_2, λ)")
            raise CheckError
        for p in e.params:
            ty = self.expr(p)
            if not isinstance(ty, Ty) or ty.shape:
                self.error(p.span, f"a hyperparameter of {e.func} is a number, not {ty}")
                raise CheckError
        return theta

    def apply_function(self, e: s.Call, f: FuncTy) -> Entry:
        """P(θ) as defined; P(φ) with φ of θ's type stands for the same value at φ."""
        if len(e.args) != len(f.params) or e.params:
            self.error(e.span, f"'{display(e.func)}' is {f}: it takes {len(f.params)} argument(s)")
            raise CheckError
        for arg, param in zip(e.args, f.params, strict=True):
            got, want = self.expr(arg), self.try_lookup(param)
            if not _same_entry(got, want):
                self.error(arg.span, f"'{display(e.func)}' is a function of {display(param)}, "
                                     f"which is {want}; given {got}")
                raise CheckError
        return f.result

    def expr_choice(self, e: s.Choice) -> Ty:
        """a or b randomly with probability p or q: options alike, one scalar per option."""
        options = [self.tensor(x) for x in e.options]
        for x, ty in zip(e.options[1:], options[1:], strict=True):
            if not same_shape(ty, options[0]) or ty.elem != options[0].elem \
                    or not _same_vocab(ty, options[0]):
                self.error(x.span, f"the options of a random choice differ: {options[0]} and {ty}")
                raise CheckError
        if len(e.probs) != len(e.options):
            self.error(e.span, f"{len(e.options)} options but {len(e.probs)} probabilities",
                       hint="give one probability per option")
        for p in e.probs:
            ty = self.tensor(p)
            if ty.shape:
                self.error(p.span, f"a probability must be a scalar, not {ty}")
        first = options[0]
        return Ty(first.shape, first.elem, vocab=first.vocab)

    def expr_setbuilder(self, e: s.SetBuilder) -> SetTy:
        """{t ∈ [ℓ] : c}: the indices of [ℓ] where c holds."""
        size = self.set_size(e.domain)
        outer = self.loop_vars.get(e.var)
        self.loop_vars[e.var] = size
        self.scopes.append({e.var: Ty(elem="ℕ", value=Dim.sym(e.var))})
        try:
            cond = self.tensor(e.cond)
        finally:
            self.scopes.pop()
            self.loop_vars.pop(e.var)
            if outer is not None:
                self.loop_vars[e.var] = outer
        if cond.shape:
            self.error(e.cond.span, f"a set's condition must be a single truth value, not {cond}")
        return SetTy(size)

    def apply_filter(self, e: s.Call) -> Ty:
        """top_k(w | k), top_p(w | p): a vector of weights in, a distribution of its shape out."""
        bound, what = FILTERS[e.func]
        usage = f"write {e.func}(w | {bound}): {bound} is {what}"
        if len(e.args) != 1:
            self.error(e.span, f"{e.func} filters one vector of weights, given {len(e.args)} "
                               "arguments",
                       hint=usage)
            raise CheckError
        if len(e.params) != 1 or isinstance(e.params[0], s.Arg):
            self.error(e.span, f"{e.func} takes one number after '|', its {bound}", hint=usage)
            raise CheckError
        weights = self.tensor(e.args[0])
        if weights.rank != 1:
            self.error(e.args[0].span, f"{e.func} filters a vector of weights, not {weights}",
                       hint="index one column: p ← P[:, t]")
            raise CheckError
        self.filter_bound(e.func, e.params[0])
        return Ty(weights.shape)

    def apply_dropout(self, e: s.Call) -> Ty:
        """dropout(X | p): a tensor in, one of its shape out; p a number in [0, 1)."""
        usage = "write dropout(X | p): p is the probability that an entry is zeroed"
        if len(e.args) != 1 or len(e.params) != 1 or isinstance(e.params[0], s.Arg):
            self.error(e.span, "dropout takes one tensor, then its probability after '|'",
                       hint=usage)
            raise CheckError
        x = self.tensor(e.args[0])
        p = self.tensor(e.params[0])
        given = e.params[0]
        if p.shape or isinstance(given, s.Num) and not 0 <= given.value < 1:
            self.error(given.span, f"the probability of dropout lies in [0, 1), not "
                                   f"{given.text if isinstance(given, s.Num) else p}", hint=usage)
            raise CheckError
        return Ty(x.shape, "ℝ")

    def filter_bound(self, func: str, given: s.Expr) -> None:
        """k of top_k is a whole number ≥ 1; p of top_p a number in (0, 1]."""
        ty = self.tensor(given)
        value = given.value if isinstance(given, s.Num) else None
        if ty.shape:
            problem = f"is a number, not {ty}"
        elif func == "top_k" and (ty.elem != "ℕ" or value is not None and value < 1):
            problem = f"is a whole number ≥ 1, not {given.text if value is not None else ty}"
        elif func == "top_p" and value is not None and not 0 < value <= 1:
            problem = f"lies in (0, 1], not {given.text}"
        else:
            return
        bound, what = FILTERS[func]
        self.error(given.span, f"the {bound} of {func} {problem}", hint=f"{bound} is {what}")

    def apply_builtin(self, name: str, args: list[Ty], e: s.Expr) -> Ty:
        if name in PAIRWISE and len(args) == 2:
            if any(a.shape for a in args):
                self.error(e.span, f"{name}(a, b) compares two numbers, given {args[0]} and "
                                   f"{args[1]}", hint=f"{name}(x) takes the {name} of a vector")
                raise CheckError
            return Ty(elem="ℕ") if all(a.elem == "ℕ" for a in args) else Ty()
        if len(args) != 1:
            self.error(e.span, f"{name} takes one argument")
            raise CheckError
        (x,) = args
        if name == "length":
            return Ty(elem="ℕ", value=x.shape[0] if x.shape else ONE)
        if name in REDUCING:
            return Ty(x.shape[:-1])
        return Ty(x.shape)

    # --- calls to cards
    def call_card(self, callee: s.Algorithm, e: s.Call) -> Ty:
        if len(self.c._active) >= MAX_CALL_DEPTH and id(callee) not in self.c.infos:
            self.error(e.span, f"cards call each other too deeply (more than {MAX_CALL_DEPTH} "
                               "levels)", hint="a model is a few levels of cards: block, "
                                               "attention, normalisation")
            raise CheckError
        info = self.c.info(callee)
        sig = info.sig
        args = list(e.args)
        if 0 < len(args) < len(sig.inputs):  # an omitted context sequence: Z = X (self-attention)
            args += [args[0]] * (len(sig.inputs) - len(args))
        if len(args) != len(sig.inputs):
            self.error(e.span, f"'{callee.name}' takes {len(sig.inputs)} input(s), given {len(e.args)}",
                       notes=((callee.span, "declared here"),))
            raise CheckError
        bind: dict[str, Dim] = {}
        lift: tuple[Dim, ...] = ()
        for arg, (pname, want) in zip(args, sig.inputs, strict=False):
            if not isinstance(want, Ty):  # an input declared by prose alone: a bundle
                self.error(arg.span, f"'{callee.name}' takes '{display(pname)}' as a bundle of "
                                     "parameters, which no step of a card can pass it",
                           notes=((callee.span, "declared here"),),
                           hint=f"declare '{display(pname)}' with a type: "
                                f"'{display(pname)} ∈ ℝ^{{…}}'")
                raise CheckError
            got = self.tensor(arg)
            extra = got.rank - want.rank
            if extra > 0 and not lift:  # an ℝ^{D} card applied to ℝ^{T×D}: mapped over rows
                lift = tuple(d for d in got.shape[:extra] if d is not None)
            if extra < 0 or not self.unify(want.shape, got.shape[max(extra, 0):], bind):
                self.error(arg.span, f"'{callee.name}' expects {display(pname)} ∈ "
                                     f"{_shown(want, bind)}, got {got}",
                           notes=((callee.span, f"'{callee.name}' is declared here"),))
                raise CheckError
            if want.vocab is not None and got.vocab is not None \
                    and not self.unify((want.vocab,), (got.vocab,), bind):
                self.error(arg.span, f"'{callee.name}' expects tokens of a vocabulary of "
                                     f"{_d(subst_dim(want.vocab, bind))}, got tokens of one of "
                                     f"{_d(got.vocab)}",
                           notes=((callee.span, f"'{callee.name}' is declared here"),))
                raise CheckError
        params, hypers = self.bind_params(sig, e, bind)
        for name, dim in sig.definitions.items():
            if name not in bind:
                bind[name] = subst_dim(dim, bind)
        for name, hty in sig.hypers.items():
            if name not in bind and hty.value is not None and name not in sig.definitions:
                mine = self.try_lookup(name)
                if isinstance(mine, Ty) and mine.value is not None:
                    bind[name] = mine.value
                else:  # inferred from later use (X + MHAttention(X̃ | …) fixes d_out = d_e)
                    bind[name] = Dim.sym("?" + name)
        out = substitute(sig.output or Ty(), bind)
        self.info.calls[id(e)] = CallInfo(callee, dict(bind), lift, params, hypers)
        if not isinstance(out, Ty):  # a training card returns parameters
            return out
        return Ty(lift + out.shape, out.elem, vocab=out.vocab)

    def call_model(self, e: s.Call, model: ModelTy) -> Ty:
        """`M(x | θ)` for a card-valued M not bound to a card: its declared signature, θ the
        parameters of whichever card it stands for."""
        name = display(e.func)
        if len(e.args) != 1:
            self.error(e.span, f"{name} takes one input, {str(model).split(' → ')[0]}; given "
                               f"{len(e.args)}",
                       notes=((model.decl.span, f"{name} is declared here"),))
            raise CheckError
        if len(e.params) != 1 or not isinstance(e.params[0], s.Name):
            self.error(e.span, f"{name} takes its parameters after '|': write "
                               f"{name}(x | θ)", notes=((model.decl.span, "declared here"),))
            raise CheckError
        theta = e.params[0]
        have = self.lookup(theta.id, theta.span)
        if not isinstance(have, BundleTy):
            self.error(theta.span, f"{name}'s parameters are a bundle, and '{display(theta.id)}'"
                                   f" is {have}", hint="declare them by prose alone: "
                                                       f"'Input: θ, the parameters of {name}.'")
            raise CheckError
        self.info.types[id(theta)] = have
        got = self.tensor(e.args[0])
        want, bind = model.input, {}
        extra = got.rank - want.rank
        lift = tuple(d for d in got.shape[:extra] if d is not None) if extra > 0 else ()
        if extra < 0 or not self.unify(want.shape, got.shape[max(extra, 0):], bind) or (
                want.vocab is not None and got.vocab is not None
                and not self.unify((want.vocab,), (got.vocab,), bind)):
            self.error(e.args[0].span, f"{name} expects {_shown(want, bind)}, got {got}",
                       notes=((model.decl.span, f"{name} is declared here"),))
            raise CheckError
        out = substitute(model.output, bind)
        assert isinstance(out, Ty)
        return Ty(lift + out.shape, out.elem, vocab=out.vocab)

    def bind_params(self, sig: Signature, e: s.Call, bind: dict[str, Dim]):
        params: dict[str, s.Expr] = {}
        hypers: dict[str, s.Expr] = {}
        positional = [p for p in e.params if not isinstance(p, s.Arg)]
        if len(positional) > len(sig.params):
            self.error(e.span, f"'{sig.alg.name}' takes {len(sig.params)} parameter(s) after '|', "
                               f"given {len(positional)}")
            raise CheckError
        for p, (name, want) in zip(positional, sig.params, strict=False):
            if name in sig.hypers:
                hypers[name] = p
                self.tensor(p)
                continue
            params[name] = p
            self.bind_entry(want, p, bind, sig.alg)
        for p in e.params:
            if isinstance(p, s.Arg):
                target = p.target.base if isinstance(p.target, s.Index) else p.target
                if not isinstance(target, s.Name) or target.id not in sig.hypers:
                    self.error(p.target.span, f"'{sig.alg.name}' has no hyperparameter "
                                              f"'{_text(target)}'",
                               notes=((sig.alg.span, "declared here"),))
                    continue
                hypers[target.id] = p
                if isinstance(p.target, s.Index):  # Mask[t, t′] = [[t ≤ t′]]: a rule
                    idx = [i.id for i in p.target.items if isinstance(i, s.Name)]
                    self.scopes.append({i: Ty(elem="ℕ") for i in idx})
                    try:
                        self.tensor(p.value)
                    finally:
                        self.scopes.pop()
                else:
                    self.tensor(p.value)
        return params, hypers

    def bind_entry(self, want: Entry, given: s.Expr, bind: dict[str, Dim], callee) -> None:
        if not isinstance(given, s.Name):
            self.error(given.span, "expected the name of a parameter or bundle")
            raise CheckError
        have = self.lookup(given.id, given.span)
        if isinstance(have, BundleTy) and not have.members and isinstance(want, BundleTy):
            adopted = BundleTy(want.members, callee.name)
            have.members.update(adopted.members)  # the caller's bundle takes the callee's shape
            have.card = callee.name
            self.info.types[id(given)] = have
            return
        if not self.unify_entry(want, have, bind):
            self.error(given.span, f"'{display(given.id)}' is {_entry_text(have)} but "
                                   f"'{callee.name}' expects {_entry_text(want)}")
            raise CheckError
        self.info.types[id(given)] = have

    def unify_entry(self, want: Entry, have: Entry, bind: dict[str, Dim]) -> bool:
        if isinstance(want, FamilyTy):
            want = want.entry
        if isinstance(have, FamilyTy):
            have = have.entry
        if isinstance(want, Ty) and isinstance(have, Ty):
            return self.unify(want.shape, have.shape, bind)
        if isinstance(want, BundleTy) and isinstance(have, BundleTy):
            w, h = list(want.members.values()), list(have.members.values())
            return len(w) == len(h) and all(self.unify_entry(a, b, bind) for a, b in zip(w, h, strict=False))
        return False

    def unify(self, want: tuple, got: tuple, bind: dict[str, Dim]) -> bool:
        """Bind the callee's symbols so that its dimensions `want` equal the caller's `got`:
        each dimension that leaves one unknown symbol, linearly, binds it (`3 d` against
        `3 D/H`), in as many passes as bindings make more dimensions solvable."""
        if len(want) != len(got):
            return False
        pending = [(w, g) for w, g in zip(want, got, strict=True) if w is not None and g is not None]
        while True:
            left = []
            for w, g in pending:
                unknowns = w.symbols - set(bind)
                solved = solve(subst_dim(w, bind), g, unknowns) if unknowns else None
                if solved is None:
                    left.append((w, g))
                else:
                    bind[solved[0]] = solved[1]
            if len(left) == len(pending):
                break
            pending = left
        return all(dims_equal(subst_dim(w, bind), g) for w, g in pending)


# ------------------------------------------------------------------ helpers


_WORDS = {"+": "add", "−": "subtract", "⊙": "multiply element-wise", "·": "multiply",
          " ": "multiply", "/": "divide"}


def fits_model(want: ModelTy, sig: Signature) -> bool:
    """A card whose one input and output fit a card type, with one reading of its symbols."""
    given = [ty for _, ty in sig.inputs]
    bind: dict[str, Dim] = {}
    return len(given) == 1 and isinstance(given[0], Ty) and isinstance(sig.output, Ty) \
        and _fits(want.input, given[0], bind) and _fits(want.output, sig.output, bind)


def _fits(want: Ty, given: Ty, bind: dict[str, Dim]) -> bool:
    """A card's declared input or output matches a card type's: the same rank and kind, its
    sizes consistent with one reading of the type's symbols."""
    if want.rank != given.rank or want.elem != given.elem or \
            (want.vocab is None) != (given.vocab is None):
        return False
    for w, g in zip((*want.shape, want.vocab), (*given.shape, given.vocab), strict=True):
        if w is None or g is None:
            continue
        sym = next(iter(w.symbols), None) if len(w.symbols) == 1 else None
        if sym is None or Dim.sym(sym) != w:
            if not dims_equal(subst_dim(w, bind), g):
                return False
        elif sym in bind and not dims_equal(bind[sym], g):
            return False
        else:
            bind[sym] = g
    return True


def _adopt(bundle: BundleTy, other: BundleTy) -> None:
    """A bundle known only by name (θ, prose-declared) takes the structure it is used with."""
    if not bundle.members and other.members:
        bundle.members.update(other.members)
        bundle.card = other.card


def _is_sequence(entry: Entry | None) -> bool:
    return isinstance(entry, Ty) and entry.rank == 1 and entry.vocab is not None


def _same_vocab(a: Ty, b: Ty) -> bool:
    return a.vocab is None or b.vocab is None or a.vocab == b.vocab or _is_var(a.vocab) \
        or _is_var(b.vocab)


def _same_entry(a: Entry | None, b: Entry | None) -> bool:
    if isinstance(a, BundleTy) and isinstance(b, BundleTy):
        return a.same_kind(b)
    if isinstance(a, Ty) and isinstance(b, Ty):
        return same_shape(a, b)
    return a == b


def _appended(body: tuple[s.Step, ...]) -> list[str]:
    """Names a loop body appends to: x ← [x, y]."""
    out = []
    for step in body:
        st = step.stmt
        if isinstance(st, s.Assign) and isinstance(st.target, s.Name) \
                and isinstance(st.value, s.Concat) and st.target in st.value.items:
            out.append(st.target.id)
        elif isinstance(st, (s.For, s.While)):
            out += _appended(st.body)
    return out


def _targets(st: s.Stmt) -> list[str]:
    """The names a statement gives a value to."""
    if isinstance(st, s.Assign):
        t = st.target.base if isinstance(st.target, s.Index) else st.target
        return [t.id] if isinstance(t, s.Name) else [t.func] if isinstance(t, s.Call) else []
    if isinstance(st, s.Sample):
        return [st.var]
    if isinstance(st, (s.If, s.ForAll)):
        return _targets(st.then if isinstance(st, s.If) else st.body)
    return []


def _bound_vars(node: object) -> set[str]:
    """The variables that loops, sums and set-builders inside a node bind."""
    out: set[str] = set()
    if isinstance(node, (s.For, s.SetBuilder)):
        out.add(node.var)
    elif isinstance(node, s.ForAll):
        out.update(node.vars)
    elif isinstance(node, s.Sum):
        out.add(node.index)
    if isinstance(node, tuple):
        for x in node:
            out |= _bound_vars(x)
    elif hasattr(node, "__dataclass_fields__"):
        for f in node.__dataclass_fields__:
            out |= _bound_vars(getattr(node, f))
    return out


def _members(b: BundleTy) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    for name, entry in b.members.items():
        out[name] = entry
        if isinstance(entry, BundleTy):
            out.update(_members(entry))
        if isinstance(entry, FamilyTy) and isinstance(entry.entry, BundleTy):
            out.update({k: FamilyTy(entry.var, entry.over, v) for k, v in _members(entry.entry).items()})
    return out


def _is_param(e: s.Expr, params: dict[str, Entry]) -> bool:
    return isinstance(e, s.Name) and e.id in params


def _names(node: object) -> list[s.Name]:
    """Every name written in a node (steps, expressions), in source order."""
    if isinstance(node, s.Name):
        return [node]
    if isinstance(node, tuple):
        return [n for x in node for n in _names(x)]
    if hasattr(node, "__dataclass_fields__"):
        return [n for f in node.__dataclass_fields__ for n in _names(getattr(node, f))]
    return []


def _is_var(d: Dim) -> bool:
    syms = d.symbols
    return len(syms) == 1 and next(iter(syms)).startswith("?") and d == Dim.sym(next(iter(syms)))


def dims_equal(a: Dim | None, b: Dim | None) -> bool:
    return a is None or b is None or a == b


def same_shape(a: Ty, b: Ty) -> bool:
    return a.rank == b.rank and all(dims_equal(x, y) for x, y in zip(a.shape, b.shape, strict=False))


def broadcast_shape(a: tuple, b: tuple) -> tuple | None:
    """Trailing axes align (row-major bias vectors); a free axis (1^⊺) takes its partner's size."""
    if len(a) < len(b):
        a, b = b, a
    out = list(a[: len(a) - len(b)])
    for x, y in zip(a[len(a) - len(b):], b, strict=False):
        if not dims_equal(x, y):
            if x == ONE:
                out.append(y)
                continue
            if y == ONE:
                out.append(x)
                continue
            return None
        out.append(x if x is not None else y)
    return tuple(out)


def broadcastable(small: Ty, big: Ty) -> bool:
    return broadcast_shape(small.shape, big.shape) is not None


def _d(d: Dim | None) -> str:
    return "*" if d is None else display(str(d))


def _shown(ty: Ty, bind: dict[str, Dim]) -> str:
    return str(substitute(ty, bind))


def _entry_text(e: Entry) -> str:
    return str(e)


def _text(e: s.Expr) -> str:
    return display(e.id) if isinstance(e, s.Name) else "this expression"


def _product_hint(e: s.BinOp, a: Ty, b: Ty) -> str | None:
    if a.rank == 2 and b.rank == 2 and dims_equal(a.shape[-1], b.shape[-1]):
        return "did you mean to transpose the right operand (^⊺)?"
    if a.rank == 2 and b.rank == 2 and dims_equal(a.shape[0], b.shape[0]):
        return "did you mean to transpose the left operand (^⊺)?"
    return None


def _read_as_prose(alg: s.Algorithm, name: str) -> str | None:
    """`θ^attn, θ^mlp` declares θ^attn, described as 'θ^mlp': the hint says so."""
    for decl in (n for n in s.nodes(alg) if isinstance(n, s.Decl)):
        if decl.prose is not None and decl.type is None and decl.prose.strip(" .") in (
                name, display(name)):
            return (f"'{display(decl.names[-1])}, {decl.prose}' declares "
                    f"{display(decl.names[-1])} and describes it as '{decl.prose}': "
                    f"declare each parameter bundle on its own line")
    return None


def _spelling_hint(name: str) -> str | None:
    """What a name that is not one was meant to be, in the card's notation."""
    power = re.fullmatch(r"(.+)\^(\d+)", name)
    if power:
        base = display(power.group(1))
        return (f"'{display(name)}' reads as one name with a superscript; a power is "
                f"'{base}²' or '{base}^{{{power.group(2)}}}'")
    if name in ("sum", "Sum"):
        return "a sum is 'Σ_{i=1}^{N} x_i' (ASCII 'sum_{i=1}^{N} x_i')"
    if name.startswith("sum_"):
        return "an ASCII sum takes braces: 'sum_{i=1}^{N} x_i' or 'sum_{i} x_i'"
    if name in ("matmul", "dot"):
        return "a matrix product is written 'W X' (side by side) or 'W · X'"
    return None


def _card_like(name: str) -> bool:
    """A name spelled as cards are (SwiGLU, LayerNorm), not a builtin's in another case: no
    builtin is offered for it, only a card."""
    return bool(re.fullmatch(r"[A-Z][A-Za-z0-9]*[A-Z][A-Za-z0-9]*", name)) and len(name) > 3 \
        and name.lower() not in {b.lower() for b in BUILTINS}


def _join_hints(*hints: str | None) -> str | None:
    return " ".join(h for h in hints if h) or None


def _suggest(name: str, candidates: list[str]) -> str | None:
    import difflib

    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f"did you mean '{display(close[0])}'?" if close else None


def check(lib: Library) -> tuple[Checker, Diagnostics]:
    from .namecheck import check_names  # it reads the checker's results: imported late
    from .presets import check_presets  # likewise

    checker = Checker(lib)
    checker.check_all()
    check_names(checker)
    check_presets(checker)  # every preset evaluated: what check accepts also builds
    return checker, checker.diags
