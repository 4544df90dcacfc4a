"""The checker's step for names: what `cardc.names` maps to one Python identifier must be one
card name, and a card declares each name once.

Three namespaces of generated code are checked. A card's *locals* (its declared and assigned
names: inputs, outputs, hyperparameters, parameters, step targets) become arguments and locals
of one function or `forward`; its *attributes* (parameters, as `self.W_e`, and hyperparameters,
as `self.D`) live on one `nn.Module`; card *labels* become classes, functions and module files.
Loop variables are not checked: the lowering gives each a name no card name of the card takes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import syntax as s
from ..diagnostics import Diagnostics
from ..names import attribute, identifier
from ..spelling import canonical_name, display
from .driver import Checker
from .indexed import split_name

_WORD = re.compile(r"[^\s,;:∈=~]+")  # a declared name as written (braced subscripts aside)
_DECLARING = ("Input", "Hyperparameters", "Parameters")  # a name is declared once among these


@dataclass(frozen=True)
class Named:
    """A card name, where it is written, and the identifier it becomes."""

    name: str
    span: s.Span
    py: str


def check_names(checker: Checker) -> None:
    diags = checker.diags
    for card_file in checker.lib.files:
        for alg in card_file.algorithms:
            declared = _declared(alg, diags.sources)
            _duplicates(declared, diags)
            reported: set[str] = set()  # one error a name, in whichever namespace comes first
            _collide(_locals(alg, declared), "in generated code", diags, reported)
            _collide(_attributes(declared), "as attributes of the generated module", diags,
                     reported)
            _shadows(alg, checker, declared, diags)
    labels: set[str] = set()
    _collide(_labels(checker), "in generated code", diags, labels)
    _collide(_file_names(checker), "as generated file names", diags, labels)


def card_identifiers(alg: s.Algorithm) -> frozenset[str]:
    """The identifiers of every name `alg` declares or assigns: a loop variable the lowering
    binds takes none of these."""
    return frozenset(n.py for n in _locals(alg, _declared(alg, {})))


# ------------------------------------------------------------------ gathering


@dataclass(frozen=True)
class _Decl:
    kind: str  # a block kind, or "Bundle" for a bundle's own name
    name: str
    span: s.Span
    family: str | None  # the variable of the family (For h ∈ [H]:) it is declared in
    own: bool = False  # the card's own bundle (`| θ`, declared at the top): the module itself


def _declared(alg: s.Algorithm, sources: dict[str, str]) -> list[_Decl]:
    out: list[_Decl] = []

    def walk(kind: str, item: s.Item, family: str | None, top: bool = False) -> None:
        if isinstance(item, s.Decl):
            out.extend(_Decl(kind, n, _name_span(item.span, n, sources), family)
                       for n in item.names)
        elif isinstance(item, s.Bundle):
            own = top and kind == "Parameters" and item.name in alg.params
            out.append(_Decl("Bundle", item.name, _name_span(item.span, item.name, sources),
                             family, own))
            for sub in item.items:
                walk(kind, sub, family)
        elif isinstance(item, s.Family):
            for sub in item.items:
                walk(kind, sub, item.index, top=False)

    for block in alg.blocks:
        for item in block.items:
            walk(block.kind, item, None, top=True)
    return out


def _name_span(span: s.Span, name: str, sources: dict[str, str]) -> s.Span:
    """The span of `name` within a declaration, where its canonical spelling is found there."""
    lines = sources.get(span.file, "").splitlines()
    if not 1 <= span.line <= len(lines):
        return span
    line, want = lines[span.line - 1], display(name)
    for m in _WORD.finditer(line, max(span.col - 1, 0)):  # as written: `gamma1` is γ1
        if display(canonical_name(m.group(0))) == want:
            return s.Span(span.file, span.line, m.start() + 1, span.line, m.end() + 1)
    return span


def _locals(alg: s.Algorithm, declared: list[_Decl]) -> list[Named]:
    names = [(d.name, d.span) for d in declared]
    names += [(n, alg.span) for n in (*alg.outputs, *alg.args, *alg.params)]
    for node in s.nodes(alg.steps):
        if isinstance(node, s.Assign):
            target = node.target
            if isinstance(target, s.Index):
                target = target.base
            if isinstance(target, s.Name):
                names.append((target.id, target.span))
            elif isinstance(target, s.Call):
                names.append((target.func, target.span))
        elif isinstance(node, s.Sample):
            names.append((node.var, node.span))
        elif isinstance(node, s.Return) and node.name:
            names.append((node.name, node.span))
    return [Named(n, span, identifier(n)) for n, span in names]


def _attributes(declared: list[_Decl]) -> list[Named]:
    out = []
    for d in declared:
        if d.kind == "Hyperparameters":
            out.append(Named(d.name, d.span, identifier(d.name)))
        elif d.kind in ("Parameters", "Bundle") and not d.own:  # a bundle: a submodule
            out.append(Named(d.name, d.span, attribute(*split_name(d.name), d.family)))
    return out


def _parsed(checker: Checker) -> list[tuple[s.CardFile, s.Algorithm]]:
    """The cards parsed so far, titled ones too (a lazily loaded library stays lazy)."""
    return [(f, a) for f in checker.lib.files for a in f.algorithms]


def _labels(checker: Checker) -> list[Named]:
    return [Named(alg.label, alg.span, identifier(alg.label))
            for _, alg in _parsed(checker) if alg.label]


def _file_names(checker: Checker) -> list[Named]:
    """`cardc build` writes generated/<folder>/<label, lower case>.py: one file per card."""
    out = []
    for card_file, alg in _parsed(checker):
        if alg.label:
            folder = card_file.path.rsplit("/", 1)[0] if "/" in card_file.path else ""
            out.append(Named(alg.label, alg.span, f"{folder}/{identifier(alg.label).lower()}"))
    return out


# ------------------------------------------------------------------ reporting


def _shadows(alg: s.Algorithm, checker: Checker, declared: list[_Decl],
             diags: Diagnostics) -> None:
    """A card's local may not take the identifier of a card it calls: generated code calls
    that card's class or function by it, from the same scope."""
    info = checker.infos.get(id(alg))
    callees = {identifier(c.callee.label): c.callee for c in (info.calls.values() if info else ())
               if c.callee.label}
    for n in _locals(alg, declared):
        callee = callees.pop(n.py, None)  # once a card
        if callee is not None:
            diags.error(n.span, f"'{display(n.name)}' would hide the card "
                                f"'{display(callee.label or '')}' it calls: both would be "
                                f"'{n.py}' in generated code",
                        notes=((callee.span, f"'{display(callee.label or '')}' is here"),),
                        hint="rename one of them")



def _duplicates(declared: list[_Decl], diags: Diagnostics) -> None:
    first: dict[str, _Decl] = {}
    for d in declared:
        if d.kind not in _DECLARING:
            continue
        prior = first.setdefault(d.name, d)
        if prior is not d:
            where = "" if prior.kind == d.kind else f" (first under {prior.kind})"
            diags.error(d.span, f"'{display(d.name)}' is declared twice{where}",
                        notes=((prior.span, "first declared here"),),
                        hint="declare each name once; remove or rename one of them")


def _collide(names: list[Named], where: str, diags: Diagnostics, reported: set[str]) -> None:
    """A located error at each name whose identifier an earlier, different name already takes
    (once a name: `reported` holds those already blamed)."""
    first: dict[str, Named] = {}
    for n in names:
        prior = first.setdefault(n.py, n)
        if prior.name == n.name or n.name in reported:
            continue
        reported.add(n.name)
        py = n.py.rsplit("/", 1)[-1]
        diags.error(n.span, f"'{display(n.name)}' and '{display(prior.name)}' would both be "
                            f"'{py}' {where}",
                    notes=((prior.span, f"'{display(prior.name)}' is here"),),
                    hint="rename one of them")
