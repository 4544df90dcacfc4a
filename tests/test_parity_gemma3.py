"""Parity: the card-generated Gemma 3 equals Hugging Face's Gemma3ForCausalLM number for number.

A small randomly initialised Gemma3ForCausalLM (Gemma3TextConfig; no download) of 8 layers in
the pattern of period 3 (`sliding_window_pattern` = 3): layers 3 and 6 (from 1) global, over the
whole context with rotary base 1 000 000, the six others local, over a sliding window of 5
positions in sequences of 17 with rotary base 10 000, so that each kind occurs more than once and
a local layer follows the last global one. Grouped-query attention whose heads of width 16 are
scaled by query_pre_attn_scalar = 20, the per-head query and key RMSNorms, every parameter
randomised (the gains, stored less one, included), is copied into the model `cards/gemma3.card`
compiles to, through `cards/gemma3.hf.json`. Logits and gradients must agree to fp32 rounding;
the same weights without the window, with every layer local, with another period, with the two
rotary bases exchanged, with one layer's query-norm gains reset or with two query heads swapped
must not. The card's model decodes through its KV cache as full recomputation does.

The card is one loop over its N layers, `Gemma3Block(E | θ^block_ℓ, θ_base = …, w = …)`, each
block built with the window and rotary base its index ℓ gives (global where p divides ℓ); the
mapping names transformers' layer i as the card's block.{i}. The mapping's `layer_types` check
is a literal cycle of period 6 and cannot follow p, so import and export take p = 6 only: the
import → export round trip is of a model of transformers' default period (8 layers: five local,
one global, two local), and a checkpoint of period 3 is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from decodecheck import check_incremental_decoding  # noqa: E402
from parity import (  # noqa: E402
    logits_diff,
    max_diff,
    next_token_grad_diffs,
    padding_row_grad_diff,
    swap_columns,
)

from cardc.build import build_model  # noqa: E402
from cardc.interop import load_mapping  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, H_KV, HEAD, D_F, CTX, WINDOW, EPS = 101, 48, 8, 4, 2, 16, 96, 64, 5, 1e-6
PERIOD = 3  # layers 3 and 6 (from 1) global: each kind more than once, a local one last
THETA_LOCAL, THETA_GLOBAL, SCALAR = 1e4, 1e6, 20
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
MAPPING = load_mapping(ROOT / "cards" / "gemma3.card")


def kinds(period: int) -> list[str]:
    """transformers' default layer_types: layer i (from 0) is full attention when (i + 1) %
    period == 0."""
    return ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(N)]


KINDS = kinds(PERIOD)
assert KINDS.count("full_attention") == 2 and KINDS[-1] == "sliding_attention"


def make_config(period: int = PERIOD):
    config = transformers.Gemma3TextConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, head_dim=HEAD, intermediate_size=D_F,
        max_position_embeddings=CTX, sliding_window=WINDOW, query_pre_attn_scalar=SCALAR,
        rope_theta=THETA_GLOBAL, rope_local_base_freq=THETA_LOCAL, rms_norm_eps=EPS,
        tie_word_embeddings=True, attention_dropout=0.0, pad_token_id=PAD,
        bos_token_id=None, eos_token_id=None, sliding_window_pattern=period)
    assert config.layer_types == kinds(period), config.layer_types
    assert config.attn_logit_softcapping is None and config.final_logit_softcapping is None
    return config


def make_hf(period: int = PERIOD):
    config = make_config(period)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.Gemma3ForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains (stored less one) included
        for _, p in hf.named_parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(window: int = WINDOW, theta_local: float = THETA_LOCAL,
              theta_global: float = THETA_GLOBAL, v_pad: int = PAD + 1,  # IDs count from 1
              period: int = PERIOD):
    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, d=HEAD, D_f=D_F, N=N, p=period, ctx=CTX, w=window,
                  s=SCALAR, ε=EPS, θ_local=theta_local, θ_global=theta_global, v_pad=v_pad)
    model = build_model(str(ROOT / "cards" / "gemma3.card"), None, hypers,
                        library=str(ROOT / "cards"))
    return model.float().eval()


def load_through_mapping(hf, ours) -> dict[str, tuple[str, bool]]:
    """Copy every HF parameter into `ours` by the mapping, strictly: none left over, none
    missing."""
    entries = MAPPING.entries(MAPPING.layer_count(ours.card_meta["hyperparameters"]))
    table = {e.hf: (e.card, e.transpose) for e in entries}
    hf_params = dict(hf.named_parameters(remove_duplicate=False))
    assert set(hf_params) == set(table) | set(MAPPING.tied), set(hf_params) ^ set(table)
    ours.load_state_dict({mine: (hf_params[name].detach().T if t else hf_params[name].detach())
                          .clone() for name, (mine, t) in table.items()}, strict=True)
    return table


@pytest.fixture(scope="module")
def pair():
    hf, ours = make_hf(), make_ours()
    table = load_through_mapping(hf, ours)
    assert table["model.layers.3.mlp.up_proj.weight"] == ("block.3.mlp.W_up", True)
    assert table["model.layers.5.self_attn.q_norm.weight"] == ("block.5.attn.gamma_q", False)
    assert table["model.layers.7.input_layernorm.weight"] == ("block.7.gamma1", False)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    return hf, ours, table, idx


def test_each_layer_is_built_as_transformers_layer_types_says(pair):
    """Block i (from 0) has the whole context as its window and θ_global as its base exactly
    where transformers' layer i is full attention; and the rotary bases transformers computes
    are those."""
    hf, ours, _, _ = pair
    want = [(CTX, THETA_GLOBAL) if k == "full_attention" else (WINDOW, THETA_LOCAL)
            for k in KINDS]
    assert [(b.w, b.theta_base) for b in ours.block] == want
    assert [(a.layer_type, a.sliding_window) for a in (x.self_attn for x in hf.model.layers)] \
        == [(k, WINDOW if k == "sliding_attention" else None) for k in KINDS]


def test_logits_match(pair):
    hf, ours, _, idx = pair
    diff = logits_diff(hf, ours, idx, (B, T, V))
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, table, idx = pair
    diffs = next_token_grad_diffs(hf, ours, table, idx)
    assert {n for n in diffs if "q_norm" in n or "k_norm" in n}, "the head norms are compared"
    assert {n.split(".")[2] for n in diffs if n.startswith("model.layers.")} == \
        {str(i) for i in range(N)}, "every layer's gradients are compared"
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


@pytest.mark.parametrize("change", [
    dict(window=CTX), dict(period=N + 1), dict(period=6), dict(period=2),
    dict(theta_local=THETA_GLOBAL, theta_global=THETA_LOCAL), dict(theta_global=THETA_LOCAL)],
    ids=["no window", "every layer local", "period 6", "period 2", "bases exchanged", "one base"])
def test_what_makes_it_gemma3_matters(pair, change):
    """Negative controls: every layer global or every layer local, the global layers elsewhere,
    or the local and global rotary bases confused, must break parity."""
    hf, ours, _, idx = pair
    broken = make_ours(**change)
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"{change} changed the logits by only {diff:.3e}"


@pytest.mark.parametrize("layer", [2, 5], ids=["first global", "second global"])
def test_query_norm_gains_are_used(pair, layer):
    """A negative control: resetting a global layer's query-head gains must break parity."""
    hf, ours, _, idx = pair
    assert KINDS[layer] == "full_attention"
    broken = make_ours()
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        broken.block[layer].attn.gamma_q.zero_()
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"resetting q_norm changed the logits by only {diff:.3e}"


