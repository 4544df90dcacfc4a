"""The verbs that exchange checkpoints with Hugging Face: import and export."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..app.inputs import parse_overrides, require_cards
from .common import EXIT_OK, library


def cmd_import(args: argparse.Namespace) -> int:
    from ..interop import import_checkpoint  # torch

    require_cards([args.card])
    model, path = import_checkpoint(args.card, args.source, args.out, args.preset,
                                    parse_overrides(args.set), args.name,
                                    library(args, [args.card]))
    params = sum(p.numel() for p in model.parameters())
    tokenizer = Path(args.out) / "tokenizer.json"
    said = f" and {tokenizer}" if tokenizer.is_file() else \
        " (the source has no tokenizer: prompts are read as bytes)"
    print(f"imported {args.source} as {model.card_meta['name']} ({params:,} parameters); "
          f"wrote {path}{said}")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from ..interop import export_hf  # torch

    mapping, dest = export_hf(args.dir, args.to, args.library or ["cards"], args.mapping)
    print(f"exported {args.dir} as {mapping.architecture}; wrote {dest}/")
    return EXIT_OK
