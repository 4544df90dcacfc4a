"""What the language server answers, one function a request, each from a checked `Document`:
hover, definition, references, completion, document symbols, rename and formatting."""

from __future__ import annotations

import re
from pathlib import Path

from lsprotocol import types as lsp

from .. import syntax as s
from ..builtins import BUILTINS
from ..diagnostics import Diagnostic
from ..render.text import format_source, render_expr
from ..spelling import GREEK, canonical_name, display
from .document import Document
from .index import FileIndex, Occurrence
from .positions import Columns

SOURCE = "cardc"


def uri_of(path: str) -> str:
    return Path(path).resolve().as_uri()


def diagnostics(doc: Document) -> list[lsp.Diagnostic]:
    """The checker's located messages; a hint is part of the message, each note related
    information at its own place."""
    return [_diagnostic(doc, d) for d in doc.diagnostics]


def _diagnostic(doc: Document, d: Diagnostic) -> lsp.Diagnostic:
    severity = lsp.DiagnosticSeverity.Error if d.severity == "error" \
        else lsp.DiagnosticSeverity.Warning
    message = display(d.message + (f"\nhint: {d.hint}" if d.hint else ""))
    related = [lsp.DiagnosticRelatedInformation(_location(doc, span), display(text))
               for span, text in d.notes if span.line > 0]
    return lsp.Diagnostic(doc.columns.range(d.span), message, severity=severity, source=SOURCE,
                          related_information=related or None)


def _columns(doc: Document, path: str) -> Columns:
    if path == doc.path:
        return doc.columns
    text = doc.lib.diags.sources.get(path)
    if text is None:  # a file the library did not read: its text on disk
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    return Columns(text)


def _location(doc: Document, span: s.Span) -> lsp.Location:
    return lsp.Location(uri_of(span.file), _columns(doc, span.file).range(span))


def _at(doc: Document, position: lsp.Position) -> Occurrence | None:
    line, col = doc.columns.column(position)
    return doc.index.at(line, col)


# --- hover -------------------------------------------------------------------------------


def hover(doc: Document, position: lsp.Position) -> lsp.Hover | None:
    """A name's type as the checker infers it and its declaration's prose; a card's
    signature and description."""
    occ = _at(doc, position)
    if occ is None:
        return None
    if occ.kind == "card":
        callee = doc.resolve(occ.name)
        text = _card_summary(doc, callee) if callee else f"no card named '{display(occ.name)}'"
    elif occ.kind == "param":
        callee = doc.resolve(occ.callee or "")
        decl = _declaration(callee, occ.name) if callee else None
        text = _name_summary(occ.name, decl, None, f"a hyperparameter of {occ.callee}")
    else:
        decl = _declaration(occ.alg, occ.name)
        text = _name_summary(occ.name, decl, _type_of(doc, occ), None)
    return lsp.Hover(lsp.MarkupContent(lsp.MarkupKind.Markdown, text),
                     range=doc.columns.range(occ.span))


def _type_of(doc: Document, occ: Occurrence) -> str | None:
    """The checker's type of the value a name holds there."""
    if doc.checker is None:
        return None
    info = doc.checker.infos.get(id(occ.alg))
    if info is None:
        return None
    entry = info.types.get(id(occ.node)) if occ.node is not None else None
    if entry is None:
        entry = _signature_entry(info.sig, occ.name)
    return None if entry is None else display(str(entry))


def _signature_entry(sig, name: str):
    for n, ty in sig.inputs:
        if n == name:
            return ty
    if name in sig.hypers:
        return sig.hypers[name]
    return _member(sig.tree, name)


def _member(bundle, name: str):
    """A parameter, by name, anywhere in a bundle of bundles and families."""
    members = getattr(bundle, "members", None)
    if members is None:
        entry = getattr(bundle, "entry", None)
        return None if entry is None else _member(entry, name)
    if name in members:
        return members[name]
    for entry in members.values():
        found = _member(entry, name)
        if found is not None:
            return found
    return None


