"""Fixtures the test files share, and the order the suite's files start in."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tools import CHROMIUM, FLAGS, missing

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, through playwright (the docs site's and the renderings' tests)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright")
    if not Path(CHROMIUM).exists():
        missing("chromium")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


def _share_the_cores() -> None:
    """Under pytest-xdist each worker, and each `cardc` process its tests start, computes with
    its share of the cores (set before torch loads, which reads it once). torch's default is
    every core for every process: with the workers busy at once, its threads wait on each
    other's cores, and a small model's training run took 157 s instead of 14 (2 cores)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))


_share_the_cores()


@pytest.fixture(scope="session", autouse=True)
def _parsed_once() -> Iterator[None]:
    """Each card text parsed once a test process: most tests load the whole library (each
    model built from a card in a folder of its own checks it against cards/), ~40 files parsed
    again per build. A parse reads only its text and the file's name, and its tree is
    immutable (frozen dataclasses), so the tree and the diagnostics of a text are reused;
    what a test checks about parsing is what the first parse of each text did."""
    import cardc.parser as parser
    from cardc.diagnostics import Diagnostics

    fresh, done = parser.parse, {}

    def parse(text: str, file: str = "<card>", diags: Diagnostics | None = None):
        diags = diags if diags is not None else Diagnostics()
        key = (text, file)
        if key not in done:
            if len(done) >= 4096:  # fuzzed texts: keep the memory bounded
                done.pop(next(iter(done)))
            own = Diagnostics()
            done[key] = fresh(text, file, own), own.sources[file], own.items
        card, source, items = done[key]
        diags.sources[file] = source
        diags.items += items
        return card

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parser, "parse", parse)
        yield


@pytest.fixture
def cli(capsys, monkeypatch) -> Iterator[Callable[..., subprocess.CompletedProcess]]:
    """`cardc ARGS` run in this process (from the repository's root), answered as
    `subprocess.run` answers. For a call a test only checks or compares with another: a new
    interpreter and torch's import cost ~2.5 s a call, and `python -m cardc` is `main` and
    nothing more (cardc/__main__.py). An exception escaping `main`, which a process would print
    as a traceback, fails the test."""
    import torch

    from cardc.cli import main

    monkeypatch.chdir(ROOT)
    # what `cardc train` sets for its own process: put back for the tests after this one
    handler, rng = signal.getsignal(signal.SIGTERM), torch.get_rng_state()

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()  # what came before is not this call's
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["cardc", *args], code, out, err)

    yield run
    signal.signal(signal.SIGTERM, handler)
    torch.set_rng_state(rng)


# The files that take longest (by `pytest --durations`), roughly longest first. pytest-xdist
# (--dist loadfile) hands whole files to its workers in the order they were collected, and the
# heaviest files sort late (presets, soundness, train_cli): started last, a long file keeps one
# worker busy while the others sit idle.
SLOWEST = (
    "test_soundness.py", "test_presets.py", "test_names.py", "test_train_cli.py",
    "test_interpret.py", "test_render_latex.py", "test_fuzz.py", "test_cli_runs.py",
    "test_docs.py", "test_resume.py", "test_reproducers.py", "test_cardgen.py",
    "test_render_text.py", "test_interop_mapping.py", "test_file_fuzz.py", "test_decoding.py",
    "test_mapping_guide.py", "test_observe.py", "test_diff_boxed.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest files first, then the rest as collected; each file's tests in their order."""
    rank = {name: n for n, name in enumerate(SLOWEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST)))
