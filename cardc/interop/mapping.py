"""A mapping file read into a `Mapping` (the keys are described in cardc/interop/__init__.py).

No torch here: a mapping is read, checked and reported on without building a model.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from ..names import identifier
from ..runtime import jsontext
from ..runtime.errors import RuntimeInputError
from ..spelling import canonical_name
from . import expr as ex
from .constraints import Constraint, parse_constraint
from .constraints import names as constraint_names
from .derived import COUNT
from .renamed import current_key

MAPPING_SUFFIX = ".hf.json"

Need = Callable[[bool, str], None]


@dataclass(frozen=True)
class Part:
    """One role in a fused tensor: its card tensor, and its width in each group (an expression
    of the card's hyperparameters), or None for the card tensor's width over the groups."""
    card: str
    size: str | None = None


@dataclass(frozen=True)
class Entry:
    """One Hugging Face tensor and where it lives in the card's model."""
    hf: str
    card: str  # a fused tensor's: its first part's
    transpose: bool = False
    chunk: tuple[int, int] = (0, 1)
    axis: int = 0
    # the Hugging Face layout, a reshape of the card's (transposed first where `transpose`):
    # whole numbers, or expressions of the card's hyperparameters (a convolution's D, C, p, p)
    shape: tuple[int | str, ...] | None = None
    groups: str | None = None  # fused: how many times the parts repeat along `axis`
    parts: tuple[Part, ...] = ()  # fused: the roles within one group, in order
    # a row of a stacked family (`gamma1` of shape (N, D)): its index along the first axis,
    # `{i}` as written, a number once the entry is at a layer
    row: str | None = None

    @property
    def cards(self) -> tuple[str, ...]:
        """The card tensors it holds, each once."""
        return tuple(dict.fromkeys(p.card for p in self.parts)) if self.parts else (self.card,)

    @property
    def per_layer(self) -> bool:
        return "i" in index_vars(self.hf)

    def at(self, i: int, **more: int) -> Entry:
        """This entry at layer i, and at the values `more` gives further indices."""
        return self.where({"i": i, **more})

    def where(self, values: dict[str, int]) -> Entry:
        """This entry with each index `values` gives evaluated, the others as written."""
        parts = tuple(Part(index_name(p.card, values), p.size) for p in self.parts)
        return Entry(index_name(self.hf, values), index_name(self.card, values), self.transpose,
                     self.chunk, self.axis, self.shape, self.groups, parts,
                     None if self.row is None else index_name(self.row, values))


    def sized(self, sizes: dict[str, Fraction]) -> Entry:
        """This entry with the hyperparameters its indices read replaced by their values."""
        parts = tuple(Part(sized_name(p.card, sizes), p.size) for p in self.parts)
        return Entry(sized_name(self.hf, sizes), sized_name(self.card, sizes), self.transpose,
                     self.chunk, self.axis, self.shape, self.groups, parts,
                     None if self.row is None else sized_name(self.row, sizes))


_INDEX = re.compile(r"\{([^{}]*)\}")  # a layer index in a name: {i}, {2i}, {2*i + 1}


def layer_index(text: str, names: tuple[str, ...] = ("i",),
                sizes: tuple[str, ...] = ()) -> ex.Expr:
    """The index `{text}` stands for, an affine a·v + b of one index v of `names` (the layer
    i, or an index the mapping's `indices` declare) with whole a, b ≥ 0, so that it names
    member 0, 1, … of its own family exactly once each; ExprError otherwise. b may add
    whole multiples of the card's hyperparameters `sizes`, the index written first
    (`{m + N_d}`: a family of layers after the first N_d)."""
    e = _index_expr(text)
    read = ex.names(e)
    indices = [n for n in read if n not in sizes]
    if set(indices) - set(names) or len(set(indices)) > 1:
        other = next((n for n in indices if n not in names), indices[-1] if indices else "")
        known = " or ".join(names)
        raise ex.ExprError(f"an index reads one of {known}, not '{other}'" if len(names) > 1
                           else f"an index may only read the layer i, not '{other}'")
    var = indices[0] if indices else names[0]
    if read and read[0] != var:
        raise ex.ExprError(f"'{text}' reads a hyperparameter before its index: write {var} first")
    consts = [n for n in read if n != var]
    base = dict.fromkeys(consts, Fraction(0))
    f0, f1, f2 = (ex.evaluate(e, {**base, var: Fraction(k)}) for k in range(3))
    shifts = [ex.evaluate(e, {**base, c: Fraction(1), var: Fraction(0)}) - f0 for c in consts]
    slopes = [ex.evaluate(e, {**base, c: Fraction(1), var: Fraction(1)})
              - ex.evaluate(e, {**base, c: Fraction(1), var: Fraction(0)}) for c in consts]
    if f1 - f0 != f2 - f1 or any(v.denominator != 1 for v in (f0, f1 - f0, *shifts)) \
            or f0 < 0 or f1 - f0 < 0 or any(v < 0 for v in shifts) \
            or any(s != f1 - f0 for s in slopes):
        plus = "".join(f" + c·{c}" for c in consts)
        raise ex.ExprError(f"'{text}' is not a·{var} + b{plus} with whole a, b"
                           f"{', c' if consts else ''} ≥ 0")
    return e


def sized_name(template: str, sizes: dict[str, Fraction]) -> str:
    """`template` with the hyperparameters `sizes` an index reads (`{m + N_d}`) replaced by
    their values (`{1*m + 2}`), so that each index reads its own variable alone."""
    def sub(m: re.Match[str]) -> str:
        e = _index_expr(m.group(1))
        read = ex.names(e)
        if not read or not set(read[1:]) & set(sizes):
            return m.group(0)
        var = read[0]
        at = {n: sizes[n] for n in read[1:]}
        b = ex.evaluate(e, {**at, var: Fraction(0)})
        a = ex.evaluate(e, {**at, var: Fraction(1)}) - b
        return f"{{{int(a)}*{var} + {int(b)}}}"
    return _INDEX.sub(sub, template)


def _index_expr(text: str) -> ex.Expr:
    """An index as an expression: `2i` is 2*i, `3j + 1` is 3*j + 1."""
    return ex.parse(_IMPLICIT.sub(r"\1*", text))


_IMPLICIT = re.compile(r"(?<![\w.])(\d+)\s*(?=[^\W\d]\w*\b)")  # 2i is 2*i


def index_vars(template: str) -> list[str]:
    """The index each `{…}` of a name reads, in order (one that reads none: i)."""
    out = []
    for m in _INDEX.finditer(template):
        try:
            out.append((ex.names(_index_expr(m.group(1))) or ["i"])[0])
        except ex.ExprError:
            out.append("i")  # refused where the mapping is read (_check_indices)
    return out


def index_name(template: str, values: dict[str, int]) -> str:
    """`template` with each index `{…}` whose variable `values` gives evaluated."""
    def sub(m: re.Match[str]) -> str:
        e = _index_expr(m.group(1))
        var = (ex.names(e) or ["i"])[0]
        if var not in values:
            return m.group(0)
        return str(int(ex.evaluate(e, {var: Fraction(values[var])})))
    return _INDEX.sub(sub, template)


def layer_name(template: str, i: int) -> str:
    """`template` with each index `{…}` evaluated for layer i (checked by `layer_index`)."""
    return index_name(template, {"i": i})


@dataclass(frozen=True)
class Hyper:
    """How a card hyperparameter relates to config.json: `text` (a key, or an expression of
    keys) gives it. A key absent or null makes it `null` if set, else the value of the first
    of `default`'s expressions whose keys are all present.
    Export writes `solve` (solved from the expression), or null where the value is `null`."""
    text: str
    expr: ex.Expr
    default: tuple[ex.Expr, ...] = ()
    same: tuple[str, ...] = ()  # further config keys that hold the same value
    null: ex.Number | None = None
    solve: str | None = None
    computed: bool = False  # written as {"expr": …}, not as a key
    real: bool = False  # export writes the solved key as a float even when whole
    count: bool = False  # {"count": K}: how many entries the object or list K holds

    @property
    def key(self) -> str:
        return self.text

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.text, *self.same)

    def reads(self) -> list[str]:
        """Every config key it reads."""
        return ex.names(self.expr) + list(self.same) + \
            [name for e in self.default for name in ex.names(e)]


