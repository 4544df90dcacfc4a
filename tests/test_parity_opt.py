"""Parity: the card-generated OPT equals Hugging Face's OPTForCausalLM number for number.

Two small randomly initialised OPTForCausalLMs (no download; every parameter random, the
LayerNorm gains and biases, every projection bias and the position table included; tied
embeddings; a pad token the input holds): a pre-LN one with a final LayerNorm, as
facebook/opt-125m and every larger size (`OPT`), and a post-LN one whose token embeddings are
narrower than the residual stream, taken in by project_in and out by project_out, as
facebook/opt-350m (`OPTProjected`). Each is copied into the model `cards/opt.card` compiles to,
through `cards/opt.hf.json`. Logits and gradients must agree to fp32 rounding; the same weights
with the position table read without OPT's offset of 2, two query heads swapped or one
LayerNorm's bias reset must not. The generated module decodes through its KV cache as
recomputation does, and as transformers' cached `generate` does; `cardc import` chooses the card
by config.json, refuses what neither card computes, and `cardc export` gives the source's
tensors back bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from decodecheck import check_incremental_decoding  # noqa: E402
from parity import (  # noqa: E402
    load_through_mapping,
    logits_diff,
    max_diff,
    next_token_grad_diffs,
    padding_row_grad_diff,
    swap_columns,
)

from cardc.build import build_model  # noqa: E402
from cardc.interop import load_mapping  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, D_F, CTX = 101, 48, 2, 4, 96, 64
HEAD = D // H
B, T = 3, 17
PAD = 1  # OPT's pad token (0-based, as transformers counts), which the input holds
# card name → (do_layer_norm_before, word_embed_proj_dim)
KINDS = {"OPT": (True, D), "OPTProjected": (False, 32)}


def config_of(name: str, **changes):
    pre_ln, d_e = KINDS[name]
    config = transformers.OPTConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H, ffn_dim=D_F,
        max_position_embeddings=CTX, do_layer_norm_before=pre_ln, word_embed_proj_dim=d_e,
        dropout=0.0, attention_dropout=0.0, layerdrop=0.0, pad_token_id=PAD, **changes)
    config._attn_implementation = "eager"
    return config


def make_hf(name: str):
    torch.manual_seed(0)
    hf = transformers.OPTForCausalLM(config_of(name)).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the LayerNorm gains and biases included
        for pname, p in hf.named_parameters():
            mean = 1.0 if pname.endswith("layer_norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(name: str, v_pad: int = PAD + 1):  # the card counts IDs from 1
    hypers = dict(V=V, D=D, H=H, D_f=D_F, N=N, ctx=CTX, v_pad=v_pad)
    if name == "OPTProjected":
        hypers["D_e"] = KINDS[name][1]
    model = build_model(str(ROOT / "cards" / "opt.card"), None, hypers,
                        library=str(ROOT / "cards"), name=name)
    return model.float().eval()


@pytest.fixture(scope="module", params=list(KINDS))
def pair(request):
    name = request.param
    hf, ours = make_hf(name), make_ours(name)
    table = load_through_mapping(hf, ours, load_mapping(ROOT / "cards" / "opt.card", name), N,
                                 tied=True)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    return name, hf, ours, table, idx


def test_the_two_configs_are_the_two_layouts(pair):
    name, hf, *_ = pair
    decoder = hf.model.decoder
    if name == "OPT":
        assert decoder.project_in is None and decoder.final_layer_norm is not None
    else:
        assert decoder.project_in is not None and decoder.final_layer_norm is None
        assert not decoder.layers[0].do_layer_norm_before


def test_logits_match(pair):
    _, hf, ours, _, idx = pair
    diff = logits_diff(hf, ours, idx, (B, T, V))
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    name, hf, ours, table, idx = pair
    diffs = next_token_grad_diffs(hf, ours, table, idx)
    assert "model.decoder.embed_positions.weight" in diffs
    if name == "OPTProjected":
        assert {"model.decoder.project_in.weight", "model.decoder.project_out.weight"} <= set(diffs)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


def _broken(name, ours):
    broken = make_ours(name)
    broken.load_state_dict(ours.state_dict(), strict=True)
    return broken


def test_the_position_offset_is_what_parity_rests_on(pair):
    """A negative control: the table read from its first row (no offset of 2) breaks parity."""
    name, hf, ours, _, idx = pair
    broken = _broken(name, ours)
    with torch.no_grad():
        broken.W_p.copy_(torch.roll(ours.W_p, shifts=2, dims=0))  # row t + 2 now holds row t
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"reading positions without the offset changed the logits by {diff:.3e}"


def test_swapped_query_heads_are_caught(pair):
    name, hf, ours, _, idx = pair
    broken = _broken(name, ours)
    with torch.no_grad():
        swap_columns(broken.block[0].attn.W_q, 0, HEAD)
        swap_columns(broken.block[0].attn.b_q[None, :], 0, HEAD)
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"swapping query heads changed the logits by only {diff:.3e}"


def test_a_reset_layer_norm_bias_is_caught(pair):
    name, hf, ours, _, idx = pair
    broken = _broken(name, ours)
    with torch.no_grad():
        broken.block[N - 1].beta2.zero_()
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"resetting a LayerNorm bias changed the logits by only {diff:.3e}"


def test_a_card_without_the_padding_row_is_caught(pair):
    """A negative control: with v_pad = 0 the pad row takes a gradient transformers does not."""
    name, hf, ours, table, idx = pair
    diff = padding_row_grad_diff(hf, ours, make_ours(name, v_pad=0), table, idx)
    assert diff > 1e-3, "a card without the padding row matched its gradient"


def test_kv_cache_decoding_equals_full_recomputation(pair):
    """Chunks fed through `new_cache()` give the logits of the whole sequence at once (the
    positions follow the decoded tokens), with gradients; greedy decoding through the cache
    picks what transformers' cached `generate` picks."""
    _, hf, ours, _, idx = pair
    with torch.no_grad():
        full = ours(idx)
        cache = ours.new_cache()
        chunks = [idx[:, :6], idx[:, 6:7], idx[:, 7:8], idx[:, 8:13], idx[:, 13:]]
        rows = torch.cat([ours(c, cache=cache) for c in chunks], dim=-2)
    assert cache.pos == T
    diff = max_diff(rows, full)
    assert diff <= 1e-5, f"cached decoding differs from recomputation by {diff:.3e}"
    check_incremental_decoding(ours, [idx])

    prompt = idx[:1, 1:6]
    with torch.no_grad():
        want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                           do_sample=False, pad_token_id=PAD, eos_token_id=None)
        cache, x, got = ours.new_cache(), prompt, prompt
        for _ in range(12):
            nxt = ours(x, cache=cache)[:, -1].argmax(-1, keepdim=True)
            got, x = torch.cat([got, nxt], dim=-1), nxt
    assert torch.equal(got, want)


