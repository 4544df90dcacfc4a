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
    cards = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "cards").rglob("*.card"))
             if "faithful" not in p.parts]
    assert main(["check", *cards]) == 0
    assert "ok:" in capsys.readouterr().out


def test_the_paper_cards_report_exactly_the_papers_two_defects(capsys):
    """cards/paper/faithful keeps Algorithms 8 and 9 as the paper prints them; the corrected
    cards beside them check clean, so these two diagnostics are all there is."""
    assert main(["check", "cards/paper"]) == 1
    err = capsys.readouterr().err
    assert err == (ROOT / "tests" / "golden" / "cards_paper.expected").read_text(encoding="utf-8")
    assert err.count("error:") == 2 and err.endswith("2 errors\n")


@pytest.mark.parametrize("card", GOLDEN, ids=lambda p: p.stem)
def test_golden_diagnostics(card, capsys):
    code = main(["check", str(card.relative_to(ROOT))])
    err = capsys.readouterr().err
    assert code == 1
    assert err == card.with_suffix(".expected").read_text(encoding="utf-8")


def _sig(name):
    lib, _ = load(["cards"])
    checker, diags = check(lib)
    assert {d.span.file for d in diags.errors} <= {"cards/paper/faithful/etransformer.card",
                                                   "cards/paper/faithful/edtransformer.card"}
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


# ------------------------------------------------ titled cards, ∀-families, Σ_u, loop variables


def _check_text(text: str, monkeypatch_dir: Path) -> list[str]:
    path = monkeypatch_dir / "t.card"
    path.write_text(text, encoding="utf-8")
    lib, _ = load([path], root=None)
    _, diags = check(lib)
    return [d.message for d in diags.errors]


SINGLE_QUERY = """\
Algorithm 3: Basic single-query attention.
Input: e ∈ ℝ^{d_in}, the current token; e_t ∈ ℝ^{d_in}, context tokens t ∈ [T].
Output: ṽ ∈ ℝ^{d_out}
Parameters: W_q, W_k ∈ ℝ^{d_attn×d_in}, W_v ∈ ℝ^{d_out×d_in}
1 q ← W_q e
2 ∀t: k_t ← W_k e_t
3 ∀t: v_t ← W_v e_t
4 ∀t: α_t = exp(q^⊺ k_t)/Σ_u exp(q^⊺ k_u)
5 return ṽ = Σ_{t=1}^{T} α_t v_t
"""


def test_titled_card_is_checked(tmp_path):
    assert _check_text(SINGLE_QUERY, tmp_path) == []
    wrong = SINGLE_QUERY.replace("W_v ∈ ℝ^{d_out×d_in}", "W_v ∈ ℝ^{d_in×d_in}")
    assert _check_text(wrong, tmp_path) == ["returns ℝ^{d_in} but Output declares ℝ^{d_out}"]


def test_unembedding_distribution_has_the_vocabulary_size(tmp_path):
    card = ("Algorithm 7: Unembedding.\nInput: e ∈ ℝ^{d_e}\nOutput: p ∈ Δ(V)\n"
            "Parameters: W_u ∈ ℝ^{M×d_e}\n1 return p = softmax(W_u e)\n")
    assert _check_text(card, tmp_path) == ["returns ℝ^{M} but Output declares ℝ^{N_V}"]
    assert _check_text(card.replace("M×", "N_V×"), tmp_path) == []


def test_each_sequence_has_its_own_length(tmp_path):
    card = ("Algorithm: Y ← F(z, x)\nInput: z, x ∈ V*\nOutput: Y ∈ ℝ^{length(x)}\n"
            "Parameters: w ∈ ℝ^{N_V}\n1 return Y = w[z]\n")
    assert _check_text(card, tmp_path) == ["returns ℝ^{|z|} but Output declares ℝ^{|x|}"]


LOOP = """\
Algorithm: Y ← F(X | θ)
Input: X ∈ ℝ^{D×T}
Output: Y ∈ ℝ^{D×T}
Hyperparameters: L ∈ ℕ
Parameters: θ includes all of the following parameters:
    For l ∈ [L]:
        W_l, U_l ∈ ℝ^{D×D}
1 for i = 1, 2, …, L do
2     X ← W_l X
3     X ← U_l X
4 end
5 return Y = X
"""


def test_a_loop_that_binds_the_wrong_variable_is_reported_once(tmp_path):
    assert _check_text(LOOP, tmp_path) == ["the loop binds 'i' but its body indexes by 'l'"]
    assert _check_text(LOOP.replace("for i =", "for l ="), tmp_path) == []


def test_a_loop_using_its_variable_reports_each_unbound_use(tmp_path):
    card = LOOP.replace("2     X ← W_l X", "2     X ← W_l X[:, i : i]")
    assert _check_text(card, tmp_path) == [
        "'W_l' is indexed by 'l', which no enclosing loop binds",
        "'U_l' is indexed by 'l', which no enclosing loop binds",
    ]
