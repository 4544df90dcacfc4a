"""The verb that samples: `cardc sample RUN`, each --prompt continued by the run's inference
card (or --card's). A thin layer over `cardc.app.sampling`, which imports torch when it runs."""

from __future__ import annotations

import argparse

from .common import EXIT_OK

MAX_TOKENS = 100_000  # `sample --tokens`: more is hours of decoding, never what was meant


def cmd_sample(args: argparse.Namespace) -> int:
    """Print each prompt's continuation, under a header of its own when there are several (as
    head(1) does)."""
    from ..app.sampling import SampleOptions, sample_with

    shown = sample_with(SampleOptions(
        dir=args.dir, prompt=tuple(args.prompt or ()), tokens=args.tokens,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        stop=tuple(args.stop), seed=args.seed, device=args.device, card=args.card,
        overrides=tuple(args.set),
        library=tuple(args.library) if args.library is not None else None))
    for n, text in enumerate(shown, 1):
        if len(shown) > 1:
            print(("\n" if n > 1 else "") + f"==> prompt {n} <==")
        print(text)
    return EXIT_OK

