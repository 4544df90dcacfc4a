"""The fuzz harness of mapping files (tests/map_fuzz.py), on a small budget of cases: a damaged
mapping file, or a damaged config.json beside a checkpoint, is loaded, imported and exported or
refused in one line naming the file (or the tensor), never a traceback or a half-written folder.
The long run, over every shipped mapping file: `python -m tests.map_fuzz --cases 2000`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import map_fuzz  # noqa: E402

FAMILIES = ["gpt2", "falcon"]  # a plain table, and fused tensors split by groups


def failures(counts) -> int:
    return sum(v for (_, outcome), v in counts.items() if outcome == "failure")


def test_map_fuzz_small_budget():
    logged: list[str] = []
    counts = map_fuzz.fuzz(16, seed=27, log=logged.append, only=FAMILIES)
    assert failures(counts) == 0, "\n".join(logged)
    assert {step for step, outcome in counts if outcome == "refused"} >= {"load", "import",
                                                                           "export"}
    assert {step for step, outcome in counts if outcome == "done"} >= {"import", "export"}


def test_the_harness_reports_a_traceback_and_a_folder_left_behind(monkeypatch, tmp_path):
    def crash(*argv):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(map_fuzz, "cli", crash)
    logged: list[str] = []
    assert failures(map_fuzz.fuzz(2, seed=0, log=logged.append, only=["gpt2"])) == 2
    assert all("RecursionError" in line for line in logged)
    (tmp_path / "out").mkdir()
    outcome, detail = map_fuzz.judge(1, "cardc: error: x.hf.json: bad\n", tmp_path / "out",
                                     ["x.hf.json"])
    assert outcome == "failure" and "left" in detail
    assert map_fuzz.judge(1, "cardc: error: bad\n", tmp_path / "none", ["x.hf.json"])[0] == \
        "failure"
    assert map_fuzz.judge(1, "cardc: error: x.hf.json: a\nb\n", tmp_path / "none",
                          ["x.hf.json"])[0] == "failure"
