"""The recurrent family, cards/recurrent.card: a decoder whose token mixer is a gated diagonal
linear recurrence (RecurrentLM). No library peer implements it, so the reference is written
here in plain PyTorch, position by position, from the card's math; the generated module
(a scan, no Python loop over positions) must give its logits and gradients within 1e-4 in
float32, decode through its cache as recomputation does, and train."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import cardc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decodecheck import check_incremental_decoding  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIZES = dict(V=97, D=32, D_h=24, D_f=40, N=2)
EPS = 1e-5


def rms_norm(x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * gamma


def reference(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """The card's math written out: embeddings, then per block an RMSNorm, the recurrence
    h_t = a_t ⊙ h_{t−1} + (1 − a_t) ⊙ u_t one position at a time read through a SiLU gate,
    an RMSNorm and a SwiGLU MLP, each added to the residual; a final RMSNorm and the tied
    unembedding."""
    E = p["W_e"][x]
    for n in range(SIZES["N"]):
        q = {k.split(".", 2)[2]: v for k, v in p.items() if k.startswith(f"block.{n}.")}
        Z = rms_norm(E, q["gamma1"])
        A = torch.sigmoid(Z @ q["rec.W_a"] + q["rec.b_a"])
        U, G = Z @ q["rec.W_u"], F.silu(Z @ q["rec.W_g"])
        h, rows = torch.zeros(x.shape[0], SIZES["D_h"]), []
        for t in range(x.shape[1]):
            h = A[:, t] * h + (1 - A[:, t]) * U[:, t]
            rows.append(h * G[:, t])
        E = E + torch.stack(rows, 1) @ q["rec.W_o"]
        Z = rms_norm(E, q["gamma2"])
        E = E + (F.silu(Z @ q["mlp.W_gate"]) * (Z @ q["mlp.W_up"])) @ q["mlp.W_down"]
    return rms_norm(E, p["gamma_f"]) @ p["W_e"].T


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = cardc.model(str(ROOT / "cards" / "recurrent.card"), preset="tiny", **SIZES)
    with torch.no_grad():  # gains, gates and biases far from their initial values
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m.eval()


def test_logits_and_gradients_match_a_plain_pytorch_reference(model):
    x = torch.randint(0, SIZES["V"], (3, 20), generator=torch.Generator().manual_seed(1))
    params = dict(model.named_parameters())
    assert len(params) == 2 + SIZES["N"] * 10
    ours, theirs = model(x), reference(x, params)
    assert (ours - theirs).abs().max().item() <= 1e-4
    targets = x.roll(-1, 1)
    loss_ours = F.cross_entropy(ours.flatten(0, 1), targets.flatten())
    loss_theirs = F.cross_entropy(theirs.flatten(0, 1), targets.flatten())
    names = list(params)
    g_ours = torch.autograd.grad(loss_ours, list(params.values()))
    g_theirs = torch.autograd.grad(loss_theirs, list(params.values()))
    for name, a, b in zip(names, g_ours, g_theirs, strict=True):
        assert (a - b).abs().max().item() <= 1e-4, name
        assert b.abs().max().item() > 0, name  # every parameter is reached


def test_a_changed_gate_is_caught(model):
    """A negative control: the reference with the decay and its complement swapped differs."""
    x = torch.randint(0, SIZES["V"], (2, 12), generator=torch.Generator().manual_seed(2))
    params = dict(model.named_parameters())
    swapped = {k: -v if k.endswith("rec.W_a") or k.endswith("rec.b_a") else v
               for k, v in params.items()}  # σ(−z) = 1 − σ(z)
    with torch.no_grad():
        assert (model(x) - reference(x, swapped)).abs().max().item() > 1e-2


def test_the_forward_is_a_scan_and_the_cache_carries_the_state(model):
    assert model.analysis.decodes and model.analysis.causal
    source = (ROOT / "generated" / "recurrentlm.py").read_text(encoding="utf-8")
    assert "linear_scan(" in source and "cache.resume(" in source and "cache.hold(" in source
    x = torch.randint(0, SIZES["V"], (2, 16), generator=torch.Generator().manual_seed(3))
    check_incremental_decoding(model, [x])
    cache = model.new_cache()
    with torch.no_grad():
        model(x, cache=cache)
    # constant work per token: the cache holds one state per layer, of D_h numbers per row
    assert sorted(cache.states) == list(range(SIZES["N"])) and not cache.kv
    assert all(h.shape == (2, SIZES["D_h"]) for h in cache.states.values())


def test_a_tiny_recurrent_lm_trains_and_samples(tmp_path, cli):
    """`cardc train cards/recurrent.card` on its tiny preset, smaller: the val loss falls, and
    the run samples through the cache."""
    r = cli("train", "cards/recurrent.card", "--preset", "tiny", "--set", "D=32", "--set", "D_h=32",
            "--set", "D_f=64", "--set", "N=1", "--steps", "12", "--eval-every", "12",
            "--batch-size", "4", "--block-size", "16", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr
