"""Mapping files beyond numbers in config.json: a hyperparameter counted from the structure of
the config (`{"count": "id2label"}`: a classifier's classes), read at import and written back
at export; and a tensor reshaped by the card's hyperparameters, transposed first (a
convolution's weight as a card's matrix). Bad mapping files and configs are refused in one
message naming the file or the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cardc.cli import main
from cardc.interop import (
    config_for,
    from_card_state,
    kept_entries,
    parse_mapping,
    preset_from_config,
    to_card_state,
)
from cardc.runtime.errors import RuntimeInputError

ROOT = Path(__file__).resolve().parent.parent


def mapping(hypers: dict, tensors: dict | None = None) -> object:
    raw = {"card": "X", "architecture": "XForImageClassification", "model_type": "x",
           "hyperparameters": hypers, "tensors": tensors or {"w": "W"}}
    return parse_mapping(raw, "x.hf.json")


COUNTED = {"D": "hidden_size", "K": {"count": "id2label", "default": "2"}}


@pytest.mark.parametrize(("labels", "count"), [
    ({"0": "cat", "1": "dog", "2": "emu"}, 3),
    (["cat", "dog"], 2),
    ({}, 0),
])
def test_the_count_of_a_config_object_or_list(labels, count):
    m = mapping(COUNTED)
    assert preset_from_config({"hidden_size": 8, "id2label": labels}, m) == {"D": 8, "K": count}


@pytest.mark.parametrize("config", [{"hidden_size": 8}, {"hidden_size": 8, "id2label": None}])
def test_an_absent_count_takes_the_default(config):
    assert preset_from_config(config, mapping(COUNTED))["K"] == 2


def test_export_writes_as_many_entries_and_import_reads_them_back():
    m = mapping(COUNTED)
    config = config_for(m, {"D": 8, "K": 5})
    assert config["id2label"] == {str(i): f"LABEL_{i}" for i in range(5)}
    assert preset_from_config(json.loads(json.dumps(config)), m) == {"D": 8, "K": 5}


NAMED = {"D": "hidden_size", "K": {"count": "id2label", "same": ["label2id"], "default": "2"}}


def test_an_imported_configs_entries_are_written_back_as_they_were():
    """The label names import read come back from export (they were LABEL_i), with the keys
    counted alike; a model whose count changed gets LABEL_i and nothing counted alike."""
    m = mapping(NAMED)
    source = {"hidden_size": 8, "id2label": {"0": "cat", "1": "dog", "2": "emu"},
              "label2id": {"cat": 0, "dog": 1, "emu": 2}}
    kept = kept_entries(source, m)
    assert kept == {"id2label": source["id2label"], "label2id": source["label2id"]}
    back = config_for(m, preset_from_config(source, m), kept)
    assert {k: back[k] for k in source} == source
    changed = config_for(m, {"D": 8, "K": 2}, kept)
    assert changed["id2label"] == {"0": "LABEL_0", "1": "LABEL_1"} and "label2id" not in changed
    assert "label2id" not in config_for(m, {"D": 8, "K": 3})


def test_keys_counted_alike_must_agree():
    with pytest.raises(RuntimeInputError, match=r"config.json has label2id = 1 but id2label = 2; "
                                                r"the card's K is both"):
        preset_from_config({"hidden_size": 8, "id2label": ["a", "b"], "label2id": {"a": 0}},
                           mapping(NAMED))


def test_a_count_without_a_default_names_the_absent_key():
    m = mapping({"K": {"count": "id2label"}})
    with pytest.raises(RuntimeInputError, match=r"config.json lacks 'id2label' \(the card's K\)"):
        preset_from_config({}, m)


@pytest.mark.parametrize("value", [5, "cats", 2.5, True])
def test_a_key_that_holds_no_entries_is_refused_by_name(value):
    with pytest.raises(RuntimeInputError, match=r"config.json has id2label = .* \(the card's K "
                                                r"counts its entries\); expected an object or a "
                                                r"list"):
        preset_from_config({"hidden_size": 8, "id2label": value}, mapping(COUNTED))


@pytest.mark.parametrize(("spec", "message"), [
    ({"count": 3}, "x.hf.json: hyperparameter 'K': 'count' must name a config key"),
    ({"count": ""}, "x.hf.json: hyperparameter 'K': 'count' must name a config key"),
    ({"count": "id2label", "expr": "n + 1"},
     "x.hf.json: hyperparameter 'K': 'count' cannot be combined with 'expr'"),
    ({"count": "id2label", "same": "label2id"},
     "x.hf.json: hyperparameter 'K': 'same' must be a list of config keys"),
    ({"count": "id2label", "key": "labels"},
     "x.hf.json: hyperparameter 'K': 'count' cannot be combined with 'key'"),
    ({"count": "id2label", "default": 7},
     "x.hf.json: hyperparameter 'K': 'default' must be an expression or a list of them"),
])
def test_malformed_counts_name_the_file_and_hyperparameter(spec, message):
    with pytest.raises(RuntimeInputError) as err:
        mapping({"K": spec})
    assert str(err.value) == message


@pytest.mark.parametrize("n", [-1, 2.5, 10**7])
def test_export_refuses_a_count_it_cannot_write(n):
    with pytest.raises(RuntimeInputError, match=r"cannot write id2label for the card's K"):
        config_for(mapping(COUNTED), {"D": 8, "K": n})


# ------------------------------------------------------------------ reshapes by hyperparameters

CONV = {"conv.weight": {"card": "W", "transpose": True, "shape": ["D", "C", "p", "p"]}}


def test_a_convolution_weight_is_the_card_matrix_transposed_and_reshaped():
    m = mapping({"D": "d", "C": "c", "p": "p"}, CONV)
    W = torch.randn(3 * 2 * 2, 5, generator=torch.Generator().manual_seed(0))  # (C p p, D)
    hypers = {"D": 5, "C": 3, "p": 2}
    hf = from_card_state(m, {"W": W}, 0, hypers)
    conv = hf["conv.weight"]
    assert conv.shape == (5, 3, 2, 2)
    for d, c, a, b in [(0, 0, 0, 0), (4, 2, 1, 0), (1, 1, 0, 1)]:  # column (c p + a) p + b
        assert conv[d, c, a, b] == W[(c * 2 + a) * 2 + b, d]
    back = to_card_state(m, hf, {"W": W}, 0, hypers)
    assert torch.equal(back["W"], W)


@pytest.mark.parametrize(("shape", "hypers", "message"), [
    (["D", "C", "q", "q"], {"D": 5, "C": 3, "p": 2},
     "tensor 'conv.weight': 'shape': 'q' reads 'q', which is no hyperparameter of the card"),
    (["D", "C", "p", "p"], {"D": 5, "C": 3, "p": 3},
     r"tensor 'conv.weight': the card's W of shape \(12, 5\) has no shape \[5, 3, 3, 3\]"),
])
def test_a_reshape_the_card_cannot_take_is_named(shape, hypers, message):
    m = mapping({"D": "d"}, {"conv.weight": {"card": "W", "transpose": True, "shape": shape}})
    W = torch.zeros(12, 5)
    with pytest.raises(RuntimeInputError, match=message):
        to_card_state(m, {"conv.weight": torch.zeros(5, 3, 2, 2)}, {"W": W}, 0, hypers)


@pytest.mark.parametrize(("spec", "message"), [
    ({"card": "W", "shape": [1, 2.5]}, "'shape' must be a list of integers and expressions"),
    ({"card": "W", "shape": ["D +"]}, "tensor 'w': 'shape'"),
    ({"card": "W", "shape": [1, -1], "chunk": [0, 2]}, "'shape' cannot be combined with 'chunk'"),
])
def test_malformed_shapes_name_the_tensor(spec, message):
    with pytest.raises(RuntimeInputError, match=message):
        mapping({"D": "d"}, {"w": spec})


def test_cardc_import_of_a_config_with_a_bad_label_list_is_one_line(tmp_path, capsys,
                                                                    monkeypatch):
    """A ViT checkpoint whose id2label is a number: one line naming the key, no traceback."""
    from safetensors.torch import save_file
    monkeypatch.chdir(ROOT)
    folder = tmp_path / "hf"
    folder.mkdir()
    config = {"model_type": "vit", "architectures": ["ViTForImageClassification"],
              "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 16, "image_size": 8, "patch_size": 4, "num_channels": 3,
              "layer_norm_eps": 1e-12, "hidden_act": "gelu", "qkv_bias": True, "id2label": 5}
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"classifier.bias": torch.zeros(5)}, str(folder / "model.safetensors"))
    code = main(["import", "cards/vit.card", "--from", str(folder), "--out",
                 str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 1
    assert err.strip().splitlines() == [
        "cardc: error: config.json has id2label = 5 (the card's K counts its entries); "
        "expected an object or a list"]
    assert not (tmp_path / "run").exists()
