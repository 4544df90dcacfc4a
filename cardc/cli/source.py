"""The verbs that read cards and write text: check, fmt, render, diff, info, build, docs.
None of them imports torch, and `cardc check`, `fmt` and `render` answer in well under a second:
what only the other verbs need (lowering and codegen, typesetting, the docs site) is imported
by the verb that needs it."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from ..app.inputs import UsageError, parse_overrides, require_cards, set_flags
from ..checker import check
from ..diagnostics import Diagnostics
from ..library import load
from ..parser import parse_file, read_card
from ..render.text import format_source, render_card
from ..runtime.errors import RuntimeInputError
from .common import EXIT_ERROR, EXIT_OK, library, only_in, report, write


def cmd_check(args: argparse.Namespace) -> int:
    require_cards(args.paths)
    lib, targets = load(args.paths, root=library(args, args.paths), lazy=True)  # as called
    _, diags = check(lib)
    wanted = {str(Path(t)) for t in targets}
    code = report(only_in(diags, wanted))
    if code == EXIT_OK and not args.quiet:
        cards = sum(len(f.algorithms) for f in lib.files if f.path in wanted)
        print(f"ok: {cards} card{'s' if cards != 1 else ''} in {len(targets)} file"
              f"{'s' if len(targets) != 1 else ''}")
    return code


def cmd_fmt(args: argparse.Namespace) -> int:
    changed, diags = [], Diagnostics()
    for path in require_cards(args.paths):
        text = read_card(path, diags)
        if text is None:
            continue
        pretty, d = format_source(text, str(path))
        diags.extend(d)
        if d.errors or pretty == text:
            continue
        changed.append(path)
        if not args.check:
            write(path, pretty)
    code = report(diags)
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


def cmd_lsp(args: argparse.Namespace) -> int:
    """The language server (cardc.lsp), until the editor closes the connection."""
    from ..lsp.server import main as serve

    return serve()


def cmd_render(args: argparse.Namespace) -> int:
    if args.standalone and args.to != "latex":
        raise UsageError("--standalone goes with --to latex")
    paths = require_cards(args.paths)
    if args.to in ("latex", "md", "html"):
        return _render_typeset(args, paths)
    diags = Diagnostics()
    out = []
    for path in paths:
        out.append(render_card(parse_file(path, diags)))
    code = report(diags)
    if code == EXIT_OK:
        sys.stdout.write("\n".join(out))
    return code


def _render_typeset(args: argparse.Namespace, paths: list[Path]) -> int:
    """LaTeX, Markdown or HTML of the cards, typeset from the checker's types where they check
    (a card that does not check still renders, its names in their letters' own style); an HTML
    page holds the cards, then the cards they call from other files."""
    from ..render import html, latex, markdown

    lib, targets = load([str(p) for p in paths], root=library(args, [str(p) for p in paths]))
    if report(only_in(lib.diags, set(targets))):
        return EXIT_ERROR
    checker, _ = check(lib)
    files = {str(Path(f.path)): f for f in lib.files}
    if args.to == "md":
        sys.stdout.write("\n---\n\n".join(markdown.render_markdown(files[str(Path(t))], checker)
                                            for t in targets))
        return EXIT_OK
    if args.to == "html":
        sys.stdout.write(html.render_cards([files[str(Path(t))] for t in targets], checker))
        return EXIT_OK
    out = [latex.render_latex(files[str(Path(t))], checker, args.standalone and len(targets) == 1)
           for t in targets]
    if args.standalone and len(targets) > 1:
        out = [latex.standalone("\n".join(out))]
    sys.stdout.write("\n".join(out))
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    """`cardc diff A B`: the architecture difference of two model cards, step by step; with
    `--to html`, a page of their pseudocode with the steps that differ boxed."""
    from ..build import checked, find_card
    from ..diff import diff_cards

    require_cards([args.a, args.b])
    lib, checker, _ = checked([args.a, args.b], library(args, [args.a]))
    a = find_card(lib, checker, args.a, args.name_a)
    b = find_card(lib, checker, args.b, args.name_b)
    if args.to == "html":
        from ..docs.boxed import diff_page

        sys.stdout.write(diff_page(checker, a, b))
        return EXIT_OK
    print("\n".join(diff_cards(checker, a, b)))
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    from ..build import files_used
    from ..flops import card_cost
    from ..info import PresetError, summarize
    from ..presets import validate

    require_cards([args.card])
    # as `check` does: the card and what it calls, not the whole library (its errors would
    # not be reported: only those of the files used are)
    lib, _ = load([args.card], root=library(args, [args.card]), lazy=True)
    checker, diags = check(lib)
    if report(only_in(diags, files_used(lib, checker, {str(Path(args.card))}))):
        return EXIT_ERROR
    card_file = next(f for f in lib.files if Path(f.path) == Path(args.card))
    algs = [a for a in card_file.algorithms if a.label and (args.name in (None, a.name, a.label))]
    if not algs:
        raise UsageError(f"no card named '{args.name}' in {args.card}")
    alg = algs[0]
    try:
        overrides = parse_overrides(args.set)
        validate(checker, alg, args.preset, overrides, set_flags(args.set))
        summary = summarize(checker.infos[id(alg)].sig, args.preset, overrides,
                            card_cost(checker, alg), args.seq, args.batch)
        if summary.compute is not None:
            summary.compute.loss = _loss_logits(checker, alg, summary.values)
    except PresetError as err:
        return report(err.card_error(diags.sources).diagnostics)
    print(summary.text())
    return EXIT_OK


def _loss_logits(checker, alg, values) -> tuple[int, int | None] | None:
    """A language model's vocabulary, and the most logits its training loss holds at once
    (None: every one), as its lowering found (cardc.lower.likelihood)."""
    from ..build import lowered, unbound_models
    from ..lower import Lowering
    from ..lower.likelihood import LOGITS_AT_ONCE
    from ..types import Ty

    sig = checker.info(alg).sig
    if not isinstance(sig.output, Ty) or not Lowering.is_language_model(sig) or \
            unbound_models(checker, alg):
        return None  # a recipe's output is parameters; a generic one has no model yet
    vocab = int(sig.output.shape[0 if sig.layout == "column" else -1].evaluate(values))
    return vocab, LOGITS_AT_ONCE if lowered(checker, alg).analysis.likelihood else None


def cmd_build(args: argparse.Namespace) -> int:
    from ..build import files_used, generated_cards, module_path, require_clean, written_source

    require_cards(args.paths)
    if not args.check:
        from ..runtime.runs import check_writable_folder

        check_writable_folder(args.out)
    roots = library(args, args.paths)
    lib, targets = load(args.paths, root=roots)
    checker, diags = check(lib)
    # Cards named one by one must check; a folder's cards that do not are skipped with a note.
    require_clean(lib, checker, diags, {str(Path(p)) for p in args.paths if not Path(p).is_dir()})
    wanted = [f.path for f in lib.files if f.path in {str(Path(t)) for t in targets}]
    broken = {d.span.file for d in diags.errors}
    stale, written = [], []
    expected = set()
    for alg in generated_cards(lib, checker, wanted):
        if files_used(lib, checker, {lib.file_of(alg).path}) & broken:
            print(f"note: skipped {alg.name} ({lib.file_of(alg).path}): it does not check "
                  "(see 'cardc check')", file=sys.stderr)
            continue
        path = module_path(lib, alg, args.out, roots)
        expected.add(path)
        # card files named from the folder that holds the output, as they are found from it
        text = written_source(checker, alg, Path(os.path.abspath(args.out)).parent)
        if _generated_text(path) == text:
            continue
        if args.check:
            stale.append(f"{path} is out of date with {lib.file_of(alg).path}")
        else:
            written.append((path, text))
    up_to_date = f"ok: {len(expected)} generated module{'s' if len(expected) != 1 else ''} up to date"
    if args.check:
        return _report_stale(args.out, expected, stale, up_to_date, args.paths)
    _refuse_foreign(path for path, _ in written)
    if written:  # made only once there is code to write: a card that fails leaves nothing
        os.makedirs(os.path.realpath(args.out), exist_ok=True)  # a link's folder, if it has none
    for path, text in written:
        write(path, text)
    for path, _ in written:
        print(f"wrote {path}")
    if not written:
        print(up_to_date)
    return EXIT_OK


GENERATED = "# Code generated by cardc"  # how every generated module starts


def _generated_text(path: Path) -> str | None:
    """The text of the module cardc generated at `path`; None where there is none."""
    if not path.is_file() or path.is_symlink():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.startswith(GENERATED) else None


def _refuse_foreign(paths: Iterable[Path]) -> None:
    """Refuse, before writing any, to replace a file that is not a module cardc generated."""
    for path in paths:
        if os.path.lexists(path) and _generated_text(path) is None:
            raise RuntimeInputError(f"'{path}' is not a module cardc generated (it does not "
                                    f"start with '{GENERATED}'); move it, or build to "
                                    "another --out")


def _report_stale(out: str, expected: set[Path], stale: list[str], up_to_date: str,
                  given: list[str]) -> int:
    """`build --check`: every module out of date, and, where a folder of cards is checked,
    every generated module no card makes (cards named one by one judge their own alone)."""
    folders = any(Path(p).is_dir() for p in given)
    for path in sorted(Path(out).rglob("*.py")) if folders and Path(out).is_dir() else []:
        if path not in expected and _generated_text(path) is not None:
            stale.append(f"{path} was generated from a card that is no longer a model")
    for line in stale:
        print(f"cardc: {line}", file=sys.stderr)
    if stale:
        print("run 'cardc build' to regenerate", file=sys.stderr)
        return EXIT_ERROR
    print(up_to_date)
    return EXIT_OK


def cmd_docs(args: argparse.Namespace) -> int:
    """`cardc docs`: a static site of the cards and every card they call; a card that does not
    check gets a page saying so (a card that does not parse stops the site)."""
    from ..docs.site import write_site

    paths = [str(p) for p in require_cards(args.paths)]
    lib, targets = load(paths, root=library(args, paths))
    if report(only_in(lib.diags, set(targets))):
        return EXIT_ERROR
    checker, diags = check(lib)
    pages = write_site(lib, checker, diags, targets, args.out)
    broken = sum(not p.checked for p in pages)
    note = f" ({broken} that do not check)" if broken else ""
    print(f"ok: {len(pages)} card pages{note} in {args.out}; open {Path(args.out) / 'index.html'}")
    return EXIT_OK
