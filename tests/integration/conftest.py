"""Fixtures the integration tests share.

``browser``: one headless system Chromium per test process, driven by Playwright (never
a downloaded browser), for every module that clicks through the viewer's pages; each
test opens its own pages in it. It skips where playwright or Chromium is missing.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if CHROMIUM is None:
        pytest.skip("no system Chromium to drive")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()
