"""The checker: every card in cards/ is clean; bad cards get exact, golden diagnostics."""

import subprocess
import sys
from pathlib import Path

import pytest

from cardc.checker import check
from cardc.cli import main
from cardc.info import summarize
from cardc.library import load

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = sorted((ROOT / "tests" / "golden").glob("*.card"))


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_every_card_checks_clean(capsys):
    assert main(["check", "cards"]) == 0
    assert "ok:" in capsys.readouterr().out


@pytest.mark.parametrize("card", GOLDEN, ids=lambda p: p.stem)
def test_golden_diagnostics(card, capsys):
    code = main(["check", str(card.relative_to(ROOT))])
    err = capsys.readouterr().err
    assert code == 1
    assert err == card.with_suffix(".expected").read_text(encoding="utf-8")


def _sig(name):
    lib, _ = load(["cards"])
    checker, diags = check(lib)
    assert not diags.errors
    return checker.infos[id(lib.find(name))].sig


def test_gpt2_parameter_count_from_the_card():
    assert summarize(_sig("GPT2"), "gpt2").parameters == 124_439_808


def test_info_command(capsys):
    assert main(["info", "cards/gpt2.card", "--preset", "gpt2"]) == 0
    assert "124,439,808" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["info", "cards/gpt2.card", "--preset", "nope"],
    ["info", "cards/gpt2.card", "--preset", "tiny", "--set", "H=3"],  # d = D/H is not whole
    ["info", "cards/gpt2.card", "--set", "Q=1"],
])
def test_info_rejects_bad_presets(argv, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["check", "missing.card"], ["check"], ["render", "--to", "pdf", "x"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    assert exc.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_check_render_fmt_never_import_torch():
    code = (
        "import sys\n"
        "from cardc.cli import main\n"
        "for argv in (['check', 'cards'], ['render', 'cards/gpt2.card'], ['fmt', '--check', 'cards'],"
        " ['info', 'cards/gpt2.card', '--preset', 'tiny']):\n"
        "    main(argv)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
