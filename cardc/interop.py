"""Checkpoints between Hugging Face `transformers` and cardc, driven by one mapping file per card.

A model card with a Hugging Face counterpart keeps `<card stem>.hf.json` beside it
(`cards/gpt2.card` → `cards/gpt2.hf.json`); a new family adds such a file, not code. The file is
JSON rather than TOML because cardc supports Python 3.10, whose standard library has no tomllib,
and because the files it describes (`config.json`, the safetensors index) are JSON too. Its keys:

- `card`: the model card of the file it maps (`GPT2`); `architecture` and `model_type`: what
  export writes to config.json (`GPT2LMHeadModel`, `gpt2`) and import expects there.
- `variants`: card name → the mapping of another card of the same card file (`LlamaUntied`
  beside `Llama`, `BERTForMaskedLM` beside `BERT`), written as a JSON merge patch (RFC 7396) of
  the top level: objects merge key by key, a value replaces what it names, null removes it, a
  list replaces the whole list. Import picks the first mapping in file order whose
  `fixed_config` config.json keeps, among those whose `architecture` it names (its
  `architectures`; among all if it names none of theirs); `--name` picks one by its card.
  Export picks the mapping of the checkpoint's card.
- `hyperparameters`: card hyperparameter → config.json key (`a.b`: key b of the object a), or `{"key": K, "default": EXPR}`
  where EXPR (numbers, config keys, + − * / //) applies when K is absent or null
  (`n_inner: null` means 4·n_embd), and `"same": [K2, …]`: further keys that must hold the
  same value (BART's encoder_layers and decoder_layers, both the card's N); import refuses a
  config.json where they differ, export writes every one.
- `fixed_config`: config values the card's computation fixes (`activation_function`,
  `tie_word_embeddings`). Import refuses a config.json that sets another value; export writes
  them. A list names the accepted values; export writes the first. A key `a.b` is key b of the
  object a (`rope_parameters.rope_type`), as in `hyperparameters`.
- `export_config`: further values export writes (no dropout: the card has none); `a.b` keys too.
- `layers`: the hyperparameter that counts the layers; `{i}` in a name is the layer, from 0.
- `tensors`: Hugging Face name → the generated module's parameter name, or
  `{"card": NAME, "transpose": true, "chunk": [k, n], "axis": a}`: the Hugging Face tensor is
  the card's transposed (nn.Linear stores (out, in), cards are row-major (in, out)), and/or the
  k-th of n equal slices of it along axis a of the card's layout (separate q/k/v projections of
  a fused W_qkv). `"shape": [1, -1]` instead: the Hugging Face tensor is the card's reshaped
  so (BART's final_logits_bias, a (1, V) buffer, is the card's b_f ∈ ℝ^{V}).
- `tied`: Hugging Face name → the Hugging Face tensor it shares storage with; export omits it,
  import accepts it only if equal.
- `base_prefix`: what the base model's names start with (`transformer.`); checkpoints of the bare
  base model leave it out, so import adds it back. `base_model`: true when `architecture` is
  that bare base model (BertModel), whose checkpoints export writes without the prefix too.
- `ignore`: names (with `{i}`) import skips, such as the causal-mask buffers older GPT-2
  checkpoints carry.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from .names import identifier
from .runtime.atomic import atomic_path, write_text_atomic
from .runtime.errors import RuntimeInputError
from .spelling import canonical_name

MAPPING_SUFFIX = ".hf.json"
HF_WEIGHTS, HF_INDEX, HF_CONFIG = "model.safetensors", "model.safetensors.index.json", "config.json"
META_KEY = "hf"  # the checkpoint metadata entry that records an import

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv}


# ------------------------------------------------------------------ the mapping


@dataclass(frozen=True)
class Entry:
    """One Hugging Face tensor and where it lives in the card's model."""
    hf: str
    card: str
    transpose: bool = False
    chunk: tuple[int, int] = (0, 1)
    axis: int = 0
    shape: tuple[int, ...] | None = None  # the Hugging Face layout, a reshape of the card's

    def at(self, i: int) -> Entry:
        return Entry(self.hf.format(i=i), self.card.format(i=i), self.transpose, self.chunk,
                     self.axis, self.shape)