def test_swapped_query_heads_are_caught(pair):
    """A negative control: two query heads of the last (local) layer swapped."""
    hf, ours, _, idx = pair
    broken = make_ours()
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        swap_columns(broken.block[N - 1].attn.W_q, 0, HEAD)
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"swapping query heads changed the logits by only {diff:.3e}"


def test_a_card_without_the_padding_row_is_caught(pair):
    """A negative control: with v_pad = 0 the pad row takes a gradient transformers does not."""
    hf, ours, table, idx = pair
    diff = padding_row_grad_diff(hf, ours, make_ours(v_pad=0), table, idx)
    assert diff > 1e-3, "a card without the padding row matched its gradient"


def test_cached_decoding_equals_recomputation(pair):
    """Through new_cache(), fed in chunks past the window: the logits of one full forward, and
    the same greedy tokens; and the cache's logits are transformers' too."""
    hf, ours, _, idx = pair
    assert hasattr(ours, "new_cache")
    check_incremental_decoding(ours, [idx])
    with torch.no_grad():
        cache = ours.new_cache()
        rows = torch.cat([ours(idx[:, a:b], cache=cache) for a, b in ((0, 7), (7, 8), (8, T))], 1)
        diff = max_diff(rows, hf(idx).logits)
    assert diff <= 1e-4, f"max |cached logits diff| = {diff:.3e}"


