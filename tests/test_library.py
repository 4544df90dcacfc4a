"""`cardc check` loads the library lazily (library.load(lazy=True)): only the cards a checked
card calls get parsed, and what it reports is what the fully parsed library reports."""

from pathlib import Path

import pytest

from cardc.checker import check
from cardc.diagnostics import Diagnostics
from cardc.library import defined_names, load
from cardc.parser import parse_file

ROOT = Path(__file__).resolve().parent.parent
CARDS = sorted(p.relative_to(ROOT) for p in (ROOT / "cards").rglob("*.card"))


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def shown(paths: list[str], lazy: bool) -> tuple[str, int]:
    """What `cardc check` prints of the given cards, and how many files it parsed."""
    lib, targets = load(paths, root="cards", lazy=lazy)
    _, diags = check(lib)
    wanted = {str(Path(t)) for t in targets}
    mine = Diagnostics([d for d in diags.items if d.span.file in wanted], diags.sources)
    return mine.render(), len(lib.files)


@pytest.mark.parametrize("card", CARDS, ids=str)
def test_the_index_reads_the_names_the_parser_finds(card):
    names = defined_names(card.read_text(encoding="utf-8"))
    assert names == {a.name for a in parse_file(card, Diagnostics()).algorithms if a.name}


@pytest.mark.parametrize("card", ["cards/gpt2.card", "cards/llama_training.card",
                                  "tests/golden/faithful/etransformer.card",
                                  "tests/golden/training_errors.card"])
def test_lazy_check_reports_what_the_whole_library_reports(card):
    eager, everything = shown([card], lazy=False)
    lazy, parsed = shown([card], lazy=True)
    assert lazy == eager
    assert parsed < everything


def test_an_unknown_name_is_still_matched_against_every_card(tmp_path):
    text = (ROOT / "cards" / "gpt2.card").read_text(encoding="utf-8")
    card = tmp_path / "typo.card"
    card.write_text(text.replace("LayerNorm(E | γ_f", "LayerNrom(E | γ_f"), encoding="utf-8")
    lazy, _ = shown([str(card)], lazy=True)
    assert "did you mean 'LayerNorm'?" in lazy
    assert lazy == shown([str(card)], lazy=False)[0]
