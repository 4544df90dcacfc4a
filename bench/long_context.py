"""Decoding as the context grows: a generated decoder's KV cache against `transformers`' dynamic
and static caches, the same weights, at contexts of 256 to 4096 positions.

At each context length L a random prompt of L tokens is prefilled and then `--tokens` tokens are
decoded greedily, one forward each. What is reported per L: the milliseconds a decoded token
takes (the decode steps alone, after the prefill; median over `--rounds` alternating rounds),
and the bytes the cache holds at the end (ours: its buffers, room to spare included;
`transformers`: the key and value tensors its cache object holds). The three continue the prompt
with the same tokens, or no figure is given for the pair. The model is a card with a mapping file
(`--family`, default llama), its positions set to the longest context plus the tokens decoded.

    python bench/long_context.py [--family llama] [--preset tiny] [--set NAME=VALUE]
                                 [--contexts 256 512 1024 2048 4096] [--tokens 32] [--rounds 3]
                                 [--compile] [--device cpu|cuda]

`--compile` adds ours through a static cache under torch.compile (inductor), each context's
two graphs compiled by an untimed round first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


def ours_decode(model, prompt: torch.Tensor, tokens: int,
                step=None) -> tuple[float, int, torch.Tensor]:
    """Seconds of the decode steps, the cache's bytes, and the tokens, through the model's
    own KV cache (as its generate does); with `step` (the model under torch.compile), through
    a static cache of the positions needed."""
    cache = model.new_cache() if step is None else \
        model.new_cache(length=prompt.shape[-1] + tokens)
    step = model if step is None else step
    logits = step(prompt, cache=cache)[:, -1]
    out, start = [logits.argmax(-1, keepdim=True)], time.perf_counter()
    for _ in range(tokens - 1):
        logits = step(out[-1], cache=cache)[:, -1]
        out.append(logits.argmax(-1, keepdim=True))
    synchronize(prompt.device)
    spent = time.perf_counter() - start
    held = sum(K.numel() * K.element_size() + V.numel() * V.element_size()
               for K, V, _ in cache.room.values()) or \
        sum(K.numel() * K.element_size() * 2 for K, _ in cache.kv.values())
    return spent, held, torch.cat(out, -1)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that the clock counts it (CUDA runs ahead)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def theirs_decode(hf, prompt: torch.Tensor, tokens: int,
                  static: bool) -> tuple[float, int, torch.Tensor]:
    """The same through `transformers`' cache objects, a forward per token."""
    from transformers import DynamicCache, StaticCache

    total = prompt.shape[-1] + tokens
    cache = StaticCache(config=hf.config, max_cache_len=total) if static else \
        DynamicCache(config=hf.config)
    positions = torch.arange(prompt.shape[-1], device=prompt.device)
    logits = hf(prompt, cache=cache, cache_position=positions, use_cache=True).logits
    out, start = [logits[:, -1].argmax(-1, keepdim=True)], time.perf_counter()
    for i in range(tokens - 1):
        at = torch.tensor([prompt.shape[-1] + i])
        logits = hf(out[-1], cache=cache, cache_position=at.to(prompt.device),
                    use_cache=True).logits
        out.append(logits[:, -1].argmax(-1, keepdim=True))
    synchronize(prompt.device)
    spent = time.perf_counter() - start
    held = sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (layer.keys, layer.values) if isinstance(t, torch.Tensor))
    return spent, held, torch.cat(out, -1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="llama")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    from generate import context_hyper, theirs

    from cardc import build
    from cardc.interop import load_mapping

    card = str(ROOT / "cards" / f"{args.family}.card")
    mapping = load_mapping(card)
    overrides = dict(kv.split("=", 1) for kv in args.set)
    overrides = {k: float(v) for k, v in overrides.items()}
    overrides[context_hyper(mapping)] = max(args.contexts) + args.tokens
    torch.manual_seed(0)
    model = build.build_model(card, args.preset, overrides).eval()
    hf = theirs(mapping, model).to(args.device)
    model.to(args.device)
    vocab = int(model.card_meta["hyperparameters"]["V"])
    print(f"{args.family} ({args.preset}), {args.tokens} tokens decoded after each context; "
          f"ms a token (median of {args.rounds}), and the cache's size at the end")
    print(f"{'context':>8} {'cardc':>9} {'dynamic':>9} {'static':>9} {'ratio d':>8} "
          f"{'ratio s':>8}  {'cache cardc':>12} {'dynamic':>12} {'static':>12}")
    runs = {"cardc": lambda x: ours_decode(model, x, args.tokens),
            "dynamic": lambda x: theirs_decode(hf, x, args.tokens, False),
            "static": lambda x: theirs_decode(hf, x, args.tokens, True)}
    if args.compile:
        torch._dynamo.config.cache_size_limit = 4 * len(args.contexts)
        step = torch.compile(model, fullgraph=True)
        runs["compiled"] = lambda x: ours_decode(model, x, args.tokens, step)
    with torch.no_grad():
        for length in args.contexts:
            prompt = torch.randint(0, vocab, (1, length),
                                   generator=torch.Generator().manual_seed(length)).to(args.device)
            if args.compile:
                runs["compiled"](prompt)  # this context's graphs, compiled untimed
            times: dict[str, list[float]] = {name: [] for name in runs}
            held, seqs = {}, {}
            for _ in range(args.rounds):  # alternating: the machine's load falls on all three
                for name, run in runs.items():
                    spent, held[name], seqs[name] = run(prompt)
                    times[name].append(spent / (args.tokens - 1) * 1000)
            ms = {name: statistics.median(t) for name, t in times.items()}
            same = {name: torch.equal(seqs[name], seqs["cardc"]) for name in runs}
            ratio = {name: f"{ms[name] / ms['cardc']:.2f}×" if same[name] else "differ"
                     for name in ("dynamic", "static")}
            mib = {name: f"{held[name] / 2**20:.1f} MiB" for name in runs}
            compiled = "" if not args.compile else \
                f"  compiled static {ms['compiled']:.2f} ms" + ("" if same["compiled"] else
                                                                 " (differs)")
            print(f"{length:>8} {ms['cardc']:>8.2f} {ms['dynamic']:>9.2f} {ms['static']:>9.2f} "
                  f"{ratio['dynamic']:>8} {ratio['static']:>8}  {mib['cardc']:>12} "
                  f"{mib['dynamic']:>12} {mib['static']:>12}{compiled}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