@dataclass(frozen=True)
class Mapping:
    source: str  # where it was read, for messages
    raw: dict[str, Any]  # as read: a checkpoint records it, so export needs no file
    card: str
    architecture: str
    model_type: str
    hyperparameters: dict[str, Hyper]
    fixed_config: dict[str, list[Any]]
    export_config: dict[str, Any]
    layers: str | None  # the text of `layers`: the card's layer count, an expression
    tensors: tuple[Entry, ...]
    tied: dict[str, str]
    base_prefix: str
    ignore: tuple[str, ...]
    base_model: bool = False
    derived_config: dict[str, tuple[str, ex.Expr]] = field(default_factory=dict)
    harmless: tuple[str, ...] = ()
    cycles: dict[str, tuple[tuple[Any, ...], ex.Expr]] = field(default_factory=dict)
    constraints: dict[str, Constraint] = field(default_factory=dict)  # by hyperparameter
    indices: dict[str, str] = field(default_factory=dict)  # index → its count, beside {i}

    def entries(self, n_layers: int, counts: dict[str, int] | None = None) -> list[Entry]:
        """The table with each layer index expanded for layers 0 … n_layers − 1, and each
        further index v for 0 … counts[v] − 1 (`index_counts`)."""
        out = []
        for e in self.tensors:
            layers = [e.at(i) for i in range(n_layers)] if e.per_layer else [e]
            out += [x for layer in layers for x in self.members(layer, counts or {})]
        seen: dict[str, str] = {}
        for e in out:
            if e.hf in seen:
                raise RuntimeInputError(f"{self.source}: '{e.hf}' is named twice (as the card's "
                                        f"{seen[e.hf]} and {e.card})")
            seen[e.hf] = e.card
        return out

    def members(self, e: Entry, counts: dict[str, int]) -> list[Entry]:
        """`e` at every value of each further index it reads (an expert's tensors, each)."""
        out = [e]
        for var in dict.fromkeys(v for v in index_vars(e.hf) if v in self.indices):
            if var not in counts:
                raise RuntimeInputError(f"{self.source}: the members of '{var}' are not counted "
                                        f"(its count is {self.indices[var]})")
            out = [x.where({var: k}) for x in out for k in range(counts[var])]
        return out

    def index_counts(self, hypers: dict[str, Any]) -> dict[str, int]:
        """How many members each index of `indices` runs over, from the card's
        hyperparameters (by Python name)."""
        return {var: self.count(text, f"the members of '{var}'", hypers)
                for var, text in self.indices.items()}

    def last_indices(self, counts: dict[str, int]) -> dict[str, int]:
        """The last member of each further index: the names checked before all are made."""
        return {var: n - 1 for var, n in counts.items() if n > 0}

    def count(self, text: str, what: str, hypers: dict[str, Any]) -> int:
        """A count the mapping writes as an expression of the card's hyperparameters."""
        e = ex.parse(text)
        try:
            env = {n: ex.exact(hypers[identifier(n)]) for n in ex.names(e)}
            value = ex.evaluate(e, env)
        except (KeyError, ex.ExprError) as err:
            raise RuntimeInputError(f"{self.source}: cannot count {what} ({text}): "
                                    f"{'no ' + repr(err.args[0]) if isinstance(err, KeyError) else err}"
                                    ) from None
        if value.denominator != 1 or value < 0:
            given = ", ".join(f"{n} = {ex.number(v)}" for n, v in env.items())
            raise RuntimeInputError(f"{what} of {self.source} number {text} = "
                                    f"{ex.number(value)} ({given}), not a whole number")
        return int(value)

    def sized(self, hypers: dict[str, Any]) -> Mapping:
        """This mapping with the hyperparameters its names' indices read (`{m + N_d}`)
        replaced by their values in `hypers` (by Python name)."""
        sizes = {n: ex.exact(hypers[identifier(n)]) for n in self.hyperparameters
                 if identifier(n) in hypers}
        read = {n for e in self.tensors for t in (e.hf, *e.cards) for m in _INDEX.finditer(t)
                for n in ex.names(_index_expr(m.group(1)))[1:]}
        lacking = sorted(read - set(sizes))
        if lacking:
            raise RuntimeInputError(f"{self.source}: no value of '{lacking[0]}', which an index "
                                    "of a tensor name reads")
        return replace(self, tensors=tuple(e.sized(sizes) for e in self.tensors),
                       ignore=tuple(sized_name(n, sizes) for n in self.ignore))

    def layer_count(self, hypers: dict[str, Any]) -> int:
        """How many layers `{i}` runs over, from the card's hyperparameters (by Python name)."""
        if self.layers is None:
            return 0
        return self.count(self.layers, "the layers", hypers)

    def ignored(self, name: str) -> bool:
        return any(re.fullmatch(r"\d+".join(map(re.escape, _INDEX.split(p)[::2])), name)
                   for p in self.ignore)

    def understood(self) -> set[str]:
        """The config keys (dotted) this mapping reads, fixes, writes or knows to be harmless."""
        keys = {"model_type", *self.fixed_config, *self.export_config, *self.harmless}
        for spec in self.hyperparameters.values():
            keys.update(spec.reads())
        for key, (_, e) in self.derived_config.items():
            keys.update([key, *ex.names(e)])
        for key, (_, e) in self.cycles.items():
            keys.update([key, *ex.names(e)])
        return keys


