"""MAPPING.md, the guide to writing a mapping file, as a reader follows it: its example card and
mapping file are taken from the guide, its commands are run (at 2 updates rather than 300), the
exports load in `transformers` (random weights, no network) and compute cardc's logits, and every
error message its table quotes is what breaking the example that way gives."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from cardc.build import rebuild_model  # noqa: E402
from cardc.interop import import_hf, parse_mappings  # noqa: E402
from cardc.runtime.checkpoint import load_state, read_checkpoint  # noqa: E402
from cardc.runtime.errors import RuntimeInputError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "MAPPING.md").read_text(encoding="utf-8")
CARD, MAPPING = "my/tinygpt.card", "my/tinygpt.hf.json"
TINY = "my/tiny.hf.json"  # the README tutorial's card's, whose layer norms are stacked families


def _files() -> dict[str, str]:
    """The files the guide's worked example writes: fenced blocks whose info string names one."""
    return {path: text for _, path, text in
            re.findall(r"^```(\w+) (my/[\w.]+)\n(.*?)^```", GUIDE, flags=re.M | re.S)}


def _commands() -> list[list[str]]:
    """The example's `cardc` commands, as the guide gives them, at 2 updates."""
    block = next(b for b in re.findall(r"^```sh\n(.*?)^```", GUIDE, flags=re.M | re.S)
                 if "cardc export" in b)
    return [[sys.executable, "-m", "cardc", *shlex.split(line)[1:]]
            for line in block.replace("--steps 300", "--steps 2").splitlines()
            if line.startswith(".venv/bin/cardc ")]


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    """A folder holding the example's files and what its commands made."""
    here = tmp_path_factory.mktemp("guide")
    for path, text in _files().items():
        if path == TINY:
            continue  # its card is the README's: test_stacked_families_export_and_import_back
        (here / path).parent.mkdir(parents=True, exist_ok=True)
        (here / path).write_text(text, encoding="utf-8")
    for cmd in _commands():
        run = subprocess.run(cmd, cwd=here, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, (cmd, run.stderr)
    return here


def test_the_guide_holds_the_example():
    assert set(_files()) == {CARD, MAPPING, TINY}
    json.loads(_files()[MAPPING])
    verbs = [cmd[3] for cmd in _commands()]
    assert verbs == ["train", "export", "train", "export", "import"]


@pytest.mark.parametrize("run, folder, tied", [("runs/tinygpt", "hf-tinygpt", True),
                                               ("runs/untied", "hf-untied", False)])
def test_the_exports_compute_cardcs_logits_in_transformers(example, run, folder, tied):
    meta, state = read_checkpoint(example / run)
    model = rebuild_model(meta)
    load_state(model, state)
    hf = transformers.AutoModelForCausalLM.from_pretrained(example / folder).eval()
    assert type(hf).__name__ == "GPT2LMHeadModel" and hf.config.tie_word_embeddings is tied
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = model.eval()(tokens), hf(tokens).logits
    assert (want - got).abs().max().item() < 1e-5


def test_the_import_back_chooses_the_untied_card(example):
    meta, _ = read_checkpoint(example / "runs" / "back")
    assert meta["name"] == "TinyGPTUntied"


# ------------------------------------------------------------------ the errors the guide quotes

Edit = Callable[[dict[str, Any]], Any]


def _mapping() -> dict[str, Any]:
    return json.loads(_files()[MAPPING])


def _loading(edit: Edit) -> str:
    raw = _mapping()
    edit(raw)
    with pytest.raises(RuntimeInputError) as err:
        parse_mappings(raw, MAPPING)
    return str(err.value)


def _importing(example: Path, where: Path, edit: Edit | None = None,
               config: Edit | None = None, tensors: Edit | None = None) -> str:
    """The refusal of `cardc import` of the tied export, the mapping, its config.json or its
    tensors edited first."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(example / "my", where / "my")
    shutil.copytree(example / "hf-tinygpt", where / "hf")
    raw = _mapping()
    if edit is not None:
        edit(raw)
    (where / MAPPING).write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    if config is not None:
        data = json.loads((where / "hf" / "config.json").read_text(encoding="utf-8"))
        config(data)
        (where / "hf" / "config.json").write_text(json.dumps(data), encoding="utf-8")
    if tensors is not None:
        state = load_file(where / "hf" / "model.safetensors")
        tensors(state)
        save_file(state, where / "hf" / "model.safetensors")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(where)
        with pytest.raises(RuntimeInputError) as err:
            import_hf(CARD, "hf")
    return str(err.value)


def _untied_head(state: dict[str, torch.Tensor]) -> None:
    state["lm_head.weight"] = state["transformer.wte.weight"] + 1


def _hypers(raw: dict[str, Any]) -> dict[str, Any]:
    return raw["hyperparameters"]


def _tensors(raw: dict[str, Any]) -> dict[str, Any]:
    return raw["tensors"]


LOADING: dict[str, Edit] = {
    "my/tinygpt.hf.json: unknown key 'tensor'": lambda m: m.update(tensor=m.pop("tensors")),
    "names with {i} need 'layers', the hyperparameter (or an expression of them) that counts "
    "the layers": lambda m: m.pop("layers"),
    "config key 'n_inner' is both hyperparameter 'D_f' and in 'fixed_config': a value is set "
    "in one place": lambda m: _hypers(m).update(D_f="n_inner"),
}
IMPORTING: dict[str, dict[str, Edit]] = {
    "'hyperparameters': 'D_f' is a hyperparameter the card TinyGPT derives (it sets V, D, H, N, "
    "ctx, ε)": {"edit": lambda m: (_hypers(m).update(D_f="n_inner"),
                                   m["fixed_config"].pop("n_inner"))},
    "config.json: hyperparameter 'ctx' has no value": {
        "edit": lambda m: (_hypers(m).pop("ctx"), m["harmless"].append("n_positions"))},
    "config.json lacks 'n_layer' (the card's N)": {"config": lambda c: c.pop("n_layer")},
    "config key 'use_parallel_residual' = True is not understood by my/tinygpt.hf.json: it maps "
    "it to no hyperparameter, fixes no value for it and does not list it as harmless": {
        "config": lambda c: c.update(use_parallel_residual=True)},
    "config.json has activation_function = 'relu', but the card TinyGPT computes "
    "activation_function = 'gelu_new'": {"config": lambda c: c.update(activation_function="relu")},
    "config.json has n_inner = 1024, but the card TinyGPT computes n_inner = 4 * n_embd = 256": {
        "config": lambda c: c.update(n_inner=1024)},
    "unexpected tensor 'transformer.ln_f.bias': my/tinygpt.hf.json maps no such tensor for a "
    "model with 2 layers": {"edit": lambda m: _tensors(m).pop("transformer.ln_f.bias")},
    "my/tinygpt.hf.json does not map the card's tensor 'beta_f'": {
        "edit": lambda m: _tensors(m).update({"transformer.ln_f.bias": "beta"})},
    "missing tensor 'transformer.h.1.ln_2.bias' (the card's block.1.beta2) of layer 1: the "
    "checkpoint's sizes give 2 layers": {
        "tensors": lambda t: t.pop("transformer.h.1.ln_2.bias")},
    "tensor 'transformer.h.0.mlp.c_fc.weight' has shape (64, 256); the card's block.0.mlp.W_1 "
    "needs (256, 64)": {"edit": lambda m: _tensors(m).update({
        "transformer.h.{i}.mlp.c_fc.weight": {"card": "block.{i}.mlp.W_1", "transpose": True}})},
    "tensor 'lm_head.weight' differs from 'transformer.wte.weight', but the card TinyGPT ties "
    "them": {"tensors": _untied_head},
}


def _quoted() -> list[str]:
    """The messages of the guide's table of errors: its rows' first cells."""
    table = GUIDE[GUIDE.index("## Errors"):]
    return [m.replace("\\|", "|") for m in re.findall(r"^\| `(.+?)` \|", table, flags=re.M)]


def test_every_quoted_error_is_checked_here():
    assert sorted(_quoted()) == sorted([*LOADING, *IMPORTING])


@pytest.mark.parametrize("quote", list(LOADING))
def test_a_broken_mapping_is_refused_as_the_guide_says(quote):
    assert quote in _loading(LOADING[quote])


@pytest.mark.parametrize("quote", list(IMPORTING))
def test_a_refused_import_says_what_the_guide_says(example, tmp_path, quote):
    assert quote in _importing(example, tmp_path, **IMPORTING[quote])


# ------------------------------------------------------------------ stacked families


def _tiny_folder(where: Path, mapping: dict[str, Any]) -> str:
    """The README tutorial's card, and beside it the guide's mapping file for it (edited)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (card,) = re.findall(r"```card\n(.*?)```", readme, flags=re.S)
    (where / "my").mkdir(parents=True, exist_ok=True)
    (where / "my" / "tiny.card").write_text(card, encoding="utf-8")
    (where / TINY).write_text(json.dumps(mapping, ensure_ascii=False), encoding="utf-8")
    return str(where / "my" / "tiny.card")


def test_stacked_families_export_and_import_back(tmp_path):
    """Each layer's norms are a row of the card's (N, D) tensors: every weight random, so a row
    read for another layer would show."""
    import cardc
    from cardc.interop import load_mappings, write_model_hf

    card = _tiny_folder(tmp_path, json.loads(_files()[TINY]))
    model = cardc.model(card, "tiny", D=32, N=3).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    write_model_hf(load_mappings(card)[0], model.state_dict(),
                   model.card_meta["hyperparameters"], tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert torch.equal(hf.transformer.h[2].ln_2.weight, model.gamma2[2])
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(tokens) - hf(tokens).logits).abs().max().item() < 1e-5
    back = import_hf(card, tmp_path / "hf")
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(),
                                                 model.state_dict().values(), strict=True))


def test_a_row_given_twice_is_refused(tmp_path):
    import cardc
    from cardc.interop import load_mappings, write_model_hf

    mapping = json.loads(_files()[TINY])
    card = _tiny_folder(tmp_path, mapping)
    model = cardc.model(card, "tiny", D=32)
    write_model_hf(load_mappings(card)[0], model.state_dict(),
                   model.card_meta["hyperparameters"], tmp_path / "hf")
    mapping["tensors"]["transformer.h.{i}.ln_1.weight"]["row"] = "{0}"
    _tiny_folder(tmp_path, mapping)
    with pytest.raises(RuntimeInputError, match=r"the card's gamma1 gets rows \[0, 0\], not "
                                                r"each of 0 … 1 once"):
        import_hf(card, tmp_path / "hf")
