"""`cardc lsp` end to end: a real server process (`python -m cardc lsp`) driven over the
Language Server Protocol by pytest-lsp's client, as an editor drives it.

Each test opens a card (a copy of a shipped one, under a folder of its own, so that calls
resolve to the shipped library and the card's own file), sends the requests an editor sends,
and reads what comes back: diagnostics as the text changes, hover, definition, references,
completion, document symbols, rename and formatting.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types as lsp
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

ROOT = Path(__file__).resolve().parent.parent
GPT2 = (ROOT / "cards" / "gpt2.card").read_text(encoding="utf-8")

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(scope="module",
                    config=ClientServerConfig(server_command=[sys.executable, "-m", "cardc", "lsp"]))
async def client(lsp_client: LanguageClient):
    params = lsp.InitializeParams(capabilities=client_capabilities("visual-studio-code"),
                                  root_uri=ROOT.as_uri())
    await lsp_client.initialize_session(params)
    yield
    await lsp_client.shutdown_session()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cards")


def _uri(folder: Path, name: str) -> str:
    return (folder / name).resolve().as_uri()


async def _open(client: LanguageClient, uri: str, text: str) -> list[lsp.Diagnostic]:
    client.text_document_did_open(lsp.DidOpenTextDocumentParams(
        lsp.TextDocumentItem(uri, "card", 1, text)))
    await client.wait_for_notification(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    return list(client.diagnostics[uri])


def _at(text: str, line: int, word: str, nth: int = 0) -> lsp.Position:
    """The position of the nth `word` on 1-based `line`."""
    col = -1
    for _ in range(nth + 1):
        col = text.split("\n")[line - 1].index(word, col + 1)
    return lsp.Position(line - 1, col)


async def test_diagnostics_follow_the_edits(client: LanguageClient, folder: Path):
    """A misspelt name is an error at its place, with the checker's hint; a one-character edit
    that fixes it clears it."""
    uri = _uri(folder, "typo.card")
    text = GPT2.replace("1 E ← W_e[x]", "1 E ← W_x[x]")
    found = await _open(client, uri, text)
    assert [(d.range.start.line, d.range.start.character) for d in found] == [(13, 6)]
    assert "unknown name 'W_x'" in found[0].message and "hint: did you mean" in found[0].message
    assert found[0].severity == lsp.DiagnosticSeverity.Error and found[0].source == "cardc"
    fix = lsp.Range(lsp.Position(13, 8), lsp.Position(13, 9))  # W_x → W_e
    start = time.perf_counter()
    client.text_document_did_change(lsp.DidChangeTextDocumentParams(
        lsp.VersionedTextDocumentIdentifier(uri=uri, version=2),
        [lsp.TextDocumentContentChangePartial(range=fix, text="e")]))
    await client.wait_for_notification(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    took = time.perf_counter() - start
    assert list(client.diagnostics[uri]) == []
    assert took < 5, f"diagnostics took {took:.2f} s after a one-character edit"


async def test_a_note_is_related_information_at_its_own_place(client: LanguageClient,
                                                              folder: Path):
    """A call with one input too many: the error at the call, the callee's declaration (in the
    shipped library's file) as related information."""
    uri = _uri(folder, "arity.card")
    text = GPT2.replace("5 E ← LayerNorm(E | γ_f", "5 E ← LayerNorm(E, E | γ_f")
    found = await _open(client, uri, text)
    assert len(found) == 1 and "takes 1 input(s), given 2" in found[0].message
    (note,) = found[0].related_information or []
    assert note.location.uri.endswith("/layer_norm.card") and note.message == "declared here"


async def test_hover_shows_a_names_type_and_its_prose(client: LanguageClient, folder: Path):
    uri = _uri(folder, "hover.card")
    await _open(client, uri, GPT2)
    hover = await client.text_document_hover_async(lsp.HoverParams(
        lsp.TextDocumentIdentifier(uri), _at(GPT2, 14, "W_e")))
    assert hover is not None
    assert "ℝ^{V×D}" in hover.contents.value and "token embeddings" in hover.contents.value
    card = await client.text_document_hover_async(lsp.HoverParams(
        lsp.TextDocumentIdentifier(uri), _at(GPT2, 16, "GPT2Block")))
    assert card is not None and "X ← GPT2Block(X | θ)" in card.contents.value
    assert "pre-LN transformer block" in card.contents.value


async def test_definition_reaches_the_shipped_library(client: LanguageClient, folder: Path):
    """A call to LayerNorm goes to its header in the shipped cards/nn; a name to its
    declaration; a callee's hyperparameter (`ε = ε`'s first ε) to the callee's."""
    uri = _uri(folder, "definition.card")
    await _open(client, uri, GPT2)
    ask = client.text_document_definition_async
    (norm,) = await ask(lsp.DefinitionParams(lsp.TextDocumentIdentifier(uri),
                                             _at(GPT2, 18, "LayerNorm")))
    assert norm.uri.endswith("/cards/nn/layer_norm.card")
    header = (ROOT / "cards" / "nn" / "layer_norm.card").read_text(encoding="utf-8").split("\n")
    assert "LayerNorm(" in header[norm.range.start.line]
    (w_e,) = await ask(lsp.DefinitionParams(lsp.TextDocumentIdentifier(uri),
                                            _at(GPT2, 14, "W_e")))
    assert (w_e.uri, w_e.range.start.line, w_e.range.start.character) == (uri, 6, 4)
    (eps,) = await ask(lsp.DefinitionParams(lsp.TextDocumentIdentifier(uri),
                                            _at(GPT2, 18, "ε")))
    assert eps.uri.endswith("/cards/nn/layer_norm.card")


