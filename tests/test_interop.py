"""`cardc import` and `cardc export` against Hugging Face's GPT2LMHeadModel, and the mapping file.

A small randomly initialised GPT2LMHeadModel (no download) is saved with `save_pretrained`,
imported through `cards/gpt2.hf.json`, sampled, and exported back; numbers must agree with
transformers' own, and every bad input must end in one line naming what is wrong.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

from cardc.build import build_model, rebuild_model  # noqa: E402
from cardc.cli import main  # noqa: E402
from cardc.interop import (  # noqa: E402
    config_for,
    from_card_state,
    load_mapping,
    parse_mapping,
    preset_from_config,
    to_card_state,
)
from cardc.runtime.checkpoint import load_state, read_checkpoint, save_checkpoint  # noqa: E402
from cardc.runtime.data import encode  # noqa: E402
from cardc.runtime.errors import RuntimeInputError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CARD = "cards/gpt2.card"
V, CTX, D, N, H = 300, 64, 48, 2, 4  # V > 256: byte prompts fit, and V is no other size
HYPERS = dict(V=V, D=D, H=H, D_f=4 * D, N=N, ctx=CTX)
PROMPT = "The "


def cardc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cardc", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def make_hf():
    config = transformers.GPT2Config(vocab_size=V, n_positions=CTX, n_embd=D, n_layer=N, n_head=H,
                                     bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, biases and layer-norm gains included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.0
            # strong positions: a random model otherwise repeats one token under greedy decoding
            std = 1.0 if name.endswith("wpe.weight") else 0.1
            p.copy_(mean + std * torch.randn(p.shape, generator=gen))
        # Shrink every unembedding row but printable ASCII's: greedy text is then printable, and
        # what `cardc sample` prints gives back the exact token IDs.
        printable = torch.zeros(V, dtype=torch.bool)
        printable[32:127] = True
        hf.transformer.wte.weight[~printable] *= 0.01
    return hf


def logits_of_run(run: Path, idx: torch.Tensor) -> torch.Tensor:
    meta, state = read_checkpoint(run)
    model = rebuild_model(meta)
    load_state(model, state)
    with torch.no_grad():
        return model.eval()(idx)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "gpt2-small-random"
    make_hf().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_model(hf_dir):
    return transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()


@pytest.fixture(scope="module")
def run_dir(hf_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "imported"
    r = cardc("import", CARD, "--from", str(hf_dir), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "imported" in r.stdout and (out / "model.safetensors").is_file()
    return out


@pytest.fixture
def idx() -> torch.Tensor:
    return torch.randint(0, V, (3, 17), generator=torch.Generator().manual_seed(7))


# ------------------------------------------------------------------ import, sample, export


def test_import_matches_hf_logits(run_dir, hf_model, idx):
    with torch.no_grad():
        want = hf_model(idx).logits
    got = logits_of_run(run_dir, idx)
    diff = (got - want).abs().max().item()
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_import_records_card_and_hyperparameters(run_dir, hf_dir):
    meta, _ = read_checkpoint(run_dir)
    assert meta["name"] == "GPT2" and meta["preset"] is None
    assert meta["hyperparameters"] == {**HYPERS, "eps": 1e-5}
    assert meta["hf"]["source"] == str(hf_dir)
    assert meta["hf"]["mapping"]["architecture"] == "GPT2LMHeadModel"


def test_greedy_sample_matches_hf_generate(run_dir, hf_model):
    """`cardc sample` runs the inference card the import records (the generic LMSampling)."""
    from cardc.runtime.checkpoint import read_checkpoint

    assert read_checkpoint(run_dir)[0]["sampler"]["name"] == "LMSampling"
    ids = torch.tensor([encode(PROMPT)])
    prompt = " ".join(map(str, ids[0].tolist()))  # V > 256 and no tokenizer: token IDs
    r = cardc("sample", str(run_dir), "--prompt", prompt, "--temperature", "0", "--tokens", "20")
    assert r.returncode == 0, r.stderr
    want = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20,
                             do_sample=False)[0].tolist()
    assert len(want) == len(ids[0]) + 20
    assert [int(w) for w in r.stdout.split()] == want[len(ids[0]):]  # what it adds


def test_a_text_prompt_to_more_tokens_than_bytes_is_refused_before_the_model_runs(
        run_dir, capsys, monkeypatch):
    """An import without a tokenizer reads text as bytes, which cannot show the model's tokens
    from 256 up: a text prompt is refused in one line saying what would do, and the model
    never runs."""
    import cardc.build

    def never(*_args, **_kwargs):
        raise AssertionError("the sampler was made")

    monkeypatch.setattr(cardc.build, "procedure_function", never)
    code, out, err = run_main(capsys, "sample", str(run_dir), "--prompt", PROMPT)
    assert code != 0 and out == "" and err.count("\n") == 1, err
    assert "has no tokenizer.json" in err and f"{V:,} tokens" in err
    assert "tokenizer.json, or vocab.json and merges.txt" in err and "token IDs" in err


def test_training_fine_tunes_an_imported_checkpoint(run_dir, hf_model, tmp_path):
    """`cardc train --finetune` trains on from the imported weights: its first evaluation is the HF
    model's own next-token loss on the same held-out windows, and two updates move it."""
    from cardc.runtime.data import get_batch, load_corpus, split

    out = tmp_path / "tuned"
    r = cardc("train", CARD, "--preset", "tiny", "--finetune", str(run_dir), "--steps", "2",
              "--batch-size", "2", "--block-size", "16", "--eval-every", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    first, last = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    held_out = split(load_corpus(None))[1]
    gen = torch.Generator().manual_seed(1337 + 1)  # the harness's evaluation batches
    losses = []
    with torch.no_grad():
        for _ in range(20):
            x, y = get_batch(held_out, 16, 15, gen, torch.device("cpu"))
            losses.append(F.cross_entropy(hf_model(x).logits.flatten(0, 1), y.flatten()))
    assert abs(first["val_loss"] - torch.stack(losses).mean().item()) < 1e-4
    assert last["val_loss"] != first["val_loss"]


def test_export_loads_in_transformers_bit_exact(run_dir, hf_dir, hf_model, idx, tmp_path, capsys):
    dest = tmp_path / "exported"
    code, out, err = run_main(capsys, "export", str(run_dir), "--to", str(dest))
    assert code == 0, err
    assert sorted(p.name for p in dest.iterdir()) == [".cardc-manifest", "config.json",
                                                      "model.safetensors"]
    source, exported = load_file(hf_dir / "model.safetensors"), load_file(dest / "model.safetensors")
    assert set(exported) == set(source)
    unequal = [name for name in source if not torch.equal(source[name], exported[name])]
    assert not unequal, f"changed by import → export: {unequal}"
    back = transformers.AutoModelForCausalLM.from_pretrained(dest).eval()
    assert type(back).__name__ == "GPT2LMHeadModel"
    assert back.lm_head.weight is back.transformer.wte.weight
    with torch.no_grad():
        assert torch.equal(back(idx).logits, hf_model(idx).logits)


def test_bos_and_eos_survive_import_and_export(tmp_path, capsys):
    """The token IDs config.json names for bos and eos (several, for eos) come back on
    export: they change no logits, but `generate` stops at eos."""
    config = transformers.GPT2Config(vocab_size=V, n_positions=CTX, n_embd=D, n_layer=N,
                                     n_head=H, bos_token_id=5, eos_token_id=[7, 9])
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "src")
    code, _, err = run_main(capsys, "import", CARD, "--from", str(tmp_path / "src"),
                            "--out", str(tmp_path / "run"))
    assert code == 0, err
    code, _, err = run_main(capsys, "export", str(tmp_path / "run"), "--to", str(tmp_path / "hf"))
    assert code == 0, err
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (written["bos_token_id"], written["eos_token_id"]) == (5, [7, 9])
    back = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert (back.bos_token_id, back.eos_token_id) == (5, [7, 9])