@dataclass(frozen=True)
class Hyper:
    key: str
    default: str | None = None
    same: tuple[str, ...] = ()  # further config keys that hold the same value

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key, *self.same)


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
    layers: str | None
    tensors: tuple[Entry, ...]
    tied: dict[str, str]
    base_prefix: str
    ignore: tuple[str, ...]
    base_model: bool = False

    def entries(self, n_layers: int) -> list[Entry]:
        """The table with `{i}` expanded for every layer."""
        out = []
        for e in self.tensors:
            out += [e.at(i) for i in range(n_layers)] if "{i}" in e.hf else [e]
        return out

    def ignored(self, name: str) -> bool:
        return any(re.fullmatch(re.escape(p).replace(r"\{i\}", r"\d+"), name) for p in self.ignore)


def mapping_path(card: str | os.PathLike[str]) -> Path:
    path = Path(card)
    return path.with_name(path.stem + MAPPING_SUFFIX)


def load_mappings(card: str | os.PathLike[str]) -> list[Mapping]:
    """The mappings of the file beside `card`: its top level's card first, then its variants."""
    path = mapping_path(card)
    if not path.is_file():
        raise RuntimeInputError(f"{card} has no Hugging Face mapping: expected {path}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RuntimeInputError(f"cannot read {path}: {err}") from None
    return parse_mappings(raw, str(path))


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
    layers = canonical_name(raw["layers"]) if isinstance(raw.get("layers"), str) else None
    need(layers in hypers or not any("{i}" in e.hf for e in tensors),
         "names with {i} need 'layers', the hyperparameter that counts the layers")
    fixed = {k: v if isinstance(v, list) else [v] for k, v in raw.get("fixed_config", {}).items()}
    return Mapping(source, raw, raw["card"], raw["architecture"], raw["model_type"], hypers, fixed,
                   dict(raw.get("export_config", {})), layers, tensors, dict(raw.get("tied", {})),
                   str(raw.get("base_prefix", "")), tuple(raw.get("ignore", [])),
                   raw.get("base_model", False) is True)


_KEYS = {"about", "card", "architecture", "model_type", "hyperparameters", "fixed_config",
         "export_config", "layers", "tensors", "tied", "base_prefix", "ignore", "variants",
         "base_model"}


def _check_keys(raw: Any, need: Callable[[bool, str], None]) -> None:
    need(isinstance(raw, dict), "expected a JSON object")
    for key in sorted(set(raw) - _KEYS):  # a misspelt key would otherwise be ignored
        need(False, f"unknown key '{key}' (known: {', '.join(sorted(_KEYS))})")
    for key in ("card", "architecture", "model_type"):
        need(isinstance(raw.get(key), str), f"'{key}' must be a string")
    for key in ("hyperparameters", "tensors"):
        need(isinstance(raw.get(key), dict) and bool(raw[key]), f"'{key}' must be a non-empty object")
    for key in ("fixed_config", "export_config", "tied"):
        need(isinstance(raw.get(key, {}), dict), f"'{key}' must be an object")
    need(isinstance(raw.get("ignore", []), list), "'ignore' must be a list of names")
    need(isinstance(raw.get("base_model", False), bool), "'base_model' must be true or false")


def _hyper(name: str, spec: Any, need: Callable[[bool, str], None]) -> Hyper:
    spec = {"key": spec} if isinstance(spec, str) else spec
    need(isinstance(spec, dict) and isinstance(spec.get("key"), str),
         f"hyperparameter '{name}' must name a config key")
    same = spec.get("same", [])
    need(isinstance(same, list) and all(isinstance(k, str) for k in same),
         f"hyperparameter '{name}': 'same' must be a list of config keys")
    return Hyper(spec["key"], spec.get("default"), tuple(same))


def _entry(hf: str, spec: Any, need: Callable[[bool, str], None]) -> Entry:
    spec = {"card": spec} if isinstance(spec, str) else spec
    need(isinstance(spec, dict) and isinstance(spec.get("card"), str),
         f"tensor '{hf}' must map to a card tensor name")
    chunk, axis = spec.get("chunk", [0, 1]), spec.get("axis", 0)
    need(isinstance(chunk, list) and len(chunk) == 2 and all(type(c) is int for c in chunk)
         and 0 <= chunk[0] < chunk[1], f"tensor '{hf}': 'chunk' must be [k, n] with 0 <= k < n")
    need(type(axis) is int, f"tensor '{hf}': 'axis' must be an integer")
    shape = spec.get("shape")
    need(shape is None or isinstance(shape, list) and all(type(n) is int for n in shape),
         f"tensor '{hf}': 'shape' must be a list of integers")
    need(shape is None or not spec.get("transpose") and chunk == [0, 1],
         f"tensor '{hf}': 'shape' cannot be combined with 'transpose' or 'chunk'")
    return Entry(hf, spec["card"], spec.get("transpose", False) is True, (chunk[0], chunk[1]), axis,
                 None if shape is None else tuple(shape))


# ------------------------------------------------------------------ hyperparameters


def preset_from_config(config: dict[str, Any], mapping: Mapping) -> dict[str, float]:
    """The card's hyperparameters a Hugging Face config.json implies (card names)."""
    check_config(config, mapping)
    out: dict[str, float] = {}
    for name, spec in mapping.hyperparameters.items():
        value = _lookup(config, spec.key)
        if value is None and spec.default is not None:
            value = _evaluate(spec.default, config, f"{mapping.source}: '{name}'")
        if value is None:
            raise RuntimeInputError(f"config.json lacks '{spec.key}' (the card's {name})")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RuntimeInputError(f"config.json has {spec.key} = {value!r}; expected a number")
        for key in spec.same:
            other = _lookup(config, key)
            if other is not None and other != value:
                raise RuntimeInputError(f"config.json has {key} = {other!r} but {spec.key} = "
                                        f"{value!r}; the card's {name} is both")
        out[name] = value
    return out


_ABSENT = object()


def _lookup(config: dict[str, Any], key: str, absent: Any = None) -> Any:
    """`a.b` reads config["a"]["b"]: transformers 5 nests rope_theta in rope_parameters."""
    value: Any = config
    for part in key.split("."):
        value = value.get(part, absent) if isinstance(value, dict) else absent
    return value


def _store(config: dict[str, Any], key: str, value: Any) -> None:
    *path, last = key.split(".")
    for part in path:
        config = config.setdefault(part, {})
    config[last] = value


def check_config(config: dict[str, Any], mapping: Mapping) -> None:
    """Refuse a config.json that describes a computation the card does not perform."""
    if config.get("model_type", mapping.model_type) != mapping.model_type:
        raise RuntimeInputError(f"config.json is for model_type '{config['model_type']}'; "
                                f"{mapping.source} maps '{mapping.model_type}'")
    for key, accepted in mapping.fixed_config.items():
        value = _lookup(config, key, _ABSENT)
        if value is not _ABSENT and value not in accepted:
            raise RuntimeInputError(f"config.json has {key} = {value!r}, but the card "
                                    f"{mapping.card} computes {key} = {accepted[0]!r}")


def select_for_config(mappings: list[Mapping], config: dict[str, Any] | None) -> Mapping:
    """The mapping a config.json describes: the first whose fixed values it keeps among those
    whose architecture it names, or among all if it names none of theirs (a bare LlamaModel's
    checkpoint names its own: architectures choose between mappings, they refuse none).
    No config.json: the first mapping."""
    if config is None:
        return mappings[0]
    named = config.get("architectures")
    named = named if isinstance(named, list) else []
    fits = [m for m in mappings if m.architecture in named] or mappings
    errors = []
    for m in fits:
        try:
            check_config(config, m)
        except RuntimeInputError as err:
            errors.append(err)
        else:
            return m
    raise errors[0]


def _evaluate(expr: str, names: dict[str, Any], where: str) -> float:
    """A default such as `4 * n_embd`: numbers, config keys and arithmetic, nothing else."""
    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.Name) and type(names.get(node.id)) in (int, float):
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise RuntimeInputError(f"{where}: cannot evaluate '{expr}' with this config.json")
    try:
        return walk(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ZeroDivisionError):
        raise RuntimeInputError(f"{where}: cannot evaluate '{expr}'") from None