def test_import_then_export_is_bit_exact(tmp_path, capsys):
    """`cardc import` of a saved Gemma3ForCausalLM of transformers' default period computes its
    logits; `cardc export` writes back the very tensors and a config.json transformers loads to
    the same logits."""
    from safetensors.torch import load_file
    from test_interop import logits_of_run, run_main

    hf = make_hf(period=6)
    hf.save_pretrained(tmp_path / "hf")
    code, _, err = run_main(capsys, "import", "cards/gemma3.card", "--from", str(tmp_path / "hf"),
                            "--out", str(tmp_path / "run"))
    assert code == 0, err
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD
    with torch.no_grad():
        want = hf(idx).logits
        diff = max_diff(logits_of_run(tmp_path / "run", idx), want)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"

    code, out, err = run_main(capsys, "export", str(tmp_path / "run"), "--to",
                              str(tmp_path / "back"))
    assert code == 0, err
    assert "as Gemma3ForCausalLM" in out
    source = load_file(tmp_path / "hf" / "model.safetensors")
    exported = load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(exported) == sorted(source)
    changed = [n for n in source if not torch.equal(exported[n], source[n])]
    assert not changed, f"changed by import → export: {changed}"
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["layer_types"] == kinds(6)
    assert config["sliding_window_pattern"] == config["_sliding_window_pattern"] == 6
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == THETA_LOCAL
    assert config["rope_parameters"]["full_attention"]["rope_theta"] == THETA_GLOBAL
    source_model = transformers.Gemma3ForCausalLM.from_pretrained(tmp_path / "hf").eval()
    back = transformers.Gemma3ForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert back.config.layer_types == kinds(6)
    with torch.no_grad():  # each as transformers loads it, the same attention kernel
        assert torch.equal(back(idx).logits, source_model(idx).logits)


@pytest.mark.parametrize("change, named", [
    ({"layer_types": ["sliding_attention", "full_attention"] * 4}, "layer_types"),
    ({"layer_types": kinds(6)[:7] + ["full_attention"]}, "layer_types"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"sliding_window_pattern": 2}, "sliding_window_pattern"),
    ({"_sliding_window_pattern": 2}, "_sliding_window_pattern"),
])
def test_import_refuses_what_the_card_does_not_compute(tmp_path, capsys, change, named):
    """Another layer pattern or a soft cap is refused by name, not imported silently wrong."""
    from test_interop import run_main

    make_hf(period=6).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    code, _, err = run_main(capsys, "import", "cards/gemma3.card", "--from", str(tmp_path / "hf"),
                            "--out", str(tmp_path / "run"))
    assert code == 1 and named in err, err