def _declaration(alg: s.Algorithm | None, name: str) -> s.Decl | None:
    if alg is None:
        return None
    for block in alg.blocks:
        for decl in _decls(block.items):
            if name in decl.names:
                return decl
    return None


def _decls(items) -> list[s.Decl]:
    out: list[s.Decl] = []
    for item in items:
        if isinstance(item, s.Decl):
            out.append(item)
        elif isinstance(item, (s.Bundle, s.Family)):
            out += _decls(item.items)
    return out


def _name_summary(name: str, decl: s.Decl | None, ty: str | None, role: str | None) -> str:
    written = ty or (render_expr(decl.type) if decl is not None and decl.type is not None
                     else None)
    head = f"**{display(name)}**" + (f" ∈ {display(written)}" if written else "")
    lines = [head]
    if decl is not None and decl.value is not None:
        lines.append(f"= {display(render_expr(decl.value))}")
    if decl is not None and decl.prose:
        lines.append(display(decl.prose))
    if role:
        lines.append(role)
    return "\n\n".join(lines)


def _card_summary(doc: Document, alg: s.Algorithm) -> str:
    outputs, args = ", ".join(alg.outputs), ", ".join(alg.args)
    params = f" | {', '.join(alg.params)}" if alg.params else ""
    where = doc.lib.file_of(alg).path
    lines = [f"**{display(', '.join(filter(None, [outputs])))} ← {display(alg.name or '')}"
             f"({display(args)}{display(params)})**"]
    lines += [display(c) for c in alg.comments[:1]]
    lines.append(f"`{_shown_path(where)}:{alg.span.line}`")
    return "\n\n".join(lines)


