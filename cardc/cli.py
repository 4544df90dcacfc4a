"""The `cardc` command line. Bad input ends in one clear message and a non-zero exit."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .diagnostics import Diagnostics
from .library import card_paths, load

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 with usage; keep it, minus noise
        self.print_usage(sys.stderr)
        print(f"cardc: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _require_cards(paths: list[str]) -> list[Path]:
    found = card_paths(paths)
    missing = [str(p) for p in found if not p.exists()]
    if missing:
        raise UsageError(f"no such card file: {missing[0]}")
    if not found:
        raise UsageError(f"no .card files under {', '.join(paths)}")
    return found


def _report(diags: Diagnostics) -> int:
    if diags.items:
        print(diags.render(), file=sys.stderr)
    errors = len(diags.errors)
    if errors:
        print(f"\n{errors} error{'s' if errors > 1 else ''}", file=sys.stderr)
    return EXIT_ERROR if errors else EXIT_OK


# ------------------------------------------------------------------ commands


def cmd_check(args: argparse.Namespace) -> int:
    from .checker import check

    _require_cards(args.paths)
    lib, targets = load(args.paths, root=args.library)
    _, diags = check(lib)
    wanted = {str(Path(t)) for t in targets}
    shown = Diagnostics([d for d in diags.items if d.span.file in wanted], diags.sources)
    code = _report(shown)
    if code == EXIT_OK and not args.quiet:
        cards = sum(len(f.algorithms) for f in lib.files if f.path in wanted)
        print(f"ok: {cards} card{'s' if cards != 1 else ''} in {len(targets)} file"
              f"{'s' if len(targets) != 1 else ''}")
    return code


def cmd_fmt(args: argparse.Namespace) -> int:
    from .render.text import format_source
    from .runtime.atomic import write_text_atomic

    changed, diags = [], Diagnostics()
    for path in _require_cards(args.paths):
        text = path.read_text(encoding="utf-8")
        pretty, d = format_source(text, str(path))
        diags.extend(d)
        if d.errors or pretty == text:
            continue
        changed.append(path)
        if not args.check:
            write_text_atomic(path, pretty)
    code = _report(diags)
    if code:
        return code
    if args.check and changed:
        for p in changed:
            print(f"would reformat {p}", file=sys.stderr)
        return EXIT_ERROR
    if not args.check:
        for p in changed:
            print(f"reformatted {p}")
    return EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    from .parser import parse_file
    from .render.text import render_card

    if args.to != "text":
        raise UsageError(f"--to {args.to} is not available yet; use --to text")
    diags = Diagnostics()
    out = []
    for path in _require_cards(args.paths):
        out.append(render_card(parse_file(path, diags)))
    code = _report(diags)
    if code == EXIT_OK:
        sys.stdout.write("\n".join(out))
    return code


def cmd_info(args: argparse.Namespace) -> int:
    from .checker import check
    from .info import PresetError, summarize

    _require_cards([args.card])
    lib, _ = load([args.card], root=args.library)
    checker, diags = check(lib)
    if _report(diags):
        return EXIT_ERROR
    card_file = next(f for f in lib.files if Path(f.path) == Path(args.card))
    algs = [a for a in card_file.algorithms if a.name and (args.name in (None, a.name))]
    if not algs:
        raise UsageError(f"no card named '{args.name}' in {args.card}")
    alg = algs[0]
    try:
        overrides = _overrides(args.set)
        summary = summarize(checker.infos[id(alg)].sig, args.preset, overrides)
    except PresetError as err:
        d = Diagnostics(sources=diags.sources)
        d.error(err.span, err.message, err.hint)
        return _report(d)
    print(summary.text())
    return EXIT_OK


def _overrides(pairs: list[str]) -> dict[str, float]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            out[name.strip()] = float(value) if sep else float("nan")
        except ValueError:
            raise UsageError(f"expected NAME=NUMBER, got '{pair}'") from None
        if not sep:
            raise UsageError(f"expected NAME=NUMBER, got '{pair}'")
    return out


# ------------------------------------------------------------------ entry point


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="cardc", description="Check, render and compile algorithm cards.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("check", help="report errors in cards (exit 1 on any)")
    c.add_argument("paths", nargs="+", help="card files or folders")
    c.add_argument("-q", "--quiet", action="store_true")
    c.set_defaults(run=cmd_check)

    f = sub.add_parser("fmt", help="rewrite cards in canonical form")
    f.add_argument("paths", nargs="+")
    f.add_argument("--check", action="store_true", help="report, do not rewrite; exit 1 if any would change")
    f.set_defaults(run=cmd_fmt)

    r = sub.add_parser("render", help="print cards as pseudocode")
    r.add_argument("paths", nargs="+")
    r.add_argument("--to", default="text", choices=["text", "latex", "html", "md"])
    r.set_defaults(run=cmd_render)

    i = sub.add_parser("info", help="parameter count and hyperparameters at a preset")
    i.add_argument("card")
    i.add_argument("--preset")
    i.add_argument("--name", help="which card of the file (default: the first)")
    i.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    i.set_defaults(run=cmd_info)

    for sp in (c, i):
        sp.add_argument("--library", default="cards",
                        help="folder of cards that calls resolve against (default: cards)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except UsageError as err:
        print(f"cardc: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("cardc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