def test_a_checkpoint_of_another_period_is_refused(tmp_path, capsys):
    """A model transformers saved with sliding_window_pattern = 3 (its layer_types written out)
    is one the card computes (the parity above), but the mapping's layer_types is a cycle of
    period 6: import refuses it, by name, rather than reading it wrong."""
    from test_interop import run_main

    make_hf().save_pretrained(tmp_path / "hf")
    code, _, err = run_main(capsys, "import", "cards/gemma3.card", "--from", str(tmp_path / "hf"),
                            "--out", str(tmp_path / "run"))
    assert code == 1 and "layer_types" in err, err


def test_another_period_is_refused_by_name_on_import_and_export(pair, tmp_path):
    """Where layer_types is left to transformers' default, sliding_window_pattern = 3 is refused
    naming it; and a card model of period 3 is not exported with layer_types of period 6."""
    from cardc.interop import preset_from_config
    from cardc.interop.transfer import write_model_hf
    from cardc.runtime.errors import RuntimeInputError

    config = {**make_config().to_dict(), "layer_types": None, "_sliding_window_pattern": 3}
    with pytest.raises(RuntimeInputError, match="sliding_window_pattern = 3"):
        preset_from_config(config, MAPPING)
    _, ours, _, _ = pair
    with pytest.raises(RuntimeInputError, match="p = 3"):
        write_model_hf(MAPPING, ours.state_dict(), ours.card_meta["hyperparameters"],
                       tmp_path / "back")
    assert not (tmp_path / "back" / "config.json").exists()


GEMMA3_270M = {  # google/gemma-3-270m's config.json, as transformers 4.55 wrote it
    "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False, "attention_dropout": 0.0, "attn_logit_softcapping": None,
    "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "initializer_range": 0.02,
    "intermediate_size": 2048, "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
    "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
    "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 512,
    "torch_dtype": "bfloat16", "transformers_version": "4.55.0.dev0",
    "use_bidirectional_attention": False, "use_cache": True, "vocab_size": 262144}
GEMMA3_1B = {  # google/gemma-3-1b-pt's config.json: 26 layers, the last two after a global one
    **{k: v for k, v in GEMMA3_270M.items() if k not in ("layer_types", "_sliding_window_pattern")},
    "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
    "sliding_window_pattern": 6, "transformers_version": "4.50.0.dev0"}


@pytest.mark.parametrize("preset, config, count", [
    ("gemma3-270m", GEMMA3_270M, 268_098_176), ("gemma3-1b", GEMMA3_1B, 999_885_952)])
def test_the_presets_are_the_published_models(preset, config, count):
    """The mapping reads each published config.json as the preset's sizes, and `cardc info
    --preset` counts what Gemma3ForCausalLM counts on the meta device at that config."""
    from test_interop import cardc

    from cardc.interop import preset_from_config

    r = cardc("info", "cards/gemma3.card", "--preset", preset)
    assert r.returncode == 0, r.stderr
    line = r.stdout.split("hyperparameters: ")[1].splitlines()[0]
    card = {k: float(v) for k, v in (item.split(" = ") for item in line.split(", "))}
    hypers = preset_from_config(config, MAPPING)
    assert {k: float(v) for k, v in hypers.items() if k != "v_pad"} == \
        {k: v for k, v in card.items() if k != "v_pad"}
    assert hypers["p"] == 6 and hypers["v_pad"] == 1  # pad_token_id 0; the preset has none
    cfg = transformers.Gemma3TextConfig(**config)
    with torch.device("meta"):
        hf = transformers.Gemma3ForCausalLM(cfg)
    theirs = sum(p.numel() for p in hf.parameters())
    assert theirs == count
    assert f"parameters: {theirs:,}" in r.stdout


def test_a_tiny_gemma3_trains_and_samples(tmp_path, cli):
    """`cardc train cards/gemma3.card` trains it (val loss falls); the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/gemma3.card", "--preset", "tiny", "--set", "D=32", "--set", "d=8",
              "--set", "s=8", "--set", "D_f=64", "--set", "N=7", "--set", "w=6",
              "--steps", "12", "--eval-every", "12", "--batch-size", "4", "--block-size", "16",
              "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training Gemma3 (" in r.stdout  # whichever recipe trains it
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr
