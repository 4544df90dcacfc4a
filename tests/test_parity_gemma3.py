"""Parity: the card-generated Gemma 3 equals Hugging Face's Gemma3ForCausalLM number for number.

A small randomly initialised Gemma3ForCausalLM (Gemma3TextConfig; no download) of 8 layers in
transformers' default pattern — five local layers (a sliding window of 5 positions over sequences
of 17, rotary base 10 000), one global layer (the whole context, rotary base 1 000 000), then two
local layers more — with grouped-query attention whose heads of width 16 are scaled by
query_pre_attn_scalar = 20, the per-head query and key RMSNorms, every parameter randomised (the
gains, stored less one, included), is copied into the model `cards/gemma3.card` compiles to,
through `cards/gemma3.hf.json`. Logits and gradients must agree to fp32 rounding; the same
weights without the window, with the two rotary bases exchanged, with one layer's query-norm
gains reset or with two query heads swapped must not. The card's model decodes through its KV
cache as full recomputation does, and import → export gives the source's tensors back bit for
bit.

The card stacks N_c = ⌊N/6⌋ periods of six layers (θ^cycle_ℓ: local.0 … local.4, then
global_) and the local layers after them (θ^tail_ℓ); the mapping names transformers' layer
6i + j as cycle.{i}.local.{j} (j < 5) or cycle.{i}.global_, and layer 6 N_c + m as tail.{m}.
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
N_C = N // 6  # one period of six layers, then two local layers
THETA_LOCAL, THETA_GLOBAL, SCALAR = 1e4, 1e6, 20
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
MAPPING = load_mapping(ROOT / "cards" / "gemma3.card")
KINDS = ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2


def make_config():
    config = transformers.Gemma3TextConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, head_dim=HEAD, intermediate_size=D_F,
        max_position_embeddings=CTX, sliding_window=WINDOW, query_pre_attn_scalar=SCALAR,
        rope_theta=THETA_GLOBAL, rope_local_base_freq=THETA_LOCAL, rms_norm_eps=EPS,
        tie_word_embeddings=True, attention_dropout=0.0, pad_token_id=PAD,
        bos_token_id=None, eos_token_id=None)
    assert config.layer_types == KINDS, config.layer_types
    assert config.attn_logit_softcapping is None and config.final_logit_softcapping is None
    return config


def make_hf():
    config = make_config()
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.Gemma3ForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains (stored less one) included
        for _, p in hf.named_parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(window: int = WINDOW, theta_local: float = THETA_LOCAL,
              theta_global: float = THETA_GLOBAL, v_pad: int = PAD + 1):  # IDs count from 1
    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, d=HEAD, D_f=D_F, N=N, N_c=N_C, ctx=CTX, w=window,
                  s=SCALAR, ε=EPS, θ_local=theta_local, θ_global=theta_global, v_pad=v_pad)
    model = build_model(str(ROOT / "cards" / "gemma3.card"), None, hypers,
                        library=str(ROOT / "cards"))
    return model.float().eval()


def load_through_mapping(hf, ours) -> dict[str, tuple[str, bool]]:
    """Copy every HF parameter into `ours` by the mapping, strictly: none left over, none
    missing. The tail's names read N_c (`{m + 6*N_c}`) and count N − 6 N_c members, so the
    mapping is sized by the model's hyperparameters first."""
    hypers = ours.card_meta["hyperparameters"]
    mapping = MAPPING.sized(hypers)
    entries = mapping.entries(mapping.layer_count(hypers), mapping.index_counts(hypers))
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
    assert table["model.layers.3.mlp.up_proj.weight"] == ("cycle.0.local.3.mlp.W_up", True)
    assert table["model.layers.5.self_attn.q_norm.weight"] == ("cycle.0.global_.attn.gamma_q",
                                                               False)
    assert table["model.layers.7.input_layernorm.weight"] == ("tail.1.gamma1", False)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    return hf, ours, table, idx


def test_logits_match(pair):
    hf, ours, _, idx = pair
    diff = logits_diff(hf, ours, idx, (B, T, V))
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, table, idx = pair
    diffs = next_token_grad_diffs(hf, ours, table, idx)
    assert {n for n in diffs if "q_norm" in n or "k_norm" in n}, "the head norms are compared"
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


@pytest.mark.parametrize("change", [
    dict(window=CTX), dict(theta_local=THETA_GLOBAL, theta_global=THETA_LOCAL),
    dict(theta_global=THETA_LOCAL)], ids=["no window", "bases exchanged", "one base"])
def test_what_makes_it_gemma3_matters(pair, change):
    """Negative controls: every layer global, or the local and global rotary bases confused,
    must break parity."""
    hf, ours, _, idx = pair
    broken = make_ours(**change)
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"{change} changed the logits by only {diff:.3e}"


def test_query_norm_gains_are_used(pair):
    """A negative control: resetting the global layer's query-head gains must break parity."""
    hf, ours, _, idx = pair
    broken = make_ours()
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        broken.cycle[0].global_.attn.gamma_q.zero_()
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"resetting q_norm changed the logits by only {diff:.3e}"


def test_swapped_query_heads_are_caught(pair):
    hf, ours, _, idx = pair
    broken = make_ours()
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        swap_columns(broken.tail[0].attn.W_q, 0, HEAD)
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
    """`cardc import` of a saved Gemma3ForCausalLM computes its logits; `cardc export` writes
    back the very tensors and a config.json transformers loads to the same logits."""
    from safetensors.torch import load_file
    from test_interop import logits_of_run, run_main

    hf = make_hf()
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
    assert config["layer_types"] == KINDS
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == THETA_LOCAL
    assert config["rope_parameters"]["full_attention"]["rope_theta"] == THETA_GLOBAL
    source_model = transformers.Gemma3ForCausalLM.from_pretrained(tmp_path / "hf").eval()
    back = transformers.Gemma3ForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert back.config.layer_types == KINDS
    with torch.no_grad():  # each as transformers loads it, the same attention kernel
        assert torch.equal(back(idx).logits, source_model(idx).logits)


@pytest.mark.parametrize("change, named", [
    ({"layer_types": ["sliding_attention", "full_attention"] * 4}, "layer_types"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"sliding_window_pattern": 2}, "sliding_window_pattern"),
])
def test_import_refuses_what_the_card_does_not_compute(tmp_path, capsys, change, named):
    """Another layer pattern or a soft cap is refused by name, not imported silently wrong."""
    from test_interop import run_main

    make_hf().save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    code, _, err = run_main(capsys, "import", "cards/gemma3.card", "--from", str(tmp_path / "hf"),
                            "--out", str(tmp_path / "run"))
    assert code == 1 and named in err, err


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
