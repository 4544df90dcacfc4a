"""Parity: the card-generated Qwen2-MoE equals Hugging Face's Qwen2MoeForCausalLM number for number.

A small randomly initialised Qwen2MoeForCausalLM (no download; 4 routed experts a layer, each
token through 2, a shared expert of its own width behind a sigmoid gate, grouped-query attention
with biased q, k, v) is saved as a checkpoint (each expert's gate_proj, up_proj, down_proj on
their own) and read into the model `cards/qwen2moe.card` compiles to through
`cards/qwen2moe.hf.json`. Logits and gradients must agree to fp32 rounding, import → export must
give the checkpoint back bit for bit, decoding through the KV cache must equal recomputation, the
shared expert must count, and configs the card does not compute are refused by name.
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
from cardc.interop import load_mapping, to_card_state  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, H_KV, CTX, E, K, D_F, D_S, THETA, EPS = 101, 48, 2, 4, 2, 64, 4, 2, 40, 56, 1e4, 1e-6
B, T = 3, 17
MAPPING = load_mapping(ROOT / "cards" / "qwen2moe.card")
HYPERS = dict(V=V, D=D, H=H, H_kv=H_KV, N=N, ctx=CTX, E=E, k=K, D_f=D_F, D_s=D_S, ε=EPS,
              θ_base=THETA)


def make_config(**changes):
    settings = dict(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, intermediate_size=64, moe_intermediate_size=D_F,
        shared_expert_intermediate_size=D_S, max_position_embeddings=CTX, num_experts=E,
        num_experts_per_tok=K, rope_theta=THETA, rms_norm_eps=EPS, tie_word_embeddings=False,
        attention_dropout=0.0)
    settings.update(changes)
    return transformers.Qwen2MoeConfig(**settings)


def make_hf(**changes):
    config = make_config(**changes)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.Qwen2MoeForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(name: str | None = None):
    model = build_model(str(ROOT / "cards" / "qwen2moe.card"), None, HYPERS,
                        library=str(ROOT / "cards"), name=name)
    return model.float().eval()


def grad_pairs(hf, ours) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, HF's gradient, ours in HF's layout) for every parameter: transformers keeps each
    layer's routed experts fused, gate and up stacked as (E, 2 D_f, D), down as (E, D, D_f)."""
    mine = dict(ours.named_parameters())
    out = []
    for name, p in hf.named_parameters():
        i = name.split(".")[2] if name.startswith("model.layers.") else None
        if name.endswith("experts.gate_up_proj"):
            theirs = torch.stack([torch.cat([mine[f"block.{i}.moe.theta.{j}.W_gate"].grad.T,
                                             mine[f"block.{i}.moe.theta.{j}.W_up"].grad.T])
                                  for j in range(E)])
        elif name.endswith("experts.down_proj"):
            theirs = torch.stack([mine[f"block.{i}.moe.theta.{j}.W_down"].grad.T
                                  for j in range(E)])
        else:
            entry = next(e for e in MAPPING.entries(N, {"j": E}) if e.hf == name)
            g = mine[entry.card].grad
            theirs = g.T if entry.transpose else g.reshape(p.shape)
        out.append((name, p.grad, theirs))
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf = make_hf()
    folder = tmp_path_factory.mktemp("qwen2moe")
    hf.save_pretrained(folder)
    saved = load_file(folder / "model.safetensors")
    ours = make_ours()
    state = to_card_state(MAPPING, saved, ours.state_dict(), N, ours.card_meta["hyperparameters"])
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
    diffs = {name: max_diff(a, b) for name, a, b in grad_pairs(hf, ours)}
    assert len(diffs) == len(dict(ours.named_parameters())) - N * (3 * E - 2)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


