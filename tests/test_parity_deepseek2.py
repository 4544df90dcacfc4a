"""Parity: the card-generated DeepSeek-V2 equals Hugging Face's DeepseekV2ForCausalLM number for
number.

A small randomly initialised DeepseekV2ForCausalLM (no download; three layers, the first with
a dense MLP, the others 4 routed experts a layer, each token through 2, beside shared experts;
latent attention with a rotary part on interleaved pairs) is saved as a checkpoint and read
into the model `cards/deepseek2.card` compiles to through `cards/deepseek2.hf.json`, whose
index m counts the expert layers after the dense ones and j their experts. Logits and
gradients must agree to fp32 rounding, import → export must give the checkpoint back bit for
bit, decoding through the cache must equal recomputation with the cache holding the latent
and the shared rotary key alone, and configs the card cannot represent are refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from decodecheck import check_incremental_decoding  # noqa: E402
from parity import max_diff  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from cardc.build import build_model  # noqa: E402
from cardc.interop import (  # noqa: E402
    from_card_state,
    load_mapping,
    preset_from_config,
    to_card_state,
)
from cardc.runtime.errors import RuntimeInputError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, N_D, H, D_F, CTX, E, K, D_E, SHARED = 101, 48, 3, 1, 4, 40, 64, 4, 2, 12, 2
D_N, D_R, D_V, D_C, THETA, EPS, RHO = 8, 4, 6, 16, 1e4, 1e-5, 1.5
B, T = 3, 17
MAPPING = load_mapping(ROOT / "cards" / "deepseek2.card")
HYPERS = dict(V=V, D=D, H=H, N=N, N_d=N_D, ctx=CTX, d_n=D_N, d_r=D_R, d_v=D_V, D_c=D_C, D_f=D_F,
              E=E, k=K, D_e=D_E, D_s=SHARED * D_E, ε=EPS, ρ=RHO, θ_base=THETA)


def config(**changes):
    settings = dict(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, first_k_dense_replace=N_D,
        num_attention_heads=H, num_key_value_heads=H, intermediate_size=D_F,
        moe_intermediate_size=D_E, max_position_embeddings=CTX, n_routed_experts=E,
        num_experts_per_tok=K, n_shared_experts=SHARED, routed_scaling_factor=RHO,
        kv_lora_rank=D_C, q_lora_rank=None, qk_nope_head_dim=D_N, qk_rope_head_dim=D_R,
        v_head_dim=D_V, rope_theta=THETA, rms_norm_eps=EPS, tie_word_embeddings=False,
        attention_dropout=0.0)
    return transformers.DeepseekV2Config(**{**settings, **changes})


def make_hf():
    cfg = config()
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.DeepseekV2ForCausalLM(cfg).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours():
    model = build_model(str(ROOT / "cards" / "deepseek2.card"), None, HYPERS,
                        library=str(ROOT / "cards"))
    return model.float().eval()


def hf_grads(hf) -> dict[str, torch.Tensor]:
    """HF's gradients under its checkpoint's names: transformers keeps each layer's experts
    fused, gate and up stacked as (E, 2 D_e, D), down as (E, D, D_e)."""
    out = {}
    for name, p in hf.named_parameters():
        stem = name.rsplit(".", 1)[0]
        if name.endswith("experts.gate_up_proj"):
            for j in range(E):
                out[f"{stem}.{j}.gate_proj.weight"] = p.grad[j, :D_E]
                out[f"{stem}.{j}.up_proj.weight"] = p.grad[j, D_E:]
        elif name.endswith("experts.down_proj"):
            for j in range(E):
                out[f"{stem}.{j}.down_proj.weight"] = p.grad[j]
        else:
            out[name] = p.grad
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf = make_hf()
    folder = tmp_path_factory.mktemp("deepseek2")
    hf.save_pretrained(folder)
    saved = load_file(folder / "model.safetensors")
    ours = make_ours()
    state = to_card_state(MAPPING, saved, ours.state_dict(), N_D,
                          ours.card_meta["hyperparameters"])
    ours.load_state_dict(state, strict=True)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    return hf, ours, saved, idx


def test_logits_match(pair):
    hf, ours, _, idx = pair
    with torch.no_grad():
        want, got = hf(idx).logits, ours(idx)
    assert got.shape == want.shape == (B, T, V)
    diff = max_diff(got, want)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, _, idx = pair
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    hf(idx, labels=idx).loss.backward()
    ours(idx[:, :-1], idx[:, 1:])[1].backward()
    mine = from_card_state(MAPPING, {n: p.grad for n, p in ours.named_parameters()}, N_D,
                           ours.card_meta["hyperparameters"])
    theirs = hf_grads(hf)
    assert sorted(mine) == sorted(theirs)
    diffs = {name: max_diff(mine[name], theirs[name]) for name in theirs}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


def test_the_rotary_pairs_are_interleaved(pair):
    """A negative control: the rotary key's columns of layer 0 in rotate-half order (the
    permutation that would turn HF's pairs into halves), queries untouched, change the logits."""
    hf, ours, _, idx = pair
    broken = make_ours()
    state = dict(ours.state_dict())
    w = state["dense.0.attn.W_kr"]
    state["dense.0.attn.W_kr"] = torch.cat([w[:, 0::2], w[:, 1::2]], dim=1)
    broken.load_state_dict(state, strict=True)
    with torch.no_grad():
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"permuting the rotary key changed the logits by only {diff:.3e}"


