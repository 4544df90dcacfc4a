"""`cardc import` and `cardc export`: a Hugging Face checkpoint into a card's model and back."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..names import identifier
from ..runtime.errors import RuntimeInputError
from .config import (
    check_config,
    config_for,
    describe,
    kept_entries,
    kept_token_ids,
    preset_from_config,
    select_for_config,
    with_token_ids,
)
from .files import HF_CONFIG, read_hf, write_hf
from .mapping import (
    MAPPING_SUFFIX,
    Mapping,
    load_mappings,
    mapping_path,
    parse_mapping,
    read_mappings,
    select_by_name,
)
from .tensors import from_card_state, to_card_state

META_KEY = "hf"  # the checkpoint metadata entry that records an import


def import_hf(card: str, source: str | os.PathLike[str], preset: str | None = None,
              overrides: dict[str, float] | None = None, name: str | None = None,
              library: list[str] | None = None) -> nn.Module:
    """The model of a card of the file `card` holding a Hugging Face checkpoint's weights.

    The card is `name`, else the one whose mapping fits config.json (`select_for_config`).
    Hyperparameters come from the preset, else from config.json; `overrides` apply last.
    `model.card_meta` records the import and the mapping, so the checkpoint exports anywhere."""
    from ..build import (
        ZeroSize,
        build_model,
        checked,
        find_card,
        library_roots,
        record_sampler,
    )
    from ..presets import find_preset
    from ..runtime.checkpoint import load_state

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
    find_preset(alg, preset)  # a --preset the card lacks is the flag's error, said first
    check_card_hypers(checker.info(alg).sig, mapping)
    check_sizes(checker.info(alg), mapping, hypers, preset, overrides or {}, hf_state, config)
    if hypers and preset is None:  # the mapping's own count first: it names the layers
        mapping.layer_count({identifier(k): v for k, v in {**hypers, **(overrides or {})}.items()})
    check_card_sizes(checker, alg, mapping, hypers, preset, overrides or {}, config)
    try:
        model = build_model(card, preset, {**hypers, **(overrides or {})}, library, mapping.card)
    except ZeroSize as err:
        zero = [n for n in hypers if identifier(n) in err.names]
        if not zero:
            raise
        raise RuntimeInputError(_divides_by_zero(mapping, zero[0], config)) from None
    expected = model.state_dict()
    state = to_card_state(mapping, hf_state, expected, _layers(mapping, model.card_meta),
                          model.card_meta["hyperparameters"])
    load_state(model, state)
    model.card_meta[META_KEY] = {"source": os.fspath(source), "mapping": mapping.raw,
                                 "entries": kept_entries(config or {}, mapping),
                                 "token_ids": kept_token_ids(config or {}, mapping)}
    record_sampler(model.card_meta, lib, checker, alg)
    return model


def _divides_by_zero(mapping: Mapping, name: str, config: dict[str, Any] | None) -> str:
    return (f"config.json {describe(mapping.hyperparameters[name], 0, config)}; the card's {name} must "
            "be a positive whole number: the card divides by it")


def check_card_hypers(sig: Any, mapping: Mapping) -> None:
    """Refuse a mapping that gives the card a hyperparameter it does not declare, or one the
    card derives from others: config.json would be blamed for the mapping's fault."""
    from .. import syntax as s

    declared = [n for d in sig.alg.decls("Hyperparameters") if isinstance(d, s.Decl)
                for n in d.names]
    for name in mapping.hyperparameters:
        if name not in declared or name in sig.definitions:
            what = "derives" if name in declared else "does not have"
            raise RuntimeInputError(f"{mapping.source}: 'hyperparameters': '{_shown(name)}' is a "
                                    f"hyperparameter the card {mapping.card} {what} (it sets "
                                    f"{', '.join(n for n in declared if n not in sig.definitions)})")


