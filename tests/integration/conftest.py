"""Fixtures the integration tests share.

``browser``: one headless system Chromium per test process, driven by Playwright (never
a downloaded browser), for every module that clicks through the viewer's pages; each
test opens its own pages in it. It skips where playwright or Chromium is missing.

``notebook_frame``: opens a page's inline HTML (``Page._repr_html_()``) in an
``about:srcdoc`` frame, as Jupyter, VS Code and Colab show it, optionally sandboxed,
collecting console and page errors.

``weights_read``: the class of every transformers model whose weights are read during
the test, in order.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
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


NotebookFrame = Callable[[str, str], tuple[Any, list[str]]]


@pytest.fixture
def notebook_frame(browser: Any) -> Iterator[NotebookFrame]:
    """``open(frame_html, sandbox) -> (frame, errors)``: the page drawn inside its
    ``about:srcdoc`` frame (with ``sandbox`` as the frame's sandbox attribute when not
    empty), and the list that collects its console and page errors. The pages it opened
    are closed after the test."""
    pages: list[Any] = []

    def open_frame(frame_html: str, sandbox: str) -> tuple[Any, list[str]]:
        if sandbox:
            frame_html = frame_html.replace("<iframe ", f'<iframe sandbox="{sandbox}" ', 1)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        pages.append(page)
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.set_content(frame_html)
        page.frame_locator("iframe").locator("body[data-ready='1']").wait_for(timeout=20_000)
        frame = page.frames[1]
        assert frame.url == "about:srcdoc"
        return frame, errors

    yield open_frame
    for page in pages:
        page.close()


@pytest.fixture
def weights_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The class of every transformers model whose weights are read, in order."""
    from transformers import PreTrainedModel

    read = PreTrainedModel.from_pretrained.__func__  # type: ignore[attr-defined]
    seen: list[str] = []

    def counted(cls: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(cls.__name__)
        return read(cls, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(counted))
    return seen
