"""Parity: the card-generated Mixtral equals Hugging Face's MixtralForCausalLM number for number.

A small randomly initialised MixtralForCausalLM (no download; 4 experts a layer, each token
through 2, grouped-query attention with 4 query and 2 key/value heads) is saved as a
checkpoint (each expert's w1, w3, w2 on their own) and read into the model
`cards/mixtral.card` compiles to through `cards/mixtral.hf.json`, whose index j counts the
experts. Logits and gradients must agree to fp32 rounding, import → export must give the
checkpoint back bit for bit, decoding through the KV cache must equal recomputation, and the
same weights with two experts swapped must not match.
"""

from __future__ import annotations

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

V, D, N, H, H_KV, HEAD, D_F, CTX, E, K, THETA, EPS = 101, 48, 2, 4, 2, 12, 40, 64, 4, 2, 1e4, 1e-5
B, T = 3, 17
MAPPING = load_mapping(ROOT / "cards" / "mixtral.card")
HYPERS = dict(V=V, D=D, H=H, H_kv=H_KV, d=HEAD, D_f=D_F, N=N, ctx=CTX, E=E, k=K, w=CTX, ε=EPS,
              θ_base=THETA)


def make_hf():
    config = transformers.MixtralConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        num_key_value_heads=H_KV, intermediate_size=D_F, max_position_embeddings=CTX,
        num_local_experts=E, num_experts_per_tok=K, rope_theta=THETA, rms_norm_eps=EPS,
        tie_word_embeddings=False, attention_dropout=0.0, sliding_window=None)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.MixtralForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the RMSNorm gains included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours():
    model = build_model(str(ROOT / "cards" / "mixtral.card"), None, HYPERS,
                        library=str(ROOT / "cards"))
    return model.float().eval()


def grad_pairs(hf, ours) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, HF's gradient, ours in HF's layout) for every parameter: transformers keeps each
    layer's experts fused, gate and up stacked as (E, 2 D_f, D), down as (E, D, D_f)."""
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
            saved = name.replace(".mlp.", ".block_sparse_moe.")
            entry = next(e for e in MAPPING.entries(N, {"j": E}) if e.hf == saved)
            g = mine[entry.card].grad
            theirs = g.T if entry.transpose else g
        out.append((name, p.grad, theirs))
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf = make_hf()
    folder = tmp_path_factory.mktemp("mixtral")
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
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


def test_swapped_experts_are_caught(pair):
    """A negative control: two experts of layer 0 exchanged (their router columns kept)."""
    hf, ours, _, idx = pair
    broken = make_ours()
    state = dict(ours.state_dict())
    for w in ("W_gate", "W_up", "W_down"):
        a, b = f"block.0.moe.theta.0.{w}", f"block.0.moe.theta.1.{w}"
        state[a], state[b] = state[b], state[a]
    broken.load_state_dict(state, strict=True)
    with torch.no_grad():
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"swapping two experts changed the logits by only {diff:.3e}"


def test_the_cache_equals_recomputation(pair):
    _, ours, _, idx = pair
    check_incremental_decoding(ours, [idx])


def test_import_then_export_gives_the_checkpoint_back_bit_for_bit(pair, tmp_path):
    from test_interop import cardc

    from cardc.runtime.checkpoint import read_checkpoint

    hf, _, saved, idx = pair
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/mixtral.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert read_checkpoint(tmp_path / "run")[0]["hyperparameters"]["E"] == E
    r = cardc("export", str(tmp_path / "run"), "--to", str(tmp_path / "back"))
    assert r.returncode == 0, r.stderr
    back = load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(back) == sorted(saved)
    assert all(torch.equal(back[k], saved[k]) for k in saved)
    again = transformers.MixtralForCausalLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():  # the export writes the window w = ctx, not null: another kernel
        assert max_diff(again(idx).logits, hf(idx).logits) <= 1e-5


def test_a_tiny_mixtral_trains_and_samples(tmp_path, cli):
    """`cardc train cards/mixtral.card` trains it (val loss falls) and the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/mixtral.card", "--preset", "tiny", "--set", "D=32", "--set", "d=8",
              "--set", "D_f=48", "--set", "N=1", "--steps", "12", "--eval-every", "12",
              "--batch-size", "4", "--block-size", "16", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training Mixtral (" in r.stdout
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr


@pytest.mark.parametrize("k", [0, E + 1])
def test_more_experts_a_token_than_a_layer_has_is_refused_by_name(pair, tmp_path, k):
    """A token goes through 1 to E experts: outside that the card's top-k set would hold every
    expert (or none) where transformers' top-k fails, so import refuses the key by name."""
    import json

    from test_interop import cardc

    hf = pair[0]
    hf.save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["num_experts_per_tok"] = k
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    r = cardc("import", "cards/mixtral.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 1, r.stderr
    assert "num_experts_per_tok" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()
