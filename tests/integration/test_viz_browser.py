"""The page in a real browser (Playwright driving the system Chromium; never a downloaded one).

A long-input page, a generation page and a sentence-pair page are loaded; every view is
clicked through, a token pinned and a second one added to the selection; no console error.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from attnkit import viz
from attnkit.viz.reduce import Budget

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium to drive")
VIEWS = ("head", "matrix", "model", "stats", "rollout", "neuron")


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _visit(browser, path: Path, state: str = "") -> tuple:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri() + ("#" + state if state else ""))
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    return page, errors


def _click_through(page) -> list[str]:  # type: ignore[no-untyped-def]
    seen = []
    for view in VIEWS:
        button = page.locator(f"#view-{view}")
        if button.is_disabled():
            continue
        button.click()
        seen.append(view)
        assert f"view={view}" in page.evaluate("location.hash")  # the address follows the view
        if view == "head":
            tokens = page.locator("#q-col .tok")
            tokens.nth(1).click()
            tokens.nth(2).click(modifiers=["Shift"])
            assert page.locator("#selection").is_visible()
            assert "sel=q1,2" in page.evaluate("location.hash")
        if view == "stats":
            page.locator("#stats th").nth(4).click()
    return seen


def test_long_page(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    L = 300
    w = torch.softmax(torch.randn(2, 3, L, L) * 4, -1)
    path = tmp_path / "long.html"
    page_obj = viz.render_html(w, [f" t{i}" for i in range(L)], budget=Budget(dense_cells=1000))
    path.write_text(page_obj, encoding="utf-8")
    page, errors = _visit(browser, path)
    assert (
        page.locator("#view-matrix").get_attribute("aria-pressed") == "true"
    )  # long: matrix first
    assert "top 16 keys" in page.locator("#holds").inner_text()
    page.locator("#overview-canvas").click(position={"x": 200, "y": 200})
    assert "queries" in page.locator("#matrix-title").inner_text()
    assert _click_through(page) == list(VIEWS[:5])
    assert errors == []


def test_generation_page_steps_and_saves(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    n = 12
    w = torch.softmax(torch.randn(2, 2, n, n) + torch.triu(torch.full((n, n), -1e9), 1), -1)
    s = viz.AttentionSet(
        "self-attention (causal)", w, [f" w{i}" for i in range(n)], generated_start=8
    )
    path = viz.to_html([s], None, tmp_path / "gen.html")
    page, errors = _visit(browser, path)
    assert page.locator("#gen-box").is_visible()
    page.locator("#step").fill("2")
    assert "step=2" in page.evaluate("location.hash")
    assert page.locator("#q-col .tok").count() == 10  # the prompt and two generated tokens
    _click_through(page)
    page.locator("#view-matrix").click()
    with page.expect_download() as svg:
        page.locator("#save-svg").click()
    assert svg.value.suggested_filename == "attention-matrix.svg"
    with page.expect_download() as png:
        page.locator("#save-png").click()
    assert png.value.suggested_filename == "attention-matrix.png"
    assert errors == []


def test_pair_page_from_a_link(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tokens = ["[CLS]", "a", "b", "[SEP]", "c", "d", "e", "[SEP]"]
    w = torch.softmax(torch.randn(2, 3, 8, 8), -1)
    path = viz.to_html(w, tokens, tmp_path / "pair.html", pair_start=4, title="T " * 200)
    page, errors = _visit(browser, path, "view=matrix&layer=1&heads=2&filter=AB")
    assert page.locator('[data-filter="AB"]').get_attribute("aria-pressed") == "true"
    assert page.evaluate("document.getElementById('matrix').width") == 4
    _click_through(page)
    page.locator("#view-head").click()
    page.locator("#q-col .tok").nth(0).focus()
    page.keyboard.press("Enter")  # the keyboard pins a token
    assert "token=0" in page.evaluate("location.hash")
    assert errors == []
