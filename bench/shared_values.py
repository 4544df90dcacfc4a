"""What making values once is worth (cardc/lower/invariants.py): a model card's generated
module decoding greedily through its KV cache, against the same module generated without that
pass (each layer then makes its own slopes, bias or mask), the same weights, in one process,
the two taking turns over the rounds; medians and their ratio. Also the training step (forward,
cross-entropy, backward) of the same two. Machine load moves both alike.

    python bench/shared_values.py [--card cards/bloom.card] [--preset tiny] [--set NAME=VALUE]
                                  [--tokens 64] [--steps 5] [--rounds 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from cardc import build
from cardc.lower import cards, pipeline

ROOT = Path(__file__).resolve().parent.parent


def _models(card: str, preset: str, overrides: dict[str, float]):
    """The card's module with the pass and without it, holding the same weights."""
    shared = build.build_model(card, preset, overrides).eval()
    every = dataclasses.replace(pipeline.FUSED, passes=tuple(
        p for p in pipeline.FUSED.passes if p is not pipeline._share_invariants))
    original = cards.pipeline
    cards.pipeline = lambda fuse: every if fuse else pipeline.LITERAL
    try:
        plain = build.build_model(card, preset, overrides).eval()
    finally:
        cards.pipeline = original
    plain.load_state_dict(shared.state_dict())
    return {"made once": shared, "every layer": plain}


def _decode(model, prompt: torch.Tensor, tokens: int) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    with torch.no_grad():
        cache, x, out = model.new_cache(), prompt, [prompt]
        for _ in range(tokens):
            x = model(x, cache=cache)[:, -1].argmax(-1, keepdim=True)
            out.append(x)
    return time.perf_counter() - start, torch.cat(out, dim=-1)


def _train(model, batch: torch.Tensor, steps: int) -> float:
    model.train()
    start = time.perf_counter()
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        model(batch[:, :-1], batch[:, 1:])[1].backward()
    model.eval()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--card", default=str(ROOT / "cards" / "bloom.card"))
    p.add_argument("--preset", default="tiny")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    overrides = {k: float(v) for k, v in (s.split("=", 1) for s in args.set)}
    models = _models(args.card, args.preset, overrides)
    vocab = models["made once"].V
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, 16), generator=g)
    batch = torch.randint(0, vocab, (8, 65), generator=g)
    times: dict[tuple[str, str], list[float]] = {}
    outs = {}
    for _ in range(args.rounds):
        for name, model in models.items():
            took, outs[name] = _decode(model, prompt, args.tokens)
            times.setdefault((name, "decode"), []).append(took)
            times.setdefault((name, "train"), []).append(_train(model, batch, args.steps))
    same = torch.equal(*outs.values())
    print(f"{Path(args.card).name} {args.preset}, {torch.get_num_threads()} threads, "
          f"median of {args.rounds} rounds, taking turns")
    for what, unit in (("decode", f"{args.tokens} tokens"), ("train", f"{args.steps} steps")):
        med = {n: statistics.median(times[(n, what)]) for n in models}
        print(f"  {what} ({unit}): " + ", ".join(f"{n} {t:.3f} s" for n, t in med.items()) +
              f"; made once is {med['every layer'] / med['made once']:.2f}× as fast")
    print(f"  same tokens: {same}")


if __name__ == "__main__":
    main()