def mapping_path(card: str | os.PathLike[str]) -> Path:
    path = Path(card)
    return path.with_name(path.stem + MAPPING_SUFFIX)


def load_mappings(card: str | os.PathLike[str]) -> list[Mapping]:
    """The mappings of the file beside `card`: its top level's card first, then its variants."""
    path = mapping_path(card)
    if not path.is_file():
        raise RuntimeInputError(f"{card} has no Hugging Face mapping: expected {path}")
    return read_mappings(path)


def read_mappings(path: str | os.PathLike[str]) -> list[Mapping]:
    """The mappings of the mapping file `path` (as `cardc export --mapping` names one)."""
    path = Path(path)
    if not path.is_file():
        raise RuntimeInputError(f"no mapping file '{path}'")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise RuntimeInputError(f"cannot read {path}: {err}") from None
    return parse_mappings(jsontext.loads(text, str(path)), str(path))


def load_mapping(card: str | os.PathLike[str], name: str | None = None) -> Mapping:
    """The mapping of the card `name` (default: the file's top-level card) beside `card`."""
    return select_by_name(load_mappings(card), name)


def select_by_name(mappings: list[Mapping], name: str | None) -> Mapping:
    if name is None:
        return mappings[0]
    for m in mappings:
        if m.card == name:
            return m
    raise RuntimeInputError(f"{mappings[0].source} maps no card {name!r} (it maps "
                            f"{', '.join(m.card for m in mappings)})")


