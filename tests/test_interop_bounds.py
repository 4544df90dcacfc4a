"""Mapping files, config.json and sharded indexes nobody vouches for: huge numbers, deep nesting
and wrong types end in one located line and exit 1 from `cardc import` / `cardc export`, with
the work bounded before it starts (no hang, no traceback).

A tiny GPT-2 is exported once through cards/gpt2.hf.json; each case damages a copy of its
config.json or of the mapping file (beside a copy of the card) and imports it.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cardc.build import build_model
from cardc.cli import main
from cardc.interop import load_mapping, write_model_hf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkonce import cards_checked_once  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIZES = dict(V=16, D=8, H=2, D_f=16, N=2, ctx=8)


@pytest.fixture(scope="module", autouse=True)
def _cards_checked_once():
    """Each card is checked once for the module: only the checkpoints and mappings change."""
    with cards_checked_once():
        yield


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    model = build_model(str(ROOT / "cards" / "gpt2.card"), None, SIZES)
    write_model_hf(load_mapping(ROOT / "cards" / "gpt2.card"), model.state_dict(),
                   model.card_meta["hyperparameters"], folder)
    return folder


def run(capsys, *args: str) -> tuple[int, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        code = main(list(args))
    return code, capsys.readouterr().err


def import_with(tmp_path: Path, hf_folder: Path, capsys, config: Callable[[dict], str | None]
                = lambda c: None, mapping: Callable[[dict], str | None] = lambda m: None,
                ) -> tuple[int, str]:
    """`cardc import` of the tiny GPT-2 with its config.json and mapping file edited: each
    callback changes the parsed JSON in place, or returns the file's whole text."""
    source = tmp_path / "hf"
    shutil.copytree(hf_folder, source)
    raw = json.loads((source / "config.json").read_text())
    text = config(raw)
    (source / "config.json").write_text(text if text is not None else json.dumps(raw))
    cards = tmp_path / "cards"
    cards.mkdir()
    shutil.copy(ROOT / "cards" / "gpt2.card", cards / "gpt2.card")
    raw = json.loads((ROOT / "cards" / "gpt2.hf.json").read_text())
    text = mapping(raw)
    (cards / "gpt2.hf.json").write_text(text if text is not None else json.dumps(raw))
    out = tmp_path / "run"
    code, err = run(capsys, "import", str(cards / "gpt2.card"), "--from", str(source),
                    "--out", str(out), "--library", str(ROOT / "cards"))
    assert code != 0 or not err, err
    if code != 0:
        assert not out.exists()
    return code, err


def test_the_untouched_copy_imports(tmp_path, hf_folder, capsys):
    assert import_with(tmp_path, hf_folder, capsys)[0] == 0


def deep(n: int) -> str:
    return "[" * n + "]" * n


def set_tensor(key: str, spec: object) -> Callable[[dict], None]:
    return lambda m: m["tensors"].__setitem__(key, spec)


