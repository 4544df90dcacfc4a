"""No traceback and no hang from any card text: the fuzz harness on a small budget, and each
signature it (or a person) found, as a regression test with the message and place it gets."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cardc.cli import main
from cardc.diagnostics import Diagnostics
from cardc.parser import MAX_CARD_BYTES, parse
from cardc.render.text import render_card

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz  # noqa: E402

CARD = """Algorithm: Y ← F(X | W)
Input: X ∈ ℝ^{D×T}
Output: Y ∈ ℝ^{D×T}
Hyperparameters: D, T ∈ ℕ
Parameters: W ∈ ℝ^{D×D}
1 return Y = W X
"""


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _check(tmp_path, data: bytes | str, capsys, name: str = "c.card") -> tuple[int, str]:
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    code = main(["check", str(path)])
    return code, capsys.readouterr().err.replace(str(tmp_path) + os.sep, "")


# ------------------------------------------------------------------ the harness


def test_fuzz_small_budget():
    """300 cases, fixed seed: no traceback, hang, unlocated diagnostic or broken round trip."""
    counts = fuzz.fuzz(300, seed=14, jobs=1, timeout=20.0, quiet=True)
    failures = {k: counts[k] for k in fuzz.FAILURES if counts[k]}
    assert not failures, fuzz.summary(counts, 0)
    assert counts["clean"] and counts["diagnosed"]  # both kinds of card were made


def _looping_case(path: str) -> fuzz.Outcome:
    """A stand-in for run_case: loops on a case that says so, idles on one that says so."""
    data = Path(path).read_bytes()
    if data == b"loop":
        while True:
            pass
    if data == b"idle":
        import time

        time.sleep(2)
    return fuzz.Outcome("clean")


def test_the_harness_limits_cpu_time_not_the_wall_clock(monkeypatch):
    """A case that loops is a hang once it has used its CPU seconds; one that waits longer
    than that on the wall clock (as on a busy machine) without using them is not."""
    monkeypatch.setattr(fuzz, "run_case", _looping_case)  # the workers fork with it
    pool = fuzz.Pool(1, timeout=1.0, memory=2 << 30)
    try:
        outcomes = [o.kind for _, _, o in pool.run([(0, b"idle"), (1, b"loop"), (2, b"x")])]
    finally:
        pool.close()
    assert outcomes == ["clean", "hang", "clean"]


def test_the_harness_reports_an_unlocated_diagnostic():
    diags = Diagnostics(sources={"c.card": "one line"})
    diags.error(fuzz_span("c.card", 0, 0), "somewhere")
    assert fuzz._unlocated(diags, "c.card") == "c.card: somewhere"
    diags = Diagnostics(sources={"c.card": "one line"})
    diags.error(fuzz_span("c.card", 1, 30), "past the end of the line")
    assert fuzz._unlocated(diags, "c.card") == "c.card:1:30: past the end of the line"


def test_the_harness_makes_cases_deterministically():
    seeds = fuzz.seeds()
    assert fuzz.make_case(3, 7, seeds) == fuzz.make_case(3, 7, seeds)
    made = {fuzz.make_case(3, i, seeds) for i in range(40)}
    assert len(made) == 40


def test_grammar_cases_parse_clean():
    import random

    for i in range(30):
        text = fuzz.Grammar(random.Random(i)).card().decode("utf-8")
        diags = Diagnostics()
        card = parse(text, "g.card", diags)
        assert not diags.errors, diags.render()
        assert parse(render_card(card), "g.card", Diagnostics()) == card


def fuzz_span(file, line, col):
    from cardc.syntax import Span

    return Span(file, line, col, line, col + 1)


# ------------------------------------------------------------------ control characters


def test_vertical_tab_then_arrow(tmp_path, capsys):
    code, err = _check(tmp_path, b"\x0b\xe2\x86\x90", capsys)
    assert code == 1
    assert "c.card:1:1: error: control character U+000B in card text" in err
    assert "c.card:1:2: error: unexpected '←'" in err
    assert "Traceback" not in err


def test_a_single_form_feed(tmp_path, capsys):
    code, err = _check(tmp_path, b"\x0c", capsys)
    assert code == 1
    assert err.startswith("c.card:1:1: error: control character U+000C in card text")
    assert err.endswith("1 error\n")


@pytest.mark.parametrize("ch", ["\x00", "\x07", "\x1b", "\x7f", "\x85", "\u2028", "\ufeff"])
def test_control_characters_are_located(tmp_path, capsys, ch):
    text = CARD.replace("W X", f"W {ch}X")
    code, err = _check(tmp_path, text, capsys)
    assert code == 1
    assert f"c.card:6:16: error: control character U+{ord(ch):04X} in card text" in err


@pytest.mark.parametrize("eol", ["\r\n", "\r"])
def test_crlf_and_lone_cr_break_lines(tmp_path, capsys, eol):
    code, err = _check(tmp_path, "\ufeff" + CARD.replace("\n", eol), capsys)
    assert code == 0, err


# ------------------------------------------------------------------ nesting and size


def test_deep_nesting_is_one_located_error(tmp_path, capsys):
    deep = CARD.replace("W X", "√(" * 400 + "X" + ")" * 400)
    code, err = _check(tmp_path, deep, capsys)
    assert code == 1
    assert err.startswith("c.card:6:136: error: nested too deeply (more than 64 levels)")
    assert err.count("error:") == 1


@pytest.mark.parametrize("piece", [" + X" * 3000, " W" * 3000])
def test_long_chains_are_one_located_error(tmp_path, capsys, piece):
    code, err = _check(tmp_path, CARD.replace("W X", "W X" + piece), capsys)
    assert code == 1 and "nested too deeply" in err and err.count("error:") == 1


def test_nesting_just_inside_the_limit_checks_renders_and_builds(tmp_path, capsys):
    text = CARD.replace("W X", "W " + "√(" * 55 + "X" + ")" * 55)
    code, err = _check(tmp_path, text, capsys)
    assert code == 0, err
    outcome = fuzz.run_case(str(tmp_path / "c.card"))
    assert outcome.kind == "clean", outcome.detail


def test_deep_loops_are_one_located_error(tmp_path, capsys):
    loops = "".join(f"{'    ' * d}for i{d} ∈ [T] do\n" for d in range(150))
    ends = "".join(f"{'    ' * d}end\n" for d in reversed(range(150)))
    text = CARD.replace("1 return Y = W X\n", loops + "Y ← W X\n" + ends + "return Y = Y\n")
    code, err = _check(tmp_path, text, capsys)
    assert code == 1 and "nested too deeply" in err and err.count("error:") == 1


def test_an_oversized_file_is_refused_where_the_limit_is(tmp_path, capsys):
    line = "/* " + "x" * 96 + " */\n"
    data = (line * (MAX_CARD_BYTES // len(line) + 10)).encode()
    code, err = _check(tmp_path, data, capsys)
    line_no = MAX_CARD_BYTES // len(line) + 1
    col = MAX_CARD_BYTES % len(line) + 1
    assert code == 1
    assert err.startswith(f"c.card:{line_no}:{col}: error: card file is larger than 256 KiB")


def test_many_cards_check_in_linear_time(tmp_path, capsys):
    import time

    header = "Algorithm: Y ← F0(X | W, b, γ)\n"
    start = time.process_time()  # CPU time: a busy machine adds none
    code, err = _check(tmp_path, header * 3000, capsys)
    assert code == 1 and time.process_time() - start < 20


# ------------------------------------------------------------------ reading files


def test_non_utf8_is_located_at_the_byte(tmp_path, capsys):
    code, err = _check(tmp_path, b"Algorithm: Y \xe2\x86\x90 F(X)\r/* caf\xe9 */\n", capsys)
    assert code == 1
    assert err.startswith("c.card:2:7: error: not UTF-8 text: byte 0xe9")
    assert "2 | /* caf� */" in err


def _check_in_a_process(path: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cardc", "check", path], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "pipe.card"
    os.mkfifo(fifo)
    done = _check_in_a_process(str(fifo))
    assert done.returncode == 1
    assert done.stderr.startswith(f"{fifo}: error: cannot read card: not a regular file")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_dev_zero_is_refused():
    done = _check_in_a_process("/dev/zero")
    assert done.returncode == 1
    assert done.stderr.startswith("/dev/zero: error: cannot read card: not a regular file")


# ------------------------------------------------------------------ checker signatures


def test_concatenated_scalars(tmp_path, capsys):
    code, err = _check(tmp_path, CARD.replace("1 return Y = W X", "1 a ← [D, T]\n2 return Y = W X"),
                       capsys)
    assert code == 1
    assert "c.card:6:7: error: cannot concatenate scalars" in err


def test_a_block_loop_as_a_one_line_body(tmp_path, capsys):
    text = CARD.replace("1 return Y = W X", "1 for t ∈ [T] : for l = 1, …, D do\n2 return Y = W X")
    code, err = _check(tmp_path, text, capsys)
    assert code == 1
    assert "c.card:6:17: error: a 'for' loop that opens a block cannot be the body of a " \
           "one-line statement" in err


def test_a_loop_with_no_steps(tmp_path, capsys):
    text = CARD.replace("1 return Y = W X", "1 For h ∈ [D]:\n2 return Y = W X")
    code, err = _check(tmp_path, text, capsys)
    assert code == 1
    assert "c.card:6:3: error: this 'for' loop has no steps" in err
    assert "hint: indent the steps of the loop under it" in err


def test_a_family_of_families(tmp_path, capsys):
    text = CARD.replace("Parameters: W ∈ ℝ^{D×D}\n", "Parameters: W ∈ ℝ^{D×D}\nFor l ∈ [T]:\n"
                        "    For k ∈ [T]:\n        V ∈ ℝ^{D}\n")
    code, err = _check(tmp_path, text, capsys)
    assert code == 1
    assert "c.card:7:5: error: a family cannot hold another family directly" in err


def test_a_header_with_nothing_after_the_colon(tmp_path, capsys):
    code, err = _check(tmp_path, CARD + "Algorithm: ", capsys)
    assert code == 1
    assert "c.card:7:1: error: expected a signature or a title after ':'" in err


# ------------------------------------------------------------------ first contact


def test_every_syntax_error_of_a_file_is_reported(tmp_path, capsys):
    text = CARD.replace("1 return Y = W X", "1 Z ← W +* X\n2 Z ← Z )\n3 return Y = Z")
    code, err = _check(tmp_path, text, capsys)
    assert code == 1
    assert "c.card:6:10: error: unexpected '*'" in err
    assert "c.card:7:9: error: unexpected ')'" in err
    assert err.endswith("2 errors\n")


def test_a_misspelt_name_is_one_error(capsys):
    assert main(["check", "tests/golden/misspelt_name.card"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tests/golden/misspelt_name.card:14:7: error: unknown name 'W_ee'")
    assert err.count("error:") == 1


def test_n_for_naturals_gets_a_hint(tmp_path, capsys):
    code, err = _check(tmp_path, CARD.replace("T ∈ ℕ", "T ∈ N; ε = 1e-5"), capsys)
    assert code == 1
    assert "c.card:4:26: error: unexpected ';'" in err
    assert "hint: the natural numbers are 'ℕ' (ASCII 'NN')" in err


def test_a_card_with_no_steps(tmp_path, capsys):
    code, err = _check(tmp_path, "\n".join(CARD.splitlines()[:5]) + "\n", capsys)
    assert code == 1
    assert "c.card:1:1: error: 'F' has no steps" in err


def test_many_declarations_check_in_linear_time(tmp_path, capsys):
    import time

    lines = CARD.splitlines()
    text = "\n".join(lines[:2] + ["Input: v ∈ V ≅ [D], a token ID."] * 6000 + lines[2:]) + "\n"
    start = time.process_time()  # CPU time: a busy machine adds none
    _check(tmp_path, text, capsys)
    assert time.process_time() - start < 15


def test_many_decoding_steps_lower_in_linear_time(tmp_path):
    """A sampling card whose model call is repeated: each step asked how the card reads its
    result, walking the whole card."""
    import time

    lines = (ROOT / "cards" / "paper" / "dinference.card").read_text(encoding="utf-8").splitlines()
    at = next(i for i, ln in enumerate(lines) if "DTransformer(" in ln)
    path = tmp_path / "c.card"
    path.write_text("\n".join(lines[:at] + [lines[at]] * 1000 + lines[at + 1:]) + "\n",
                    encoding="utf-8")
    start = time.process_time()  # CPU time: a busy machine adds none
    outcome = fuzz.run_case(str(path))
    assert outcome.kind in ("clean", "diagnosed"), outcome.detail
    assert time.process_time() - start < 30  # quadratic: minutes


def test_a_model_card_with_no_input_builds(tmp_path):
    path = tmp_path / "c.card"
    path.write_text("Algorithm 2: Positional embedding.\n"
                    "Output: e ∈ ℝ^{d_e}, the vector representation of the position.\n"
                    "Parameters: W_p ∈ ℝ^{d_e×ℓ_max}, the positional embedding matrix.\n"
                    "1 return e = W_p[:, 1]\n", encoding="utf-8")
    outcome = fuzz.run_case(str(path))
    assert outcome.kind == "clean", outcome.detail


def test_deeply_nested_bundles_are_one_located_error(tmp_path, capsys):
    """Indentation nests bundles: 700 levels fit in a card file, and are not recursed into."""
    lines = ["Algorithm: Y ← F(X | W)", "Input: X ∈ ℝ^{D}", "Output: Y ∈ ℝ^{D}",
             "Parameters: W consisting of:"]
    lines += [" " * (d + 1) + "W consisting of:" for d in range(700)]
    lines += [" " * 701 + "V ∈ ℝ^{D}", "1 return Y = X"]
    code, err = _check(tmp_path, "\n".join(lines) + "\n", capsys)
    assert code == 1
    assert err.startswith("c.card:69:66: error: nested too deeply (more than 64 levels)")
    assert "hint: nest loops, bundles and families less deeply" in err


def test_fmt_reads_cards_as_check_does(tmp_path, capsys):
    path = tmp_path / "c.card"
    path.write_bytes(b"Algorithm: Y \xff F(X)\n")
    assert main(["fmt", "--check", str(path)]) == 1
    err = capsys.readouterr().err.replace(str(tmp_path) + os.sep, "")
    assert err.startswith("c.card:1:14: error: not UTF-8 text: byte 0xff")
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe.card")
        done = subprocess.run([sys.executable, "-m", "cardc", "fmt", str(tmp_path / "pipe.card")],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 1 and "not a regular file" in done.stderr


def test_an_oversized_file_with_tabs_is_located_in_its_text(tmp_path):
    path = tmp_path / "c.card"
    path.write_bytes(b"\t/*\tx\t*/\n" * (MAX_CARD_BYTES // 9 + 5))
    assert fuzz.run_case(str(path)).kind == "diagnosed"


def _chain(n: int) -> str:
    return "\n".join(f"Algorithm: Y ← F{i}(X)\nInput: X ∈ ℝ^{{D}}\nOutput: Y ∈ ℝ^{{D}}\n"
                     f"1 return Y = {f'F{i + 1}(X)' if i < n - 1 else 'X'}\n" for i in range(n))


def test_a_long_chain_of_calls_is_located_not_recursed(tmp_path, capsys):
    code, err = _check(tmp_path, _chain(300), capsys)
    assert code == 1
    assert err.startswith("c.card:159:14: error: cards call each other too deeply "
                          "(more than 32 levels)")
    assert "Traceback" not in err


def test_a_chain_of_calls_within_the_limit_checks_and_renders(tmp_path):
    path = tmp_path / "c.card"
    path.write_text(_chain(30), encoding="utf-8")
    assert fuzz.run_case(str(path)).kind == "clean"


@pytest.mark.parametrize("expr", ["W x", "F(x | θ) x + y", "W^⊺ x", "x x"])
def test_a_product_by_a_name_x_is_not_a_times_sign(expr):
    """ASCII `x` is × between dimensions (ℝ^{a x b}), and a name everywhere else."""
    text = f"Algorithm: Y ← G(x)\nInput: x ∈ ℝ^{{a x b}}\n1 Y ← {expr}\n"
    diags = Diagnostics()
    card = parse(text, "c.card", diags)
    assert not diags.errors, diags.render()
    assert parse(render_card(card), "c.card", Diagnostics()) == card
    assert "x" in [n.id for n in _names(card.algorithms[0].steps[0].stmt.value)]


def _names(e):
    from cardc.syntax import Name, nodes

    return [n for n in nodes(e) if isinstance(n, Name)]


def test_a_card_whose_input_is_a_bundle_called_with_a_value(tmp_path, capsys):
    text = CARD.replace("1 return Y = W X", "1 return Y = G(X)") + (
        "\nAlgorithm: Y ← G(K)\nInput: K, the keys.\nOutput: Y ∈ ℝ^{D×T}\n1 return Y = K\n")
    code, err = _check(tmp_path, text, capsys)
    assert code == 1
    assert "c.card:6:16: error: 'G' takes 'K' as a bundle of parameters" in err