def test_generated_forward_has_no_loop_over_heads():
    """The committed modules batch the heads into one SDPA call (the queries scaled before it,
    SDPA's own scale 1) and have a KV cache."""
    from test_heads import _loops

    for stem in ("opt", "optprojected"):
        text = (ROOT / "generated" / f"{stem}.py").read_text()
        assert _loops(text) == []
        assert "def new_cache" in text and "grouped_sdpa(" in text and "scale=1.0" in text


@pytest.mark.parametrize("name", list(KINDS))
def test_import_then_export_is_bit_exact(name, tmp_path, capsys):
    """`cardc import` of a saved OPT chooses the card by config.json and computes its logits;
    `cardc export` gives back the very tensors under the very names, and a config transformers
    loads into a model that computes exactly what the source does."""
    from safetensors.torch import load_file
    from test_interop import logits_of_run, run_main
    from test_interop_families import from_pretrained

    from cardc.runtime.checkpoint import read_checkpoint

    hf = make_hf(name)
    hf.save_pretrained(tmp_path / "hf")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        code, _, err = run_main(capsys, "import", "cards/opt.card", "--from",
                                str(tmp_path / "hf"), "--out", str(tmp_path / "run"))
        assert code == 0, err
        code, out, err = run_main(capsys, "export", str(tmp_path / "run"), "--to",
                                  str(tmp_path / "out"))
    assert code == 0, err
    assert "as OPTForCausalLM" in out
    assert read_checkpoint(tmp_path / "run")[0]["name"] == name
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = hf(idx).logits
        assert max_diff(logits_of_run(tmp_path / "run", idx), want) <= 1e-4
    source = load_file(tmp_path / "hf" / "model.safetensors")
    exported = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(exported) == sorted(source)
    assert all(torch.equal(exported[n], source[n]) for n in source)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["architectures"], config["do_layer_norm_before"],
            config["word_embed_proj_dim"], config["tie_word_embeddings"]) == \
        (["OPTForCausalLM"], *KINDS[name], True)
    family = type("Family", (), {"cls": "OPTForCausalLM"})
    back = from_pretrained(family, tmp_path / "out")
    with torch.no_grad():  # both loaded alike (the source above computes eagerly)
        assert torch.equal(back(idx).logits, from_pretrained(family, tmp_path / "hf")(idx).logits)


