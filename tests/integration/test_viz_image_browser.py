"""The image view in a real browser (Playwright driving the system Chromium; never a downloaded one).

A page written by ``attnkit show --image`` for a tiny random DeiT ([CLS], [DIST] and
4 × 4 patches) opens on the picture; clicking a patch, a non-patch token, a head's
map and the rollout tab each change the heatmap and the address; every other view
still works, the search marks patches, and nothing is logged as an error. A long
page (top-k rows only) draws [CLS] from the exact rows kept beside it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit import viz
from attnkit.cli import main
from attnkit.viz.reduce import Budget

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium to drive")
VIEWS = ("head", "matrix", "model", "stats", "rollout", "neuron", "image")


@pytest.fixture(scope="module")
def picture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    arr = (rng.random((40, 40, 3)) * 60).astype(np.uint8)  # (H, W, 3)
    arr[8:24, 8:32] = [220, 40, 40]
    path = tmp_path_factory.mktemp("pictures") / "box.png"
    Image.fromarray(arr).save(path)
    return path


@pytest.fixture(scope="module")
def deit_page(tmp_path_factory: pytest.TempPathFactory, picture: Path) -> Path:
    from transformers import DeiTConfig, DeiTModel

    root = tmp_path_factory.mktemp("deit")
    torch.manual_seed(0)
    cfg = DeiTConfig(image_size=32, patch_size=8, num_hidden_layers=2, num_attention_heads=2,
                     hidden_size=16, intermediate_size=32)  # fmt: skip
    model = DeiTModel(cfg)
    with torch.no_grad():  # sharper, distinct heads; [CLS] and [DIST] not zero
        for name, p in model.named_parameters():
            if name.endswith(("query.weight", "key.weight", "q_proj.weight", "k_proj.weight")):
                p.mul_(25)
            if name.endswith(("cls_token", "distillation_token")):
                p.normal_()
    model.save_pretrained(root / "tiny-deit")
    prep = {"do_resize": True, "size": {"height": 32, "width": 32}, "resample": 2,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5] * 3, "image_std": [0.5] * 3}  # fmt: skip
    (root / "tiny-deit" / "preprocessor_config.json").write_text(json.dumps(prep))
    out = root / "deit.html"
    rc = main(["show", "--image", str(picture), "--model", str(root / "tiny-deit"),
               "--out", str(out), "--no-png"])  # fmt: skip
    assert rc == 0
    return out


def _visit(browser, path: Path, state: str = "") -> tuple:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": 1200, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri() + ("#" + state if state else ""))
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    page.wait_for_selector("#image-canvas[data-drawn]", timeout=20_000)
    return page, errors


def _pixels(page) -> str:  # type: ignore[no-untyped-def]
    return str(page.evaluate("document.getElementById('image-canvas').toDataURL()"))


def _hash(page) -> dict[str, str]:  # type: ignore[no-untyped-def]
    h = page.evaluate("location.hash").lstrip("#")
    return dict(p.split("=", 1) for p in h.split("&") if "=" in p)


def _click_patch(page, r: int, c: int, **kw) -> None:  # type: ignore[no-untyped-def]
    box = page.locator("#image-canvas").bounding_box()
    side = box["width"] / 4  # 4 × 4 patches over a square picture
    page.locator("#image-canvas").click(
        position={"x": (c + 0.5) * side, "y": (r + 0.5) * side}, **kw
    )


def test_the_image_view_opens_on_the_picture_and_a_click_changes_the_heatmap(  # type: ignore[no-untyped-def]
    browser, deit_page
) -> None:
    page, errors = _visit(browser, deit_page)
    assert page.locator("#view-image").get_attribute("aria-pressed") == "true"
    assert _hash(page)["view"] == "image"
    assert "from [CLS]" in page.locator("#image-from").inner_text()
    chips = page.locator("#image-prefix .tok-chip")
    assert [chips.nth(i).inner_text().split()[0] for i in range(chips.count())] == [
        "[CLS]",
        "[DIST]",
    ]
    assert page.locator("#image-heads canvas").count() == 2  # one map per head
    before = _pixels(page)

    _click_patch(page, 1, 2)  # patch p(1,2): token 2 + 1 * 4 + 2
    assert _hash(page)["token"] == "8"
    assert "from p(1,2)" in page.locator("#image-from").inner_text()
    after = _pixels(page)
    assert after != before
    _click_patch(page, 1, 2)  # the same patch again: back to [CLS]
    assert "token" not in _hash(page) and _pixels(page) == before

    chips.nth(1).click()  # look from the distillation token
    assert _hash(page)["token"] == "1" and "from [DIST]" in page.locator("#image-from").inner_text()
    page.locator("#image-heads figure").nth(1).click()  # only head 1
    assert _hash(page)["heads"] == "1"
    one_head = _pixels(page)
    page.locator('#image-show [data-show="rollout"]').click()
    assert _hash(page)["img"] == "rollout"
    assert page.locator("#image-heads").is_hidden()
    assert _pixels(page) != one_head
    page.locator('#image-show [data-show="attention"]').click()
    assert "img" not in _hash(page)
    assert errors == []


def test_every_view_works_on_an_image_page_and_the_search_finds_patches(browser, deit_page) -> None:  # type: ignore[no-untyped-def]
    page, errors = _visit(browser, deit_page, "view=image&layer=1&heads=0&img=rollout")
    assert page.locator('#image-show [data-show="rollout"]').get_attribute("aria-pressed") == "true"
    for view in VIEWS:
        page.locator(f"#view-{view}").click()
        assert _hash(page)["view"] == view
    page.locator("#find").fill("p(2,")
    page.locator("#find").press("Enter")  # the first patch of row 2 becomes the current token
    assert _hash(page)["at"] == str(2 + 2 * 4)
    assert "from p(2,0)" in page.locator("#image-from").inner_text()
    assert "match 1 of 4" in page.locator("#find-count").inner_text()
    with page.expect_download() as svg:
        page.locator("#save-svg").click()
    assert svg.value.suggested_filename == "attention-image.svg"
    assert errors == []


def test_a_long_image_page_draws_cls_from_its_exact_rows(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rows = cols = 6
    L = 1 + rows * cols
    torch.manual_seed(0)
    w = torch.softmax(torch.randn(2, 2, L, L) * 3, -1)  # (layers, heads, L, L)
    pic = np.random.default_rng(1).integers(0, 255, (48, 48, 3), dtype=np.uint8)
    s = viz.image.ImageSetReducer("self-attention", 2, 2, L, L, prefix=1,
                                  budget=Budget(dense_cells=100, top_k=2))  # fmt: skip
    for layer in range(2):
        s.add(layer, 0, w[layer])
    reduced = s.finish()
    layout = s.finish_layout(viz.ImageLayout(pic, rows, cols, (8, 8)), reduced)
    reduced.tokens = layout.tokens()
    path = viz.to_html(reduced, None, tmp_path / "long.html", image=layout)
    page, errors = _visit(browser, path)
    assert "Long input" not in page.locator("#image-scale").inner_text()  # [CLS]: every weight
    _click_patch_grid(page, rows, 2, 3)
    assert (
        "Long input: a patch's row holds only its top 2 keys"
        in page.locator("#image-scale").inner_text()
    )
    # Without the exact rows, [CLS] too would be drawn from its top 2 keys alone.
    bare = viz.to_html(reduced, None, tmp_path / "bare.html",
                       image=viz.ImageLayout(pic, rows, cols, (8, 8)))  # fmt: skip
    page2, errors2 = _visit(browser, bare)
    assert "Long input" in page2.locator("#image-scale").inner_text()
    assert errors == errors2 == []


def _click_patch_grid(page, n: int, r: int, c: int) -> None:  # type: ignore[no-untyped-def]
    box = page.locator("#image-canvas").bounding_box()
    side = box["width"] / n
    page.locator("#image-canvas").click(position={"x": (c + 0.5) * side, "y": (r + 0.5) * side})
