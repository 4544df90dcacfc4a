"""The card grammar's LALR tables, and a parser that runs them.

lark builds the tables from cardc/grammar.lark (about a second). They are kept in the user's cache
folder as plain data, beside lark's own saved parser, so that a cold `cardc check` loads them
without importing lark at all. The parser lexes as lark's contextual lexer does and shapes
children as lark's tree builder does, but builds nodes as rules reduce, with no tree in between.
lark comes back only to describe a syntax error, with its own lexer and exceptions.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import pickle
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any, NamedTuple

GRAMMAR = Path(__file__).with_name("grammar.lark")
OPTIONS: dict[str, Any] = {"parser": "lalr", "start": ["start", "annot", "sum"],
                           "propagate_positions": True, "maybe_placeholders": False}


class Token(str):
    """A token's text, with its terminal and place, as lark's Token has them."""

    type: str
    start_pos: int
    line: int
    column: int
    end_line: int | None
    end_column: int | None
    end_pos: int | None

    def __new__(cls, kind: str, value: str, start_pos: int, line: int, column: int,
                end_line: int | None = None, end_column: int | None = None,
                end_pos: int | None = None) -> Token:
        tok = super().__new__(cls, value)
        tok.type, tok.start_pos, tok.line, tok.column = kind, start_pos, line, column
        tok.end_line, tok.end_column, tok.end_pos = end_line, end_column, end_pos
        return tok

    @property
    def value(self) -> str:
        return str(self)

    def update(self, kind: str | None = None, value: str | None = None) -> Token:
        """This token's place, with another terminal or text (as lark's Token.update)."""
        return Token(kind or self.type, self if value is None else value, self.start_pos,
                     self.line, self.column, self.end_line, self.end_column, self.end_pos)


class Meta(NamedTuple):
    """Where a rule's text lies: from its first token, or first child's, to its last."""

    line: int
    column: int
    end_line: int
    end_column: int
    start_pos: int
    end_pos: int


@dataclass(frozen=True)
class Rule:
    """What a reduction by one grammar rule does with its children."""

    size: int  # symbols on the stack
    origin: str
    name: str  # the alias, else the rule's name: what builds its node
    keep: tuple[tuple[int, bool], ...] | None  # (index, splice) per child kept; None: all, as is
    expand: bool  # `?rule`: a single child stands for the rule
    unit: bool  # one child, which stands for the rule unchanged (`?sum: product`)
    helper: bool  # an EBNF repetition lark made up (`__names_star_1`), spliced into its parent


@dataclass
class Scanner:
    """The terminals one lark lexer (one or more parser states) accepts, in lark's order. The
    first that matches is the token, as in lark's alternation of them all; that alternation is
    compiled only once the lexer is busy, as compiling one for each of the many lexers a card
    meets would take most of a cold start's time."""

    terminals: tuple[tuple[str, str], ...]  # (name, regular expression)
    retype: dict[str, dict[str, str]]  # a keyword that also matches NAME: text → its terminal
    ignore: frozenset[str]
    multiline: frozenset[str]  # terminals that may hold a line break
    flags: int
    compiled: tuple[tuple[str, re.Pattern[str]], ...] = ()
    alternation: re.Pattern[str] | None = None
    uses: int = 0

    def match(self, text: str, pos: int) -> tuple[str, str] | None:
        """The token at `pos`: its text and terminal."""
        if self.alternation is None:
            self.uses += 1
            if self.uses > _BUSY:
                self.alternation = self._alternation()
            elif not self.compiled:
                self.compiled = tuple((n, _compile(rx, self.flags)) for n, rx in self.terminals)
        if self.alternation is not None:
            m = self.alternation.match(text, pos)
            return (m.group(0), m.lastgroup) if m else None
        for name, pattern in self.compiled:
            m = pattern.match(text, pos)
            if m:
                return m.group(0), name
        return None

    def _alternation(self) -> re.Pattern[str]:
        return _compile("|".join(f"(?P<{n}>{rx})" for n, rx in self.terminals), self.flags)

    def __getstate__(self) -> dict[str, Any]:  # saved without what it compiles
        return {**self.__dict__, "compiled": (), "alternation": None, "uses": 0}


_BUSY = 200  # tokens a lexer reads before its alternation is worth compiling


@cache
def _compile(regexp: str, flags: int) -> re.Pattern[str]:
    return re.compile(regexp, flags)


@dataclass
class Tables:
    """The parser: its actions by state and terminal, its rules, and a scanner per state."""

    rows: dict[int, dict[str, int | Rule]]  # the state to shift to, or the rule to reduce by
    gotos: dict[int, dict[str, int]]  # after a reduction: the state by the rule's origin
    begin: dict[str, int]  # by start rule
    end: dict[str, int]
    rules: tuple[Rule, ...]
    scanners: dict[int, Scanner]  # by state; states that accept the same terminals share one
    terminals: dict[str, str]  # every terminal's regular expression, by name
    lark: bytes  # lark's own saved parser, for errors (its states are these states)
    units: dict[tuple[int, int, str], int] = field(default_factory=dict)  # see _unit_chain


# ------------------------------------------------------------------ loading and saving


@cache
def tables() -> Tables:
    """The card grammar's tables: from the cache folder, else built with lark (and saved
    there); a missing or unreadable file is built anew."""
    grammar = GRAMMAR.read_text(encoding="utf-8")
    path = _cache_file(grammar)
    if path is not None and path.exists():
        with contextlib.suppress(Exception), open(path, "rb") as f:
            loaded = pickle.load(f)
            if isinstance(loaded, Tables):
                return loaded
    built = _build(grammar)
    if path is not None:
        from .atomic import atomic_path  # tempfile: a cost only a rebuild pays

        with contextlib.suppress(OSError), atomic_path(path) as tmp, open(tmp, "wb") as f:
            pickle.dump(built, f, protocol=pickle.HIGHEST_PROTOCOL)
    return built


@cache
def lark_parser() -> Any:
    """lark's parser for the card grammar, the one the tables came from."""
    import lark

    return lark.Lark.load(io.BytesIO(tables().lark))


def _cache_file(grammar: str) -> Path | None:
    """Where the tables are kept: $XDG_CACHE_HOME/cardc, else ~/.cache/cardc, under a hash of
    the grammar, the options, this file (the tables' format) and lark's source (its version,
    without importing it); none when CARDC_NO_CACHE is set."""
    if os.environ.get("CARDC_NO_CACHE"):
        return None
    spec = importlib.util.find_spec("lark")
    lark_init = Path(spec.origin).read_bytes() if spec and spec.origin else b""
    key = (repr((grammar, sorted(OPTIONS.items()))).encode("utf-8")
           + Path(__file__).read_bytes() + lark_init)
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "cardc" / f"tables-{hashlib.sha256(key).hexdigest()[:24]}.pickle"


def _build(grammar: str) -> Tables:
    import lark
    from lark.parsers.lalr_analysis import Shift

    parser = lark.Lark(grammar, **OPTIONS)
    saved = io.BytesIO()
    parser.save(saved)
    table = parser.parser.parser.parser.parse_table
    rules = {id(r): _rule(r) for r in parser.rules}
    rows: dict[int, dict[str, int | Rule]] = {}
    gotos: dict[int, dict[str, int]] = {}
    for state, actions in table.states.items():  # names as plain str: lark's are often Tokens
        rows[state] = {str(t): arg if a is Shift else rules[id(arg)] for t, (a, arg) in actions.items()}
        gotos[state] = {str(t): arg for t, (a, arg) in actions.items() if a is Shift and not t.isupper()}
    scanners: dict[int, Scanner] = {}
    by_lexer: dict[int, Scanner] = {}
    for state, lexer in parser.parser.lexer.lexers.items():
        if id(lexer) not in by_lexer:
            by_lexer[id(lexer)] = _scanner(lexer)
        scanners[state] = by_lexer[id(lexer)]
    terminals = {str(t.name): str(t.pattern.to_regexp()) for t in parser.terminals}
    return Tables(rows, gotos, dict(table.start_states), dict(table.end_states),
                  tuple(rules.values()), scanners, terminals, saved.getvalue())


def _rule(rule: Any) -> Rule:
    """lark's tree shaping, decided once per rule: anonymous and `_` tokens are dropped,
    `_` rules (EBNF repetitions) spliced into their parent, `?rule`s with one child inlined."""
    kept = [(i, not sym.is_term and sym.name.startswith("_"))
            for i, sym in enumerate(rule.expansion) if not (sym.is_term and sym.filter_out)]
    keep = None if len(kept) == len(rule.expansion) and not any(sp for _, sp in kept) else tuple(kept)
    expand = bool(rule.options.expand1) and not rule.alias
    size, name = len(rule.expansion), str(rule.alias or rule.origin.name)
    return Rule(size, str(rule.origin.name), name, keep, expand,
                unit=size == 1 and expand and keep is None, helper=name.startswith("_"))


def _scanner(lexer: Any) -> Scanner:
    """What a lark lexer does, as data: its terminals after lark takes out keywords that a
    pattern of the same priority also matches, and the retyping that gives those back."""
    from lark.lexer import UnlessCallback, _create_unless

    if lexer.user_callbacks or lexer.re is not re or lexer.use_bytes:
        raise TypeError("cardc's lexer reads only plain `re` terminals without callbacks")
    terminals, callbacks = _create_unless(lexer.terminals, lexer.g_regex_flags, lexer.re,
                                          lexer.use_bytes)
    retype: dict[str, dict[str, str]] = {}
    for name, callback in callbacks.items():
        if not isinstance(callback, UnlessCallback):
            raise TypeError(f"unexpected lexer callback for {name}")
        words: dict[str, str] = {}
        for term in callback.scanner.terminals:  # the first whose text matches wins
            if term.pattern.type != "str" or term.pattern.flags:
                raise TypeError(f"keyword {term.name} is not plain text")
            words.setdefault(str(term.pattern.value), str(term.name))
        retype[str(name)] = words
    return Scanner(tuple((str(t.name), str(t.pattern.to_regexp())) for t in terminals), retype,
                   frozenset(map(str, lexer.ignore_types)), frozenset(map(str, lexer.newline_types)),
                   int(lexer.g_regex_flags))


# ------------------------------------------------------------------------------- parsing


class Cursor:
    """The parser's state stack, seen by lark's contextual lexer as its `position`."""

    __slots__ = ("stack",)

    def __init__(self, stack: list[int]):
        self.stack = stack

    @property
    def position(self) -> int:
        return self.stack[-1]


Build = Callable[[Rule, "Meta | None", list], Any]  # a rule's node from its kept children


def parse(text: str, start: str, build: Build, respell: Callable[[Token], Token],
          at: tuple[int, int] = (0, 1)) -> Any:
    """Parse `text` from the rule `start`, calling `build` as rules reduce (what a lark
    Transformer would do on the finished tree, in the same order), `respell` on each NAME
    token; raises ParseError where the text does not parse. `at`: the offset and number of
    the line to begin at (after a syntax error, the parse goes on from a later line)."""
    t = tables()
    rows, gotos, units, end = t.rows, t.gotos, t.units, t.end[start]
    stack = [t.begin[start]]
    cursor = Cursor(stack)
    values: list[Any] = []
    metas: list[Any] = []  # per value: its token, its Meta, or None where it spans no text
    for token in _tokens(t, text, cursor, at):
        kind = token.type
        if kind == "TIMES" and token == "x" and not _shifts(t, stack, kind):
            kind, token = "NAME", token.update("NAME")  # `W x`: a name, as only `a x b` is ×
        if kind == "NAME":
            token = respell(token)
        while True:
            state = stack[-1]
            row = rows[state]
            act = row.get(kind)
            if act is None:
                expected = {name for name in row if name.isupper()}
                raise ParseError(partial(_unexpected, token, expected, cursor))
            if type(act) is int:  # shift
                stack.append(act)
                values.append(token)
                metas.append(token)
                break
            if act.unit:  # only the state changes
                key = (stack[-2], state, kind)
                top = units.get(key)
                if top is None:
                    top = units[key] = _unit_chain(t, *key)
                stack[-1] = top
            else:
                n = act.size
                if n:
                    kids, parts = values[-n:], metas[-n:]
                    del stack[-n:], values[-n:], metas[-n:]
                    first, last = parts[0], parts[-1]
                    meta = Meta(first.line, first.column, last.end_line, last.end_column,
                                first.start_pos, last.end_pos) \
                        if first is not None and last is not None else _extent(parts)
                else:
                    kids, meta = [], None
                values.append(_reduce(act, build, meta, kids))
                metas.append(meta)
                stack.append(gotos[stack[-1]][act.origin])
            if stack[-1] == end and kind == "$END":
                return values[-1]


def _shifts(t: Tables, stack: list[int], term: str) -> bool:
    """Whether `term` is shifted after the reductions it calls for. The lexer offers a terminal
    that any reduction accepts as lookahead (LALR merges lookaheads of states that look alike),
    so an ASCII `x` after a product may lex as × where the product goes on with the name x."""
    states = list(stack)
    while True:
        act = t.rows[states[-1]].get(term)
        if act is None:
            return False
        if type(act) is int:
            return True
        if act.size:
            del states[-act.size:]
        states.append(t.gotos[states[-1]][act.origin])


def _unit_chain(t: Tables, below: int, top: int, term: str) -> int:
    """The top state after the run of unit reductions that lookahead `term` starts in state
    `top` (each pops one state and pushes one, so the state `below` stays), short of an end
    state; remembered in `t.units`, as expressions chain seven such rules deep."""
    while True:
        act = t.rows[top].get(term)
        if not isinstance(act, Rule) or not act.unit:
            return top
        top = t.gotos[below][act.origin]
        if top in t.end.values():
            return top


def _reduce(rule: Rule, build: Build, meta: Meta | None, kids: list) -> Any:
    if rule.keep is not None:
        kept: list[Any] = []
        for i, splice in rule.keep:
            if splice:
                kept += kids[i]
            else:
                kept.append(kids[i])
        kids = kept
    if rule.expand and len(kids) == 1:
        return kids[0]
    if rule.helper:
        return kids  # its parent splices these in
    return build(rule, meta, kids)


def _extent(parts: list) -> Meta | None:
    """The extent of a rule's children (tokens and Metas); None where all are empty."""
    first = parts[0] if parts else None
    if first is None:
        first = next((p for p in parts if p is not None), None)
        if first is None:
            return None
    last = parts[-1]
    if last is None:
        last = next(p for p in reversed(parts) if p is not None)
    return Meta(first.line, first.column, last.end_line, last.end_column, first.start_pos,
                last.end_pos)


def _tokens(t: Tables, text: str, cursor: Cursor, at: tuple[int, int]) -> Iterator[Token]:
    """lark's contextual lexing: at each place, the first of the terminals that the parser's
    state accepts that matches (in lark's order of priority); where none does, lark's own lexer
    raises the error it would have raised. Ends with the $END token."""
    pos, line = at
    line_start, end = pos, len(text)
    token = None
    scanners, stack = t.scanners, cursor.stack
    while pos < end:
        sc = scanners[stack[-1]]
        if sc.alternation is not None:  # a busy lexer: most tokens
            m = sc.alternation.match(text, pos)
            found = (m.group(0), m.lastgroup) if m else None
        else:
            found = sc.match(text, pos)
        if found is None:
            raise ParseError(partial(_lex_error, text, cursor, (pos, line, line_start), token))
        value, kind = found
        start, column = pos, pos - line_start + 1
        pos += len(value)
        newlines = 0
        if kind in sc.multiline and "\n" in value:
            line_start = start + value.rindex("\n") + 1
            newlines = value.count("\n")
            line += newlines
        if kind in sc.ignore:
            continue
        if kind in sc.retype:
            kind = sc.retype[kind].get(value, kind)
        token = Token(kind, value, start, line - newlines, column, line, pos - line_start + 1, pos)
        yield token
    if token is None:
        yield Token("$END", "", pos, line, pos - line_start + 1)
    else:
        yield Token("$END", "", token.start_pos, token.line, token.column, token.end_line,
                    token.end_column, token.end_pos)


class ParseError(Exception):
    """The text does not parse. What went wrong, as lark would have said it, costs an import of
    lark: callers that only need to know pay nothing (annotations that are notes fail often)."""

    def __init__(self, lark_error: Callable[[], Exception]):
        super().__init__("syntax error")
        self.lark_error = lark_error


def _unexpected(token: Token, expected: set[str], cursor: Cursor) -> Exception:
    from lark import UnexpectedToken

    return UnexpectedToken(token, expected, state=cursor)


def _lex_error(text: str, cursor: Cursor, at: tuple[int, int, int], last: Token | None
               ) -> Exception:
    """What lark's lexer raises where ours found no terminal."""
    from lark import LarkError
    from lark.lexer import LexerState, LineCounter
    from lark.utils import TextSlice

    pos, line, line_start = at
    counter = LineCounter("\n")
    counter.char_pos, counter.line, counter.line_start_pos = pos, line, line_start
    counter.column = pos - line_start + 1
    state = LexerState(TextSlice.cast_from(text), counter, last)
    try:
        next(lark_parser().parser.lexer.lex(state, cursor))
    except LarkError as err:
        return err
    raise AssertionError(f"lark lexed what cardc's lexer could not, at {line}:{counter.column}")
