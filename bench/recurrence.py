"""Speed of a recurrence over positions (cards/recurrent.card): the fused module's scan against
the literal module's Python loop over positions, and decoding through the cache, which carries
each layer's state, against recomputing every position for each new token.

The same weights in both modules of each pair; the two alternate over several rounds and the
medians and their ratio are reported (run on a machine with other work, the ratios are what
to read, not the times).

    python bench/recurrence.py [--preset tiny] [--set NAME=VALUE] [--batch 8] [--seq 256]
                               [--tokens 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from cardc.build import build_model

CARD = "cards/recurrent.card"


def train_step(model: torch.nn.Module, x: torch.Tensor) -> None:
    logits = model(x[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).backward()


@torch.no_grad()
def decode(model: torch.nn.Module, prompt: torch.Tensor, tokens: int, cached: bool) -> torch.Tensor:
    """Greedy tokens after `prompt`: through the cache, or recomputing every position."""
    cache = model.new_cache() if cached else None
    x, step = prompt, prompt
    for _ in range(tokens):
        logits = model(step, cache=cache) if cached else model(x)
        token = logits[:, -1].argmax(-1, keepdim=True)
        x = torch.cat([x, token], 1)
        step = token if cached else x
    return x


def timed(run, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    overrides = {k: float(v) for k, v in (s.split("=", 1) for s in args.set)}
    torch.manual_seed(0)
    fused = build_model(CARD, args.preset, overrides)
    literal = build_model(CARD, args.preset, overrides, fuse=False)
    literal.load_state_dict(fused.state_dict())
    x = torch.randint(0, fused.V, (args.batch, args.seq + 1))
    scan, loop = [], []
    for _ in range(args.rounds):  # interleaved: each round times both once more
        scan += timed(lambda: train_step(fused, x), 1)
        loop += timed(lambda: train_step(literal, x), 1)
    a, b = statistics.median(scan), statistics.median(loop)
    print(f"training step, B={args.batch} T={args.seq}: scan {a * 1e3:.1f} ms, "
          f"Python loop {b * 1e3:.1f} ms: the scan is {b / a:.2f}x as fast")
    fused.eval()
    prompt = x[:2, :16]
    assert torch.equal(decode(fused, prompt, 8, True), decode(fused, prompt, 8, False))
    cached, plain = [], []
    for _ in range(args.rounds):
        cached += timed(lambda: decode(fused, prompt, args.tokens, True), 1)
        plain += timed(lambda: decode(fused, prompt, args.tokens, False), 1)
    a, b = statistics.median(cached), statistics.median(plain)
    print(f"greedy decoding of {args.tokens} tokens after 16: with the cache {a * 1e3:.1f} ms, "
          f"recomputing {b * 1e3:.1f} ms: {b / a:.2f}x")


if __name__ == "__main__":
    main()