@pytest.mark.parametrize("name, changes, key", [
    ("OPT", {"_remove_final_layer_norm": True}, "_remove_final_layer_norm"),
    ("OPT", {"word_embed_proj_dim": 32}, "word_embed_proj_dim"),  # pre-LN, projected
    ("OPT", {"activation_function": "gelu"}, "activation_function"),
    ("OPT", {"enable_bias": False}, "enable_bias"),
    ("OPT", {"layer_norm_elementwise_affine": False}, "layer_norm_elementwise_affine"),
    ("OPTProjected", {"tie_word_embeddings": False}, "tie_word_embeddings"),
])
def test_a_config_neither_card_computes_is_refused(name, changes, key):
    """OPTConfig switches that change the math away from both cards are refused by name."""
    from cardc.interop import load_mappings, select_for_config
    from cardc.runtime.errors import RuntimeInputError

    config = config_of(name).to_dict()
    assert select_for_config(load_mappings(ROOT / "cards" / "opt.card"), config).card == name
    with pytest.raises(RuntimeInputError, match=key):
        select_for_config(load_mappings(ROOT / "cards" / "opt.card"), {**config, **changes})


def test_the_mapping_reads_what_an_opt_config_holds():
    """facebook/opt-125m's and opt-350m's config.json (their keys as published) read as the
    card's presets opt-125m and opt-350m: dropout, prefix and activation_dropout are harmless."""
    from cardc.interop import load_mappings, preset_from_config, select_for_config

    common = {"activation_dropout": 0.0, "activation_function": "relu",
              "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 2,
              "dropout": 0.1, "eos_token_id": 2, "init_std": 0.02, "layerdrop": 0.0,
              "max_position_embeddings": 2048, "model_type": "opt", "pad_token_id": 1,
              "prefix": "</s>", "torch_dtype": "float16", "use_cache": True,
              "vocab_size": 50272, "_remove_final_layer_norm": False}
    mappings = load_mappings(ROOT / "cards" / "opt.card")
    opt_125m = {"V": 50272, "D": 768, "H": 12, "D_f": 3072, "N": 12, "ctx": 2048, "v_pad": 2}
    opt_350m = {"V": 50272, "D": 1024, "D_e": 512, "H": 16, "D_f": 4096, "N": 24, "ctx": 2048,
                "v_pad": 2}
    for config, name, want in [
        ({**common, "do_layer_norm_before": True, "ffn_dim": 3072, "hidden_size": 768,
          "num_attention_heads": 12, "num_hidden_layers": 12, "word_embed_proj_dim": 768},
         "OPT", opt_125m),
        ({**common, "do_layer_norm_before": False, "ffn_dim": 4096, "hidden_size": 1024,
          "num_attention_heads": 16, "num_hidden_layers": 24, "word_embed_proj_dim": 512},
         "OPTProjected", opt_350m),
    ]:
        mapping = select_for_config(mappings, config)
        assert mapping.card == name
        assert preset_from_config(config, mapping) == want


@pytest.mark.parametrize("name, preset, kwargs", [
    ("OPT", "opt-125m", dict(hidden_size=768, num_hidden_layers=12, ffn_dim=3072,
                             num_attention_heads=12)),
    ("OPT", "opt-1.3b", dict(hidden_size=2048, num_hidden_layers=24, ffn_dim=8192,
                             num_attention_heads=32)),
    ("OPTProjected", "opt-350m", dict(hidden_size=1024, num_hidden_layers=24, ffn_dim=4096,
                                      num_attention_heads=16, word_embed_proj_dim=512,
                                      do_layer_norm_before=False)),
])
def test_the_presets_count_what_transformers_counts(name, preset, kwargs):
    """`cardc info --preset P` equals OPTForCausalLM's count on the meta device at P's config."""
    from test_interop import cardc

    cfg = transformers.OPTConfig(vocab_size=50272, max_position_embeddings=2048, **kwargs)
    with torch.device("meta"):
        hf = transformers.OPTForCausalLM(cfg)
    theirs = sum(p.numel() for p in hf.parameters())
    r = cardc("info", "cards/opt.card", "--name", name, "--preset", preset)
    assert r.returncode == 0, r.stderr
    assert f"parameters: {theirs:,}" in r.stdout


def test_a_tiny_opt_trains_and_samples(tmp_path, cli):
    """`cardc train cards/opt.card` trains it (val loss falls) and the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/opt.card", "--preset", "tiny", "--set", "D=32", "--set", "N=1",
              "--steps", "12", "--eval-every", "12", "--batch-size", "4", "--block-size", "16",
              "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training OPT (" in r.stdout
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr
    assert s.stdout.strip()
