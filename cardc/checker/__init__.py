"""Name resolution and shape checking with symbolic dimensions.

Each card is checked in its own symbols. A call unifies the callee's declared shapes with the
caller's, rewrites the callee's output and parameters in the caller's symbols, and lets a
callee's input of shape ℝ^{D} take an ℝ^{T×D} argument row by row (row lifting).
Tokens carry the size of their vocabulary, so a token indexes a vocabulary axis and nothing else.
A parameter bundle declared by prose alone takes the structure of the card it is passed to, and
training steps do arithmetic on bundles (θ − η · ∇loss(θ)).
Errors are collected as diagnostics; checking goes on after each one.

The stages, each a module: `declarations` (a card's blocks into a signature), `steps`,
`expressions` and `calls` (its steps, one checker each, sharing the state in `scope`), with
`shapes`, `indexed` (names with indices) and `messages` below them; `driver` runs them card by
card; `namecheck` and `presets` check what the driver found. `check` runs it all.
"""

from __future__ import annotations

from ..builtins import CONSTANTS, DROPOUT, FILTERS, PAIRWISE
from ..diagnostics import Diagnostics
from ..library import Library
from .driver import Checker
from .indexed import instance, split_name
from .namecheck import check_names
from .presets import check_presets
from .results import CallInfo, CardInfo, CheckError, ModelTy, RunValue, Signature
from .shapes import expr_dim, fits_model

__all__ = ["CONSTANTS", "DROPOUT", "FILTERS", "PAIRWISE", "CallInfo", "CardInfo", "CheckError",
           "Checker", "ModelTy", "RunValue", "Signature", "check", "expr_dim", "fits_model",
           "instance", "split_name"]


def check(lib: Library) -> tuple[Checker, Diagnostics]:
    """Check every card of the library: shapes, then the names generated code will use, then
    every preset (what check accepts also builds)."""
    checker = Checker(lib)
    checker.check_all()
    check_names(checker)
    check_presets(checker)
    return checker, checker.diags
