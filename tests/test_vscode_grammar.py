"""The VS Code extension (editors/vscode): its manifest, and its TextMate grammar run by
vscode-textmate under Node (editors/vscode/test/grammar.test.js). The Node tests need node and
npm: they skip where those are missing, except under CARDC_REQUIRE_TOOLS=1 (CI), where they
fail."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cardc.builtins import BY_NAME

ROOT = Path(__file__).resolve().parent.parent
EXTENSION = ROOT / "editors" / "vscode"
GRAMMAR = EXTENSION / "syntaxes" / "card.tmLanguage.json"


def _tool(name: str) -> str:
    """The path of `name` on PATH; a skip (a failure under CARDC_REQUIRE_TOOLS) without it."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CARDC_REQUIRE_TOOLS"):
            pytest.fail(f"{name} is required here (CARDC_REQUIRE_TOOLS) and is not installed")
        pytest.skip(f"{name} is not installed")
    return found


def _run(command: list[str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=EXTENSION, capture_output=True, text=True,
                          encoding="utf-8", timeout=timeout)


def test_the_manifest_contributes_the_language_grammar_and_setting() -> None:
    manifest = json.loads((EXTENSION / "package.json").read_text(encoding="utf-8"))
    contributes = manifest["contributes"]
    assert contributes["languages"][0]["id"] == "card"
    assert ".card" in contributes["languages"][0]["extensions"]
    assert contributes["grammars"][0]["scopeName"] == "source.card"
    for relative in (contributes["grammars"][0]["path"],
                     contributes["languages"][0]["configuration"], manifest["main"]):
        assert (EXTENSION / relative).is_file(), relative
    assert contributes["configuration"]["properties"]["cardc.path"]["default"] == "cardc"
    assert "vscode-languageclient" in manifest["dependencies"]
    locked = json.loads((EXTENSION / "package-lock.json").read_text(encoding="utf-8"))
    for package in ("vscode-languageclient", "vscode-textmate", "vscode-oniguruma"):
        assert f"node_modules/{package}" in locked["packages"], package


def test_the_grammar_knows_every_builtin() -> None:
    """The grammar lists the builtins by name (cardc.builtins is the table): a builtin added
    there is added to the grammar too."""
    grammar = json.loads(GRAMMAR.read_text(encoding="utf-8"))
    assert grammar["scopeName"] == "source.card"
    builtins = [rule["match"] for rule in grammar["repository"]["names"]["patterns"]
                if rule.get("name") == "support.function.builtin.card"]
    words = set(re.findall(r"[A-Za-z_0-9]+", " ".join(builtins)))
    missing = {name for name in BY_NAME if len(name) > 1} - words
    assert not missing, f"builtins the grammar does not name: {sorted(missing)}"


def test_the_grammar_tokenizes_the_cards_under_node() -> None:
    node = _tool("node")
    if not (EXTENSION / "node_modules" / "vscode-textmate").is_dir():
        done = _run([_tool("npm"), "ci", "--no-audit", "--no-fund"], timeout=600)
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    done = _run([node, "--test", "test/grammar.test.js"], timeout=300)
    assert done.returncode == 0, f"the grammar's tests failed:\n{done.stdout}\n{done.stderr}"
    assert re.search(r"^# fail 0$", done.stdout, re.M), done.stdout
