"""The viewer and the heatmaps in a real notebook.

A notebook is executed by a Python kernel (nbclient), converted to HTML (nbconvert), and
opened in Chromium: the inline viewer, embedded as an about:srcdoc frame as Jupyter
embeds it, answers a click on every view with no page error, and ``viz.heatmaps``
shows a picture in a fresh kernel without pyplot imported first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed")
nbconvert = pytest.importorskip("nbconvert", reason="nbconvert is not installed")
pytest.importorskip("ipykernel", reason="no Python kernel (ipykernel) is installed")

pytestmark = pytest.mark.slow  # a kernel start and a browser: about 15 s

SETUP = """\
import torch
from attnkit import viz

g = torch.Generator().manual_seed(0)
w = torch.softmax(torch.randn(2, 3, 6, 6, generator=g) * 3, -1)  # (layers, heads, Q, K)
tokens = ["the", " cat", " sat", " on", " the", " mat"]
"""
VIEWS = ("matrix", "model", "stats", "rollout", "head")  # the head view last: its tokens


def _run(tmp_path: Path) -> tuple[object, Path]:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(SETUP),
        nbformat.v4.new_code_cell("viz.show(w, tokens)"),
        nbformat.v4.new_code_cell("viz.heatmaps(w[0, :2])  # pyplot never imported"),
    ]
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    # the "basic" template: the cells alone, without the full template's scripts from
    # other hosts (MathJax, require.js), which cannot load offline
    body, _ = nbconvert.HTMLExporter(template_name="basic").from_notebook_node(nb)
    path = tmp_path / "notebook.html"
    path.write_text(f"<!DOCTYPE html><html><body>{body}</body></html>", encoding="utf-8")
    return nb, path


def test_the_viewer_and_heatmaps_work_in_an_executed_notebook(  # type: ignore[no-untyped-def]
    browser, tmp_path: Path
) -> None:
    nb, path = _run(tmp_path)
    shown, picture = nb.cells[1].outputs, nb.cells[2].outputs  # type: ignore[attr-defined]
    assert any("text/html" in o.get("data", {}) for o in shown), shown
    assert any("image/png" in o.get("data", {}) for o in picture), picture  # not a repr line

    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri())
    page.frame_locator("iframe").first.locator("body[data-ready='1']").wait_for(timeout=30_000)
    frame = next(f for f in page.frames if f.url == "about:srcdoc")
    for view in VIEWS:
        frame.locator(f"#view-{view}").click()
        assert f"view={view}" in frame.evaluate("AK.address()")
    frame.locator("#q-col .tok").nth(1).click()
    assert "token=1" in frame.evaluate("AK.address()")
    assert page.locator("img[src^='data:image/png']").count() >= 1  # the heatmaps
    assert errors == []
    page.close()
