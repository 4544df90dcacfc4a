"""The one table of builtins and special tokens: the checker, the lowering, the renderers and
the runtime read the same definitions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cardc import builtins
from cardc.checker import Checker
from cardc.checker.scope import BodyState
from cardc.dims import Dim
from cardc.library import load
from cardc.lower import body
from cardc.render import html, latex
from cardc.runtime.tasks import special_tokens

ROOT = Path(__file__).resolve().parent.parent


def test_the_special_tokens_are_the_last_three_ids_of_the_vocabulary():
    """The paper's N_V − 2, N_V − 1 and N_V (1-based) are N_V − 3 … N_V − 1 in tensors."""
    assert special_tokens(50) == {"mask_token": 47, "bos_token": 48, "eos_token": 49}
    for name, k in body.SPECIAL_TOKENS.items():  # the lowering writes N_V − k
        assert 50 - k == special_tokens(50)[name]


def test_the_checker_types_a_special_token_as_its_paper_id():
    """mask_token is the token N_V − 2 of V, counted from 1 as cards count."""
    lib, _ = load([str(ROOT / "cards" / "paper")])
    checker = Checker(lib)
    alg = lib.find("ETraining")
    state = BodyState(checker, alg, checker.info(alg))
    mask = state.lookup("mask_token", alg.span)
    assert mask.value == mask.vocab - Dim.const(2) and mask.elem == "ℕ"


def test_every_reader_takes_its_view_from_the_table():
    assert {b.name: b.torch for b in builtins.TABLE if b.torch} == body.ELEMENTWISE
    assert {b.name for b in builtins.TABLE if b.upright} <= builtins.UPRIGHT
    assert builtins.ELEMENTWISE | builtins.REDUCING | set(builtins.FILTERS) <= builtins.BUILTINS
    assert "UPRIGHT" in vars(latex) and "UPRIGHT" in vars(html)


def test_the_table_imports_no_torch():
    code = "import sys, cardc.builtins; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