def test_the_cache_equals_recomputation(pair):
    _, ours, _, idx = pair
    check_incremental_decoding(ours, [idx])


def test_import_then_export_gives_the_checkpoint_back_bit_for_bit(pair, tmp_path):
    from test_interop import cardc

    from cardc.runtime.checkpoint import read_checkpoint

    hf, _, saved, idx = pair
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/deepseek2.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    hypers = read_checkpoint(tmp_path / "run")[0]["hyperparameters"]
    assert (hypers["N_d"], hypers["D_s"], hypers["E"]) == (N_D, SHARED * D_E, E)
    r = cardc("export", str(tmp_path / "run"), "--to", str(tmp_path / "back"))
    assert r.returncode == 0, r.stderr
    back = load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(back) == sorted(saved)
    assert all(torch.equal(back[k], saved[k]) for k in saved)
    exported = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (exported["first_k_dense_replace"], exported["n_shared_experts"]) == (N_D, SHARED)
    again = transformers.DeepseekV2ForCausalLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert max_diff(again(idx).logits, hf(idx).logits) <= 1e-5


def test_the_config_gives_the_card_its_sizes():
    hypers = preset_from_config(json.loads(config().to_json_string()), MAPPING)
    assert hypers == {**HYPERS, "v_pad": 0}


@pytest.mark.parametrize("change, key", [
    (dict(q_lora_rank=8), "q_lora_rank"),
    (dict(topk_method="group_limited_greedy", n_group=2, topk_group=1), "topk_method"),
    (dict(norm_topk_prob=True), "norm_topk_prob"),
    (dict(num_key_value_heads=2), "num_key_value_heads"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": THETA, "factor": 4.0,
                           "original_max_position_embeddings": 16}), "rope_type"),
])
def test_configs_the_card_cannot_represent_are_refused_by_name(change, key):
    with pytest.raises(RuntimeInputError, match=key):
        preset_from_config(json.loads(config(**change).to_json_string()), MAPPING)


def test_the_cache_holds_the_latent_and_the_rotary_key_alone(pair):
    """Per token and layer the cache keeps D_c + d_r numbers (the latent, then the shared
    rotary key), not the H (d_n + d_r) + H d_v of every head's keys and values: the values
    are read from the keys' first D_c columns."""
    _, ours, _, idx = pair
    cache = ours.new_cache()
    with torch.no_grad():
        ours(idx, cache=cache)
    assert len(cache.kv) == N
    held = sum(K.numel() + V.numel() for K, V in cache.kv.values())
    assert held == N * B * T * (D_C + D_R)
    assert all(K.shape == (B, 1, T, D_C + D_R) for K, _ in cache.kv.values())


def test_a_tiny_deepseek2_trains_and_samples(tmp_path, cli):
    """`cardc train cards/deepseek2.card` trains it (val loss falls) and the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/deepseek2.card", "--preset", "tiny", "--set", "D=32", "--set",
              "N=2", "--set", "d_n=8", "--set", "d_r=4", "--set", "d_v=8", "--set", "D_c=16",
              "--set", "D_f=48", "--set", "D_e=16", "--set", "D_s=32", "--steps", "12",
              "--eval-every", "12", "--batch-size", "4", "--block-size", "16",
              "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training DeepSeek2 (" in r.stdout
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr
