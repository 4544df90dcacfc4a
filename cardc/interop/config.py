"""config.json ↔ the card's hyperparameters, through a mapping; no torch here."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from ..names import identifier
from ..runtime.errors import RuntimeInputError
from ..spelling import canonical_name
from . import expr as ex
from .constraints import names as constraint_names
from .constraints import violation
from .derived import counted, entries, holds
from .harmless import harmless
from .mapping import Hyper, Mapping
from .renamed import current_config, current_key

_ABSENT = object()


class ConfigMismatch(RuntimeInputError):
    """A config.json the mapping refuses; `stage` is how far its checks got (a variant whose
    fixed values fit and that then refuses a key says more than one refused for its tying)."""

    def __init__(self, message: str, stage: tuple[int, int]) -> None:
        super().__init__(message)
        self.stage = stage


def lookup(config: dict[str, Any], key: str, absent: Any = None) -> Any:
    """`a.b` reads config["a"]["b"]: transformers 5 nests rope_theta in rope_parameters. A
    renamed key is read in its current spelling (`config` is in it: `current_config`)."""
    value: Any = config
    for part in current_key(key).split("."):
        value = value.get(part, absent) if isinstance(value, dict) else absent
    return value


def store(config: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` (dotted, written in its current spelling)."""
    *path, last = current_key(key).split(".")
    for part in path:
        config = config.setdefault(part, {})
    config[last] = value


# ------------------------------------------------------------------ import


def preset_from_config(config: dict[str, Any], mapping: Mapping) -> dict[str, float]:
    """The card's hyperparameters a Hugging Face config.json implies (card names)."""
    check_config(config, mapping)
    config, _ = current_config(config)
    out: dict[str, float] = {}
    for name, spec in mapping.hyperparameters.items():
        value = hyper_value(config, spec, f"the card's {name}")
        for key in spec.same:
            other = lookup(config, key)
            if other is not None and spec.count:
                other = counted(other, key, f"the card's {name}")
            if other is not None and other != value:
                raise RuntimeInputError(f"config.json has {key} = {other!r} but {spec.key} = "
                                        f"{value!r}; the card's {name} is both")
        out[name] = value
    broken = broken_constraint(mapping, out)
    if broken is not None:
        name, why = broken
        raise RuntimeInputError(f"config.json {describe(mapping.hyperparameters[name], out[name], config)}"
                                f", but {mapping.source} maps only a card's {name} {why}")
    return out


def broken_constraint(mapping: Mapping, hypers: dict[str, Any],
                      python: bool = False) -> tuple[str, str] | None:
    """The first hyperparameter outside the mapping's constraints, and what it must be
    (`must be a power of two`); `hypers` keyed by card name, or by Python name if `python`."""
    def get(name: str) -> Any:
        canon = canonical_name(name)
        return hypers.get(identifier(canon) if python else canon)

    for name, c in mapping.constraints.items():
        value = get(name)
        if value is None:
            continue
        env = {}
        for n in constraint_names(c):
            if get(n) is None:
                raise RuntimeInputError(f"{mapping.source}: the constraint of {name} reads {n}, "
                                        "which has no value")
            env[n] = ex.exact(get(n))
        try:
            why = violation(c, ex.exact(value), env)
        except ex.ExprError as err:
            raise RuntimeInputError(f"{mapping.source}: the constraint of {name}: {err}") from None
        if why is not None:
            return name, f"that is {why}"
    return None


def hyper_value(config: dict[str, Any], spec: Hyper, what: str) -> ex.Number:
    """The value config.json gives one hyperparameter: a key's value as it is written, an
    expression's computed exactly (an int when whole)."""
    if spec.count and lookup(config, spec.key) is not None:
        return counted(lookup(config, spec.key), spec.key, what)
    env, missing = ({}, spec.key) if spec.count else _env(config, ex.names(spec.expr), what)
    if missing is not None:
        if spec.null is not None:
            return spec.null
        if not spec.default:
            raise RuntimeInputError(f"config.json lacks '{missing}' ({what}"
                                    f"{' = ' + spec.text if spec.computed else ''})")
        absent = []
        for default in spec.default:  # the first whose keys are all present applies
            env, gone = _env(config, ex.names(default), what)
            if gone is None:
                return _computed(default, env, what, config)
            absent.append(gone)
        raise RuntimeInputError(f"config.json lacks '{absent[0]}' ({what}'s default)")
    return _computed(spec.expr, env, what, config)


