"""A card's generated Python for its page: highlighted by pygments, a line at a time, with the
`[file.card:N]` tag each generated line carries turned into a link to card line N, and the
way back: each card line's first generated line."""

from __future__ import annotations

import html
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

from .. import syntax as s
from ..build import generated, lowered, relocated, shown_card_path
from ..checker import Checker
from ..diagnostics import CardError
from ..highlight import CSS_CLASS
from ..names import identifier

_TAG = re.compile(r"\[([^\[\]<>&\"]+\.card):(\d+)\]")  # as the escaped line holds it


@dataclass
class Code:
    """The generated module (or why there is none), as highlighted lines."""

    lines: list[str] = field(default_factory=list)  # HTML, one per line of the module
    first: dict[tuple[str, int], int] = field(default_factory=dict)  # (card file, line) → line
    text: str = ""
    missing: str | None = None
    own: range = range(0)  # the card's own class or function, numbered from 1

    def parts(self) -> list[tuple[str | None, list[tuple[int, str]]]]:
        """The module in up to three runs of numbered lines: what comes before the card's own
        class (folded: imports, presets and the cards it calls), the class, what follows it.
        The first of each pair says what a folded run holds, None for the open one."""
        numbered = list(enumerate(self.lines, 1))
        if not self.own:
            return [(None, numbered)]
        lo, hi = self.own.start - 1, self.own.stop - 1
        runs = [("imports, presets and the code of the cards it calls", numbered[:lo]),
                (None, numbered[lo:hi]), ("the rest of the module", numbered[hi:])]
        return [run for run in runs if run[1]]


def card_code(checker: Checker, alg: s.Algorithm, link: Callable[[str, int], str | None],
              base: str | os.PathLike[str]) -> Code:
    """`alg`'s generated module, naming card files as `cardc build` does from `base` (the
    folder that holds the site); `link(card file, line)` is the href of a card line."""
    try:
        program = lowered(checker, alg)
        text = generated(checker, alg, relocated(program, lambda p: shown_card_path(p, base)))
    except CardError as err:
        first = err.diagnostics.errors[0] if err.diagnostics.errors else None
        return Code(missing=first.message if first else "it does not compile")
    files: dict[str, str] = {}  # a tag's file name → the card file, as the library holds it
    for path in program.sources:
        files.setdefault(Path(path).name, path)
    out = Code(text=text, own=_own(text, identifier(alg.label or "")))
    for number, line in enumerate(_highlighted(text), 1):
        out.lines.append(_TAG.sub(partial(_tag, files=files, link=link, out=out, number=number),
                                  line))
    return out


def _own(text: str, name: str) -> range:
    """The lines of the top-level class or function `name` (any case), to the next
    top-level statement."""
    lines = text.split("\n")
    head = re.compile(rf"(class|def) {re.escape(name)}\b", re.I)
    start = next((i for i, line in enumerate(lines) if head.match(line)), None)
    if start is None:
        return range(0)
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1].strip()), len(lines))
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    return range(start + 1, end + 1)


def _tag(m: re.Match, files: dict[str, str], link: Callable[[str, int], str | None],
         out: Code, number: int) -> str:
    path = files.get(html.unescape(m.group(1)))
    line = int(m.group(2))
    if path is None:
        return m.group(0)
    out.first.setdefault((path, line), number)
    href = link(path, line)
    return m.group(0) if href is None else f'<a href="{html.escape(href)}">{m.group(0)}</a>'


def _highlighted(text: str) -> list[str]:
    """The module as HTML lines: pygments closes its spans at each line's end."""
    body = highlight(text, PythonLexer(), HtmlFormatter(nowrap=True))
    return body.rstrip("\n").split("\n")


def stylesheet() -> str:
    """pygments' colours for the code (`.python`) and the card source (`.card-source`): a
    light scheme, and a dark one where the reader's system asks for it."""
    light = "\n".join(_scoped(HtmlFormatter(style="friendly").get_style_defs(f".{scope}"), scope)
                      for scope in ("python", CSS_CLASS))
    dark = "\n".join(_scoped(HtmlFormatter(style="github-dark").get_style_defs(f".{scope}"), scope)
                     for scope in ("python", CSS_CLASS))
    return f"{light}\n@media (prefers-color-scheme: dark) {{\n{dark}\n}}\n"


def _scoped(css: str, scope: str) -> str:
    """Only the rules under the scope's class: pygments adds rules for bare `pre` and line
    numbers, which would restyle the rest of the page."""
    return "\n".join(line for line in css.splitlines() if line.startswith(f".{scope}"))