def config_for(mapping: Mapping, hypers: dict[str, Any]) -> dict[str, Any]:
    """config.json for a model with these hyperparameters (keyed by Python name)."""
    config: dict[str, Any] = {"architectures": [mapping.architecture],
                              "model_type": mapping.model_type}
    for name, spec in mapping.hyperparameters.items():
        for key in spec.keys:
            _store(config, key, hypers[identifier(name)])
    for key, accepted in mapping.fixed_config.items():
        _store(config, key, accepted[0])
    for key, value in mapping.export_config.items():
        _store(config, key, value)
    return config


# ------------------------------------------------------------------ tensors


def to_card_state(mapping: Mapping, hf_state: dict[str, torch.Tensor],
                  expected: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """Hugging Face tensors renamed, transposed and joined into the card's state dict.

    `expected` is the card model's state dict (for shapes); every mismatch names the tensor."""
    hf_state = _normalise(mapping, hf_state)
    entries = mapping.entries(n_layers)
    _check_names(mapping, entries, hf_state, set(expected), n_layers)
    parts: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for e in entries:
        want, got = _hf_shape(e, expected[e.card].shape), hf_state[e.hf]
        if tuple(got.shape) != want:
            raise RuntimeInputError(f"tensor '{e.hf}' has shape {tuple(got.shape)}; the card's "
                                    f"{e.card} needs {want}")
        got = got.reshape(expected[e.card].shape) if e.shape is not None else got
        parts.setdefault(e.card, []).append((e.chunk[0], got.T if e.transpose else got))
    axis = {e.card: e.axis for e in entries}
    return {card: torch.cat([t for _, t in sorted(ts, key=lambda kt: kt[0])], dim=axis[card])
            for card, ts in parts.items()}


def _check_names(mapping: Mapping, entries: list[Entry], hf_state: dict[str, torch.Tensor],
                 card_names: set[str], n_layers: int) -> None:
    extra = sorted(set(hf_state) - {e.hf for e in entries})
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise RuntimeInputError(f"unexpected tensor '{extra[0]}'{more}: {mapping.source} maps no "
                                f"such tensor for a model with {n_layers} layers")
    missing = [e for e in entries if e.hf not in hf_state]
    if missing:
        raise RuntimeInputError(f"missing tensor '{missing[0].hf}' (the card's {missing[0].card})")
    unmapped = sorted(card_names - {e.card for e in entries})
    if unmapped:
        raise RuntimeInputError(f"{mapping.source} does not map the card's tensor '{unmapped[0]}'")
    unknown = sorted({e.card for e in entries} - card_names)
    if unknown:
        raise RuntimeInputError(f"{mapping.source} maps to '{unknown[0]}', which the card's model "
                                "does not have")


def _normalise(mapping: Mapping, hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Add a missing base prefix, drop ignored buffers, fold tied copies."""
    prefix = mapping.base_prefix
    if prefix and not any(name.startswith(prefix) for name in hf_state):
        hf_state = {prefix + name: t for name, t in hf_state.items()}
    state = {name: t for name, t in hf_state.items() if not mapping.ignored(name)}
    for alias, target in mapping.tied.items():
        if alias in state:
            copy = state.pop(alias)
            if target in state and not torch.equal(copy, state[target]):
                raise RuntimeInputError(f"tensor '{alias}' differs from '{target}', but the card "
                                        f"{mapping.card} ties them")
    return state


def _hf_shape(e: Entry, card_shape: torch.Size) -> tuple[int, ...]:
    if e.shape is not None:  # the reshape a meta tensor takes: an impossible one names the tensor
        try:
            return tuple(torch.empty(card_shape, device="meta").reshape(e.shape).shape)
        except RuntimeError:
            raise RuntimeInputError(f"tensor '{e.hf}': the card's {e.card} of shape "
                                    f"{tuple(card_shape)} has no shape {list(e.shape)}") from None
    shape = list(card_shape)
    k, n = e.chunk
    if n > 1:
        shape[e.axis] //= n
    return tuple(reversed(shape)) if e.transpose else tuple(shape)


def from_card_state(mapping: Mapping, state: dict[str, torch.Tensor],
                    n_layers: int) -> dict[str, torch.Tensor]:
    """The card's state dict under Hugging Face names, each tensor contiguous and unshared;
    a bare base model's names without the base prefix, as its checkpoints have them."""
    entries = mapping.entries(n_layers)
    unmapped = sorted(set(state) - {e.card for e in entries})
    if unmapped:
        raise RuntimeInputError(f"{mapping.source} does not map the card's tensor '{unmapped[0]}'")
    out = {}
    for e in entries:
        if e.card not in state:
            raise RuntimeInputError(f"the checkpoint lacks the card's tensor '{e.card}'")
        t = state[e.card].detach()
        k, n = e.chunk
        t = t.chunk(n, dim=e.axis)[k] if n > 1 else t
        t = t.reshape(e.shape) if e.shape is not None else t
        out[e.hf] = (t.T if e.transpose else t).contiguous().clone().cpu()
    if mapping.base_model and mapping.base_prefix:
        out = {name.removeprefix(mapping.base_prefix): t for name, t in out.items()}
    return out


# ------------------------------------------------------------------ Hugging Face files


def read_hf(source: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, dict[str, torch.Tensor]]:
    """config.json (None if absent) and the tensors of a Hugging Face model folder or file."""
    path = Path(source)
    if not path.exists():
        raise RuntimeInputError(f"no such file or directory: '{path}'")
    folder = path if path.is_dir() else path.parent
    if path.is_dir():
        path = path / HF_WEIGHTS if (path / HF_WEIGHTS).is_file() else path / HF_INDEX
        if not path.is_file():
            raise RuntimeInputError(f"'{source}' has neither {HF_WEIGHTS} nor {HF_INDEX}")
    files = _shards(path) if path.name.endswith(".index.json") else [path]
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(_read_safetensors(file))
    config_file = folder / HF_CONFIG
    config = _read_json(config_file) if config_file.is_file() else None
    return config, tensors


def _shards(index: Path) -> list[Path]:
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise RuntimeInputError(f"'{index}' has no weight_map")
    return [index.parent / name for name in sorted(set(weight_map.values()))]


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    if not file.is_file():
        raise RuntimeInputError(f"no such file: '{file}'")
    try:
        with safe_open(file, framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (not iterable)
    except Exception as err:  # safetensors raises its own error type for every kind of damage
        raise RuntimeInputError(f"'{file}' is not a valid safetensors file: {err}") from None


def _read_json(file: Path) -> dict[str, Any]:
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RuntimeInputError(f"cannot read '{file}': {err}") from None
    if not isinstance(value, dict):
        raise RuntimeInputError(f"'{file}' is not a JSON object")
    return value


def write_hf(dest: str | os.PathLike[str], tensors: dict[str, torch.Tensor],
             config: dict[str, Any]) -> Path:
    """config.json and model.safetensors in `dest`. A new folder appears whole or not at all;
    in an existing one each file is replaced atomically."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise RuntimeInputError(f"'{dest}' exists and is not a folder")
    if (dest / HF_INDEX).exists():  # transformers would read the old shards, not the new file
        raise RuntimeInputError(f"'{dest}' holds a sharded model ({HF_INDEX}); "
                                "export to a new folder")
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    try:
        return _write_hf_files(dest, tensors, text)
    except OSError as err:
        raise RuntimeInputError(f"cannot write '{dest}': {err.strerror or err}") from None


def _write_hf_files(dest: Path, tensors: dict[str, torch.Tensor], text: str) -> Path:
    if dest.is_dir() and any(dest.iterdir()):
        with atomic_path(dest / HF_WEIGHTS) as tmp:
            save_file(tensors, tmp, metadata={"format": "pt"})
        write_text_atomic(dest / HF_CONFIG, text)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        with atomic_path(tmp_dir / HF_WEIGHTS) as tmp:
            save_file(tensors, tmp, metadata={"format": "pt"})
        write_text_atomic(tmp_dir / HF_CONFIG, text)
        tmp_dir.chmod(0o755)  # mkdtemp makes it private; a model folder is readable like any
        if dest.is_dir():
            dest.rmdir()  # empty: replaced by the finished folder
        tmp_dir.rename(dest)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return dest


# ------------------------------------------------------------------ import and export


def import_hf(card: str, source: str | os.PathLike[str], preset: str | None = None,
              overrides: dict[str, float] | None = None, name: str | None = None,
              library: list[str] | None = None) -> nn.Module:
    """The model of a card of the file `card` holding a Hugging Face checkpoint's weights.

    The card is `name`, else the one whose mapping fits config.json (`select_for_config`).
    Hyperparameters come from the preset, else from config.json; `overrides` apply last.
    `model.card_meta` records the import and the mapping, so the checkpoint exports anywhere."""
    from .build import build_model, checked, find_card, library_roots, record_sampler
    from .runtime.checkpoint import load_state

    mappings = load_mappings(card)
    config, hf_state = read_hf(source)
    if name is not None:
        mapping = select_by_name(mappings, name)
    else:
        mapping = select_for_config(mappings, config)
    hypers: dict[str, float] = {}
    if config is not None:
        check_config(config, mapping)  # with a preset too: the weights must mean the same
        hypers = {} if preset is not None else preset_from_config(config, mapping)
    elif preset is None:
        raise RuntimeInputError(f"no {HF_CONFIG} beside '{source}': give --preset to choose "
                                "the hyperparameters")
    lib, checker, _ = checked([card], library_roots([card], library))
    alg = find_card(lib, checker, card, mapping.card)
    check_sizes(checker.info(alg), mapping, hypers, preset, overrides or {}, hf_state)
    model = build_model(card, preset, {**hypers, **(overrides or {})}, library, mapping.card)
    expected = model.state_dict()
    state = to_card_state(mapping, hf_state, expected, _layers(mapping, model.card_meta))
    load_state(model, state)
    model.card_meta[META_KEY] = {"source": os.fspath(source), "mapping": mapping.raw}
    record_sampler(model.card_meta, lib, checker, alg)
    return model


def check_sizes(info: Any, mapping: Mapping, hypers: dict[str, float], preset: str | None,
                overrides: dict[str, float], hf_state: dict[str, torch.Tensor]) -> None:
    """Refuse config.json sizes the card cannot be built at, before any tensor is allocated:
    a dimension that is not a positive whole number (`n_head = 0`), a value outside the range
    the card declares, or more parameters than the source's tensors hold (`n_layer = 10^6`)."""
    from .info import PresetError, check_ranges, count, preset_values
    from .types import BundleTy

    sig = info.sig
    for name, value in hypers.items():
        spec = sig.hypers.get(name)
        if spec is not None and spec.elem == "ℕ" and not (value >= 1 and float(value).is_integer()):
            raise RuntimeInputError(f"config.json has {mapping.hyperparameters[name].key} = "
                                    f"{value!r}; the card's {name} must be a positive whole number")
    try:
        values = preset_values(sig, preset, {**hypers, **overrides})
        check_ranges(sig.alg, values)
        params = count(sig.tree, values, sig.alg.span) if isinstance(sig.tree, BundleTy) else 0
    except PresetError as err:
        keys = [mapping.hyperparameters[n].key for n in hypers if f"'{n}'" in err.message]
        raise RuntimeInputError(f"config.json{' (' + keys[0] + ')' if keys else ''}: "
                                f"{err.message}") from None
    except (ArithmeticError, ValueError) as err:
        raise RuntimeInputError(f"config.json: these sizes do not build the card: {err}") from None
    held = sum(t.numel() for t in hf_state.values())
    if params > 2 * held:  # tied or synthesised tensors never make a card twice its source
        shown = ", ".join(f"{mapping.hyperparameters[n].key} = {int(v):,}" for n, v in hypers.items()
                          if sig.hypers.get(n) is not None and sig.hypers[n].elem == "ℕ")
        raise RuntimeInputError(f"config.json's sizes ({shown}) make {params:,} parameters, but "
                                f"the checkpoint holds {held:,} values; the config does not "
                                "describe these weights")


def import_checkpoint(card: str, source: str | os.PathLike[str], out: str | os.PathLike[str],
                      preset: str | None = None, overrides: dict[str, float] | None = None,
                      name: str | None = None,
                      library: list[str] | None = None) -> tuple[nn.Module, str]:
    """`cardc import`: a cardc checkpoint in `out`, which then holds this checkpoint alone
    (written beside it and moved into place whole, as a training run is)."""
    from .runtime.checkpoint import CHECKPOINT_NAME, save_checkpoint
    from .runtime.runs import check_destination, new_run_id, staged_run

    check_destination(out)
    model = import_hf(card, source, preset, overrides, name, library)
    try:
        with staged_run(out) as folder:
            save_checkpoint(folder, model, {**model.card_meta, "run": new_run_id()})
    except OSError as err:
        raise RuntimeInputError(f"cannot write '{out}': {err.strerror or err}") from None
    return model, os.path.join(os.fspath(out), CHECKPOINT_NAME)


def export_hf(run_dir: str | os.PathLike[str], dest: str | os.PathLike[str],
              library: str | os.PathLike[str] | list[str] = "cards") -> tuple[Mapping, Path]:
    """A cardc checkpoint as a Hugging Face model folder that `from_pretrained` loads.

    An imported checkpoint carries its mapping; a trained one is matched to the mapping file
    beside its card in `library`."""
    from .runtime.checkpoint import read_checkpoint

    meta, state = read_checkpoint(run_dir)
    mapping = checkpoint_mapping(meta, library)
    if meta.get("name") != mapping.card:
        raise RuntimeInputError(f"'{run_dir}' holds {meta.get('name')}, but {mapping.source} "
                                f"maps {mapping.card}")
    hypers = meta.get("hyperparameters") or {}
    try:
        config = config_for(mapping, hypers)
    except KeyError as err:
        raise RuntimeInputError(f"'{run_dir}' records no hyperparameter {err}") from None
    tensors = from_card_state(mapping, state, _layers(mapping, meta))
    return mapping, write_hf(dest, tensors, config)


def checkpoint_mapping(meta: dict[str, Any],
                       library: str | os.PathLike[str] | list[str]) -> Mapping:
    recorded = meta.get(META_KEY)
    if isinstance(recorded, dict) and "mapping" in recorded:
        return parse_mapping(recorded["mapping"], "the checkpoint's mapping")
    card = str(meta.get("card", ""))
    stem = Path(card).stem
    folders = library if isinstance(library, list) else [library]
    found = [p for f in folders for p in sorted(Path(f).rglob(stem + MAPPING_SUFFIX))] \
        if stem else []
    beside = [p for p in found if p.with_name(stem + ".card").is_file()]
    if not beside:
        raise RuntimeInputError(f"no Hugging Face mapping for {card or 'this checkpoint'}: "
                                f"expected {stem or '<card>'}{MAPPING_SUFFIX} beside its card "
                                f"under '{', '.join(map(str, folders))}' (see --library)")
    text = (meta.get("cards") or {}).get(card)  # prefer the card the checkpoint was built from
    same = [p for p in beside if p.with_name(stem + ".card").read_text(encoding="utf-8") == text]
    mappings = load_mappings((same or beside)[0].with_name(stem + ".card"))
    name = meta.get("name")
    return next((m for m in mappings if m.card == name), mappings[0])


def _layers(mapping: Mapping, meta: dict[str, Any]) -> int:
    if mapping.layers is None:
        return 0
    try:
        return int(meta["hyperparameters"][identifier(mapping.layers)])
    except (KeyError, TypeError, ValueError):
        raise RuntimeInputError(f"the checkpoint records no '{mapping.layers}' "
                                "(the number of layers)") from None