def parse_mappings(raw: Any, source: str) -> list[Mapping]:
    """Every mapping of a file: the top level, then each variant patched onto it."""
    if not isinstance(raw, dict):
        raise RuntimeInputError(f"{source}: expected a JSON object")
    jsontext.check(raw, source)  # bounded before any walk over it
    variants = raw.get("variants", {})
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise RuntimeInputError(f"{source}: 'variants' must map card names to objects")
    base = {k: v for k, v in raw.items() if k != "variants"}
    out = [parse_mapping(base, source)]
    for name, patch in variants.items():
        if "variants" in patch:
            raise RuntimeInputError(f"{source}: variant '{name}' has variants of its own")
        merged = merge_patch(base, {**patch, "card": name})
        out.append(parse_mapping(merged, f"{source} (variant {name})"))
    cards = [m.card for m in out]
    dup = next((c for c in cards if cards.count(c) > 1), None)
    if dup is not None:
        raise RuntimeInputError(f"{source}: card '{dup}' is mapped twice")
    return out


def merge_patch(target: Any, patch: Any) -> Any:
    """`patch` applied to `target` as a JSON merge patch (RFC 7396); neither is changed."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def parse_mapping(raw: Any, source: str) -> Mapping:
    """A mapping from its JSON (a file's top level, or one variant merged into it), every
    malformed part reported against `source`."""
    def need(cond: bool, what: str) -> None:
        if not cond:
            raise RuntimeInputError(f"{source}: {what}")

    if isinstance(raw, dict) and "variants" in raw:  # a whole file: its top-level mapping
        return parse_mappings(raw, source)[0]
    _check_keys(raw, need)
    hypers = {canonical_name(name): _hyper(name, spec, need)
              for name, spec in raw["hyperparameters"].items()}
    tensors = tuple(_entry(hf, spec, need) for hf, spec in raw["tensors"].items())
    indices = _indices(raw.get("indices", {}), hypers, need)
    names = ("i", *indices)
    for e in tensors:
        for name in (e.hf, *e.cards):
            _check_indices(name, f"tensor '{e.hf}'", need, names, tuple(hypers))
        _check_same_indices(e, indices, need)
    for name in raw.get("ignore", []):
        _check_indices(name, "'ignore'", need, names, tuple(hypers))
    layers = _layers(raw.get("layers"), hypers, need)
    need(layers is not None or not any(e.per_layer for e in tensors),
         "names with {i} need 'layers', the hyperparameter (or an expression of them) that "
         "counts the layers")
    fixed: dict[str, list[Any]] = {}
    derived: dict[str, tuple[str, ex.Expr]] = {}
    cycles: dict[str, tuple[tuple[Any, ...], ex.Expr]] = {}
    for key, value in raw.get("fixed_config", {}).items():
        if value is None and current_key(key) != key:
            continue  # an old spelling's null (`rope_scaling`): import drops it too
        if isinstance(value, dict) and set(value) == {"expr"}:
            derived[key] = (value["expr"], _parse(value["expr"], f"fixed_config '{key}'", need))
        elif isinstance(value, dict) and "cycle" in value:
            cycles[key] = _cycle(key, value, need)
        else:
            need(value != [], f"fixed_config '{key}': a list of accepted values cannot be empty")
            fixed[key] = value if isinstance(value, list) else [value]
    export = {k: v for k, v in raw.get("export_config", {}).items()
              if v is not None or current_key(k) == k}  # an old spelling's null: nothing
    hypers = _with_solved_keys(hypers, {*fixed, *derived, *cycles, *export}, need)
    _check_written_once(hypers, {**{k: "fixed_config" for k in (*fixed, *derived, *cycles)},
                                 **{k: "export_config" for k in export}}, need)
    return Mapping(source, raw, raw["card"], raw["architecture"], raw["model_type"], hypers, fixed,
                   export, layers, tensors, dict(raw.get("tied", {})),
                   str(raw.get("base_prefix", "")), tuple(raw.get("ignore", [])),
                   raw.get("base_model", False) is True, derived,
                   tuple(raw.get("harmless", [])), cycles,
                   _constraints(raw.get("constraints", {}), hypers, need), indices)


def _constraints(raw: Any, hypers: dict[str, Hyper], need: Need) -> dict[str, Constraint]:
    """`constraints`: card hyperparameter → the values it may take, its bounds expressions of
    the mapping's hyperparameters."""
    need(isinstance(raw, dict), "'constraints' must map hyperparameters to objects")
    out = {}
    for name, spec in raw.items():
        canon = canonical_name(name)
        need(canon in hypers, f"'constraints': '{name}' is not a hyperparameter of this mapping")
        try:
            c = parse_constraint(name, spec)
        except ex.ExprError as err:
            need(False, f"'constraints': {err}")
            raise AssertionError from None  # need(False, …) raised
        unknown = [n for n in constraint_names(c) if canonical_name(n) not in hypers]
        need(not unknown, f"'constraints': '{name}' reads '{unknown[0] if unknown else ''}', "
             "which is not a hyperparameter of this mapping")
        out[canon] = c
    return out


def _cycle(key: str, value: dict[str, Any], need: Need) -> tuple[tuple[Any, ...], ex.Expr]:
    """`{"cycle": [A, B], "length": EXPR}`: a per-layer list, A, B, A, B, … of EXPR items."""
    where = f"fixed_config '{key}'"
    need(set(value) == {"cycle", "length"}, f"{where}: a cycle is {{\"cycle\": [...], "
         "\"length\": EXPR}")
    need(isinstance(value["cycle"], list) and bool(value["cycle"]),
         f"{where}: 'cycle' must be a non-empty list")
    return tuple(value["cycle"]), _parse(value["length"], f"{where}: 'length'", need)


_KEYS = {"about", "card", "architecture", "model_type", "hyperparameters", "fixed_config",
         "export_config", "layers", "tensors", "tied", "base_prefix", "ignore", "variants",
         "base_model", "harmless", "constraints", "indices"}


def _check_keys(raw: Any, need: Need) -> None:
    need(isinstance(raw, dict), "expected a JSON object")
    for key in sorted(set(raw) - _KEYS):  # a misspelt key would otherwise be ignored
        need(False, f"unknown key '{key}' (known: {', '.join(sorted(_KEYS))})")
    for key in ("card", "architecture", "model_type"):
        need(isinstance(raw.get(key), str), f"'{key}' must be a string")
    for key in ("hyperparameters", "tensors"):
        need(isinstance(raw.get(key), dict) and bool(raw[key]), f"'{key}' must be a non-empty object")
    for key in ("fixed_config", "export_config", "tied"):
        need(isinstance(raw.get(key, {}), dict), f"'{key}' must be an object")
    for key in ("ignore", "harmless"):
        value = raw.get(key, [])
        need(isinstance(value, list) and all(isinstance(v, str) for v in value),
             f"'{key}' must be a list of names")
    need(isinstance(raw.get("base_model", False), bool), "'base_model' must be true or false")


def _parse(text: Any, where: str, need: Need) -> ex.Expr:
    need(isinstance(text, str), f"{where}: an expression must be a string")
    try:
        return ex.parse(text)
    except ex.ExprError as err:
        need(False, f"{where}: {err}")
        raise AssertionError from None  # need(False, …) raised


def _layers(text: Any, hypers: dict[str, Hyper], need: Need) -> str | None:
    """`layers` in canonical spelling: an expression of the card's hyperparameters (`N`, or
    `N/2` for a card that stacks its layers in pairs)."""
    if text is None:
        return None
    e = _parse(text, "'layers'", need)
    names = ex.names(e)
    canon = {n: canonical_name(n) for n in names}
    unknown = [n for n in names if canon[n] not in hypers]
    need(not unknown, f"'layers': '{unknown[0] if unknown else ''}' is not a hyperparameter "
         "of this mapping")
    return ex.render(_renamed(e, canon))


def _renamed(e: ex.Expr, canon: dict[str, str]) -> ex.Expr:
    if isinstance(e, ex.Name):
        return ex.Name(canon[e.name])
    if isinstance(e, ex.BinOp):
        return ex.BinOp(e.op, _renamed(e.left, canon), _renamed(e.right, canon))
    if isinstance(e, ex.Call):
        return ex.Call(e.fn, tuple(_renamed(a, canon) for a in e.args))
    return e


def _check_indices(name: str, where: str, need: Need, names: tuple[str, ...] = ("i",),
                   sizes: tuple[str, ...] = ()) -> None:
    """Every index `{…}` of a name is a·v + b of one index v: the layer i or one of
    `indices`; b may add hyperparameters `sizes`."""
    for m in _INDEX.finditer(name):
        try:
            layer_index(m.group(1), names, sizes)
        except ex.ExprError as err:
            kind = "layer index" if len(names) == 1 else "index"
            need(False, f"{where}: {kind} '{{{m.group(1)}}}' in '{name}': {err}")


def _indices(raw: Any, hypers: dict[str, Hyper], need: Need) -> dict[str, str]:
    """`indices`: each further index of tensor names (`{"j": "E"}`: an expert's `{j}`), a
    name other than i, and its count, an expression of the card's hyperparameters as
    `layers` is (in canonical spelling)."""
    need(isinstance(raw, dict), "'indices' must be an object: index → its count")
    out = {}
    for var, count in raw.items():
        need(var.isidentifier() and var != "i",
             f"'indices': '{var}' cannot name an index (a letter and letters or digits, not i)")
        need(isinstance(count, str), f"'indices' '{var}': its count must be a string")
        where = f"'indices' '{var}'"
        out[var] = _layers(count, hypers, lambda ok, what, where=where: need(
            ok, what.replace("'layers'", where)))
    return out


def _check_same_indices(e: Entry, indices: dict[str, str], need: Need) -> None:
    """A tensor name and its card tensor read the same further indices: each member of the
    family is one tensor of each."""
    hf = {v for v in index_vars(e.hf) if v in indices}
    for card in e.cards:
        mine = {v for v in index_vars(card) if v in indices}
        if hf != mine:
            missing = sorted(hf ^ mine)[0]
            need(False, f"tensor '{e.hf}': index '{{{missing}}}' is in only one of it and "
                        f"the card's '{card}'")


_HYPER_KEYS = {"key", "default", "same", "expr", "null", "solve", "type", COUNT}


def _defaults(spec: Any, where: str, need: Need) -> tuple[ex.Expr, ...]:
    """One expression, or a list of them tried in order (`["rope_theta", "10000"]`)."""
    items = spec if isinstance(spec, list) else [spec]
    need(all(isinstance(item, str) for item in items),
         f"{where} must be an expression or a list of them")
    return tuple(_parse(item, where, need) for item in items)


def _hyper(name: str, spec: Any, need: Need) -> Hyper:
    where = f"hyperparameter '{name}'"
    spec = {"key": spec} if isinstance(spec, str) else spec
    if isinstance(spec, dict) and COUNT in spec:
        return _count(where, spec, need)
    need(isinstance(spec, dict) and (isinstance(spec.get("key"), str) != ("expr" in spec)),
         f"{where} must name a config key (\"key\"), compute it (\"expr\") or count the "
         "entries of one (\"count\")")
    unknown = sorted(set(spec) - _HYPER_KEYS)
    need(not unknown, f"{where}: unknown key '{unknown[0] if unknown else ''}'")
    same = spec.get("same", [])
    need(isinstance(same, list) and all(isinstance(k, str) for k in same),
         f"{where}: 'same' must be a list of config keys")
    default = _defaults(spec.get("default", []), f"{where}: 'default'", need)
    if "key" in spec:
        need(not {"null", "solve", "type"} & set(spec),
             f"{where}: 'null', 'solve' and 'type' need \"expr\"")
        return Hyper(spec["key"], ex.Name(spec["key"]), default, tuple(same), solve=spec["key"])
    text = spec["expr"]
    null = spec.get("null")
    need(null is None or type(null) in (int, float), f"{where}: 'null' must be a number")
    need(not same, f"{where}: 'same' needs \"key\"")
    solve = spec.get("solve")
    need(spec.get("type", "int") in ("int", "float"), f"{where}: 'type' must be \"int\" or \"float\"")
    parsed = _parse(text, where, need)
    if solve is not None:
        need(isinstance(solve, str), f"{where}: 'solve' must name a config key")
        why = ex.solvable(parsed, solve)
        need(why is None, f"{where}: cannot solve '{text}' for '{solve}': {why}")
    return Hyper(text, parsed, default, (), null, solve, True, spec.get("type") == "float")


def _count(where: str, spec: dict[str, Any], need: Need) -> Hyper:
    """`{"count": K}`, with an optional `"default"` for K absent or null."""
    key = spec[COUNT]
    need(isinstance(key, str) and key != "", f"{where}: 'count' must name a config key")
    others = sorted(set(spec) - {COUNT, "default", "same"})
    need(not others, f"{where}: 'count' cannot be combined with '{others[0] if others else ''}'")
    same = spec.get("same", [])
    need(isinstance(same, list) and all(isinstance(k, str) and k for k in same),
         f"{where}: 'same' must be a list of config keys")
    default = _defaults(spec.get("default", []), f"{where}: 'default'", need)
    return Hyper(key, ex.Name(key), default, tuple(same), solve=key, count=True)


def _with_solved_keys(hypers: dict[str, Hyper], written: set[str], need: Need) -> dict[str, Hyper]:
    """Each computed hyperparameter with the config key export solves for: the one key its
    expression reads that nothing else writes (none: export only checks the expression)."""
    for spec in hypers.values():
        if not spec.computed:
            written.update(spec.keys)
    written.update(s.solve for s in hypers.values() if s.computed and s.solve is not None)
    out = {}
    for name, spec in hypers.items():
        if spec.computed and spec.solve is None:
            free = [k for k in ex.names(spec.expr) if k not in written]
            need(len(free) <= 1, f"hyperparameter '{name}': '{spec.text}' reads {len(free)} keys "
                 f"nothing else writes ({', '.join(free)}): 'solve' must name the one export "
                 "writes")
            if free:
                why = ex.solvable(spec.expr, free[0])
                need(why is None, f"hyperparameter '{name}': export cannot solve '{spec.text}' "
                     f"for '{free[0]}': {why}")
                spec = Hyper(spec.text, spec.expr, spec.default, (), spec.null, free[0], True,
                             spec.real)
                written.add(free[0])
        out[name] = spec
    return out


def _overlap(a: str, b: str) -> bool:
    """Whether config keys `a` and `b` name the same value, or one holds the other (`a.b`),
    in either spelling of a renamed key."""
    a, b = current_key(a), current_key(b)
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _check_written_once(hypers: dict[str, Hyper], fixed: dict[str, str], need: Need) -> None:
    """No config key is both a hyperparameter's and a fixed or exported value: export would
    write one over the other, and import would accept values the card does not compute."""
    for name, spec in hypers.items():
        written = spec.keys if not spec.computed else (spec.solve,) if spec.solve else ()
        for key in written:
            for other, where in fixed.items():
                part = "" if key == other else f" (as '{other}')"
                need(not _overlap(key, other), f"config key '{key}' is both hyperparameter "
                     f"'{name}' and in '{where}'{part}: a value is set in one place")


ENTRY_KEYS = frozenset({"card", "transpose", "chunk", "axis", "shape", "row"})  # or "fused"


def _entry(hf: str, spec: Any, need: Need) -> Entry:
    spec = {"card": spec} if isinstance(spec, str) else spec
    if isinstance(spec, dict) and "fused" in spec:
        return _fused_entry(hf, spec, need)
    need(isinstance(spec, dict) and isinstance(spec.get("card"), str),
         f"tensor '{hf}' must map to a card tensor name")
    unknown = sorted(set(spec) - ENTRY_KEYS)  # a misspelt "tranpose" would load wrong weights
    need(not unknown, f"tensor '{hf}': unknown key {unknown[0]!r} (an entry takes "
         f"{', '.join(sorted(ENTRY_KEYS))})" if unknown else "")
    need(type(spec.get("transpose", False)) is bool,
         f"tensor '{hf}': 'transpose' must be true or false")
    chunk, axis = spec.get("chunk", [0, 1]), spec.get("axis", 0)
    need(isinstance(chunk, list) and len(chunk) == 2 and all(type(c) is int for c in chunk)
         and 0 <= chunk[0] < chunk[1], f"tensor '{hf}': 'chunk' must be [k, n] with 0 <= k < n")
    need(type(axis) is int and axis >= 0, f"tensor '{hf}': 'axis' must be an integer ≥ 0 "
         "(0: the card's first axis)")
    shape = spec.get("shape")
    need(shape is None or isinstance(shape, list) and all(type(n) in (int, str) for n in shape),
         f"tensor '{hf}': 'shape' must be a list of integers and expressions")
    for n in shape if isinstance(shape, list) else []:
        if isinstance(n, str):
            _parse(n, f"tensor '{hf}': 'shape'", need)
    need(shape is None or chunk == [0, 1],
         f"tensor '{hf}': 'shape' cannot be combined with 'chunk'")
    row = spec.get("row")
    need(row is None or isinstance(row, str) and _INDEX.fullmatch(row) is not None and
         set(index_vars(row)) <= set(index_vars(hf)),
         f"tensor '{hf}': 'row' must be an index of its name, as '{{i}}'")
    need(row is None or not {"chunk", "axis", "shape"} & set(spec),
         f"tensor '{hf}': 'row' cannot be combined with 'chunk', 'axis' or 'shape'")
    return Entry(hf, spec["card"], spec.get("transpose", False), (chunk[0], chunk[1]), axis,
                 None if shape is None else tuple(shape), row=row)


def _fused_entry(hf: str, spec: dict[str, Any], need: Need) -> Entry:
    """`{"fused": {"axis": a, "groups": EXPR, "parts": [CARD or [CARD, SIZE], …]}}`."""
    where = f"tensor '{hf}'"
    need(not {"card", "chunk", "shape", "axis"} & set(spec),
         f"{where}: 'fused' names its card tensors in 'parts' and its axis inside; it cannot be "
         "combined with 'card', 'chunk', 'shape' or 'axis'")
    fused = spec["fused"]
    need(isinstance(fused, dict) and not set(fused) - {"axis", "groups", "parts"},
         f"{where}: 'fused' must be an object of 'axis', 'groups' and 'parts'")
    axis, groups, parts = fused.get("axis", 0), fused.get("groups", "1"), fused.get("parts")
    need(type(axis) is int and axis >= 0, f"{where}: 'fused' 'axis' must be an integer ≥ 0 "
         "(0: the card's first axis)")
    groups = str(groups) if type(groups) is int else groups
    _parse(groups, f"{where}: 'groups'", need)
    need(isinstance(parts, list) and len(parts) >= 2,
         f"{where}: 'fused' 'parts' must list two or more card tensors")
    out = []
    for p in parts:
        p = [p] if isinstance(p, str) else p
        need(isinstance(p, list) and len(p) in (1, 2) and all(isinstance(x, str) for x in p),
             f"{where}: each part must be a card tensor name or [name, size]")
        if len(p) == 2:
            _parse(p[1], f"{where}: size of part '{p[0]}'", need)
        out.append(Part(p[0], p[1] if len(p) == 2 else None))
    return Entry(hf, out[0].card, spec.get("transpose", False) is True, axis=axis, groups=groups,
                 parts=tuple(out))
