"""A card's declarations read into types: hyperparameters (sizes, scalars, the run's seed and
number formats, cards taken as values), inputs and datasets, outputs, and the parameter tree
of bundles and families; and whether the card is written row- or column-major."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import replace

from .. import syntax as s
from ..dims import ONE, Dim
from ..render.text import render_expr
from ..spelling import canonical_name, display
from ..types import BundleTy, Entry, FamilyTy, Ty
from .indexed import instance, split_name
from .results import SCALAR, Cards, ModelTy, RunValue
from .shapes import _dim, _flat_names, _is_integral_expr, _members


class DeclEnv:
    """Reads one card's declaration blocks into the types of its signature."""

    def __init__(self, checker: Cards, alg: s.Algorithm):
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
        self.refuse_powers(item)
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

    def refuse_powers(self, item: s.Item) -> None:
        """A declared name a step would read as a power (`W^{1}` is W to the power 1)."""
        for name, span in _declared_names(item):
            power = s.whole_power(name)
            if power is not None:
                base, k = power
                self.error(span, f"'{display(name)}' cannot be declared: a step reads it "
                                      f"as {display(base)} to the power {k}",
                           hint=f"a name's superscript is bare or not a whole number: "
                                f"write {display(base)}^{k} or {display(base)}_{k}")

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


def _declared_names(item: s.Item) -> list[tuple[str, s.Span]]:
    """The names an item declares, a bundle's and its members' included, each with the span
    of the line that declares it."""
    if isinstance(item, s.Decl):
        return [(name, item.span) for name in item.names]
    if isinstance(item, s.Bundle | s.Family):
        inner = [n for sub in item.items for n in _declared_names(sub)]
        return [(item.name, item.span), *inner] if isinstance(item, s.Bundle) else inner
    return []


def _flat(e: s.Expr) -> str:
    """An expression as a name's subscript spells it: x_{1:N_data}."""
    return unicodedata.normalize("NFD", render_expr(e)).replace(" ", "")


def _whole(elem: str, item: s.Dataset) -> str:
    """x_n of {x_n}_{n=1}^{N} as the header names the whole dataset: x_{1:N}."""
    base, decor = split_name(elem)
    parts = [f"{k}{{{_flat(item.lo)}:{_flat(item.hi)}}}" if v == item.index else
             f"{k}{v}" if len(v) == 1 else f"{k}{{{v}}}" for k, v in decor]
    return base + "".join(parts)


def _layout(alg: s.Algorithm, env: DeclEnv) -> str | None:
    """Row-major cards multiply parameters from the right (X W), column-major from the left."""
    params = set(_flat_names(env.params))
    numbers = {n for n, ty in env.hypers.items() if isinstance(ty, Ty) and ty.rank == 0} | {
        st.var for st in s.nodes(alg.steps) if isinstance(st, s.For)}
    found: set[str] = set()
    stack: list = list(alg.steps)
    while stack:  # products under the steps, through fields and tuples of nodes
        e = stack.pop()
        if isinstance(e, s.BinOp):
            if e.op in (" ", "·") and not (_number(e.left, numbers) or _number(e.right, numbers)):
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
    if not found:  # no product with a parameter: maps over token positions say it (E[:, t] ←)
        found = {kind for st in s.nodes(alg.steps) if _over_positions(st, env)
                 for sub in st.body if (kind := _mapped(sub.stmt, st.var))}
    return found.pop() if len(found) == 1 else None


def _over_positions(st: object, env: DeclEnv) -> bool:
    """A map `for t ∈ [T] : …` whose T is the length of a sequence of token IDs."""
    if not (isinstance(st, s.For) and st.style == "map" and isinstance(st.over, s.Concat)
            and len(st.over.items) == 1 and isinstance(st.over.items[0], s.Name)):
        return False
    tokens = {n for n, ty in env.inputs.items()
              if isinstance(ty, Ty) and ty.vocab is not None and ty.rank == 1}
    lengths = {str(env.inputs[n].shape[0]) for n in tokens} | {  # and ℓ ← length(x)
        a.target.id for a in s.nodes(env.alg.steps)
        if isinstance(a, s.Assign) and isinstance(a.target, s.Name)
        and isinstance(a.value, s.Call) and a.value.func == "length"
        and [getattr(x, "id", None) for x in a.value.args] in ([n] for n in tokens)}
    return st.over.items[0].id in lengths


def _mapped(st: s.Stmt, var: str) -> str | None:
    """"column" for a map's `X[:, t] ← …` and for the paper's family of column vectors
    `e_t ← …` (`[e_1, …, e_ℓ]` their matrix), "row" for `X[t, :] ← …`, else None."""
    target = st.target if isinstance(st, s.Assign) else None
    if isinstance(target, s.Name) and any(v == var for _, v in split_name(target.id)[1]):
        return "column"
    if not (isinstance(target, s.Index) and len(target.items) == 2):
        return None
    kinds = tuple("var" if getattr(i, "id", None) == var else
                  "all" if isinstance(i, s.Slice) and i.lo is None and i.hi is None else None
                  for i in target.items)
    return {("all", "var"): "column", ("var", "all"): "row"}.get(kinds)


def _number(e: s.Expr, numbers: set[str]) -> bool:
    """Whether `e` is a number (a literal, a scalar hyperparameter, a loop variable, or
    arithmetic of those): a product with one scales, it says nothing of the layout."""
    if isinstance(e, s.Num):
        return True
    if isinstance(e, s.Name):
        return e.id in numbers
    if isinstance(e, s.Unary):
        return _number(e.operand, numbers)
    if isinstance(e, s.BinOp):
        return _number(e.left, numbers) and _number(e.right, numbers)
    return False


def _root_name(e: s.Expr) -> str | None:
    while isinstance(e, (s.Transpose, s.Index)):
        e = e.operand if isinstance(e, s.Transpose) else e.base
    return e.id if isinstance(e, s.Name) else None
