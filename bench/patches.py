"""Patches and ViT on the CPU, measured side by side in one run (interleaved, repeated,
medians; ratios, not absolute times):

1. the patch embedding patches(x | p) W + b, forward and backward, three ways: the fused
   lowering (a view split and permuted, then one matrix product: modelkit's cut_patches), the
   literal one (every entry gathered: gather_patches), and a strided convolution (what
   transformers' ViT runs) — the measurement that chose the fused lowering;
2. a training step (forward, cross-entropy, backward, AdamW) and a forward of the ViT card's
   generated model against transformers' ViTForImageClassification, same config and weights.

    .venv/bin/python bench/patches.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file

from cardc.build import build_model
from cardc.interop import load_mapping, to_card_state
from cardc.runtime import modelkit

ROOT = Path(__file__).resolve().parent.parent
CARD = ROOT / "cards" / "vit.card"


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def medians(cases: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Each case once per round, rounds repeated, after one untimed round: the median."""
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            times[name].append(timed(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def report(title: str, result: dict[str, float], base: str) -> None:
    print(title)
    for name, t in result.items():
        print(f"  {name:<28} {t * 1e3:9.2f} ms   {result[base] / t:5.2f}× {base}'s speed")


def patch_embedding(B: int, C: int, S: int, p: int, D: int, repeats: int) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, C, S, S, generator=g, requires_grad=True)
    W = torch.randn(C * p * p, D, generator=g, requires_grad=True)
    b = torch.randn(D, generator=g, requires_grad=True)

    def through(cut: Callable) -> Callable[[], None]:
        return lambda: F.linear(cut(x, p), W.T, b).sum().backward()

    def conv() -> None:
        y = F.conv2d(x, W.T.reshape(D, C, p, p), b, stride=p).flatten(2).transpose(1, 2)
        y.sum().backward()

    result = medians({"view + matmul (fused)": through(modelkit.cut_patches),
                      "gather + matmul (literal)": through(modelkit.gather_patches),
                      "strided conv2d": conv}, repeats)
    report(f"patch embedding, forward + backward, B={B} C={C} S={S} p={p} D={D}", result,
           "strided conv2d")


def vit_pair(cfg: dict):
    config = transformers.ViTConfig(
        hidden_size=cfg["D"], num_hidden_layers=cfg["N"], num_attention_heads=cfg["H"],
        intermediate_size=cfg["D_f"], image_size=cfg["S"], patch_size=cfg["p"],
        num_channels=cfg["C"], num_labels=cfg["K"], hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    torch.manual_seed(0)
    hf = transformers.ViTForImageClassification(config)
    mapping = load_mapping(CARD)
    ours = build_model(str(CARD), None, dict(cfg), library=str(ROOT / "cards"), name="ViT")
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)  # the checkpoint's names, which the mapping reads
        saved = load_file(f"{folder}/model.safetensors")
    ours.load_state_dict(to_card_state(mapping, saved, ours.state_dict(), cfg["N"],
                                       ours.card_meta["hyperparameters"]), strict=True)
    return hf, ours


def vit(cfg: dict, B: int, repeats: int) -> None:
    hf, ours = vit_pair(cfg)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, cfg["C"], cfg["S"], cfg["S"], generator=g)
    y = torch.randint(0, cfg["K"], (B,), generator=g)
    with torch.no_grad():
        diff = (ours.eval()(x) - hf.eval()(pixel_values=x).logits).abs().max().item()
    models = {"cardc ViT": (ours, lambda m: m(x)),
              "transformers ViT": (hf, lambda m: m(pixel_values=x).logits)}
    steps, forwards = {}, {}
    for name, (model, logits) in models.items():
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, logits=logits, opt=opt) -> None:
            F.cross_entropy(logits(model), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        def forward(model=model, logits=logits) -> None:
            with torch.no_grad():
                logits(model)

        steps[name], forwards[name] = step, forward
    shown = " ".join(f"{k}={v}" for k, v in cfg.items())
    print(f"ViT {shown}, batch {B} (max |logits diff| before training {diff:.1e})")
    report("  training step", medians(steps, repeats), "transformers ViT")
    report("  forward, no gradients", medians(forwards, repeats), "transformers ViT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    patch_embedding(8, 3, 224, 16, 768, args.repeats)
    patch_embedding(32, 3, 32, 4, 192, args.repeats)
    vit(dict(C=3, S=32, p=4, D=192, H=3, D_f=768, N=4, K=10), 32, args.repeats)


if __name__ == "__main__":
    main()
