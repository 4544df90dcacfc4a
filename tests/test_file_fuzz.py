"""The fuzz harness of the files beside cards (tests/file_fuzz.py), on a small budget of cases:
a damaged tokenizer.json, meta.json, token file or checkpoint is read or refused in one line
naming it, never a traceback. The long run: `python -m tests.file_fuzz --cases 10000`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import file_fuzz  # noqa: E402


def failures(counts) -> int:
    return sum(v for (_, outcome), v in counts.items() if outcome == "failure")


def test_file_fuzz_small_budget():
    logged: list[str] = []
    counts = file_fuzz.fuzz(120, seed=0, log=logged.append)
    assert failures(counts) == 0, "\n".join(logged)
    assert {kind for kind, outcome in counts if outcome == "refused"} == \
        {"tokenizer", "meta", "tokens", "checkpoint"}


def test_the_harness_reports_what_is_not_a_located_message(monkeypatch):
    def crash(kind, file):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(file_fuzz, "read", crash)
    logged: list[str] = []
    assert failures(file_fuzz.fuzz(3, seed=0, log=logged.append)) == 3
    assert all("RecursionError" in line for line in logged)