async def test_references_find_a_cards_calls_and_a_names_uses(client: LanguageClient,
                                                              folder: Path):
    uri = _uri(folder, "references.card")
    await _open(client, uri, GPT2)
    ask = client.text_document_references_async
    block = await ask(lsp.ReferenceParams(
        text_document=lsp.TextDocumentIdentifier(uri), position=_at(GPT2, 16, "GPT2Block"),
        context=lsp.ReferenceContext(include_declaration=True)))
    assert sorted((r.uri == uri, r.range.start.line) for r in block) == [(True, 15), (True, 20)]
    uses = await ask(lsp.ReferenceParams(
        text_document=lsp.TextDocumentIdentifier(uri), position=_at(GPT2, 14, "E"),
        context=lsp.ReferenceContext(include_declaration=False)))
    assert sorted(r.range.start.line for r in uses) == [13, 15, 15, 17, 17, 18]


async def test_completion_offers_symbols_names_and_cards(client: LanguageClient, folder: Path):
    """Typing `6 E <-` over the last step: the arrow is offered for `<-`, and the names in
    scope are those of the card as it last checked (the line being typed does not parse)."""
    uri = _uri(folder, "completion.card")
    await _open(client, uri, GPT2)
    step = lsp.Range(lsp.Position(18, 0), lsp.Position(18, len("6 return P = E W_e^⊺")))
    client.text_document_did_change(lsp.DidChangeTextDocumentParams(
        lsp.VersionedTextDocumentIdentifier(uri=uri, version=2),
        [lsp.TextDocumentContentChangePartial(range=step, text="6 E <-")]))
    await client.wait_for_notification(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    at_arrow = lsp.Position(18, len("6 E <-"))
    items = (await client.text_document_completion_async(lsp.CompletionParams(
        lsp.TextDocumentIdentifier(uri), at_arrow))).items
    arrow = next(i for i in items if i.label.startswith("←"))
    assert arrow.text_edit.new_text == "←"
    assert arrow.text_edit.range == lsp.Range(lsp.Position(18, 4), at_arrow)
    labels = {i.label for i in items}
    assert {"W_e", "γ_f", "GPT2Block", "LayerNorm", "softmax"} <= labels
    hover = await client.text_document_hover_async(lsp.HoverParams(
        lsp.TextDocumentIdentifier(uri), _at(GPT2, 14, "W_e")))
    assert hover is not None and "ℝ^{V×D}" in hover.contents.value  # the rest still answers
    edits = await client.text_document_formatting_async(lsp.DocumentFormattingParams(
        lsp.TextDocumentIdentifier(uri), lsp.FormattingOptions(tab_size=4, insert_spaces=True)))
    assert not edits  # never the last parsed text over what is being typed


async def test_document_symbols_are_the_cards_of_the_file(client: LanguageClient, folder: Path):
    uri = _uri(folder, "symbols.card")
    await _open(client, uri, GPT2)
    symbols = await client.text_document_document_symbol_async(lsp.DocumentSymbolParams(
        lsp.TextDocumentIdentifier(uri)))
    assert [s.name for s in symbols] == ["GPT2", "GPT2Block"]
    assert {"x", "W_e", "W_p", "γ_f"} <= {c.name for c in symbols[0].children or []}


async def test_rename_changes_a_local_name_and_nothing_else(client: LanguageClient,
                                                            folder: Path):
    uri = _uri(folder, "rename.card")
    await _open(client, uri, GPT2)
    edit = await client.text_document_rename_async(lsp.RenameParams(
        lsp.TextDocumentIdentifier(uri), _at(GPT2, 14, "E"), "H_0"))
    changes = edit.changes[uri]
    assert len(changes) == 6 and all(c.new_text == "H_0" for c in changes)
    assert all(13 <= c.range.start.line <= 18 for c in changes)  # GPT2's steps alone


async def test_formatting_is_cardc_fmt(client: LanguageClient, folder: Path):
    uri = _uri(folder, "ascii.card")
    text = GPT2.replace("1 E ← W_e[x] + W_p[1 : T]", "1 E <- W_e[x] + W_p[1 : T]")
    await _open(client, uri, text)
    (edit,) = await client.text_document_formatting_async(lsp.DocumentFormattingParams(
        lsp.TextDocumentIdentifier(uri), lsp.FormattingOptions(tab_size=4, insert_spaces=True)))
    assert edit.new_text == GPT2 and edit.range.start == lsp.Position(0, 0)
