"""The outside tools some tests drive (a real TeX, a real browser): where they are, and what a
test does when one is missing — skip, except where CI says every tool must be there."""

from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"  # Debian's, driven by playwright (no browser download)
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def missing(tool: str) -> None:
    """Skip the test, or fail it where CARDC_REQUIRE_TOOLS says the tool must be installed."""
    if os.environ.get("CARDC_REQUIRE_TOOLS"):
        pytest.fail(f"{tool} is required here (CARDC_REQUIRE_TOOLS) and is not installed")
    pytest.skip(f"{tool} is not installed")