def check_sizes(info: Any, mapping: Mapping, hypers: dict[str, float], preset: str | None,
                overrides: dict[str, float], hf_state: dict[str, torch.Tensor],
                config: dict[str, Any] | None = None) -> None:
    """Refuse config.json sizes the card cannot be built at, before any tensor is allocated:
    a size that is not a whole number (`n_head = 2.5`), a value outside the range the card
    declares, or more parameters than the source's tensors hold (`n_layer = 10^6`)."""
    from ..info import PresetError, check_ranges, count, preset_values
    from ..types import BundleTy

    sig = info.sig
    for name, value in hypers.items():
        spec = sig.hypers.get(name)
        # ℕ holds 0: a count of layers or of experts may be 0; one the card divides by may not,
        # which building the model finds (ZeroSize, in import_hf)
        if spec is not None and spec.elem == "ℕ" and not (value >= 0 and
                                                          float(value).is_integer()):
            raise RuntimeInputError(f"config.json {describe(mapping.hyperparameters[name], value, config)}"
                                    f"; the card's {name} must be a whole number")
    try:
        values = preset_values(sig, preset, {**hypers, **overrides})
        check_ranges(sig.alg, values)
        params = count(sig.tree, values, sig.alg.span) if isinstance(sig.tree, BundleTy) else 0
    except PresetError as err:
        keys = [mapping.hyperparameters[n].key for n in hypers if f"'{n}'" in err.message]
        raise RuntimeInputError(f"config.json{' (' + keys[0] + ')' if keys else ''}: "
                                f"{err.message}") from None
    except ZeroDivisionError:  # a size the card divides by (d = D/H), given as 0
        zero = [n for n, v in {**hypers, **overrides}.items() if v == 0]
        if not zero or zero[0] not in hypers:
            raise RuntimeInputError(f"{', '.join(f'{n} = 0' for n in zero) or 'a size of 0'}: "
                                    "the card divides by it") from None
        raise RuntimeInputError(_divides_by_zero(mapping, zero[0], config)) from None
    except (ArithmeticError, ValueError) as err:
        raise RuntimeInputError(f"config.json: these sizes do not build the card: {err}") from None
    held = sum(t.numel() for t in hf_state.values())
    if params > 2 * held:  # tied or synthesised tensors never make a card twice its source
        shown = ", ".join(f"{mapping.hyperparameters[n].key} = {int(v):,}" for n, v in hypers.items()
                          if sig.hypers.get(n) is not None and sig.hypers[n].elem == "ℕ")
        raise RuntimeInputError(f"config.json's sizes ({shown}) make {params:,} parameters, but "
                                f"the checkpoint holds {held:,} values; the config does not "
                                "describe these weights")


def check_card_sizes(checker: Any, alg: Any, mapping: Mapping, hypers: dict[str, float],
                     preset: str | None, overrides: dict[str, float],
                     config: dict[str, Any] | None = None) -> None:
    """Refuse config.json values that make a size of any card the model calls empty or
    fractional (a partial rotary width that is the whole head: d − d_r = 0), naming the
    config key, before the model is built: what sampling would find later."""
    from ..presets import OverrideError, PresetError, validate

    flags = {name: f"config.json {describe(mapping.hyperparameters[name], value, config)}"
             for name, value in hypers.items()
             if name in mapping.hyperparameters and name not in overrides}
    try:
        validate(checker, alg, preset, {**hypers, **overrides}, flags)
    except OverrideError as err:
        raise RuntimeInputError(str(err)) from None
    except PresetError as err:
        raise RuntimeInputError(f"config.json: {err.message}") from None


def import_checkpoint(card: str, source: str | os.PathLike[str], out: str | os.PathLike[str],
                      preset: str | None = None, overrides: dict[str, float] | None = None,
                      name: str | None = None,
                      library: list[str] | None = None) -> tuple[nn.Module, str]:
    """`cardc import`: a cardc checkpoint in `out`, which then holds this checkpoint alone
    (written beside it and moved into place whole, as a training run is)."""
    from ..runtime.checkpoint import CHECKPOINT_NAME, save_checkpoint
    from ..runtime.runs import check_destination, new_run_id, staged_run
    from ..runtime.tokenizer import ByteTokenizer, hf_tokenizer

    check_destination(out)
    # the checkpoint's own tokenizer, read first so a damaged one is named before any work
    tokenizer = (hf_tokenizer(source) if Path(source).exists() else None) or ByteTokenizer()
    model = import_hf(card, source, preset, overrides, name, library)
    meta = {**model.card_meta, "run": new_run_id(), "tokenizer": tokenizer.record()}
    try:
        with staged_run(out) as folder:
            save_checkpoint(folder, model, meta)
            tokenizer.save(folder)
    except OSError as err:
        raise RuntimeInputError(f"cannot write '{out}': {err.strerror or err}") from None
    return model, os.path.join(os.fspath(out), CHECKPOINT_NAME)


def export_hf(run_dir: str | os.PathLike[str], dest: str | os.PathLike[str],
              library: str | os.PathLike[str] | list[str] = "cards",
              mapping_file: str | os.PathLike[str] | None = None) -> tuple[Mapping, Path]:
    """A cardc checkpoint as a Hugging Face model folder that `from_pretrained` loads.

    `mapping_file` (--mapping) names the mapping outright. Otherwise an imported checkpoint
    carries its mapping, and a trained one is matched to the mapping file beside the card it
    was trained from, else beside its card in `library`. A run with a tokenizer.json exports
    it too, with a tokenizer_config.json, so the folder is all that `from_pretrained` needs."""
    from ..runtime.checkpoint import read_checkpoint
    from ..runtime.tokenizer import HFTokenizer, run_tokenizer

    meta, state = read_checkpoint(run_dir)
    tokenizer = run_tokenizer(run_dir, meta)
    mapping = named_mapping(mapping_file, meta) if mapping_file is not None else \
        checkpoint_mapping(meta, library)
    if meta.get("name") != mapping.card:
        raise RuntimeInputError(f"'{run_dir}' holds {meta.get('name')}, but {mapping.source} "
                                f"maps {mapping.card}")
    hypers = meta.get("hyperparameters") or {}
    unknown = [n for n in mapping.hyperparameters if identifier(n) not in hypers]
    if unknown and isinstance(meta.get("hyperparameters"), dict):
        raise RuntimeInputError(f"{mapping.source}: 'hyperparameters': '{_shown(unknown[0])}' "
                                f"is not a hyperparameter of the checkpoint's {meta.get('name')} (it "
                                f"records {', '.join(hypers)})")
    tensors = from_card_state(mapping, state, _layers(mapping, meta), hypers)  # sizes checked
    try:
        config = located_config(mapping, hypers, _kept(meta))
    except KeyError as err:
        raise RuntimeInputError(f"'{run_dir}' records no hyperparameter {err}") from None
    recorded = meta.get(META_KEY)
    if isinstance(recorded, dict):  # an import: its source's bos and eos, as it named them
        config = with_token_ids(config, recorded.get("token_ids"), mapping)
    files = tokenizer.hf_files() if isinstance(tokenizer, HFTokenizer) else {}
    return mapping, write_hf(dest, tensors, config, files)