CASES = {
    "config: a 4,001-digit integer": (
        lambda c: json.dumps(c)[:-1] + ', "n_ctx": ' + "9" * 4001 + "}", None,
        "hf/config.json': 'n_ctx': an integer of 4001 digits is too large (at most 2^63 − 1)"),
    "config: nested 100,000 deep": (
        lambda c: json.dumps(c)[:-1] + ', "x": ' + deep(100_000) + "}", None,
        "hf/config.json': nested too deeply (more than 64 levels)"),
    "config: nested 70 deep": (
        lambda c: json.dumps(c)[:-1] + ', "x": ' + deep(70) + "}", None,
        "hf/config.json': 'x" + "[0]" * 63 + "': nested too deeply (more than 64 levels)"),
    "config: a layer count of 10^8": (
        lambda c: c.update(n_layer=10**8), None,
        "config.json's sizes (vocab_size = 16, n_embd = 8, n_head = 2, n_layer = 100,000,000, "
        "n_positions = 8, n_inner = 16) make 60,000,000,208 parameters, but the checkpoint "
        "holds 1,408 values; the config does not describe these weights"),  # 600 a layer, 208
    "mapping: nested 100,000 deep": (
        None, lambda m: json.dumps(m)[:-1] + ', "about": ' + deep(100_000) + "}",
        "cards/gpt2.hf.json: nested too deeply (more than 64 levels)"),
    "mapping: a layer count of 10^9 as a literal": (
        None, lambda m: m.update(layers="N * 1000000000"),
        "missing tensor 'transformer.h.1999999999.ln_1.weight' (the card's "
        "block.1999999999.gamma1) of layer 1999999999: the checkpoint's sizes give "
        "2,000,000,000 layers"),
    "mapping: a literal of 10^(10^9)": (
        None, lambda m: m.update(layers="N * 1e1000000000"),
        "cards/gpt2.hf.json: 'layers': the number '1e1000000000' in 'N * 1e1000000000' is too "
        "large (at most 30 digits and an exponent of at most 30)"),
    "mapping: an expression nested 10,000 deep": (
        None, lambda m: m.update(layers="(" * 10_000 + "N" + ")" * 10_000),
        "cards/gpt2.hf.json: 'layers': '((((((((((((((((((((((((((((((((((((((((…' is too long "
        "(more than 200 tokens)"),
    "mapping: an index literal of 10^9": (
        None, set_tensor("transformer.h.{1000000000 i}.ln_1.weight", "block.{i}.ln_1.gamma"),
        "missing tensor 'transformer.h.1000000000.ln_1.weight' (the card's block.1.ln_1.gamma) "
        "of layer 1: the checkpoint's sizes give 2 layers"),
    "mapping: groups of 10^9": (
        None, set_tensor("transformer.h.{i}.attn.c_attn.weight", {"fused": {
            "axis": 1, "groups": "1000000000", "parts": ["block.{i}.attn.W_qkv",
                                                         "block.{i}.attn.W_qkv"]}}),
        "cards/gpt2.hf.json: tensor 'transformer.h.0.attn.c_attn.weight': the card's block.0.attn.W_qkv has 24 "
        "along axis 1, not 2 × 1000000000 groups of 2.4e-08"),
    "mapping: axis 99": (
        None, set_tensor("transformer.h.{i}.ln_1.weight", {"card": "block.{i}.gamma1",
                                                           "axis": 99}),
        "cards/gpt2.hf.json: tensor 'transformer.h.0.ln_1.weight': axis 99 is not an axis of the card's "
        "block.0.gamma1 of shape (8,)"),
    "mapping: axis -5": (
        None, set_tensor("transformer.h.{i}.ln_1.weight", {"card": "block.{i}.gamma1",
                                                           "axis": -5}),
        "cards/gpt2.hf.json: tensor 'transformer.h.{i}.ln_1.weight': 'axis' must be an integer "
        "≥ 0 (0: the card's first axis)"),
    "mapping: a fused axis of 99": (
        None, set_tensor("transformer.h.{i}.attn.c_attn.weight", {"fused": {
            "axis": 99, "parts": ["block.{i}.attn.W_qkv", "block.{i}.attn.W_qkv"]}}),
        "cards/gpt2.hf.json: tensor 'transformer.h.0.attn.c_attn.weight': fused axis 99 is not an axis of the "
        "card's block.0.attn.W_qkv of shape (8, 24)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_located_line(tmp_path, hf_folder, capsys, case):
    config, mapping, message = CASES[case]
    code, err = import_with(tmp_path, hf_folder, capsys, config or (lambda c: None),
                            mapping or (lambda m: None))
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("cardc: error: ") and message in err, err


@pytest.mark.parametrize("names, shown", [([1, "model.safetensors"], "1"),
                                          (["../model.safetensors"], '"../model.safetensors"'),
                                          ([None], "null")])
def test_a_sharded_index_names_each_shard_by_a_file_name(tmp_path, hf_folder, capsys, names,
                                                         shown):
    source = tmp_path / "hf"
    source.mkdir()
    shutil.copy(hf_folder / "config.json", source / "config.json")
    weight_map = {f"t{k}": name for k, name in enumerate(names)}
    (source / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    code, err = run(capsys, "import", "cards/gpt2.card", "--from", str(source), "--out",
                    str(tmp_path / "run"))
    bad = next(k for k, n in weight_map.items() if n != "model.safetensors")
    assert code == 1 and err == (
        f"cardc: error: '{source}/model.safetensors.index.json': weight_map gives tensor "
        f"'{bad}' the shard {shown}; expected a file name beside it\n")


def test_export_of_a_checkpoint_claiming_10_9_layers_is_refused_at_once(tmp_path, hf_folder,
                                                                         capsys):
    from cardc.runtime.checkpoint import read_checkpoint, save_checkpoint

    run_dir = tmp_path / "run"
    assert run(capsys, "import", "cards/gpt2.card", "--from", str(hf_folder), "--out",
               str(run_dir))[0] == 0
    meta, state = read_checkpoint(run_dir)
    meta["hyperparameters"]["N"] = 10**9
    model = build_model(str(ROOT / "cards" / "gpt2.card"), None, SIZES)
    model.load_state_dict(state)
    save_checkpoint(run_dir, model, meta)
    code, err = run(capsys, "export", str(run_dir), "--to", str(tmp_path / "hf"))
    assert code == 1 and err == (
        "cardc: error: the checkpoint lacks the card's tensor 'block.999999999.attn.b_qkv' of "
        "layer 999999999: its hyperparameters give 1,000,000,000 layers\n")
    assert not (tmp_path / "hf").exists()


def test_a_deeply_nested_checkpoint_metadata_is_one_line(tmp_path, hf_folder, capsys):
    from safetensors.torch import load_file, save_file

    run_dir = tmp_path / "run"
    assert run(capsys, "import", "cards/gpt2.card", "--from", str(hf_folder), "--out",
               str(run_dir))[0] == 0
    file = run_dir / "model.safetensors"
    save_file(load_file(file), file, metadata={"cardc": deep(100_000)})
    code, err = run(capsys, "export", str(run_dir), "--to", str(tmp_path / "hf"))
    assert code == 1 and err == (f"cardc: error: '{file}' (its cardc metadata): nested too "
                                 "deeply (more than 64 levels)\n")


def test_a_mapped_hyperparameter_the_card_lacks_is_the_mapping_s_fault(tmp_path, hf_folder,
                                                                        capsys):
    code, err = import_with(tmp_path, hf_folder, capsys,
                            mapping=lambda m: m["hyperparameters"].update(Zeta="n_positions"))
    assert code == 1 and err == (
        f"cardc: error: {tmp_path}/cards/gpt2.hf.json: 'hyperparameters': 'Zeta' is a "
        "hyperparameter the card GPT2 does not have (it sets V, D, H, D_f, N, ctx, ε)\n")


def export_with(tmp_path: Path, capsys, mapping: Callable[[dict], None]) -> tuple[int, str]:
    """`cardc export` of a trained tiny GPT-2 whose card's mapping file is edited in place by
    `mapping`; a refusal leaves no folder."""
    from cardc.runtime.checkpoint import save_checkpoint

    cards = tmp_path / "cards"
    cards.mkdir()
    shutil.copy(ROOT / "cards" / "gpt2.card", cards / "gpt2.card")
    raw = json.loads((ROOT / "cards" / "gpt2.hf.json").read_text())
    mapping(raw)
    (cards / "gpt2.hf.json").write_text(json.dumps(raw))
    model = build_model(str(cards / "gpt2.card"), None, SIZES)
    save_checkpoint(tmp_path / "run", model, {**model.card_meta, "run": "0123456789abcdef"})
    code, err = run(capsys, "export", str(tmp_path / "run"), "--to", str(tmp_path / "hf"),
                    "--library", str(cards))
    assert code == 0 or not (tmp_path / "hf").exists()
    return code, err


def test_export_names_the_mapping_whose_hyperparameter_the_checkpoint_lacks(tmp_path, capsys):
    code, err = export_with(tmp_path, capsys,
                            lambda m: m["hyperparameters"].update(Zeta="n_positions"))
    cards = tmp_path / "cards"
    assert code == 1 and err == (
        f"cardc: error: {cards}/gpt2.hf.json: 'hyperparameters': 'Zeta' is not a "
        "hyperparameter of the checkpoint's GPT2 (it records D, D_f, H, N, V, ctx, eps)\n")
    assert not (tmp_path / "hf").exists()


def test_a_mapping_that_cannot_write_the_model_s_value_is_named_on_export(tmp_path, capsys):
    code, err = export_with(tmp_path, capsys,
                            lambda m: m["hyperparameters"].update(D_f={"expr": "1e30"}))
    assert code == 1 and err == (
        f"cardc: error: {tmp_path}/cards/gpt2.hf.json: the card's D_f = 16, but the config "
        "written gives 1e30 = 1000000000000000000000000000000\n")


def test_a_layer_count_that_cannot_be_computed_names_the_mapping(tmp_path, capsys):
    code, err = export_with(tmp_path, capsys, lambda m: m.update(layers="N / 0"))
    assert code == 1 and err == (
        f"cardc: error: {tmp_path}/cards/gpt2.hf.json: cannot count the layers (N / 0): "
        "division by zero in 'N / 0'\n")


def test_a_mapped_hyperparameter_s_line_break_stays_on_its_line(tmp_path, hf_folder, capsys):
    code, err = import_with(tmp_path, hf_folder, capsys,
                            mapping=lambda m: m["hyperparameters"].update({"x\ny": "n_positions"}))
    assert code == 1 and err == (
        f"cardc: error: {tmp_path}/cards/gpt2.hf.json: 'hyperparameters': 'x\\ny' is a "
        "hyperparameter the card GPT2 does not have (it sets V, D, H, D_f, N, ctx, ε)\n")


def test_an_expression_s_line_break_stays_on_its_line(tmp_path, hf_folder, capsys):
    code, err = import_with(tmp_path, hf_folder, capsys, mapping=lambda m: m.update(
        layers="N\ny"))
    assert code == 1 and err == (
        f"cardc: error: {tmp_path}/cards/gpt2.hf.json: 'layers': unexpected 'y' in 'N\\ny'\n")


def test_export_keeps_a_mapped_hyperparameter_s_line_break_on_its_line(tmp_path, capsys):
    code, err = export_with(tmp_path, capsys,
                            lambda m: m["hyperparameters"].update({"x\ny": "n_positions"}))
    assert code == 1 and err == (
        f"cardc: error: {tmp_path}/cards/gpt2.hf.json: 'hyperparameters': 'x\\ny' is not a "
        "hyperparameter of the checkpoint's GPT2 (it records D, D_f, H, N, V, ctx, eps)\n")


def test_an_empty_list_of_accepted_values_is_refused_by_name(tmp_path, hf_folder, capsys):
    code, err = import_with(tmp_path, hf_folder, capsys, mapping=lambda m: m["fixed_config"]
                            .update(activation_function=[]))
    assert code == 1 and err == (
        f"cardc: error: {tmp_path}/cards/gpt2.hf.json: fixed_config 'activation_function': a "
        "list of accepted values cannot be empty\n")
