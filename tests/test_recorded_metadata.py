"""A checkpoint's recorded hyperparameters are untrusted input: checked as the card checks its
presets, and against the values its tensors hold, before anything is allocated."""

from __future__ import annotations

from pathlib import Path

import pytest

import cardc
from cardc.build import rebuild_model

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def recorded():
    model = cardc.model(str(ROOT / "cards" / "gpt2.card"), preset="tiny",
                        N=1, D=32, H=2, D_f=64, ctx=16, V=64)
    return model.card_meta, sum(p.numel() for p in model.state_dict().values())


@pytest.mark.parametrize("key, value, message", [
    ("D", float("nan"), "recorded D = nan: nan is not a finite number"),
    ("D", -1, "recorded D = -1: 'D' ∈ ℕ is -1, not a whole number ≥ 0"),
    ("D", 2.5, "recorded D = 2.5: 'D' ∈ ℕ is 2.5, not a whole number ≥ 0"),
    ("D", "x", "checkpoint metadata records D = 'x', not a number"),
    ("H", 3, ": d = D/H = 32/3 (D = 32, H = 3) is not a whole number"),
    ("D", 10**12, "recorded D = 1000000000000: W^h_q would hold"),
])
def test_bad_recorded_values_are_refused_where_they_stand(recorded, key, value, message):
    meta, stored = recorded
    edited = {**meta, "hyperparameters": {**meta["hyperparameters"], key: value}}
    with pytest.raises(ValueError) as err:
        rebuild_model(edited, stored)
    assert message in str(err.value)
    assert "/tmp" not in str(err.value)  # recorded cards are named as the checkpoint names them


def test_sizes_beyond_the_stored_tensors_are_refused_before_allocating(recorded):
    meta, stored = recorded
    edited = {**meta, "hyperparameters": {**meta["hyperparameters"], "D": 2048, "D_f": 8192}}
    with pytest.raises(ValueError, match=f"but its tensors hold {stored:,} values"):
        rebuild_model(edited, stored)
    assert rebuild_model(meta, stored) is not None  # the unedited record rebuilds


def test_cards_that_are_not_a_table_are_refused(recorded):
    meta, stored = recorded
    for bad in ("x", [1], None, 3):
        with pytest.raises(ValueError, match="'cards' is not a table of card files"):
            rebuild_model({**meta, "cards": bad}, stored)


def test_hyperparameters_that_are_not_a_table_are_refused(recorded):
    meta, stored = recorded
    for bad in ("x", [1], None):
        with pytest.raises(ValueError, match="'hyperparameters' is not a table of numbers"):
            rebuild_model({**meta, "hyperparameters": bad}, stored)


def test_fine_tuning_from_a_record_with_a_non_number_is_one_clear_error(recorded, tmp_path, capsys):
    from cardc.cli import main
    from cardc.runtime.checkpoint import save_checkpoint

    meta, _ = recorded
    model = rebuild_model(meta)
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(run, model, {**meta, "hyperparameters": {**meta["hyperparameters"],
                                                              "D": "x"}})
    code = main(["train", str(ROOT / "cards" / "gpt2.card"), "--preset", "tiny", "--finetune",
                 str(run), "--steps", "1", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.strip().endswith("checkpoint metadata records D = 'x', not a number")
    assert not (tmp_path / "out").exists()
