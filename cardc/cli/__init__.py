"""The `cardc` command line. Bad input ends in one clear message and a non-zero exit.

One module per group of verbs (`source`: check, fmt, render, diff, info, build, docs, lsp;
`training`: train, eval, prepare; `sampling`: sample; `interop`: import, export), the grammar
in `parser`, and `main` here, which runs a verb and turns the project's errors into one
message and an exit code. Training and sampling are `cardc.app`'s; the verbs only read flags
and print."""

from __future__ import annotations

import sys

from ..app.inputs import UsageError
from ..diagnostics import CardError
from ..runtime.errors import RuntimeInputError
from .common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, report
from .interop import cmd_export, cmd_import
from .parser import Command, build_parser
from .sampling import cmd_sample
from .source import cmd_build, cmd_check, cmd_diff, cmd_docs, cmd_fmt, cmd_info, cmd_lsp, cmd_render
from .training import cmd_eval, cmd_prepare, cmd_train

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_USAGE", "UsageError", "commands", "main"]


def commands() -> dict[str, Command]:
    """Each verb's function, read when the parser is built (so a test may replace one)."""
    return {"check": cmd_check, "fmt": cmd_fmt, "render": cmd_render, "info": cmd_info,
            "diff": cmd_diff, "build": cmd_build, "docs": cmd_docs, "train": cmd_train,
            "sample": cmd_sample, "eval": cmd_eval, "prepare": cmd_prepare,
            "import": cmd_import, "export": cmd_export, "lsp": cmd_lsp}


def main(argv: list[str] | None = None) -> int:
    args = build_parser(commands()).parse_args(argv)
    try:
        return args.run(args)
    except UsageError as err:
        print(f"cardc: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except CardError as err:
        return report(err.diagnostics) or EXIT_ERROR
    except (RuntimeInputError, ValueError) as err:
        print(f"cardc: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as err:  # a file that cannot be read or written, named by the system
        where = f": '{err.filename}'" if err.filename else ""
        print(f"cardc: error: {err.strerror or err}{where}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("cardc: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a last resort: one line, never a traceback
        print(f"cardc: internal error: {type(err).__name__}: {err} (please report this, with "
              "the command that caused it)", file=sys.stderr)
        return EXIT_ERROR

