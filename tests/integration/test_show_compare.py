"""``attnkit show --compare`` and ``--compare-model`` on tiny GPT-2 checkpoints built here.

Every model and tokenizer is created in the test (random weights, a word-level vocabulary)
and saved to a temporary directory: nothing is downloaded. The pages are then opened in
Chromium (when it is installed): no console error, and a click on side A moves side B.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit.cli import main

from tolerance import BYTE_STEP, scaled_error

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = "the cat sat on mat because it was tired a dog slept all day long".split()
SAMPLE = "the cat sat on the mat because it was tired"


def _checkpoint(directory: Path, seed: int, layers: int, words: list[str]) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=len(words) + 2, n_embd=16, n_layer=layers, n_head=2,
                     n_positions=64, bos_token_id=None, eos_token_id=None)  # fmt: skip
    GPT2LMHeadModel(cfg).save_pretrained(directory)
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=64, unk_token="[UNK]", pad_token="[PAD]"
    ).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    return {
        "a": _checkpoint(root / "tiny-a", 0, 2, WORDS),
        "b": _checkpoint(root / "tiny-b", 1, 2, WORDS),  # the same tokenizer, other weights
        "deep": _checkpoint(root / "tiny-deep", 2, 3, WORDS),
        "other": _checkpoint(root / "tiny-other", 3, 2, WORDS[::-1]),  # other token ids
    }


def _show(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["show", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _data(page: Path) -> dict:
    m = re.search(r'id="attention-data">(.*?)</script>', page.read_text(encoding="utf-8"), re.S)
    assert m is not None
    return json.loads(m.group(1))


def _decoded(part: dict, dtype: type, top: float) -> np.ndarray:
    raw = base64.b64decode(part["data"])
    if part["encoding"] == "deflate":
        raw = zlib.decompress(raw)
    codes = np.frombuffer(raw, dtype=dtype).reshape(part["shape"]).astype(np.float64)
    return codes * np.asarray(part["scales"]).reshape(*part["shape"][:2], 1, 1) / top


def _error_line(code: int, out: str, err: str, pattern: str) -> None:
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and re.fullmatch(f"attnkit show: error: {pattern}\n", err), err


def _open(request: pytest.FixtureRequest, page_path: Path, state: str = ""):  # type: ignore[no-untyped-def]
    """A new page of the shared browser (tests/integration/conftest.py) on ``page_path``,
    and the list its errors go to; asked for here, so that the checks before it run (and
    only the browser's part skips) where there is no browser."""
    page = request.getfixturevalue("browser").new_page(viewport={"width": 1300, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_path.resolve().as_uri() + ("#" + state if state else ""))
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    return page, errors


def test_compare_model_draws_both_models_and_their_difference(
    capsys: pytest.CaptureFixture[str],
    models: dict[str, Path],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    page_path, picture = tmp_path / "m.html", tmp_path / "m.png"
    code, out, err = _show(capsys, SAMPLE, "--model", str(models["a"]), "--compare-model",
                           str(models["b"]), "--out", str(page_path), "--png", str(picture))  # fmt: skip
    assert code == 0, err
    assert "B: tiny-b, 10 tokens" in out and "compared: both sides in sync, and A − B" in out
    data = _data(page_path)
    assert data["title"] == "Attention of tiny-a and tiny-b"
    a, b = data["sets"]
    cmp = data["compare"]
    assert cmp["names"] == ["tiny-a", "tiny-b"] and cmp["why"] is None
    wa, wb = _decoded(a, np.uint8, 255), _decoded(b, np.uint8, 255)
    d = _decoded(cmp["diffs"][0], np.int8, 127)
    assert scaled_error(torch.from_numpy(wa), torch.from_numpy(wb)) > BYTE_STEP  # two models
    # A - B was made from the exact weights; the page's A and B are each within a byte of them.
    tol = np.abs(d).max() / 254 + (wa.max() + wb.max()) / 510
    assert np.abs(d - (wa - wb)).max() <= tol
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    page, errors = _open(request, page_path, "view=head")
    try:
        panels = page.locator("#head-panels .head-panel:visible")
        assert panels.count() == 2
        panels.nth(1).locator(".q-col .tok").nth(3).click()  # a click on B ...
        assert (
            panels.nth(0).locator(".q-col .tok.active").get_attribute("data-i") == "3"
        )  # ... moves A
        page.locator("#view-matrix").click()
        assert page.locator("#matrix-panels .matrix-panel:visible").count() == 3
        assert errors == []
    finally:
        page.close()


def test_compare_a_second_text(
    capsys: pytest.CaptureFixture[str],
    models: dict[str, Path],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    page_path = tmp_path / "t.html"
    code, out, err = _show(capsys, SAMPLE, "--model", str(models["a"]), "--compare",
                           "a dog slept all day", "--out", str(page_path), "--no-png")  # fmt: skip
    assert code == 0, err
    assert "B tokens: a ·dog ·slept ·all ·day" in out
    assert (
        "compared side by side only: The token sequences differ: A has 10 tokens and B has 5."
        in out
    )
    data = _data(page_path)
    assert data["subtitle"] == f"A: {SAMPLE}  ‖  B: a dog slept all day"
    assert [s["shape"][2] for s in data["sets"]] == [10, 5] and data["compare"]["diffs"] == [None]

    page, errors = _open(request, page_path, "view=matrix")
    try:
        assert "Side by side only" in page.locator("#compare-note").inner_text()
        page.locator("#find").fill("dog")
        page.locator("#find").press("Enter")
        assert page.locator("#find-count").inner_text().startswith("A: 0, B: 1 matches")
        page.locator('#sides [data-side="B"]').click()
        assert "side=B" in page.evaluate("location.hash")
        page.locator("#find").press("Enter")  # B's own match: "dog" is token 1
        assert "at=1" in page.evaluate("location.hash")
        assert page.locator("#y-labels span.current").get_attribute("data-index") == "1"
        assert errors == []
    finally:
        page.close()


def test_the_same_text_twice_gives_a_zero_difference(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path
) -> None:
    page_path = tmp_path / "same.html"
    code, _, err = _show(capsys, SAMPLE, "--model", str(models["a"]), "--compare", SAMPLE,
                           "--out", str(page_path), "--no-png", "--layers", "1")  # fmt: skip
    assert code == 0, err
    (diff,) = _data(page_path)["compare"]["diffs"]
    assert diff["shape"] == [1, 2, 10, 10]
    assert np.all(_decoded(diff, np.int8, 127) == 0)


def test_models_of_different_depth_are_side_by_side(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path
) -> None:
    page_path = tmp_path / "deep.html"
    code, _, err = _show(capsys, SAMPLE, "--model", str(models["a"]), "--compare-model",
                         str(models["deep"]), "--out", str(page_path), "--no-png")  # fmt: skip
    assert code == 0, err
    data = _data(page_path)
    assert data["compare"]["why"].startswith("A shows 2 layers × 2 heads and B 3 × 2")
    assert [s["shape"][0] for s in data["sets"]] == [2, 3]


def test_the_last_layer_of_models_of_different_depth_is_no_difference(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path
) -> None:
    """--layers=-1 picks layer 1 of A and layer 2 of B: one layer each, but not the same
    one, so the page draws them side by side without an A − B."""
    page_path = tmp_path / "last.html"
    code, out, err = _show(capsys, SAMPLE, "--model", str(models["a"]), "--compare-model",
                           str(models["deep"]), "--layers=-1", "--out", str(page_path),
                           "--no-png")  # fmt: skip
    assert code == 0, err
    assert "both sides in sync, and A − B" not in out
    why = _data(page_path)["compare"]["why"]
    assert why.startswith("A shows layer 1 and B layer 2"), why


def test_bad_comparisons_exit_with_one_line(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path
) -> None:
    out_page = str(tmp_path / "x.html")
    base = [SAMPLE, "--model", str(models["a"]), "--out", out_page, "--no-png"]
    code, out, err = _show(capsys, *base, "--compare-model", str(models["other"]))
    _error_line(code, out, err, r"--compare-model: tiny-other has another tokenizer than tiny-a "
                r"\(the same tokens under other ids\); a comparison of models needs the same "
                r"tokens on both sides")  # fmt: skip
    code, out, err = _show(capsys, *base, "--compare", "a dog", "--compare-model",
                           str(models["b"]))  # fmt: skip
    _error_line(code, out, err, "--compare and --compare-model: give one; .*")
    code, out, err = _show(capsys, *base, "--compare-model", str(tmp_path / "nowhere"))
    _error_line(code, out, err, r"--compare-model: .*nowhere: no such directory")
    code, out, err = _show(capsys, *base, "--compare", "   ")
    _error_line(code, out, err, "--compare: the second text is empty; .*")
    code, out, err = _show(capsys, *base, "--compare", "a dog", "--generate", "2")
    _error_line(code, out, err, "--compare and --generate: .*")
    code, out, err = _show(capsys, *base, "--compare", "a dog", "--pair", "a cat")
    _error_line(code, out, err, "--compare and --pair: .*")
    assert not Path(out_page).exists()


def test_a_layer_the_second_model_lacks_is_refused_before_either_runs(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import attnkit.viz.notebook

    def ran(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model ran")

    monkeypatch.setattr(attnkit.viz.notebook, "attend", ran)
    code, out, err = _show(capsys, SAMPLE, "--model", str(models["deep"]), "--compare-model",
                           str(models["a"]), "--layers", "2", "--out", str(tmp_path / "x.html"),
                           "--no-png")  # fmt: skip
    _error_line(code, out, err, r"--compare-model: tiny-a: --layers: .*")


@pytest.mark.parametrize(("suffix", "flag"), [(".npz", "--compare"),
                                              (".safetensors", "--compare-model")])  # fmt: skip
def test_save_weights_of_a_comparison_holds_both_sides(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path, suffix: str,
    flag: str,
) -> None:  # fmt: skip
    """R5-5: side B was dropped from the file while the page and the metadata named both."""
    from attnkit.viz.export import load_weights

    base = ["--no-png", "--quiet", "--layers", "1", "--out"]
    text_b, model_b = ("a dog slept all day", models["a"]) if flag == "--compare" else (
        SAMPLE, models["b"])  # fmt: skip
    second = text_b if flag == "--compare" else str(model_b)
    both = tmp_path / f"both{suffix}"
    code, out, err = _show(capsys, SAMPLE, "--model", str(models["a"]), flag, second,
                           *base, str(tmp_path / "c.html"), "--save-weights", str(both))  # fmt: skip
    assert code == 0, err
    assert "of both sides: a/… for A, b/… for B" in out
    arrays, meta = load_weights(both)
    singles = {}
    for side, text, model in (("a", SAMPLE, models["a"]), ("b", text_b, model_b)):
        one = tmp_path / f"{side}{suffix}"
        code, _, err = _show(capsys, text, "--model", str(model), *base,
                             str(tmp_path / f"{side}.html"), "--save-weights", str(one))  # fmt: skip
        assert code == 0, err
        singles[side] = load_weights(one)
    for side, (alone, alone_meta) in singles.items():
        assert set(alone) == {"self.weights", "self.rollout", *(k for k in alone if "neuron" in k)}
        for name, value in alone.items():
            np.testing.assert_array_equal(arrays[f"{side}/{name}"], value)
        (record,) = [s for s in meta["sets"] if s["side"] == side]
        assert record["key"] == f"{side}/self"
        assert record["tokens"] == alone_meta["sets"][0]["tokens"]
    assert len(arrays) == sum(len(a) for a, _ in singles.values())
    sides = {s["key"]: s for s in meta["sides"]}
    assert sides["a"]["text"] == SAMPLE and sides["b"]["text"] == text_b
    # both sides named alike: name (kind, layers × heads)
    assert sides["b"]["model"].startswith(f"{model_b.name} (")
    assert sides["a"]["model"].startswith(f"{models['a'].name} (")
    assert sides["a"]["model"][sides["a"]["model"].index("(") :].count("×") == 1
    assert sides["b"]["model"][sides["b"]["model"].index("(") :].count("×") == 1
    assert meta["meta"]["compared"] == ("text" if flag == "--compare" else "model")
