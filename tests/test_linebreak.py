"""Generated lines over 120 characters break deterministically and change no syntax tree; every
generated module reads model-first, its helpers after its own classes and functions."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from cardc.codegen import HELPERS
from cardc.linebreak import WIDTH, break_lines

ROOT = Path(__file__).resolve().parent.parent
GENERATED = sorted((ROOT / "generated").rglob("*.py"))
ARGS = ", ".join(f"argument_number_{i}" for i in range(5))


def _broken(source: str) -> str:
    out = break_lines(source)
    assert ast.dump(ast.parse(out)) == ast.dump(ast.parse(source))
    assert all(len(line) <= WIDTH for line in out.splitlines())
    return out


def test_a_line_that_fits_is_left_as_it_is():
    source = "x = f(a, b)  # a note\n"
    assert break_lines(source) == source


def test_a_long_call_puts_its_arguments_on_a_hanging_line_or_one_per_line():
    short = f"def g():\n    return a_function_with_a_long_name({ARGS})\n"
    assert _broken(short) == (
        "def g():\n"
        "    return a_function_with_a_long_name(\n"
        f"        {ARGS}\n"
        "    )\n")
    long = f"y = h({ARGS}, {ARGS.replace('argument', 'parameter')})\n"
    lines = _broken(long).splitlines()
    assert lines[0] == "y = h(" and lines[-1] == ")"
    assert lines[1:-1] == [f"    {a.strip()}," for a in
                           (ARGS + ", " + ARGS.replace("argument", "parameter")).split(",")]


def test_a_trailing_comment_that_would_overflow_goes_above_its_statement():
    code = "    value = compute(first, second)"
    note = "  # (B, T, D): " + "a long explanation " * 4 + "[card.card:12]"
    out = _broken(f"def g():\n{code}{note}\n")
    assert out == f"def g():\n    # {note.strip()[2:]}\n{code}\n"


def test_a_comment_too_long_for_a_line_of_its_own_wraps_at_spaces():
    text = "# " + "word " * 40
    lines = _broken(f"x = 1  {text}\n").splitlines()
    assert lines[-1] == "x = 1" and all(line.startswith("# ") for line in lines[:-1])
    assert " ".join(line[2:] for line in lines[:-1]) == text[2:].strip()


def test_nested_calls_break_outside_in_and_only_as_far_as_needed():
    inner = f"inner_call({ARGS})"
    source = f"result = outer_call({inner}, {inner.replace('inner', 'other')}, key=value)\n"
    lines = _broken(source).splitlines()
    assert lines[0] == "result = outer_call("
    assert lines[1] == f"    {inner}," and lines[-2] == "    key=value," and lines[-1] == ")"


def test_an_item_still_too_long_breaks_before_its_loosest_operators():
    left, right = f"first_term({ARGS})", f"second_term({ARGS})"
    source = f"z = f({left} + {right} * 2, other)\n"
    lines = _broken(source).splitlines()
    assert lines[1:4] == [f"    {left}", f"    + {right} * 2,", "    other,"]


def test_the_head_of_a_split_fits_where_a_bracket_allows_it():
    source = ("alpha = torch.exp((q[..., None, :] * k).sum(-1) / math.sqrt(d)) / "
              "torch.exp((q[..., None, :] * k).sum(-1) / math.sqrt(self.d_attn)).sum(-1, keepdim=True)\n")
    assert _broken(source).splitlines() == [
        "alpha = torch.exp((q[..., None, :] * k).sum(-1) / math.sqrt(d)) / torch.exp(",
        "    (q[..., None, :] * k).sum(-1) / math.sqrt(self.d_attn)",
        ").sum(-1, keepdim=True)"]


def test_lines_inside_strings_are_never_touched():
    source = f'x = """\n{"text " * 40}\n"""\n'
    assert break_lines(source) == source


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: p.name)
def test_no_generated_line_is_over_120_characters(path):
    long = [n for n, line in enumerate(path.read_text().splitlines(), 1) if len(line) > WIDTH]
    assert not long, f"{path.name}: lines {long}"


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: p.name)
def test_generated_helpers_come_after_the_model(path):
    text = path.read_text()
    names = [_defined(node) for node in ast.parse(text).body]
    helpers = [i for i, name in enumerate(names) if name in HELPERS]
    own = [i for i, name in enumerate(names) if name and name not in HELPERS and name != "PRESETS"]
    if helpers and own:
        assert max(own) < min(helpers), path.name
    for name in (n for n in names if n in HELPERS):  # each as written in its module
        assert HELPERS[name].text in text
    if helpers:
        assert re.search(r"\n\n\n# .*copied by name\.\n", text) or "cardc's sampler's" in text


def _defined(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def test_an_item_that_fits_only_without_its_comma_breaks_too():
    """One item per line, each with its comma: an item of exactly the width left still breaks."""
    wide = "a_left_operand[None, :] <= " + "b" * (WIDTH - 4 - len("a_left_operand[None, :] <= "))
    assert len("    " + wide) == WIDTH
    lines = _broken(f"y = f({ARGS}, {wide}, {ARGS})\n").splitlines()
    assert "    a_left_operand[None, :]" in lines and f"    <= {'b' * (WIDTH - 31)}," in lines
