"""Files beyond cards, read as untrusted input: a tokenizer.json, a data folder, a checkpoint.
The work each takes is bounded before it starts, and whatever is wrong with one is a single
message naming the file, never a traceback, a hang or damaged data read as good."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cardc.runtime.checkpoint import read_checkpoint, save_checkpoint
from cardc.runtime.data import DataFolder
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.jsontext import MAX_DEPTH, depth_over, loads
from cardc.runtime.prepare import prepare
from cardc.runtime.tokenizer import MAX_BPE, TOKENIZER_FILE, from_file, hf_tokenizer, train_bpe

DEEP = "[" * 100_000 + "]" * 100_000  # past any recursion limit
SHALLOW_ENOUGH = "[" * 60 + "]" * 60


def bpe_json() -> dict:
    return json.loads(train_bpe("the cat sat on the mat. " * 50, 300).text)


def write(folder: Path, value: dict) -> Path:
    path = folder / TOKENIZER_FILE
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def test_a_token_id_of_a_billion_is_refused_before_it_is_built(tmp_path):
    value = bpe_json()
    value["added_tokens"].append({"id": 10**9, "content": "<big>", "single_word": False,
                                  "lstrip": False, "rstrip": False, "normalized": False,
                                  "special": True})
    path = write(tmp_path, value)
    with pytest.raises(RuntimeInputError) as err:
        hf_tokenizer(tmp_path)
    assert str(err.value) == (f"'{path}' is not a valid tokenizer file: token ID 1,000,000,000 "
                              f"is outside 0 … {MAX_BPE - 1:,}")


def test_a_vocabulary_past_the_bound_is_refused_by_its_count(tmp_path):
    value = bpe_json()
    value["model"]["vocab"] = {f"t{i}": i for i in range(MAX_BPE + 1)}
    value["model"]["merges"] = []
    path = write(tmp_path, value)
    with pytest.raises(RuntimeInputError) as err:
        from_file(path)
    assert str(err.value) == (f"'{path}' is not a valid tokenizer file: it has "
                              f"{MAX_BPE + 1 + len(value['added_tokens']):,} tokens, more than "
                              f"{MAX_BPE:,}")


def test_a_pre_tokenizer_whose_regex_fails_on_text_is_refused_where_it_is_read(tmp_path):
    """Oniguruma gives up on catastrophic backtracking, and tokenizers panics: the panic is
    met when the tokenizer is read (import), not at the first prompt (sample)."""
    value = bpe_json()
    value["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(?:x+x+)+y"},
                              "behavior": "Isolated", "invert": False}
    path = write(tmp_path, value)
    with pytest.raises(RuntimeInputError) as err:
        from_file(path)
    assert str(err.value) == (f"'{path}': the tokenizer failed: Onig: Regex search error: "
                              "retry-limit-in-match over")


def test_json_nesting_is_bounded_and_located():
    assert loads(SHALLOW_ENOUGH, "f.json") == json.loads(SHALLOW_ENOUGH)
    for text in (DEEP, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)):
        with pytest.raises(RuntimeInputError, match=rf"^f\.json: ('[][0-9]*': )?nested too deeply \(more than "
                                                    rf"{MAX_DEPTH} levels\)$"):
            loads(text, "f.json")
    with pytest.raises(RuntimeInputError, match=r"^f\.json:2:3: not JSON: "):
        loads('{\n  x}', "f.json")
    assert depth_over({"a": [[1]]}, 2) and not depth_over({"a": [[1]]}, 3)


@pytest.fixture
def data(tmp_path) -> Path:
    (tmp_path / "a.txt").write_text("the cat sat on the mat.\n" * 200, encoding="utf-8")
    prepare([str(tmp_path / "a.txt")], str(tmp_path / "data"), log=lambda _: None)
    return tmp_path / "data"


def test_a_deeply_nested_meta_json_is_a_message(data):
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps(meta)[:-1] + ', "x": ' + DEEP + "}")
    with pytest.raises(RuntimeInputError) as err:
        DataFolder.open(data)
    assert str(err.value) == (f"'{data / 'meta.json'}' is not the meta.json of a prepared data "
                              f"folder: nested deeper than {MAX_DEPTH} levels; prepare it again "
                              "with cardc prepare")


@pytest.mark.parametrize("split", ["train", "val"])
def test_token_ids_beyond_the_vocabulary_are_refused_in_every_split(data, split):
    path = data / f"{split}.bin"
    tokens = np.fromfile(path, dtype="<u2")
    tokens[len(tokens) // 2] = 300  # a bytes folder: 256 tokens
    tokens.tofile(path)
    with pytest.raises(RuntimeInputError) as err:
        DataFolder.open(data)
    assert str(err.value) == (f"'{path}' holds token 300, outside the vocabulary of 256; "
                              "prepare the folder again")


def test_a_deeply_nested_checkpoint_record_is_a_message(tmp_path):
    save_checkpoint(tmp_path, {"w": torch.zeros(2)}, {"name": "x", "deep": json.loads(
        SHALLOW_ENOUGH)})
    assert read_checkpoint(tmp_path)[0]["deep"] == json.loads(SHALLOW_ENOUGH)
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"),
              metadata={"cardc": DEEP})
    with pytest.raises(RuntimeInputError) as err:
        read_checkpoint(tmp_path)
    assert str(err.value) == (f"'{tmp_path / 'model.safetensors'}' (its cardc metadata): "
                              f"nested too deeply (more than {MAX_DEPTH} levels)")