def write_model_hf(mapping: Mapping, state: dict[str, Any], hypers: dict[str, float],
                   dest: str | os.PathLike[str]) -> Path:
    """A card model's state and hyperparameters, in memory, as a Hugging Face model folder:
    what `export_hf` writes for a checkpoint (the benches export their models this way)."""
    tensors = from_card_state(mapping, state, mapping.layer_count(hypers), hypers)
    return write_hf(dest, tensors, located_config(mapping, hypers))


def located_config(mapping: Mapping, hypers: dict[str, Any],
                   kept: dict[str, Any] | None = None) -> dict[str, Any]:
    """`config_for`, its refusals named by the mapping file whose expressions cannot write
    the model's values."""
    try:
        return config_for(mapping, hypers, kept)
    except RuntimeInputError as err:
        if mapping.source in str(err):  # named already, first or where it says what it maps
            raise
        raise RuntimeInputError(f"{mapping.source}: {err}") from None


def _kept(meta: dict[str, Any]) -> dict[str, Any]:
    """The counted config entries an import recorded (a classifier's label names), if any."""
    recorded = meta.get(META_KEY)
    kept = recorded.get("entries") if isinstance(recorded, dict) else None
    return kept if isinstance(kept, dict) else {}


def named_mapping(path: str | os.PathLike[str], meta: dict[str, Any]) -> Mapping:
    """The mapping of the checkpoint's card in the mapping file `path`."""
    mappings = read_mappings(path)
    return next((m for m in mappings if m.card == meta.get("name")), mappings[0])


CARD_PATH_KEY = "card_path"  # where a run records the card file it was trained from


def checkpoint_mapping(meta: dict[str, Any],
                       library: str | os.PathLike[str] | list[str]) -> Mapping:
    recorded = meta.get(META_KEY)
    if isinstance(recorded, dict) and "mapping" in recorded:
        return parse_mapping(recorded["mapping"], "the checkpoint's mapping")
    own = _recorded_card(meta)
    if own is not None and mapping_path(own).is_file():  # the user's own card, where it was
        mappings = load_mappings(own)
    else:
        mappings = load_mappings(_library_card(meta, library, own))
    name = meta.get("name")
    return next((m for m in mappings if m.card == name), mappings[0])


def _recorded_card(meta: dict[str, Any]) -> Path | None:
    """The card file the run was trained from, as it recorded it (None: it records none)."""
    path = meta.get(CARD_PATH_KEY)
    return Path(path) if isinstance(path, str) and path else None


def _library_card(meta: dict[str, Any], library: str | os.PathLike[str] | list[str],
                  own: Path | None) -> Path:
    """The card of the checkpoint's name under `library` that has a mapping beside it, the
    one whose text the checkpoint recorded first; where there is none, an error naming every
    place looked in and --mapping."""
    card = str(meta.get("card", ""))
    stem = Path(card).stem
    folders = library if isinstance(library, list) else [library]
    found = [p for f in folders for p in sorted(Path(f).rglob(stem + MAPPING_SUFFIX))] \
        if stem else []
    beside = [p for p in found if p.with_name(stem + ".card").is_file()]
    if not beside:
        mapping = f"{stem or '<card>'}{MAPPING_SUFFIX}"
        places = ([f"'{mapping_path(own)}'"] if own is not None else []) + \
            [f"beside a {stem or '<card>'}.card under {', '.join(map(repr, map(str, folders)))}"]
        raise RuntimeInputError(f"no Hugging Face mapping for {card or 'this checkpoint'}: "
                                f"looked for {mapping} at {' and '.join(places)}; name one "
                                "with --mapping FILE (or the folder of its card with --library)")
    text = (meta.get("cards") or {}).get(card)  # prefer the card the checkpoint was built from
    same = [p for p in beside if p.with_name(stem + ".card").read_text(encoding="utf-8") == text]
    return (same or beside)[0].with_name(stem + ".card")


def _layers(mapping: Mapping, meta: dict[str, Any]) -> int:
    hypers = meta.get("hyperparameters")
    if mapping.layers is not None and not isinstance(hypers, dict):
        raise RuntimeInputError("the checkpoint records no hyperparameters (to count its layers)")
    return mapping.layer_count(hypers or {})


def _shown(name: str) -> str:
    """A name from a mapping file for a one-line message: a line break in it escaped."""
    return json.dumps(name, ensure_ascii=False)[1:-1]
