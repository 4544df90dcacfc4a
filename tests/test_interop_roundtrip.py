"""A property of every mapping file under cards/: random valid hyperparameters (the card's own
checks and the mapping's constraints hold, sizes tiny) and random weights, exported to a
Hugging Face folder, import, export and re-import identically — the same card, hyperparameters,
config.json and tensors, bit for bit. No transformers needed: the mapping alone is under test.

The sizes are a random walk from the card's `tiny` preset: each size halved while the card takes
it, then a few random moves (×2, ÷2, ±1, a real from a short list), each kept only if the card's
checks, the mapping's constraints and export all accept it. Hypothesis draws the walk's seed;
the budget is small for CI (two examples a mapping, no deadline). The exported folder is
the imported one byte for byte, so importing it again gives the same model.
"""

from __future__ import annotations

import json
import random
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from cardc.build import build_model, checked, find_card, library_roots
from cardc.interop import config_for, import_hf, load_mappings, write_model_hf
from cardc.interop.config import broken_constraint
from cardc.names import identifier
from cardc.presets import OverrideError, PresetError, validate
from cardc.runtime.errors import RuntimeInputError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkonce import cards_checked_once  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MAPPED = [(path, m.card) for path in sorted((ROOT / "cards").glob("*.hf.json"))
          for m in load_mappings(path.with_name(path.name.removesuffix(".hf.json") + ".card"))]
REALS = (1e-6, 1e-5, 0.5, 2.0, 30.0, 10000.0, 500000.0)


@pytest.fixture(scope="module", autouse=True)
def _cards_checked_once():
    """Each card is checked once for the module: only the checkpoints and mappings change."""
    with cards_checked_once():
        yield


def card_of(path: Path) -> str:
    return str(path.with_name(path.name.removesuffix(".hf.json") + ".card"))


class Walk:
    """The card's checks and the mapping's, for candidate hyperparameters (card names)."""

    def __init__(self, path: Path, name: str) -> None:
        card = card_of(path)
        self.mapping = next(m for m in load_mappings(card) if m.card == name)
        _, self.checker, _ = checked([card], library_roots([card], None))
        lib = self.checker.lib
        self.alg = find_card(lib, self.checker, card, name)
        sig = self.checker.info(self.alg).sig
        env = validate(self.checker, self.alg, "tiny")
        self.natural = {n for n in self.mapping.hyperparameters if sig.hypers[n].elem == "ℕ"}
        self.start = {n: self.value(n, env[n]) for n in self.mapping.hyperparameters
                      if n not in sig.definitions}

    def value(self, name: str, v: Fraction) -> int | float:
        return int(v) if name in self.natural else float(v)

    def ok(self, hypers: dict[str, int | float]) -> bool:
        try:
            validate(self.checker, self.alg, None, hypers)
            if broken_constraint(self.mapping, hypers) is not None:
                return False
            python = {identifier(k): v for k, v in hypers.items()}
            self.mapping.layer_count(python)
            config_for(self.mapping, python)
        except (OverrideError, PresetError, RuntimeInputError):
            return False
        return True

    def draw(self, rng: random.Random) -> dict[str, int | float]:
        hypers = dict(self.start)
        for _ in range(4):  # shrink: every size halved while the card takes it
            for name in sorted(self.natural & set(hypers)):
                if hypers[name] % 2 == 0 and self.ok({**hypers, name: hypers[name] // 2}):
                    hypers[name] //= 2
        for _ in range(6):
            name = rng.choice(sorted(hypers))
            v = hypers[name]
            moves = [v * 2, v // 2, v + 1, v - 1] if name in self.natural else list(REALS)
            candidate = {**hypers, name: rng.choice(moves)}
            if self.ok(candidate):
                hypers = candidate
        return hypers


WALKS: dict[tuple[Path, str], Walk] = {}


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])
                                    for k in a)


@pytest.mark.parametrize("path, name", MAPPED, ids=[f"{p.name}:{n}" for p, n in MAPPED])
@settings(max_examples=2, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_import_export_reimport_is_identical(path, name, seed, tmp_path_factory):
    walk = WALKS.setdefault((path, name), Walk(path, name))
    hypers = walk.draw(random.Random(seed))
    card = card_of(path)
    torch.manual_seed(seed)
    model = build_model(card, None, hypers, name=name)
    with torch.no_grad():
        for p in model.parameters():  # every weight random: gains and biases too
            p.normal_()
    folder = tmp_path_factory.mktemp("rt")
    write_model_hf(walk.mapping, model.state_dict(), model.card_meta["hyperparameters"],
                   folder / "hf1")

    first = import_hf(card, folder / "hf1")
    assert first.card_meta["name"] == name, hypers
    assert first.card_meta["hyperparameters"] == model.card_meta["hyperparameters"], hypers
    assert same_state(first.state_dict(), model.state_dict()), hypers

    mapping = next(m for m in load_mappings(card) if m.card == name)
    write_model_hf(mapping, first.state_dict(), first.card_meta["hyperparameters"],
                   folder / "hf2")
    config1 = json.loads((folder / "hf1" / "config.json").read_text())
    config2 = json.loads((folder / "hf2" / "config.json").read_text())
    assert config1 == config2, hypers
    assert same_state(tensors(folder / "hf1"), tensors(folder / "hf2")), hypers
    # the same files: importing the second folder is importing the first, checked above



def _round_trip(card: str, name: str, mapping, hypers: dict, folder: Path) -> None:
    model = build_model(card, None, hypers, name=name)
    write_model_hf(mapping, model.state_dict(), model.card_meta["hyperparameters"], folder)
    back = import_hf(card, folder)
    assert back.card_meta["hyperparameters"] == model.card_meta["hyperparameters"], hypers
    assert same_state(back.state_dict(), model.state_dict()), hypers


@pytest.mark.parametrize("path, name", MAPPED, ids=[f"{p.name}:{n}" for p, n in MAPPED])
def test_a_size_of_zero_the_card_takes_round_trips(path, name, tmp_path):
    """ℕ holds 0: where the card's checks and export take a 0 (no dense layers before the
    experts, as DeepSeek-V2's `first_k_dense_replace = 0`), import takes it back."""
    walk = WALKS.setdefault((path, name), Walk(path, name))
    start = walk.draw(random.Random(0))
    zeros = [n for n in sorted(walk.natural & set(start)) if walk.ok({**start, n: 0})]
    for n in zeros:
        _round_trip(card_of(path), name, walk.mapping, {**start, n: 0}, tmp_path / n)
