"""``attnkit show`` on tiny local Hugging Face checkpoints (GPT-2, DistilBERT, T5), built here.

Every model and tokenizer is created in the test (random weights, a word-level
vocabulary) and saved to a temporary directory: nothing is downloaded.
"""

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

from attnkit import viz
from attnkit.cli import main

from tolerance import BYTE_STEP, assert_close_to_scale, byte_sum_rel

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = "the cat sat on mat because it was tired a dog slept all day long".split()
SAMPLE = "the cat sat on the mat because it was tired"


def _tokenizer(directory: Path, specials: list[str], single: str | None, pair: str | None) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate([*specials, *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if single is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=[(t, vocab[t]) for t in specials]
        )
    named = {"unk_token": "[UNK]", "pad_token": specials[0]}
    if "[CLS]" in vocab:
        named |= {"cls_token": "[CLS]", "sep_token": "[SEP]"}
    if "</s>" in vocab:
        named["eos_token"] = "</s>"
    PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=64, **named).save_pretrained(
        directory
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from transformers import (
        DistilBertConfig,
        DistilBertModel,
        GPT2Config,
        GPT2LMHeadModel,
        T5Config,
        T5ForConditionalGeneration,
    )

    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    n_vocab = len(WORDS) + 4
    out = {}

    gpt2 = root / "tiny-gpt2"
    cfg = GPT2Config(vocab_size=n_vocab, n_embd=16, n_layer=2, n_head=2, n_positions=64)
    GPT2LMHeadModel(cfg).save_pretrained(gpt2)
    _tokenizer(gpt2, ["[PAD]", "[UNK]"], None, None)
    out["gpt2"] = gpt2

    distil = root / "tiny-distilbert"
    cfg = DistilBertConfig(
        vocab_size=n_vocab, dim=16, n_layers=2, n_heads=2, hidden_dim=32, max_position_embeddings=64
    )
    DistilBertModel(cfg).save_pretrained(distil)
    _tokenizer(
        distil,
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
        "[CLS] $A [SEP]",
        "[CLS] $A [SEP] $B:1 [SEP]:1",
    )
    out["distilbert"] = distil

    t5 = root / "tiny-t5"
    cfg = T5Config(
        vocab_size=n_vocab, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2,
        num_heads=2, pad_token_id=0, eos_token_id=2, decoder_start_token_id=0,
    )  # fmt: skip
    T5ForConditionalGeneration(cfg).save_pretrained(t5)
    _tokenizer(t5, ["[PAD]", "[UNK]", "</s>"], "$A </s>", "$A </s> $B </s>")
    out["t5"] = t5
    return out


def _show(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["show", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _sets(page: Path) -> list[dict]:
    m = re.search(r'id="attention-data">(.*?)</script>', page.read_text(encoding="utf-8"), re.S)
    assert m is not None
    return json.loads(m.group(1))["sets"]


def _weights(s: dict) -> np.ndarray:
    raw = base64.b64decode(s["data"])
    if s["encoding"] == "deflate":
        raw = zlib.decompress(raw)
    codes = np.frombuffer(raw, dtype=np.uint8).reshape(s["shape"])
    return codes * np.asarray(s["scales"]).reshape(*s["shape"][:2], 1, 1) / 255.0


def test_gpt2_decoder_is_causal(
    capsys: pytest.CaptureFixture[str], checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    page, picture = tmp_path / "g.html", tmp_path / "g.png"
    code, out, err = _show(
        capsys,
        SAMPLE,
        "--model",
        str(checkpoints["gpt2"]),
        "--out",
        str(page),
        "--png",
        str(picture),
    )
    assert code == 0, err
    assert out.startswith("tiny-gpt2: 2 layers × 2 heads, 10 tokens")
    assert "tokens: the ·cat ·sat ·on ·the ·mat ·because ·it ·was ·tired" in out
    assert "  layer 1: head " in out and "(2 layers × 2 heads," in out
    (s,) = _sets(page)
    assert s["name"] == "self-attention (causal)" and s["shape"] == [2, 2, 10, 10]
    w = _weights(s)
    assert np.all(np.triu(np.ones((10, 10)), 1) * w == 0)  # no query sees a later key
    rows = w.sum(-1)
    assert_close_to_scale(rows, np.ones_like(rows), rel=byte_sum_rel(w.shape[-1]))
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_folder_and_a_model_you_hold_run_through_one_function(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """hf_run.run_text chooses generation or one forward for a checkpoint folder and for a
    model you hold alike."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    from attnkit import viz
    from attnkit.viz.sources import text_run as hf_run

    seen: list[tuple[str, int]] = []
    run_text = hf_run.run_text

    def recording(model: Any, tokenizer: Any, kind: str, text: str, *args: Any,
                  **options: Any) -> Any:  # fmt: skip
        seen.append((kind, options.get("generate_tokens", 0)))
        return run_text(model, tokenizer, kind, text, *args, **options)

    monkeypatch.setattr(hf_run, "run_text", recording)
    folder = str(checkpoints["gpt2"])
    held = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    viz.show(folder, None, SAMPLE, generate=2, progress=False)
    viz.show(held, tokenizer, SAMPLE, generate=2, progress=False)
    assert seen == [("decoder", 2), ("decoder", 2)]
    encoder = str(checkpoints["distilbert"])
    held_encoder = AutoModel.from_pretrained(encoder, attn_implementation="eager")
    with pytest.raises(ValueError, match=r"^generate: needs a decoder \(a causal language"):
        viz.show(held_encoder, AutoTokenizer.from_pretrained(encoder), SAMPLE, generate=2,
                 progress=False)  # fmt: skip


def test_distilbert_encoder_with_a_pair(
    capsys: pytest.CaptureFixture[str], checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    page = tmp_path / "d.html"
    code, out, err = _show(
        capsys, "the cat sat", "--pair", "a dog slept", "--model", str(checkpoints["distilbert"]),
        "--out", str(page), "--no-png", "--heads", "1",
    )  # fmt: skip
    assert code == 0, err
    assert "tokens: [CLS] the ·cat ·sat [SEP] a ·dog ·slept [SEP]" in out  # spaces as written
    (s,) = _sets(page)
    assert s["shape"] == [2, 1, 9, 9] and s["heads"] == ["head 1"]
    assert s["pairStart"] == 5 and s["pairKeyStart"] == 5


def test_t5_encoder_decoder_has_self_and_cross_attention(
    capsys: pytest.CaptureFixture[str], checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    page = tmp_path / "t.html"
    code, out, err = _show(
        capsys, "the cat sat on the mat", "--pair", "a dog slept", "--model",
        str(checkpoints["t5"]), "--out", str(page), "--png", str(tmp_path / "t.png"),
    )  # fmt: skip
    assert code == 0, err
    assert "attention kinds on the page: encoder self-attention, decoder self-attention" in out
    enc, dec, cross = _sets(page)
    assert enc["rawTokens"] == ["the", "cat", "sat", "on", "the", "mat", "</s>"]
    assert dec["tokens"] == ["[PAD]", "a", " dog", " slept"]  # the start token, then shifted right
    assert enc["shape"] == [2, 2, 7, 7] and dec["shape"] == [2, 2, 4, 4]
    assert cross["shape"] == [2, 2, 4, 7] and cross["keyTokens"] == enc["tokens"]
    assert np.all(np.triu(np.ones((4, 4)), 1) * _weights(dec) == 0)


def test_a_hugging_face_config_that_disagrees_with_its_weights_is_refused(
    capsys: pytest.CaptureFixture[str], checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    liar = tmp_path / "liar"
    shutil.copytree(checkpoints["gpt2"], liar)
    config = json.loads((liar / "config.json").read_text())
    config["n_layer"] = 10**9
    (liar / "config.json").write_text(json.dumps(config))
    code, out, err = _show(capsys, SAMPLE, "--model", str(liar), "--out", str(tmp_path / "a.html"))
    assert code == 2 and out == ""
    assert re.fullmatch(
        r"attnkit show: error: --model: .*config\.json: num_hidden_layers is 1000000000 but the "
        r"weights hold stacks of 2\n",
        err,
    )
    config["n_layer"], config["n_positions"] = 2, 10**9
    (liar / "config.json").write_text(json.dumps(config))
    code, _, err = _show(capsys, SAMPLE, "--model", str(liar), "--out", str(tmp_path / "a.html"))
    assert (
        code == 2
        and "max_position_embeddings is 1000000000 but the weights' tables have 64 rows" in err
    )
    (liar / "model.safetensors").unlink()
    code, _, err = _show(capsys, SAMPLE, "--model", str(liar), "--out", str(tmp_path / "a.html"))
    assert code == 2 and "missing model.safetensors" in err


def test_outputs_attentions_go_straight_to_to_html(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoModel, AutoTokenizer

    directory = str(checkpoints["distilbert"])
    tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModel.from_pretrained(directory, local_files_only=True, attn_implementation="eager")
    inputs = tok("the cat sat", return_tensors="pt")
    with torch.no_grad():
        outputs = model(**inputs, output_attentions=True)
    tokens = tok.convert_ids_to_tokens(inputs["input_ids"][0])
    page = viz.to_html(outputs.attentions, tokens, tmp_path / "hf.html")
    (s,) = _sets(page)
    assert s["shape"] == [2, 2, 5, 5] and s["tokens"] == ["[CLS]", "the", "cat", "sat", "[SEP]"]
    want = torch.stack([a[0] for a in outputs.attentions]).numpy()  # (layers, heads, L, L)
    assert_close_to_scale(_weights(s), want, rel=BYTE_STEP)
