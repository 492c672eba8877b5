"""The page in a real browser (Playwright driving the system Chromium; never a downloaded one).

A long-input page, a generation page and a sentence-pair page are loaded; every view is
clicked through, a token pinned and a second one added to the selection; no console error.
Then the search (every view follows the current match, the address holds it), the matrix's
labels, the CSV downloads (checked against the weights) and comparison pages.
"""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit import viz
from attnkit.viz.reduce import Budget, ReducedSet, SetReducer

from tolerance import (
    BYTE_STEP,
    assert_close_elementwise,
    assert_close_to_scale,
    half_step_rel,
    printed_rel,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium to drive")
VIEWS = ("head", "matrix", "model", "stats", "rollout", "neuron")


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.parametrize("sandbox", ["", "allow-scripts"], ids=["srcdoc", "sandboxed"])
def test_the_inline_page_works_in_a_notebook_frame(notebook_frame, sandbox: str) -> None:  # type: ignore[no-untyped-def]
    """Jupyter, VS Code and Colab show the page in an about:srcdoc frame (sandboxed in some),
    where history.replaceState throws: the address is then kept in memory."""
    w = torch.softmax(torch.randn(2, 2, 6, 6, generator=torch.Generator().manual_seed(0)), -1)
    frame_html = viz.show(w, ["a", "b", "c", "d", "e", "f"])._repr_html_()
    frame, errors = notebook_frame(frame_html, sandbox)
    for view in ("matrix", "model", "stats", "rollout", "head"):
        frame.locator(f"#view-{view}").click()
        assert f"view={view}" in frame.evaluate("AK.address()")  # the state, wherever it lives
    frame.locator("#q-col .tok").nth(1).click()
    assert "token=1" in frame.evaluate("AK.address()")
    assert errors == []


# --------------------------------------------------------------------------- finding tokens

WORDS = ["the", " cat", " sat", " on", " a", " mat", " dog"]


def _with_neuron(L: int = 40) -> ReducedSet:
    """A dense set with q and k for the neuron view, as a model run reduces it."""
    g = torch.Generator().manual_seed(0)
    reducer = SetReducer("self-attention", 2, 2, L, L)
    q = torch.randn(2, 2, L, 4, generator=g)  # (layers, heads, L, d)
    k = torch.randn(2, 2, L, 4, generator=g)  # (layers, heads, L, d)
    for layer in range(2):
        w = torch.softmax(q[layer] @ k[layer].transpose(-1, -2) * 0.5, -1)  # (heads, L, L)
        reducer.add(layer, 0, w)
        reducer.add_qk(layer, 0, q[layer], k[layer], {"terms": "dot", "scale": 0.5})
    s = reducer.finish()
    s.tokens = [WORDS[i % len(WORDS)] for i in range(L)]
    return s


def _hash(page) -> dict[str, str]:  # type: ignore[no-untyped-def]
    text = page.evaluate("decodeURIComponent(location.hash.slice(1))")
    return dict(p.split("=", 1) for p in text.split("&") if "=" in p)


def test_search_marks_matches_and_enter_jumps_every_view(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = viz.to_html([_with_neuron()], None, tmp_path / "find.html")
    page, errors = _visit(browser, path, "view=neuron")
    cats = [i for i in range(40) if WORDS[i % 7] == " cat"]  # 1, 8, 15, ...
    page.locator("#find").fill("cat")
    assert page.locator("#find-count").inner_text().startswith(f"{len(cats)} matches")
    options = page.locator(".n-query option").all_inner_texts()
    assert [i for i, t in enumerate(options) if "match" in t] == cats
    page.locator("#find").press("Enter")
    assert _hash(page)["at"] == str(cats[0]) and page.locator(".n-query").input_value() == str(
        cats[0]
    )
    page.locator("#find").press("Enter")
    assert _hash(page)["at"] == str(cats[1]) and page.locator(".n-query").input_value() == str(
        cats[1]
    )
    assert page.locator("#find-count").inner_text().startswith(f"match 2 of {len(cats)}")
    page.locator("#view-head").click()
    marked = page.locator("#q-col .tok.match")
    assert [int(x) for x in marked.evaluate_all("ns => ns.map(n => n.dataset.i)")] == cats
    assert page.locator("#q-col .tok.current").get_attribute("data-i") == str(cats[1])
    assert page.locator("#q-col .tok.active").get_attribute("data-i") == str(cats[1])  # its lines
    page.locator("#view-matrix").click()
    assert page.locator("#y-labels span.current").get_attribute("data-index") == str(cats[1])
    page.locator("#find").press("Shift+Enter")
    assert _hash(page)["at"] == str(cats[0])
    page.locator("#find-mode").select_option("whole")
    page.locator("#find").fill("ca")
    assert page.locator("#find-count").inner_text() == "no match"
    page.locator("#goto").fill("30")
    page.locator("#goto").press("Enter")
    assert _hash(page)["at"] == "30" and _hash(page)["token"] == "30"
    # The address holds the search: editing it changes what is shown.
    page.evaluate("location.hash = 'view=head&find=dog&at=13'")
    page.wait_for_function("document.querySelector('#q-col .tok.current') !== null")
    assert page.locator("#find").input_value() == "dog"
    assert page.locator("#q-col .tok.current").get_attribute("data-i") == "13"
    assert page.locator("#q-col .tok.match").count() == len([i for i in range(40) if i % 7 == 6])
    assert errors == []


@pytest.mark.slow
def test_search_on_a_long_page_moves_the_windows(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    L = 300
    w = torch.softmax(torch.randn(2, 3, L, L) * 4, -1)
    path = tmp_path / "long.html"
    path.write_text(
        viz.render_html(w, [f" t{i}" for i in range(L)], budget=Budget(dense_cells=1000)),
        encoding="utf-8",
    )
    page, errors = _visit(browser, path, "view=head")
    page.locator("#find").fill("t12")
    page.locator("#find").press("Enter")
    page.locator("#find").press("Enter")  # t12, then t120
    assert _hash(page)["at"] == "120"
    assert page.locator("#q-col .tok.current").inner_text().endswith("t120")  # the window moved
    page.locator("#view-matrix").click()
    title = page.locator("#matrix-title").inner_text()
    lo, hi = (int(x) for x in re.search(r"queries (\d+)–(\d+)", title).groups())
    assert lo <= 120 <= hi and hi - lo + 1 == 128
    assert page.locator("#y-labels span.current").get_attribute("data-index") == "120"
    assert "Row labels name the first query of every" in page.locator(".overview-note").inner_text()
    page.locator("#goto").fill("299")
    page.locator("#goto").press("Enter")
    assert re.search(r"queries \d+–299 ", page.locator("#matrix-title").inner_text())
    page.locator("#goto").fill("5000")
    page.locator("#goto").press("Enter")
    assert "no token #5000" in page.locator("#find-count").inner_text()
    assert errors == []


def test_the_matrix_opens_readable_and_says_which_rows_its_labels_name(
    browser, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    L = 512
    w = torch.softmax(torch.randn(1, 1, L, L) * 3, -1)
    path = viz.to_html(w, [f" w{i}" for i in range(L)], tmp_path / "m.html")
    page, errors = _visit(browser, path, "view=matrix")
    assert _hash(page)["zoom"] == "12"  # readable, not 1 px per token
    assert page.locator("#y-labels span").count() == L
    assert page.locator(".matrix-note").inner_text() == "Every row and column is labelled."
    page.locator("#zoom-fit").click()
    note = page.locator(".matrix-note").inner_text()
    step = int(
        re.search(r"Labels name every (\d+)(?:st|nd|rd|th) row and column \(#0, #\1,", note)[1]
    )
    assert step > 1 and int(_hash(page)["zoom"]) < 12
    assert page.locator("#y-labels span").count() == -(-L // step)
    # The selection strip (the mean bar) is labelled, and says which keys when thinned.
    page.locator("#y-labels span").nth(3).click()
    strip = page.locator("#strips .strip").first
    assert strip.locator(".strip-labels span").count() > 10
    assert re.search(
        r"Labels name every \d+(st|nd|rd|th) key", strip.locator(".label-note").inner_text()
    )
    assert errors == []


# --------------------------------------------------------------------------- data out


def _csv(download) -> tuple[list[str], list[list[str]]]:  # type: ignore[no-untyped-def]
    text = Path(download.path()).read_text(encoding="utf-8")
    notes = [line for line in text.splitlines() if line.startswith("# ")]
    rows = list(csv.reader(line for line in text.splitlines() if not line.startswith("# ")))
    return notes, rows


@pytest.mark.slow
def test_matrix_and_statistics_download_as_csv(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    w = torch.softmax(torch.randn(2, 3, 7, 7, generator=g) * 2, -1)
    tokens = ["[CLS]", "the", "cat", 'say "hi"', "#1", "mat", "[SEP]"]
    path = viz.to_html(w, tokens, tmp_path / "d.html")
    page, errors = _visit(browser, path, "view=matrix&layer=1&heads=2")
    with page.expect_download() as got:
        page.locator("#csv-matrix").click()
    assert got.value.suggested_filename == "attention-layer1-head2.csv"
    notes, rows = _csv(got.value)
    assert any("one byte each" in n for n in notes)
    assert rows[0] == ["query \\ key", *[f"{j}:{t}" for j, t in enumerate(tokens)]]
    assert [r[0] for r in rows[1:]] == [f"{i}:{t}" for i, t in enumerate(tokens)]
    got_w = np.array([[float(x) for x in r[1:]] for r in rows[1:]])
    want = w[1, 2].double().numpy()
    assert_close_to_scale(got_w, want, rel=half_step_rel(BYTE_STEP) + printed_rel(5))
    with page.expect_download() as got:
        page.locator("#csv-stats").click()
    notes, rows = _csv(got.value)
    assert any("computed from every weight" in n for n in notes)
    header, body = rows[0], rows[1:]
    assert header[:3] == ["layer", "head", "pattern"] and len(body) == 2 * 3
    stats = viz.head_statistics(w)
    entropy = np.array([float(r[header.index("entropy")]) for r in body]).reshape(2, 3)
    # the CSV writes each figure with toPrecision(5)
    assert_close_elementwise(entropy, np.asarray(stats["entropy"]), rel=printed_rel(5))
    assert errors == []


@pytest.mark.slow
def test_a_comparison_csv_shows_formulas_as_text(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # a token became its own cell starting with "=": a spreadsheet ran it as a formula
    g = torch.Generator().manual_seed(2)
    tokens = ["the", '=HYPERLINK("http://x","y")', "-1", "@a"]
    sets = [
        viz.AttentionSet(
            "self-attention", torch.softmax(torch.randn(1, 1, 4, 4, generator=g), -1), tokens
        )
        for _ in range(2)
    ]
    path = viz.to_html(viz.compare(*sets, names=("A", "B")), None, tmp_path / "c.html")
    page, errors = _visit(browser, path, "view=matrix")
    with page.expect_download() as got:
        page.locator("#csv-matrix").click()
    notes, rows = _csv(got.value)
    assert any("has a ' before it" in n for n in notes)
    cells = {c for r in rows for c in r}
    assert '\'=HYPERLINK("http://x","y")' in cells and "'-1" in cells and "'@a" in cells
    text = [c for c in cells if c and not re.fullmatch(r"-?[\d.e+-]+", c)]  # (not figures)
    assert not any(c[:1] in "=+-@" for c in text)
    assert errors == []


@pytest.mark.slow
def test_the_svg_of_a_view_is_xml_with_control_characters_in_tokens(
    browser, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # a form feed or ESC in a token made the SVG not XML, and the PNG made from it empty
    import xml.dom.minidom

    w = torch.softmax(torch.randn(1, 2, 4, 4, generator=torch.Generator().manual_seed(3)), -1)
    path = viz.to_html(w, ["the", "cat\x0c", "\x1b[1m", "down"], tmp_path / "s.html")
    page, errors = _visit(browser, path, "view=matrix")
    with page.expect_download() as got:
        page.locator("#save-svg").click()
    svg = Path(got.value.path()).read_text(encoding="utf-8")
    xml.dom.minidom.parseString(svg)  # raises on a character XML cannot hold
    assert "cat\ufffd" in svg
    with page.expect_download() as got:
        page.locator("#save-png").click()
    assert Path(got.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert errors == []


def test_a_long_page_downloads_what_it_holds_and_says_so(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    L, k = 200, 16
    w = torch.softmax(torch.randn(1, 2, L, L) * 4, -1)
    path = tmp_path / "long.html"
    path.write_text(
        viz.render_html(w, [f" t{i}" for i in range(L)], budget=Budget(dense_cells=1000)),
        encoding="utf-8",
    )
    page, errors = _visit(browser, path, "view=matrix&heads=1")
    with page.expect_download() as got:
        page.locator("#csv-matrix").click()
    notes, rows = _csv(got.value)
    assert any(n.startswith("# Long input: the page holds") and f"top {k} keys" in n for n in notes)
    assert rows[0] == ["head", "query", "query_token", "key", "key_token", "weight", "rank"]
    assert len(rows) - 1 == L * k
    top = {int(r[1]): (int(r[3]), float(r[5])) for r in rows[1:] if r[6] == "1"}
    want, step = w[0, 1], float(w[0, 1].max()) / 255  # one byte per weight
    assert sorted(top) == list(range(L))
    for i, (j, v) in top.items():  # each row's largest weight (ties within a byte either way)
        assert abs(v - float(want[i].max())) <= step and float(want[i].max() - want[i, j]) <= step
    assert errors == []


# --------------------------------------------------------------------------- comparisons


def test_a_comparison_keeps_both_sides_in_sync_and_draws_a_minus_b(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(1)
    tokens = ["[CLS]", "the", "cat", "sat", "[SEP]"]
    wa = torch.softmax(torch.randn(2, 2, 5, 5, generator=g) * 2, -1)
    wb = torch.softmax(torch.randn(2, 2, 5, 5, generator=g) * 2, -1)
    both = viz.compare(
        viz.AttentionSet("self-attention", wa, tokens),
        viz.AttentionSet("self-attention", wb, tokens),
        names=("model A", "model B"),
    )
    path = viz.to_html(both, None, tmp_path / "c.html")
    page, errors = _visit(browser, path, "view=head")
    panels = page.locator("#head-panels .head-panel:visible")
    assert panels.count() == 2
    panels.nth(0).locator(".q-col .tok").nth(2).click()
    for n in range(2):  # the click on A selects the same token on B
        assert panels.nth(n).locator(".q-col .tok.active").get_attribute("data-i") == "2"
    assert _hash(page)["token"] == "2"
    assert page.locator("#strips .strip:visible").count() == 3  # A, B and A - B
    page.locator("#view-matrix").click()
    shown = page.locator("#matrix-panels .matrix-panel:visible")
    assert shown.count() == 3
    assert shown.nth(2).locator(".side-name").inner_text() == "A − B: difference"
    assert shown.nth(2).locator(".bar-name").inner_text().startswith("A − B")
    with page.expect_download() as got:
        page.locator("#csv-matrix").click()
    _, rows = _csv(got.value)
    assert rows[0] == ["query", "query_token", "key", "key_token", "A", "B", "A_minus_B"]
    a = np.array([float(r[4]) for r in rows[1:]]).reshape(5, 5)
    d = np.array([float(r[6]) for r in rows[1:]]).reshape(5, 5)
    exact = (wa[0].mean(0) - wb[0].mean(0)).double().numpy()  # both heads, layer 0
    assert np.abs(d - exact).max() <= np.abs(exact).max() / 100
    assert np.abs(a - wa[0].mean(0).double().numpy()).max() <= float(wa[0].max()) / 255
    page.locator('#sides [data-side="B"]').click()
    assert _hash(page)["side"] == "B"
    assert page.locator("#matrix-panels .matrix-panel:visible").count() == 1
    assert page.locator("#matrix-panels .side-name").first.inner_text() == "B: model B"
    assert errors == []


@pytest.mark.slow
def test_a_comparison_of_different_tokens_is_side_by_side_and_says_why(
    browser, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    w = torch.softmax(torch.randn(1, 2, 4, 4), -1)
    a = viz.AttentionSet("self-attention", w, ["the", " cat", " sat", "."])
    b = viz.AttentionSet("self-attention", w, ["the", " dog", " sat", "."])
    path = viz.to_html(viz.compare(a, b), None, tmp_path / "c.html")
    page, errors = _visit(browser, path, "view=matrix&find=sat")
    note = page.locator("#compare-note").inner_text()
    assert "Side by side only" in note and "differ from token 1" in note
    shown = page.locator("#matrix-panels .matrix-panel:visible")
    assert (
        shown.count() == 3 and "differ from token 1" in shown.nth(2).locator(".absent").inner_text()
    )
    assert page.locator("#find-count").inner_text().startswith("A: 1, B: 1 matches")
    assert errors == []