def _shown_path(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


# --- definition and references ---------------------------------------------------------------


def definition(doc: Document, position: lsp.Position) -> list[lsp.Location]:
    occ = _at(doc, position)
    if occ is None:
        return []
    if occ.kind in ("card", "param"):
        callee = doc.resolve(occ.name if occ.kind == "card" else occ.callee or "")
        if callee is None:
            return []
        target = _header_or_declaration(doc, callee, None if occ.kind == "card" else occ.name)
        return [] if target is None else [_location(doc, target)]
    found = _defining(doc.index, occ)
    return [] if found is None else [_location(doc, found.span)]


def _header_or_declaration(doc: Document, alg: s.Algorithm, name: str | None) -> s.Span | None:
    path = doc.lib.file_of(alg).path
    index = doc.index if path == doc.path else doc.file_index(path)
    if index is None:
        return alg.span
    for o in index.occurrences:
        if o.alg is alg and (o.header if name is None else o.kind == "decl" and o.name == name
                             and o.span.line != alg.span.line):
            return o.span
    return alg.span


def _defining(index: FileIndex, occ: Occurrence) -> Occurrence | None:
    """Where a card's own name is declared (a block's declaration before the header's), else
    first assigned."""
    same = [o for o in index.occurrences if o.alg is occ.alg and o.name == occ.name]
    decls = [o for o in same if o.kind == "decl"]
    declared = [o for o in decls if o.span.line != occ.alg.span.line] or decls
    return (declared or [o for o in same if o.assigned] or [None])[0]


def references(doc: Document, position: lsp.Position, declaration: bool) -> list[lsp.Location]:
    occ = _at(doc, position)
    if occ is None:
        return []
    if occ.kind == "card":
        return _card_references(doc, occ.name, declaration)
    spans = [o.span for o in _locals(doc.index, occ)
             if declaration or o.kind != "decl"]
    return [_location(doc, sp) for sp in spans]


def _locals(index: FileIndex, occ: Occurrence) -> list[Occurrence]:
    """The occurrences of a card's own name (not a callee's hyperparameter of that name)."""
    return [o for o in index.occurrences
            if o.alg is occ.alg and o.name == occ.name and o.kind in ("name", "decl")]


def _card_references(doc: Document, name: str, declaration: bool) -> list[lsp.Location]:
    """Every call of the card `name` resolves to, in every card file of the library (each
    resolved from its own file, as the checker resolves it), and its header."""
    target = doc.resolve(name)
    if target is None:
        return []
    doc.lib.algorithms()  # every file of the library parsed
    found: list[lsp.Location] = []
    for card_file in list(doc.lib.files):
        index = doc.index if card_file.path == doc.path else doc.file_index(card_file.path)
        if index is None:
            continue
        for o in index.occurrences:
            if o.kind != "card" or o.name != name:
                continue
            if o.header and (o.alg is not target or not declaration):
                continue
            if o.header or doc.lib.find(name, near=card_file) is target:
                found.append(_location(doc, o.span))
    return found


# --- completion --------------------------------------------------------------------------

# ASCII spellings an editor offers to turn into the symbol (the grammar takes either)
SYMBOLS = {
    "<-": "←", "->": "→", "in": "∈", "RR": "ℝ", "NN": "ℕ", "^T": "^⊺", "forall": "∀",
    "not": "¬", "and": "∧", "sqrt": "√", "grad": "∇", "inf": "∞", "(.)": "⊙", "*": "·",
    "==": "≡", "~=": "≅", "<=": "≤", ">=": "≥", "!=": "≠", "...": "…", "||": "‖", "//": "▷",
    "propto": "∝", "log2": "log₂", "Delta": "Δ", "^2": "²", "-": "−",
    **{ascii_: letter for ascii_, letter in GREEK.items()},
}
# the ASCII spellings a word may end in, longest first, so `<-` is not read as `-`
_SPELLINGS = sorted(SYMBOLS, key=len, reverse=True)
_WORD_BEFORE = re.compile(r"[A-Za-z0-9_^{}~′'\u0302\u0303α-ωΑ-Ωℓ]*$")


def completion(doc: Document, position: lsp.Position, line_text: str) -> lsp.CompletionList:
    """Names in scope, cards and builtins for the word before the cursor; and the symbol of
    an ASCII spelling the text before the cursor ends in (`<-` → ←)."""
    before = line_text[:position.character]
    items = _symbol_items(before, position)
    word = _WORD_BEFORE.search(before).group(0)  # type: ignore[union-attr]
    start = lsp.Position(position.line, position.character - len(word))
    edit_range = lsp.Range(start, position)
    prefix = canonical_name(word) if word else ""
    for label, kind, detail in _names_in_scope(doc, position):
        if label.startswith(prefix) or display(label).startswith(word):
            items.append(lsp.CompletionItem(
                display(label), kind=kind, detail=detail,
                text_edit=lsp.TextEdit(edit_range, display(label)), filter_text=word or None))
    return lsp.CompletionList(is_incomplete=False, items=items)


def _symbol_items(before: str, position: lsp.Position) -> list[lsp.CompletionItem]:
    """The symbol of the longest ASCII spelling the text ends in, and the Greek letters whose
    spelled-out names begin with the word being typed (`thet` → θ)."""
    spelling = next((sp for sp in _SPELLINGS if before.endswith(sp)), None)
    word = re.search(r"[A-Za-z]*$", before).group(0)  # type: ignore[union-attr]
    found = [] if spelling is None else [(spelling, SYMBOLS[spelling])]
    if len(word) >= 2:
        found += [(name, letter) for name, letter in GREEK.items()
                  if name.startswith(word) and name != spelling]
    items = []
    for typed, symbol in found:
        replaced = typed if typed == spelling else word
        start = lsp.Position(position.line, position.character - len(replaced))
        items.append(lsp.CompletionItem(
            f"{symbol}  ({typed})", kind=lsp.CompletionItemKind.Operator,
            detail=f"'{typed}' as a symbol", filter_text=replaced, sort_text=" " + typed,
            text_edit=lsp.TextEdit(lsp.Range(start, position), symbol)))
    return items


def _names_in_scope(doc: Document, position: lsp.Position
                    ) -> list[tuple[str, lsp.CompletionItemKind, str]]:
    line, _ = doc.columns.column(position)
    alg = doc.index.algorithm_at(line)
    found: dict[str, tuple[lsp.CompletionItemKind, str]] = {}
    if alg is not None:
        for o in doc.index.occurrences:
            if o.alg is alg and o.kind in ("decl", "name") and (o.kind == "decl" or o.assigned):
                found.setdefault(o.name, (lsp.CompletionItemKind.Variable,
                                          f"declared in {alg.name}"))
    for name in _card_names(doc):
        found.setdefault(name, (lsp.CompletionItemKind.Function, "a card"))
    for name in sorted(BUILTINS):
        found.setdefault(name, (lsp.CompletionItemKind.Function, "a builtin"))
    return [(name, kind, detail) for name, (kind, detail) in found.items()]


def _card_names(doc: Document) -> list[str]:
    names = {a.name for f in doc.lib.files for a in f.algorithms if a.name}
    for pending in doc.lib.pending.values():
        names |= pending
    return sorted(names)


# --- symbols, rename, formatting ------------------------------------------------------------


def document_symbols(doc: Document) -> list[lsp.DocumentSymbol]:
    """The cards of the file, each with the names it declares."""
    out = []
    for alg in doc.card_file.algorithms:
        first, last = doc.index.extent[id(alg)]
        whole = doc.columns.range(s.Span(doc.path, first, 1, last + 1, 1))
        header = next((o for o in doc.index.occurrences if o.alg is alg and o.header), None)
        children = [lsp.DocumentSymbol(display(o.name), lsp.SymbolKind.Variable,
                                       doc.columns.range(o.span), doc.columns.range(o.span))
                    for o in doc.index.occurrences
                    if o.alg is alg and o.kind == "decl" and o.span.line != alg.span.line]
        selection = doc.columns.range(header.span) if header else whole
        out.append(lsp.DocumentSymbol(display(alg.label or "card"), lsp.SymbolKind.Function,
                                      whole, selection, detail=display(alg.comments[0])
                                      if alg.comments else None, children=children))
    return out


def prepare_rename(doc: Document, position: lsp.Position) -> lsp.Range | None:
    """A card's own name can be renamed (a value, a loop variable, a declaration); a card's
    name and a callee's hyperparameter cannot from here."""
    occ = _at(doc, position)
    if occ is None or occ.kind not in ("name", "decl"):
        return None
    return doc.columns.range(occ.span)


_NEW_NAME = re.compile(r"[A-Za-zα-ωΑ-Ωℓ][A-Za-z0-9α-ωΑ-Ωℓ]*(?:[\^_](?:\{[^{}\s]+\}|[A-Za-z0-9α-ωΑ-Ωℓ]+))*[′']*")


def rename(doc: Document, position: lsp.Position, new_name: str) -> lsp.WorkspaceEdit | None:
    occ = _at(doc, position)
    if occ is None or occ.kind not in ("name", "decl"):
        return None
    if not _NEW_NAME.fullmatch(new_name):
        raise ValueError(f"'{new_name}' is not a name a card can declare")
    edits = [lsp.TextEdit(doc.columns.range(o.span), new_name) for o in _locals(doc.index, occ)]
    return lsp.WorkspaceEdit(changes={uri_of(doc.path): edits})


def formatting(doc: Document) -> list[lsp.TextEdit]:
    """`cardc fmt`'s text, as one edit of the whole file; none where the card has syntax
    errors (the text stays as it is)."""
    pretty, diags = format_source(doc.text, doc.path)
    if diags.errors or pretty == doc.text:
        return []
    end = doc.columns.position(len(doc.columns.lines), 10**9)
    return [lsp.TextEdit(lsp.Range(lsp.Position(0, 0), end), pretty)]
