"""Config keys `transformers` has renamed, one shared table: a config.json of either spelling
is read in the current one, and a mapping file may name a key either way.

transformers 5 (5.24 writes this) keeps the rotary settings in one object, `rope_parameters`
(`rope_type`, `rope_theta`, `partial_rotary_factor`, and a scaling's `factor` …); transformers 4
wrote `rope_theta` and `partial_rotary_factor` at the top level and a scaling as `rope_scaling`
(`null` for none; its type as `type` in older files). Import moves the old spelling into the
new before any mapping reads it, and refuses a config.json that gives one value two different
ways; export writes the current spelling only. No torch here.
"""

from __future__ import annotations

from typing import Any

from ..runtime.errors import RuntimeInputError

# old key → its current spelling; an object's keys move into the new object one by one
RENAMED: dict[str, str] = {
    "rope_scaling.type": "rope_parameters.rope_type",
    "rope_scaling": "rope_parameters",
    "rope_theta": "rope_parameters.rope_theta",
    "partial_rotary_factor": "rope_parameters.partial_rotary_factor",
}


def current_key(key: str) -> str:
    """`key` (dotted) in its current spelling: `rope_scaling.factor` → `rope_parameters.factor`."""
    for old, new in RENAMED.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old):]
    return key


def current_config(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """config.json in the current spelling (a copy), and each moved key's old spelling (for
    messages that name what the file says): each old key's value moved to its new key; a null
    old object dropped (no scaling). Refused: one value given two ways that differ."""
    out = dict(config)
    if isinstance(out.get("rope_parameters"), dict):
        out["rope_parameters"] = dict(out["rope_parameters"])
    origin: dict[str, str] = {}
    for old, new in RENAMED.items():
        value = _pop(out, old)
        if value is None:
            continue
        if isinstance(value, dict):
            for k, v in value.items():
                _put(out, f"{new}.{k}", v, f"{old}.{k}")
                origin[f"{new}.{k}"] = origin.get(f"{old}.{k}", f"{old}.{k}")
        else:
            _put(out, new, value, old)
            origin[new] = old
    return out, origin


def _pop(config: dict[str, Any], key: str) -> Any:
    *path, last = key.split(".")
    for part in path:
        config = config.get(part)
        if not isinstance(config, dict):
            return None
    return config.pop(last, None)


def _put(config: dict[str, Any], key: str, value: Any, old: str) -> None:
    *path, last = key.split(".")
    obj = config
    for part in path:
        if not isinstance(obj.get(part), dict):
            if obj.get(part) is not None:
                raise RuntimeInputError(f"config.json has {old} = {value!r}, but {part} is "
                                        f"{obj[part]!r}, not an object to hold {key}")
            obj[part] = {}
        obj[part] = dict(obj[part])
        obj = obj[part]
    if obj.get(last) is not None and obj[last] != value:
        raise RuntimeInputError(f"config.json has {old} = {value!r} and {key} = {obj[last]!r}: "
                                "two spellings of one value that differ")
    obj[last] = value
