"""`check` accepts only what builds: every preset is evaluated at check time.

Each card of cards/ (the paper's deliberately faithful cards aside) at each of its presets, and
cards derived from them by mutating a preset value, either get a located diagnostic at the preset
line from `check`, or build: their module is generated and compiles, a model card's model
instantiates (where its parameter count is small), and `cardc info` answers. Regression tests
below pin the messages of the issue's reproducers.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import cardc
from cardc import syntax as s
from cardc.build import (
    bind_recipe,
    checked,
    instantiate,
    load_module,
    model_cards,
    procedure_cards,
    require_clean,
    serves,
    source,
    unbound_models,
)
from cardc.checker import Checker, check
from cardc.cli import main
from cardc.diagnostics import Diagnostics
from cardc.info import summarize
from cardc.library import Library, load
from cardc.names import identifier
from cardc.parser import parse_file
from cardc.presets import validate

ROOT = Path(__file__).resolve().parent.parent
CARDS = ROOT / "cards"
SMALL = 5_000_000  # instantiate models below this many parameters; larger ones only generate


def _card_files() -> list[Path]:
    return sorted(p for p in CARDS.rglob("*.card") if "faithful" not in p.parts)


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    """A copy of cards/ whose files a test may rewrite (and restores)."""
    dest = tmp_path_factory.mktemp("lib") / "cards"
    shutil.copytree(CARDS, dest, ignore=shutil.ignore_patterns("faithful"))
    return dest


def _checked(path: Path, root: Path, lazy: tuple[Library, Checker] | None = None
             ) -> tuple[Library, Checker]:
    """`path`'s library, checked (raising the errors of what it uses) as `cardc check` and
    `cardc info` read it: `path` and the cards it calls, which are what resolve its names
    (`lazy`: that library, checked already). A generic recipe among them is bound to a model
    card of the library: then all of it."""
    if lazy is None:
        lib, _ = load([path], root=root, lazy=True)
        lazy = lib, check(lib)[0]
    lib, checker = lazy
    require_clean(lib, checker, checker.diags, {str(path)})
    file = next(f for f in lib.files if Path(f.path) == path)
    if any(id(a) in checker.infos and unbound_models(checker, a) for a in file.algorithms):
        lib, checker, _ = checked([str(path)], str(root))
    return lib, checker


def _builds(path: Path, root: Path, only: tuple[str, str] | None = None,
            lazy: tuple[Library, Checker] | None = None) -> None:
    """Every card of `path` builds at every preset (`only`: one card at one preset), and
    `cardc info` answers for each."""
    lib, checker = _checked(path, root, lazy)
    file = next(f for f in lib.files if Path(f.path) == path)
    models = model_cards(lib, checker, [file.path])
    procedures = procedure_cards(lib, checker, [file.path])
    for alg in file.algorithms:
        if alg.label is None or id(alg) not in checker.infos or only and alg.label != only[0]:
            continue
        if alg in procedures and unbound_models(checker, alg):  # a generic recipe: its code is
            served = [m for m in model_cards(lib, checker) if serves(checker, alg, m)]
            bind_recipe(checker, alg, served[0])  # made bound to a model card it can run
        if alg in models or alg in procedures:
            load_module(source(checker, alg), identifier(alg.label).lower())
        for preset in alg.presets:
            if only and preset.name != only[1]:
                continue
            values = validate(checker, alg, preset.name)
            summary = summarize(checker.infos[id(alg)].sig, preset.name)
            if alg in models and summary.parameters < SMALL:
                model, _ = instantiate(checker, alg, {identifier(k): v for k, v in values.items()})
                assert sum(p.numel() for p in model.parameters()) == summary.parameters
            code, out, err = _run("info", str(path), "--preset", preset.name, "--name",
                                  alg.label, "--library", str(root))
            assert code == 0 and "parameters:" in out, err


@pytest.mark.parametrize("path", _card_files(), ids=lambda p: str(p.relative_to(CARDS)))
def test_every_card_builds_at_every_preset(path: Path):
    _builds(path, CARDS)


@contextlib.contextmanager
def _on_meta() -> Iterator[None]:
    """Modules built on the meta device, which allocates nothing, their random initialisation
    left out: a meta tensor holds no values, and torch fills one through its slow reference
    ops (some ms a weight: a minute over the experts of the published sizes)."""
    normal = torch.Tensor.normal_
    torch.Tensor.normal_ = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    try:
        with torch.device("meta"):
            yield
    finally:
        torch.Tensor.normal_ = normal  # type: ignore[method-assign]


def test_info_counts_the_parameters_the_built_module_holds_at_every_preset():
    """`cardc info` and the built module agree on every model card at every preset, the large
    ones too (built on the meta device, which allocates nothing): a weight counted and not
    built, or built and not counted, is a card that `info` and `build` read differently."""
    lib, checker, _ = checked([str(p) for p in _card_files()], str(CARDS))
    seen = 0
    for alg in model_cards(lib, checker):
        for preset in alg.presets:
            values = validate(checker, alg, preset.name)
            counted = summarize(checker.infos[id(alg)].sig, preset.name).parameters
            with _on_meta():
                model, _ = instantiate(checker, alg,
                                       {identifier(k): v for k, v in values.items()})
            built = sum(p.numel() for p in model.parameters())
            assert built == counted, (alg.label, preset.name)
            seen += built >= SMALL
    assert seen >= 10  # the published sizes, not only the tiny presets


# ------------------------------------------------------------------ mutated presets

PRESET_CARDS = [p for p in _card_files()
                if any(a.presets for a in parse_file(p, Diagnostics()).algorithms)]

VALUES = st.one_of(
    st.integers(-3, 300).map(str),
    st.sampled_from(["0", "1", "−1", "2.5", "1/3", "1/0", "0/0", "10^{400}", "2^{70}",
                     "10^{10^{10}}", "1e999", "1e-999", "∞", "−∞", "(−2)^{1/2}", "3 − 3",
                     "1e300 · 1e300", "D/0", "4/3", "7"]),
)


def _mutated(text: str, preset: s.Preset, index: int | None, name: str, value: str) -> str:
    """`text` with one value of `preset` replaced (or `NAME = value` appended to it)."""
    lines = text.splitlines(keepends=True)
    if index is not None:
        span = preset.values[index][1].span
        line = lines[span.line - 1]
        lines[span.line - 1] = line[:span.col - 1] + value + line[span.end_col - 1:]
    else:
        row = preset.span.line - 1
        line = lines[row]
        cut = line.find("  ▷") if "  ▷" in line else len(line.rstrip("\n"))
        lines[row] = line[:cut] + f", {name} = {value}" + line[cut:]
    return "".join(lines)


# CARDC_PRESET_EXAMPLES=1000 for a long run
@settings(max_examples=int(os.environ.get("CARDC_PRESET_EXAMPLES", "30")), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_presets_are_refused_at_the_preset_line_or_build(library: Path, data):
    path = data.draw(st.sampled_from(PRESET_CARDS), "card file")
    target = library / path.relative_to(CARDS)
    original = target.read_text(encoding="utf-8")
    card = parse_file(target, Diagnostics())
    alg = data.draw(st.sampled_from([a for a in card.algorithms if a.presets]), "card")
    preset = data.draw(st.sampled_from(alg.presets), "preset")
    index = data.draw(st.sampled_from([*range(len(preset.values)), None]), "value")
    name = preset.values[index][0] if index is not None else \
        data.draw(st.sampled_from(["H", "D", "N_steps", "ε", "θ_base", "ctx", "d", "Q"]), "name")
    value = data.draw(VALUES, "new value")
    try:
        target.write_text(_mutated(original, preset, index, name, value), encoding="utf-8")
        lib, _ = load([target], root=library, lazy=True)
        checker, diags = check(lib)
        errors = [d for d in diags.errors if d.span.file == str(target)]
        event("refused by check" if errors else "builds")
        if errors:
            assert any(d.span.line == preset.span.line for d in errors), diags.render()
            code, _, err = _run("info", str(target), "--preset", preset.name, "--name",
                                alg.label or "", "--library", str(library))
            assert code != 0 and "Traceback" not in err
            assert re.search(rf"{re.escape(target.name)}:\d+:\d+: error:", err), err
        else:
            _builds(target, library, only=(alg.label or "", preset.name), lazy=(lib, checker))
    finally:
        target.write_text(original, encoding="utf-8")


# ------------------------------------------------------------------ the reproducers


def _card(tmp_path: Path, card: str, old: str, new: str) -> Path:
    """A copy of cards/`card` with `old` replaced by `new` (which must occur)."""
    text = (CARDS / card).read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / Path(card).name
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


def _check(path: Path) -> str:
    code, _, err = _run("check", str(path), "--library", str(CARDS))
    assert code == 1 and "Traceback" not in err
    return err


GPT2_TINY = "Preset tiny: V = 256, D = 128, H = 4,"


@pytest.mark.parametrize("value, located, message", [
    ("H = 5,", "13:8", "error: d = D/H = 128/5 (D = 128, H = 5) is not a whole number"),
    ("H = 1/0,", "13:36", "error: division by zero"),
    ("H = 10^{400},", "13:36", "error: this power overflows"),
    ("H = 10^{10^{10}},", "13:36", "error: this power overflows"),
    ("H = 4, ε = 1e999,", "13:43", "error: 1e999 is beyond the range"),
    ("H = 4, ε = −∞,", "13:43", "error: −∞ is not a finite number"),
    ("H = 4, ε = −1,", "13:43", "error: 'ε' = -1 lies outside (0, ∞)"),
    ("H = 0,", "13:36", "error: H = 0 divides the size D/H"),
    ("H = 2.5,", "13:36", "error: 'H' ∈ ℕ is 2.5, not a whole number"),
    ("H = −4,", "13:36", "error: 'H' ∈ ℕ is -4, not a whole number ≥ 0"),
    ("H = 4, H = 4,", "13:39", "error: preset 'tiny' sets 'H' twice"),
    ("H = 4, Q = 4,", "13:39", "error: preset 'tiny' sets 'Q', which is not a hyperparameter"),
    ("H = 2^{70},", "13:36", "error: 'H' = 1.181e+21 is too large for a size"),
])
def test_a_bad_preset_value_is_reported_at_the_preset_line(tmp_path, value, located, message):
    path = _card(tmp_path, "gpt2.card", GPT2_TINY, f"Preset tiny: V = 256, D = 128, {value}")
    err = _check(path)
    assert f"{path}:{located}: {message}" in err, err


def test_a_derived_size_blames_the_preset_and_notes_the_declaration(tmp_path):
    path = _card(tmp_path, "gpt2.card", GPT2_TINY, "Preset tiny: V = 256, D = 128, H = 5,")
    err = _check(path)
    assert f"{path}:13:8: error: d = D/H = 128/5" in err
    assert "attention.card:19:28: note: d = D/H in 'CausalSelfAttention'" in err
    # info at that preset: the same located message, not the card's header line
    code, _, info = _run("info", str(path), "--preset", "tiny", "--library", str(CARDS))
    assert code == 1 and f"{path}:13:8: error: d = D/H = 128/5" in info
    assert f"{path}:1:" not in info


@pytest.mark.parametrize("card, old, new, message", [
    ("llama.card", "D = 128, H = 4, H_kv = 2", "D = 128, H = 4, H_kv = 3",
     "13:8: error: G = H/H_kv = 4/3 (H = 4, H_kv = 3) is not a whole number"),
    ("llama.card", "D = 128, H = 4, H_kv = 2", "D = 132, H = 4, H_kv = 2",
     "13:8: error: d/2 = 33/2 (d = 33) is not a whole number"),
    ("llama.card", "ctx = 256  ▷ trains", "ctx = 256, θ_base = −∞  ▷ trains",
     "13:87: error: −∞ is not a finite number"),
    ("llama.card", "ctx = 256  ▷ trains", "ctx = 256, θ_base = 0  ▷ trains",
     "13:87: error: 'θ_base' = 0 lies outside (0, ∞)"),
    ("nn/attention.card", "Hyperparameters: D, H ∈ ℕ; d = D/H, the width of a head.\n",
     "Hyperparameters: D, H ∈ ℕ; d = D/H, the width of a head.\nPreset p: D = 8, d = 2\n",
     "error: 'd' = D/H is derived, not set"),
])
def test_sizes_derived_in_called_cards_are_checked(tmp_path, card, old, new, message):
    path = _card(tmp_path, card, old, new)
    assert message in _check(path)


def test_a_non_finite_default_is_refused_at_its_declaration(tmp_path):
    path = _card(tmp_path, "gpt2.card", "ε = 1e-5\n", "ε = ∞\n")
    assert f"{path}:5:48: error: ∞ is not a finite number" in _check(path)


def test_a_huge_power_is_refused_at_once(tmp_path):
    path = _card(tmp_path, "gpt2.card", GPT2_TINY, "Preset tiny: V = 256, D = 128, "
                                                   "H = 2^{10^{10^{10}}},")
    start = time.process_time()  # CPU time: a busy machine adds none
    assert "error: this power overflows" in _check(path)
    assert time.process_time() - start < 5


def test_the_same_preset_name_twice_is_reported(tmp_path):
    path = _card(tmp_path, "gpt2.card", "Preset tiny:", "Preset gpt2:")
    assert f"{path}:13:8: error: a preset named 'gpt2' is already defined" in _check(path)


# ------------------------------------------------------------------ the command line


@pytest.mark.parametrize("flags, message", [
    (["--set", "H=3"], "cardc: error: --set H=3: d = D/H = 128/3 (D = 128, H = 3) is not a "
                       "whole number (d = D/H in 'CausalSelfAttention' at "),
    (["--set", "D=-128"], "cardc: error: --set D=-128: 'D' ∈ ℕ is -128, not a whole number"),
    (["--set", "N_steps=-3"], "cardc: error: --set N_steps=-3: 'N_steps' ∈ ℕ is -3"),
    (["--set", "ctx=0"], "cardc: error: --set ctx=0: ctx = 0 is not positive"),
    (["--set", "D=0"], "cardc: error: --set D=0: D = 0 is not positive"),
    (["--set", "η=nan"], "cardc: error: --set η=nan: nan is not a finite number"),
    (["--set", "Q=1"], "cardc: error: --set Q=1: 'Q' is not a hyperparameter of 'GPT2'"),
    (["--set", "B=2.5"], "cardc: error: --set B=2.5: 'B' ∈ ℕ is 2.5"),
])
def test_train_refuses_bad_values_naming_the_flag(tmp_path, flags, message):
    out = tmp_path / "run"
    code, _, err = _run("train", str(CARDS / "gpt2.card"), "--preset", "tiny", *flags,
                        "--out", str(out))
    assert code == 1 and message in err, err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("flags, message", [
    (["--set", "H=5"], "cardc: error: --set H=5: d = D/H = 128/5"),
    (["--set", "D=1e999"], "cardc: error: --set D=1e999: inf is not a finite number"),
    (["--set", "V=0"], "cardc: error: --set V=0: V = 0 is not positive"),
])
def test_info_refuses_bad_values_naming_the_flag(flags, message):
    code, _, err = _run("info", str(CARDS / "gpt2.card"), "--preset", "tiny", *flags)
    assert code == 1 and message in err, err


def test_info_takes_good_overrides():
    code, out, _ = _run("info", str(CARDS / "gpt2.card"), "--preset", "tiny", "--set", "D=64",
                        "--set", "H=2")
    assert code == 0 and "D = 64, H = 2" in out


@pytest.mark.parametrize("dense", [0, 4])
def test_a_family_of_layers_may_have_no_member(dense, tmp_path):
    """DeepSeek-V2's first N_d layers are dense and the rest hold experts: N_d = 0 (every layer
    has experts) and N_d = N (none has) leave one family empty, a loop that runs no step,
    which info counts and the model runs, its cache decoding as recomputation does."""
    from decodecheck import check_incremental_decoding

    from cardc.cli import main

    assert main(["info", "cards/deepseek2.card", "--preset", "tiny",
                 "--set", f"N_d={dense}"]) == 0
    model = cardc.model("cards/deepseek2.card", preset="tiny", N_d=dense, N=4).eval()
    assert len(model.dense) == dense and len(model.moe) == 4 - dense
    x = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    check_incremental_decoding(model, [x])
    assert main(["info", "cards/deepseek2.card", "--preset", "tiny", "--set", "N_d=5"]) != 0
    from cardc.interop import load_mappings
    from cardc.interop.transfer import import_hf, write_model_hf

    mapping = next(m for m in load_mappings("cards/deepseek2.card") if m.card == "DeepSeek2")
    folder = tmp_path / "hf"  # export, then import: the empty family has no tensor to find
    write_model_hf(mapping, model.state_dict(), model.card_meta["hyperparameters"], folder)
    back = import_hf("cards/deepseek2.card", folder)
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(),
                                                 model.state_dict().values(), strict=True))