def _env(config: dict[str, Any], keys: list[str], what: str) -> tuple[dict[str, Fraction],
                                                                     str | None]:
    """The exact values of `keys`, or the first absent or null one."""
    env = {}
    for key in keys:
        value = lookup(config, key)
        if value is None:
            return env, key
        try:
            env[key] = ex.exact(value)
        except ex.ExprError:
            raise RuntimeInputError(f"config.json has {key} = {value!r} ({what}); expected a "
                                    "number") from None
    return env, None


def _computed(expr: ex.Expr, env: dict[str, Fraction], what: str,
              config: dict[str, Any] | None = None) -> ex.Number:
    """`expr`'s value; a bare key's as config.json writes it (10000.0 stays a float)."""
    if isinstance(expr, ex.Name) and config is not None:
        return lookup(config, expr.name)
    try:
        return ex.number(ex.evaluate(expr, env))
    except ex.ExprError as err:
        raise RuntimeInputError(f"config.json: cannot compute {what}: {err}") from None


def describe(spec: Hyper, value: Any, config: dict[str, Any] | None = None) -> str:
    """`has n_head = 0`, or `gives head_dim * partial_rotary_factor = 3.5`: where a value of
    config.json's came from: with `config`, the expression that gave it (a default where the
    first expression's keys are absent)."""
    said = f"{'gives' if spec.computed else 'has'} {spec.text} = {value!r}"
    if config is None or spec.count:
        return said
    current, _ = current_config(config)
    missing = _env(current, ex.names(spec.expr), "")[1]
    used = next((d for d in spec.default if _env(current, ex.names(d), "")[1] is None), None)
    if missing is None or used is None:
        return said
    gives = "has" if isinstance(used, ex.Name) else "gives"
    return f"has no {missing} (or null), and {gives} {ex.render(used)} = {value!r}"


def check_config(config: dict[str, Any], mapping: Mapping) -> None:
    """Refuse a config.json that describes a computation the card does not perform: another
    model type, a fixed value changed, a derived value that disagrees, or a key the mapping
    does not understand. Either spelling of a renamed key is read (cardc/interop/renamed.py)."""
    try:
        config, origin = current_config(config)
    except RuntimeInputError as err:
        raise ConfigMismatch(str(err), (0, 0)) from None
    spelt = lambda key: origin.get(current_key(key), key)  # noqa: E731 (as config.json has it)
    if config.get("model_type", mapping.model_type) != mapping.model_type:
        raise ConfigMismatch(f"config.json is for model_type '{config['model_type']}'; "
                             f"{mapping.source} maps '{mapping.model_type}'", (0, 0))
    for i, (key, accepted) in enumerate(mapping.fixed_config.items()):
        value = lookup(config, key, _ABSENT)
        if value is not _ABSENT and value not in accepted:
            raise ConfigMismatch(f"config.json has {spelt(key)} = {value!r}, but the card "
                                 f"{mapping.card} computes {key} = {accepted[0]!r}", (1, i))
    for key, (text, e) in mapping.derived_config.items():
        try:
            _check_derived(config, mapping, key, text, e)
        except RuntimeInputError as err:
            raise ConfigMismatch(str(err), (2, 0)) from None
    for key, (cycle, length) in mapping.cycles.items():
        value = lookup(config, key)
        if value is not None and not _cycles(value, config, key, cycle, length):
            raise ConfigMismatch(f"config.json has {key} = {value!r}, but the card "
                                 f"{mapping.card} computes {', '.join(map(repr, cycle))} in turn, "
                                 "layer after layer", (2, 0))
    unknown = _not_understood(config, {current_key(k) for k in mapping.understood()})
    if unknown:
        (key, value), others = unknown[0], [k for k, _ in unknown[1:]]
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        also = f" (nor are {', '.join(map(spelt, others))})" if others else ""
        raise ConfigMismatch(f"config key '{spelt(key)}' = {shown} is not understood by "
                             f"{mapping.source}: it maps it to no hyperparameter, fixes no "
                             f"value for it and does not list it as harmless{also}", (3, 0))


