"""`cardc lsp`: the language server, over stdio (pygls). Each open card file is checked again
on every change and its diagnostics published; requests read the last check of their file."""

from __future__ import annotations

import traceback
from importlib import metadata
from pathlib import Path

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from ..diagnostics import Diagnostic
from ..syntax import Span
from . import features
from .document import Document, analyse


class CardServer(LanguageServer):
    """The open documents' last checks, by URI."""

    def __init__(self) -> None:
        super().__init__("cardc", _version(),
                         text_document_sync_kind=lsp.TextDocumentSyncKind.Incremental)
        self.checked: dict[str, Document] = {}
        # each document's last check that read its cards: the names in scope while a line
        # being typed does not parse
        self.parsed: dict[str, Document] = {}

    def path_of(self, uri: str) -> str:
        return to_fs_path(uri) or uri

    def open_texts(self, skip: str) -> dict[Path, str]:
        """Every other open card file's text, as the editor holds it."""
        out = {}
        for uri, doc in self.workspace.text_documents.items():
            path = self.path_of(uri)
            if uri != skip and path.endswith(".card"):
                out[Path(path).resolve()] = doc.source
        return out

    def refresh(self, uri: str) -> None:
        """Check the document again and publish its diagnostics."""
        text = self.workspace.get_text_document(uri).source
        path = self.path_of(uri)
        try:
            doc = analyse(path, text, self.open_texts(uri))
        except Exception as err:  # a defect of cardc: say so in the file, keep serving
            self.window_log_message(lsp.LogMessageParams(lsp.MessageType.Error,
                                                         traceback.format_exc()))
            doc = analyse(path, "", {})
            doc.diagnostics = [Diagnostic(Span(path, 1, 1, 1, 2),
                                          f"internal error while checking: {err}",
                                          "please report this card")]
            doc.text = text
        self.checked[uri] = doc
        if doc.card_file.algorithms:
            self.parsed[uri] = doc
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
            uri, features.diagnostics(doc), version=self.workspace.get_text_document(uri).version))

    def document(self, uri: str) -> Document:
        """The document's last check: what edits it (formatting, rename) reads this."""
        if uri not in self.checked:
            self.refresh(uri)
        return self.checked[uri]

    def readable(self, uri: str) -> Document:
        """The last check, or while a line being typed keeps the file from parsing (a card
        with a syntax error has no cards) its last check that had cards: what only reads
        (hover, definitions, references, completion, symbols) goes on working meanwhile."""
        doc = self.document(uri)
        return doc if doc.card_file.algorithms else self.parsed.get(uri, doc)


def _version() -> str:
    """cardc's version as installed (the package's metadata: this layer is below the command
    line's, which declares it)."""
    try:
        return metadata.version("cardc")
    except metadata.PackageNotFoundError:
        return "unknown"


server = CardServer()


@server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: CardServer, params: lsp.DidOpenTextDocumentParams) -> None:
    ls.refresh(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: CardServer, params: lsp.DidChangeTextDocumentParams) -> None:
    ls.refresh(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: CardServer, params: lsp.DidSaveTextDocumentParams) -> None:
    ls.refresh(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: CardServer, params: lsp.DidCloseTextDocumentParams) -> None:
    ls.checked.pop(params.text_document.uri, None)
    ls.parsed.pop(params.text_document.uri, None)
    ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
        params.text_document.uri, []))


@server.feature(lsp.TEXT_DOCUMENT_HOVER)
def hover(ls: CardServer, params: lsp.HoverParams) -> lsp.Hover | None:
    return features.hover(ls.readable(params.text_document.uri), params.position)


@server.feature(lsp.TEXT_DOCUMENT_DEFINITION)
def definition(ls: CardServer, params: lsp.DefinitionParams) -> list[lsp.Location]:
    return features.definition(ls.readable(params.text_document.uri), params.position)


@server.feature(lsp.TEXT_DOCUMENT_REFERENCES)
def references(ls: CardServer, params: lsp.ReferenceParams) -> list[lsp.Location]:
    return features.references(ls.readable(params.text_document.uri), params.position,
                               params.context.include_declaration)


@server.feature(lsp.TEXT_DOCUMENT_COMPLETION,
                lsp.CompletionOptions(trigger_characters=["-", "=", "^", "_", "."]))
def completion(ls: CardServer, params: lsp.CompletionParams) -> lsp.CompletionList:
    uri = params.text_document.uri
    lines = ls.workspace.get_text_document(uri).lines
    line = lines[params.position.line] if params.position.line < len(lines) else ""
    return features.completion(ls.readable(uri), params.position, line.rstrip("\r\n"))


@server.feature(lsp.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
def document_symbols(ls: CardServer, params: lsp.DocumentSymbolParams
                     ) -> list[lsp.DocumentSymbol]:
    return features.document_symbols(ls.readable(params.text_document.uri))


@server.feature(lsp.TEXT_DOCUMENT_PREPARE_RENAME)
def prepare_rename(ls: CardServer, params: lsp.PrepareRenameParams) -> lsp.Range | None:
    return features.prepare_rename(ls.document(params.text_document.uri), params.position)


@server.feature(lsp.TEXT_DOCUMENT_RENAME)
def rename(ls: CardServer, params: lsp.RenameParams) -> lsp.WorkspaceEdit | None:
    return features.rename(ls.document(params.text_document.uri), params.position,
                           params.new_name)


@server.feature(lsp.TEXT_DOCUMENT_FORMATTING)
def formatting(ls: CardServer, params: lsp.DocumentFormattingParams) -> list[lsp.TextEdit]:
    return features.formatting(ls.document(params.text_document.uri))


def main() -> int:
    server.start_io()
    return 0