def test_trained_checkpoint_exports_by_its_cards_mapping(tmp_path, idx, capsys):
    """A checkpoint `cardc train` wrote records no mapping: export finds gpt2.hf.json."""
    torch.manual_seed(3)
    model = build_model(str(ROOT / CARD), None, HYPERS).eval()
    save_checkpoint(tmp_path / "run", model, model.card_meta)
    code, _, err = run_main(capsys, "export", str(tmp_path / "run"), "--to", str(tmp_path / "hf"))
    assert code == 0, err
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        diff = (back(idx).logits - model(idx)).abs().max().item()
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_a_run_of_ones_own_card_exports_by_the_mapping_beside_it(tmp_path, cli):
    """A run trained from a card outside cards/ (my/foo.card, my/foo.hf.json beside it)
    exports by that mapping, found where the run's card was; without it the error names where
    it looked and --mapping, which names a mapping file outright."""
    import shutil

    mine = tmp_path / "my"
    mine.mkdir()
    shutil.copy(ROOT / CARD, mine / "foo.card")
    shutil.copy(ROOT / "cards/gpt2.hf.json", mine / "foo.hf.json")
    sets = [a for k, v in {"V": 256, "D": 32, "H": 2, "D_f": 64, "N": 1, "ctx": 32}.items()
            for a in ("--set", f"{k}={v}")]
    r = cli("train", str(mine / "foo.card"), "--preset", "tiny", *sets, "--steps", "1",
            "--batch-size", "2", "--block-size", "16", "--device", "cpu",
            "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    r = cli("export", str(tmp_path / "run"), "--to", str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "hf/config.json").read_text())["n_embd"] == 32
    (mine / "foo.hf.json").rename(tmp_path / "kept.hf.json")
    r = cli("export", str(tmp_path / "run"), "--to", str(tmp_path / "hf2"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert str(mine / "foo.hf.json") in r.stderr and "--mapping" in r.stderr
    assert not (tmp_path / "hf2").exists()
    r = cli("export", str(tmp_path / "run"), "--to", str(tmp_path / "hf2"),
            "--mapping", str(tmp_path / "kept.hf.json"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "hf2/model.safetensors").is_file()


def test_base_model_file_with_a_preset(hf_dir, tmp_path, capsys):
    """A bare base-model file (no `transformer.` prefix, old causal-mask buffers, no config.json)
    imports with --preset and --set."""
    source = load_file(hf_dir / "model.safetensors")
    state = {k.removeprefix("transformer."): v for k, v in source.items()}
    state.update({f"h.{i}.attn.bias": torch.ones(1, 1, CTX, CTX) for i in range(N)})
    save_file(state, tmp_path / "base.safetensors")
    sets = [a for k, v in HYPERS.items() for a in ("--set", f"{k}={v}")]
    code, _, err = run_main(capsys, "import", CARD, "--from", str(tmp_path / "base.safetensors"),
                            "--out", str(tmp_path / "run"), "--preset", "tiny", *sets)
    assert code == 0, err
    _, got = read_checkpoint(tmp_path / "run")
    for e in load_mapping(ROOT / CARD).entries(N):
        assert torch.equal(got[e.card], source[e.hf]), e


def test_sharded_checkpoint(tmp_path, capsys):
    hf = make_hf()
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    code, _, err = run_main(capsys, "import", CARD, "--from", str(tmp_path / "sharded"),
                            "--out", str(tmp_path / "run"))
    assert code == 0, err
    _, state = read_checkpoint(tmp_path / "run")
    assert torch.equal(state["block.1.attn.W_qkv"], hf.transformer.h[1].attn.c_attn.weight)


# ------------------------------------------------------------------ bad input


def altered(hf_dir: Path, tmp_path: Path, change) -> Path:
    """A copy of the HF folder whose tensors `change` edits in place."""
    out = tmp_path / "altered"
    out.mkdir()
    (out / "config.json").write_text((hf_dir / "config.json").read_text())
    state = load_file(hf_dir / "model.safetensors")
    change(state)
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _reshape(state):
    state["transformer.h.1.attn.c_attn.weight"] = torch.zeros(D, 100)


def _drop(state):
    del state["transformer.h.0.ln_1.bias"]


def _extra(state):
    state["transformer.h.0.attn.rotary"] = torch.zeros(3)


def _untied(state):
    state["lm_head.weight"] = torch.zeros(V, D)


@pytest.mark.parametrize("change, message", [
    (_reshape, "tensor 'transformer.h.1.attn.c_attn.weight' has shape (48, 100); the card's "
               "block.1.attn.W_qkv needs (48, 144)"),
    (_drop, "missing tensor 'transformer.h.0.ln_1.bias'"),
    (_extra, "unexpected tensor 'transformer.h.0.attn.rotary'"),
    (_untied, "'lm_head.weight' differs from 'transformer.wte.weight'"),
])
def test_bad_tensors_are_named(hf_dir, tmp_path, capsys, change, message):
    source = altered(hf_dir, tmp_path, change)
    code, _, err = run_main(capsys, "import", CARD, "--from", str(source),
                            "--out", str(tmp_path / "run"))
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("cardc: error: ") and message in err, err
    assert not (tmp_path / "run").exists()


def _garbage(path: Path, hf_dir: Path) -> str:
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"not a safetensors file at all")
    (path / "config.json").write_text((hf_dir / "config.json").read_text())
    return str(path)


def _no_config(path: Path, hf_dir: Path) -> str:
    path.mkdir()
    (path / "model.safetensors").write_bytes((hf_dir / "model.safetensors").read_bytes())
    return str(path)


def _relu(path: Path, hf_dir: Path) -> str:
    path.mkdir()
    (path / "model.safetensors").write_bytes((hf_dir / "model.safetensors").read_bytes())
    config = json.loads((hf_dir / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    return str(path)


@pytest.mark.parametrize("card, make, message", [
    (CARD, _garbage, "is not a valid safetensors file"),
    (CARD, _no_config, "no config.json beside"),
    (CARD, _relu, "config.json has activation_function = 'relu'"),
    (CARD, lambda path, _: str(path / "nowhere"), "no such file or directory"),
    ("cards/paper/dtransformer.card", lambda _, hf_dir: str(hf_dir),
     "has no Hugging Face mapping: expected cards/paper/dtransformer.hf.json"),
])
def test_bad_sources_get_one_line(hf_dir, tmp_path, capsys, card, make, message):
    source = make(tmp_path / "source", hf_dir)
    code, _, err = run_main(capsys, "import", card, "--from", source, "--out", str(tmp_path / "run"))
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("cardc: error: ") and message in err, err
    assert not (tmp_path / "run").exists()


def test_wrong_shape_from_the_command_line(hf_dir, tmp_path):
    """The real process: exit 1, one line, no traceback, nothing written."""
    source = altered(hf_dir, tmp_path, _reshape)
    r = cardc("import", CARD, "--from", str(source), "--out", str(tmp_path / "run"))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "transformer.h.1.attn.c_attn.weight" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()


def test_export_errors_write_nothing(run_dir, tmp_path, capsys):
    code, _, err = run_main(capsys, "export", str(tmp_path / "none"), "--to", str(tmp_path / "hf"))
    assert code == 1 and "checkpoint not found" in err
    (tmp_path / "file").write_text("")
    code, _, err = run_main(capsys, "export", str(run_dir), "--to", str(tmp_path / "file"))
    assert code == 1 and "exists and is not a folder" in err
    assert not (tmp_path / "hf").exists() and (tmp_path / "file").read_text() == ""


# ------------------------------------------------------------------ the mapping format


def test_config_defaults_and_overrides():
    mapping = load_mapping(ROOT / CARD)
    config = {"vocab_size": 300, "n_embd": 48, "n_head": 4, "n_layer": 2, "n_positions": 64,
              "layer_norm_epsilon": 1e-6, "n_inner": None}
    assert preset_from_config(config, mapping) == {**HYPERS, "ε": 1e-6}
    assert preset_from_config({**config, "n_inner": 100}, mapping)["D_f"] == 100
    with pytest.raises(RuntimeInputError, match="lacks 'n_head'"):
        preset_from_config({k: v for k, v in config.items() if k != "n_head"}, mapping)


def test_transposed_and_split_tensors_round_trip():
    """What a Llama- or BERT-style mapping needs: separate, transposed q/k/v projections of the
    card's fused W_qkv (nn.Linear stores (out, in))."""
    raw = json.loads((ROOT / "cards" / "gpt2.hf.json").read_text())
    tensors = {k: v for k, v in raw["tensors"].items() if ".c_attn." not in k}
    for k, role in enumerate("qkv"):
        tensors[f"h.{{i}}.{role}_proj.weight"] = {"card": "block.{i}.attn.W_qkv",
                                                  "transpose": True, "chunk": [k, 3], "axis": 1}
        tensors[f"h.{{i}}.{role}_proj.bias"] = {"card": "block.{i}.attn.b_qkv", "chunk": [k, 3]}
    mapping = parse_mapping({**raw, "tensors": tensors}, "split.hf.json")
    torch.manual_seed(5)
    state = {k: torch.randn(v.shape) for k, v in build_model(str(ROOT / CARD), None, HYPERS)
             .state_dict().items()}
    hf = from_card_state(mapping, state, N)
    assert torch.equal(hf["h.1.k_proj.weight"], state["block.1.attn.W_qkv"][:, D:2 * D].T)
    assert torch.equal(hf["h.0.v_proj.bias"], state["block.0.attn.b_qkv"][2 * D:])
    back = to_card_state(mapping, hf, state, N)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


def test_one_hyperparameter_under_several_config_keys():
    """BART's encoder_layers and decoder_layers are both the card's N: import refuses unequal
    ones, export writes each."""
    mapping = load_mapping(ROOT / "cards" / "bart.card")
    config = {"vocab_size": 99, "d_model": 32, "max_position_embeddings": 64,
              "encoder_attention_heads": 4, "decoder_attention_heads": 4,
              "encoder_ffn_dim": 37, "decoder_ffn_dim": 37, "encoder_layers": 2,
              "decoder_layers": 2}
    hypers = preset_from_config(config, mapping)
    assert hypers == {"V": 99, "D": 32, "ctx": 64, "H": 4, "D_f": 37, "N": 2}
    with pytest.raises(RuntimeInputError, match="decoder_ffn_dim = 38 but encoder_ffn_dim = 37"):
        preset_from_config({**config, "decoder_ffn_dim": 38}, mapping)
    written = config_for(mapping, hypers)
    assert all(written[k] == v for k, v in config.items())


def test_reshaped_tensor_round_trips():
    """`"shape": [1, -1]`: BART's final_logits_bias, (1, V) there, the card's b_f ∈ ℝ^{V}."""
    card = ROOT / "cards" / "bart.card"
    mapping = load_mapping(card)
    model = build_model(str(card), None, dict(V=11, D=8, H=2, D_f=12, N=1, ctx=6))
    torch.manual_seed(6)
    state = {k: torch.randn(v.shape) for k, v in model.state_dict().items()}
    hf = from_card_state(mapping, state, 1)
    assert hf["final_logits_bias"].shape == (1, 11)
    assert torch.equal(hf["final_logits_bias"][0], state["b_f"])
    back = to_card_state(mapping, hf, state, 1)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
    hf["final_logits_bias"] = torch.zeros(2, 11)
    with pytest.raises(RuntimeInputError, match=r"'final_logits_bias' has shape \(2, 11\)"):
        to_card_state(mapping, hf, state, 1)


def test_malformed_mapping_is_reported():
    raw = json.loads((ROOT / "cards" / "gpt2.hf.json").read_text())
    with pytest.raises(RuntimeInputError, match=r"bad.hf.json: names with \{i\} need 'layers'"):
        parse_mapping({k: v for k, v in raw.items() if k != "layers"}, "bad.hf.json")
    with pytest.raises(RuntimeInputError, match="unknown key 'fixed_confg'"):
        parse_mapping({**raw, "fixed_confg": {}}, "bad.hf.json")
    with pytest.raises(RuntimeInputError, match="'chunk' must be"):
        parse_mapping({**raw, "tensors": {"x": {"card": "W_e", "chunk": [3, 3]}}}, "bad.hf.json")
    with pytest.raises(RuntimeInputError, match="'shape' cannot be combined with 'chunk'"):
        parse_mapping({**raw, "tensors": {"x": {"card": "W_e", "shape": [1, -1],
                                                "chunk": [0, 2]}}}, "bad.hf.json")
    with pytest.raises(RuntimeInputError, match="'same' must be a list"):
        parse_mapping({**raw, "hyperparameters": {"V": {"key": "vocab_size", "same": "x"}}},
                      "bad.hf.json")


def test_failed_writes_leave_nothing_half_written(run_dir, hf_dir, tmp_path, monkeypatch):
    """A write that fails (a full disk) leaves no new folder, and an old export as it was."""
    import cardc.interop as interop
    import cardc.runtime.checkpoint as checkpoint

    interop.export_hf(run_dir, tmp_path / "old")
    before = (tmp_path / "old" / "model.safetensors").read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(interop.files, "save_file", full_disk)
    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    for dest in (tmp_path / "new", tmp_path / "old"):
        with pytest.raises(RuntimeInputError, match="No space left on device"):
            interop.export_hf(run_dir, dest)
    with pytest.raises(RuntimeInputError, match="No space left on device"):
        interop.import_checkpoint(str(ROOT / CARD), hf_dir, tmp_path / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == [".cardc-manifest",
                                                                    "config.json",
                                                                    "model.safetensors"]
    assert (tmp_path / "old" / "model.safetensors").read_bytes() == before