def _check_derived(config: dict[str, Any], mapping: Mapping, key: str, text: str,
                   e: ex.Expr) -> None:
    value = lookup(config, key)
    if value is None:
        return  # transformers computes it as the card does
    env, missing = _env(config, ex.names(e), f"{key} = {text}")
    if missing is not None:
        raise RuntimeInputError(f"config.json has {key} = {value!r} but no '{missing}' to "
                                f"check it against ({key} = {text})")
    try:
        ok = ex.exact(value) == ex.evaluate(e, env)
    except ex.ExprError as err:
        raise RuntimeInputError(f"config.json: cannot check {key} = {text}: {err}") from None
    if not ok:
        raise RuntimeInputError(f"config.json has {key} = {value!r}, but the card {mapping.card} "
                                f"computes {key} = {text} = {_computed(e, env, key)!r}")


def _cycles(value: Any, config: dict[str, Any], key: str, cycle: tuple[Any, ...],
            length: ex.Expr) -> bool:
    """Whether `value` is `cycle` repeated over `length` items, compared item by item: the
    work is bounded by the list config.json holds, whatever length it claims."""
    n = _cycle_length(config, key, length)
    return isinstance(value, list) and len(value) == n and \
        all(item == cycle[k % len(cycle)] for k, item in enumerate(value))


MAX_CYCLE = 1_000_000  # items of a per-layer list export writes: more layers than any model's


def _cycled(config: dict[str, Any], key: str, cycle: tuple[Any, ...],
            length: ex.Expr) -> list[Any]:
    """`cycle` repeated over the `length` (a config expression) items of `key`."""
    n = _cycle_length(config, key, length)
    if n > MAX_CYCLE:
        raise RuntimeInputError(f"cannot write {key}: {n:,} items, more than {MAX_CYCLE:,}")
    return [cycle[k % len(cycle)] for k in range(n)]


def _cycle_length(config: dict[str, Any], key: str, length: ex.Expr) -> int:
    env, missing = _env(config, ex.names(length), key)
    if missing is not None:
        raise RuntimeInputError(f"config.json has {key} but no '{missing}' to check it against")
    n = _computed(length, env, f"the length of {key}", config)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise RuntimeInputError(f"config.json: {key} needs a whole length, not {n!r}")
    return n


def _not_understood(config: dict[str, Any], known: set[str],
                    prefix: str = "") -> list[tuple[str, Any]]:
    """The keys (dotted) of `config` that are neither known nor harmless, with their values;
    an object of which some keys are known is searched key by key."""
    out = []
    for key, value in config.items():
        path = prefix + key
        if path in known or (not prefix and harmless(key)):
            continue
        if isinstance(value, dict) and any(k.startswith(path + ".") for k in known):
            out += _not_understood(value, known, path + ".")
        else:
            out.append((path, value))
    return out


def select_for_config(mappings: list[Mapping], config: dict[str, Any] | None) -> Mapping:
    """The mapping a config.json describes: the first whose fixed values it keeps among those
    whose architecture it names, or among all if it names none of theirs (a bare LlamaModel's
    checkpoint names its own: architectures choose between mappings, they refuse none).
    None fits: the refusal of the one whose checks got furthest. No config.json: the first."""
    if config is None:
        return mappings[0]
    named = config.get("architectures")
    named = named if isinstance(named, list) else []
    fits = [m for m in mappings if m.architecture in named] or mappings
    errors: list[ConfigMismatch] = []
    for m in fits:
        try:
            check_config(config, m)
        except ConfigMismatch as err:
            errors.append(err)
        else:
            return m
    raise max(errors, key=lambda err: err.stage)  # the first of the furthest


# ------------------------------------------------------------------ export


def kept_entries(config: dict[str, Any], mapping: Mapping) -> dict[str, Any]:
    """The entries of the config keys the card counts (`id2label`, and `label2id` counted
    alike), as config.json holds them: the checkpoint's, not the card's (label names), which
    an import records and export writes back."""
    keys = [key for spec in mapping.hyperparameters.values() if spec.count for key in spec.keys]
    return {key: lookup(config, key) for key in keys
            if isinstance(lookup(config, key), (dict, list))}


# Token IDs a config names for generation (which token starts and which ends a text): they
# change no logits, so no mapping maps them, but a model exported without them would no
# longer stop where its source did.
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id")
MAX_TOKEN_IDS = 64  # eos_token_id may list several tokens (Llama 3.1 names three)


def _token_ids(value: Any) -> bool:
    """Whether `value` is a token ID, or a short list of them, as config.json writes them."""
    if isinstance(value, list):
        return 0 < len(value) <= MAX_TOKEN_IDS and all(_token_ids(v) for v in value) \
            and not any(isinstance(v, list) for v in value)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def kept_token_ids(config: dict[str, Any], mapping: Mapping) -> dict[str, Any]:
    """The bos and eos token IDs of config.json, which an import records and export writes
    back; a key the mapping itself reads or fixes is the mapping's to write."""
    return {key: config[key] for key in _free_token_keys(mapping)
            if _token_ids(config.get(key))}


def with_token_ids(config: dict[str, Any], kept: Any, mapping: Mapping) -> dict[str, Any]:
    """`config` with the token IDs an import recorded (`kept_token_ids`) in place of the
    mapping's defaults. `kept` comes from a checkpoint, untrusted: anything but token IDs of
    the keys above is left out."""
    if not isinstance(kept, dict):
        return config
    return {**config, **{key: kept[key] for key in _free_token_keys(mapping)
                         if key in kept and _token_ids(kept[key])}}


def _free_token_keys(mapping: Mapping) -> list[str]:
    """The token ID keys that the mapping neither reads as a hyperparameter nor fixes."""
    owned = {k for spec in mapping.hyperparameters.values() for k in spec.reads()} | \
        set(mapping.fixed_config)
    return [key for key in TOKEN_ID_KEYS if key not in owned]


def config_for(mapping: Mapping, hypers: dict[str, Any],
               kept: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json for a model with these hyperparameters (keyed by Python name): keys first,
    then fixed values, then each computed hyperparameter solved for its key, then derived
    values, then `export_config`. `kept`: the entries of counted keys an import recorded
    (`kept_entries`), written back where their count is unchanged."""
    broken = broken_constraint(mapping, hypers, python=True)
    if broken is not None:
        name, why = broken
        raise RuntimeInputError(f"the card's {name} = {hypers[identifier(name)]!r}, but "
                                f"{mapping.source} maps only a card's {name} {why}")
    config: dict[str, Any] = {"architectures": [mapping.architecture],
                              "model_type": mapping.model_type}
    computed = []
    for name, spec in mapping.hyperparameters.items():
        if spec.computed:
            computed.append((name, spec))
            continue
        value = hypers[identifier(name)]
        for key in spec.keys:
            if not spec.count:
                store(config, key, value)
            elif key == spec.key:
                store(config, key, entries(value, key, f"the card's {name}", (kept or {}).get(key)))
            elif holds((kept or {}).get(key), value):  # counted alike: only as it was read
                store(config, key, (kept or {})[key])
    for key, accepted in mapping.fixed_config.items():
        if accepted[0] is not None or "." not in key:  # a nested null: absent (no {type: null})
            store(config, key, accepted[0])
    for name, spec in computed:
        _export_computed(config, name, spec, hypers[identifier(name)])
    for key, (text, e) in mapping.derived_config.items():
        env, missing = _env(config, ex.names(e), f"{key} = {text}")
        if missing is not None:
            raise RuntimeInputError(f"cannot write {key} = {text}: no {missing}")
        store(config, key, _computed(e, env, key))
    for key, (cycle, length) in mapping.cycles.items():
        store(config, key, _cycled(config, key, cycle, length))
    for key, value in mapping.export_config.items():
        store(config, key, value)
    return config


def _export_computed(config: dict[str, Any], name: str, spec: Hyper, value: Any) -> None:
    """Write the key `spec` solves for, so that importing `config` gives `value` back."""
    if spec.null is not None and value == spec.null:
        if spec.solve is not None:
            store(config, spec.solve, None)
        return
    known = [k for k in ex.names(spec.expr) if k != spec.solve]
    env, missing = _env(config, known, f"the card's {name}")
    if missing is not None:
        raise RuntimeInputError(f"cannot write the card's {name} = {spec.text}: no '{missing}' "
                                "in the config written so far")
    try:
        target = ex.exact(value)
        if spec.solve is not None:
            solved = ex.solve(spec.expr, spec.solve, target, env)
            written = float(solved) if spec.real else ex.number(solved)
            if ex.exact(written) != solved:  # import would read another value back
                raise ex.ExprError(f"{spec.solve} would be {solved} = {written!r}, which "
                                   "config.json cannot hold exactly")
            store(config, spec.solve, written)
            env[spec.solve] = solved
        got = ex.evaluate(spec.expr, env)
    except ex.ExprError as err:
        raise RuntimeInputError(f"cannot write the card's {name} = {value!r} as "
                                f"{spec.text}: {err}") from None
    if got != target:
        raise RuntimeInputError(f"the card's {name} = {value!r}, but the config written gives "
                                f"{spec.text} = {ex.number(got)!r}")