def test_the_shared_expert_and_its_gate_count(pair):
    """Negative controls: the shared expert's gate negated, or its down projection zeroed."""
    hf, ours, _, idx = pair
    with torch.no_grad():
        want = hf(idx).logits
    for name, change in (("block.0.moe.w_s", torch.neg), ("block.1.moe.s.W_down", torch.zeros_like)):
        broken = make_ours()
        state = dict(ours.state_dict())
        state[name] = change(state[name])
        broken.load_state_dict(state, strict=True)
        with torch.no_grad():
            diff = max_diff(broken(idx), want)
        assert diff > 1e-3, f"changing {name} changed the logits by only {diff:.3e}"


def test_the_cache_equals_recomputation(pair):
    _, ours, _, idx = pair
    check_incremental_decoding(ours, [idx])


def test_import_then_export_gives_the_checkpoint_back_bit_for_bit(pair, tmp_path):
    from test_interop import cardc

    from cardc.runtime.checkpoint import read_checkpoint

    hf, _, saved, idx = pair
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/qwen2moe.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert read_checkpoint(tmp_path / "run")[0]["hyperparameters"]["D_s"] == D_S
    r = cardc("export", str(tmp_path / "run"), "--to", str(tmp_path / "back"))
    assert r.returncode == 0, r.stderr
    back = load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(back) == sorted(saved)
    assert all(torch.equal(back[k], saved[k]) for k in saved)
    again = transformers.Qwen2MoeForCausalLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert max_diff(again(idx).logits, hf(idx).logits) <= 1e-5


def test_renormalised_routing_is_the_variant_import_picks(tmp_path):
    """norm_topk_prob true: import picks Qwen2MoENormalized, whose logits match (the default card
    on the same weights does not: the weights of the chosen experts then differ), and export
    writes the switch back with the checkpoint bit for bit."""
    from test_interop import cardc

    from cardc.runtime.checkpoint import read_checkpoint

    hf = make_hf(norm_topk_prob=True)
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/qwen2moe.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert read_checkpoint(tmp_path / "run")[0]["name"] == "Qwen2MoENormalized"
    saved = load_file(tmp_path / "hf" / "model.safetensors")
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = hf(idx).logits
    diffs = {}
    for name in ("Qwen2MoENormalized", "Qwen2MoE"):
        ours = make_ours(name)
        mapping = load_mapping(ROOT / "cards" / "qwen2moe.card", name)
        ours.load_state_dict(to_card_state(mapping, saved, ours.state_dict(), N,
                                           ours.card_meta["hyperparameters"]), strict=True)
        with torch.no_grad():
            diffs[name] = max_diff(ours(idx), want)
    assert diffs["Qwen2MoENormalized"] <= 1e-4, diffs
    assert diffs["Qwen2MoE"] > 1e-3, diffs
    r = cardc("export", str(tmp_path / "run"), "--to", str(tmp_path / "back"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "back" / "config.json").read_text())["norm_topk_prob"] is True
    back = load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(back) == sorted(saved) and all(torch.equal(back[k], saved[k]) for k in saved)


@pytest.mark.parametrize("key,value", [
    ("decoder_sparse_step", 2),
    ("mlp_only_layers", [1]),
    ("qkv_bias", False),
    ("num_experts_per_tok", E + 1),
])
def test_configs_the_card_does_not_compute_are_refused_by_name(pair, tmp_path, key, value):
    """Layers that differ (dense MLP layers between sparse ones), unbiased projections, and
    more experts a token than a layer has (transformers' top-k cannot take them)."""
    from test_interop import cardc

    hf, _, _, _ = pair
    hf.save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config[key] = value
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    r = cardc("import", "cards/qwen2moe.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode != 0
    assert key in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def test_a_tiny_qwen2moe_trains_and_samples(tmp_path, cli):
    """`cardc train cards/qwen2moe.card` trains it (val loss falls) and the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/qwen2moe.card", "--preset", "tiny", "--set", "D=32",
              "--set", "D_f=24", "--set", "D_s=48", "--set", "N=1", "--steps", "12",
              "--eval-every", "12", "--batch-size", "4", "--block-size", "16",
              "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training Qwen2MoE (" in r.stdout
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr
