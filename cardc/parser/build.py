"""The parser's rule callbacks, put together: _Build, whose method for each grammar rule (by
alias or name) lalr.parse calls as the rule reduces, found by name in _callbacks."""

from __future__ import annotations

from functools import cache
from typing import Any

from .. import lalr
from .. import syntax as s
from ..lalr import Token
from ..spelling import canonical_name
from .decls import _Decls
from .exprs import _Exprs
from .lines import _Lines
from .steps import _Steps


@cache
def _callbacks() -> dict[str, tuple[Any, bool]]:
    """_Build's method for each rule that builds a node (by alias or name), and whether it
    takes the rule's Meta; every rule that builds one must have one."""
    out = {}
    for rule in lalr.tables().rules:
        build = getattr(_Build, rule.name, None)
        if build is not None:
            out[rule.name] = (build, getattr(build, "wants_meta", False))
        elif not rule.helper and not (rule.expand and _kept(rule) == 1):
            raise TypeError(f"no callback for the grammar rule {rule.name!r}")
    return out


def _kept(rule: lalr.Rule) -> int:
    return rule.size if rule.keep is None else len(rule.keep)


def _respell(token: Token) -> Token:
    """Names are kept in canonical spelling."""
    name = canonical_name(str(token))
    return token if name == token else token.update(value=name)


class _Build(_Lines, _Decls, _Steps, _Exprs):
    """Grammar rules → AST nodes and Line records: one method per rule (or alias), called with
    the rule's children once they are built; the methods stand in one class per kind of rule."""

    def run(self, start: str, at: tuple[int, int] = (0, 1)) -> Any:
        return lalr.parse(self.source, start, self.node, _respell, at)

    def node(self, rule: lalr.Rule, meta: lalr.Meta | None, kids: list) -> Any:
        build, wants_meta = _callbacks()[rule.name]
        return build(self, meta, kids) if wants_meta else build(self, kids)

    def sub(self, text: str, start: str) -> Any:
        """A part of the line parsed on its own (an annotation, an exponent); None if it fails."""
        build = _Build(self.file, text)
        try:
            node = build.run(start)
        except lalr.ParseError:
            return None
        if s.too_deep(node) is not None:  # before _shift walks it
            return None
        self.diags.items += build.diags.items
        return node
