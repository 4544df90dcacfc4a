"""`cardc info`'s FLOPs and memory, counted from a card's math (cardc.flops): GPT-2's training
FLOPs per token are the standard 6N + 12·L·H·Q·T, and every family's forward count equals the
matrix products its generated model runs, counted by torch's FlopCounterMode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from cardc import build
from cardc.flops import card_cost
from cardc.info import summarize

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ["gpt2", "llama", "qwen2", "mistral", "qwen3", "olmo2", "stablelm2", "falcon"]


def _checked(card: str):
    lib, checker, _ = build.checked([card], build.library_roots([card]))
    return checker, build.find_card(lib, checker, card, None)


def test_gpt2_training_flops_per_token_are_6n_plus_12_lhqt():
    """Kaplan et al.'s count (arXiv:2001.08361, table 1): N the weights of the products (the
    blocks' 12·L·D² and the tied unembedding's V·D), Q = D/H the head width."""
    checker, alg = _checked(str(ROOT / "cards" / "gpt2.card"))
    sig = checker.info(alg).sig
    for seq in (128, 1024):
        summary = summarize(sig, "gpt2", {}, card_cost(checker, alg), seq)
        v = summary.values
        L, D, H, V, D_f = v["N"], v["D"], v["H"], v["V"], v["D_f"]
        n = L * (4 * D * D + 2 * D * D_f) + V * D
        forward = summary.compute.per_token.evaluate({"T": seq})
        assert 3 * forward == 6 * n + 12 * L * H * (D // H) * seq


def test_info_prints_flops_and_memory():
    run = subprocess.run([sys.executable, "-m", "cardc", "info", "cards/gpt2.card", "--preset",
                          "gpt2", "--seq", "1024", "--batch", "8"], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "parameters: 124,439,808 (498 MB fp32, 249 MB bf16)" in run.stdout
    assert "FLOPs per token at T = 1024: forward 284,812,800, training 854,438,400" in run.stdout
    assert "activations at T = 1024, batch 8:" in run.stdout
    formula = subprocess.run([sys.executable, "-m", "cardc", "info", "cards/gpt2.card",
                              "--preset", "gpt2"], cwd=ROOT, capture_output=True, text=True)
    assert "forward 247,064,064 + 36,864·T" in formula.stdout


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Softmax attention's two products, Q K^⊺ and P V, over every key (masked or not, as a
    card's steps compute them)."""
    *batch, tq, d = query_shape
    heads = 1
    for n in batch:
        heads *= n
    return 2 * heads * tq * key_shape[-2] * (d + value_shape[-1])


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_flops_are_the_generated_models_products(family):
    card = str(ROOT / "cards" / f"{family}.card")
    checker, alg = _checked(card)
    sig = checker.info(alg).sig
    summary = summarize(sig, "tiny", {}, card_cost(checker, alg))
    model = build.build_model(card, "tiny", {})
    seq = 40
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    with FlopCounterMode(display=False, custom_mapping={sdpa: _sdpa_flops}) as counter, \
            torch.no_grad():
        model.eval()(torch.randint(1, 200, (2, seq)))
    measured = counter.get_total_flops() / 2  # per sequence of the batch
    assert summary.compute.per_token.evaluate({"T": seq}) * seq == measured


@pytest.mark.parametrize("family", ["gpt2", "llama", "falcon"])
def test_activation_memory_is_what_backpropagation_keeps(family):
    """The estimate against the bytes autograd saves for the backward of one forward of the
    generated model (the parameters left out): within 25%."""
    card = str(ROOT / "cards" / f"{family}.card")
    checker, alg = _checked(card)
    seq = 64
    summary = summarize(checker.info(alg).sig, "tiny", {}, card_cost(checker, alg), seq, 2)
    model = build.build_model(card, "tiny", {})
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randint(1, 200, (2, seq)))
    kept = sum(n for ptr, n in saved.items() if ptr not in params)
    estimate = float(summary.compute.values.evaluate({"T": seq})) * 2 * 4  # batch 2, fp32
    assert 0.75 < estimate / kept < 1.25, (estimate, kept)


def test_info_prints_what_the_loss_holds_of_the_logits():
    """GPT-2 scores its rows itself (cardc.lower.likelihood): training holds 2^24 logits at
    most; the paper's DTransformer (column-major) every one of them."""
    def info(*args: str) -> str:
        run = subprocess.run([sys.executable, "-m", "cardc", "info", *args], cwd=ROOT,
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return run.stdout

    assert "the loss at T = 1024, batch 8: 411,705,344 logits, 16,777,216 held at once (a few " \
           "positions at a time; 67.1 MB fp32" in info("cards/gpt2.card", "--preset", "gpt2",
                                                       "--seq", "1024", "--batch", "8")
    assert "the loss at T = 64, batch 2: 32,768 logits, 32,768 held at once (all at once" in \
        info("cards/gpt2.card", "--preset", "tiny", "--seq", "64", "--batch", "2")
