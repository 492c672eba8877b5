"""``attnkit show`` against odd and unwritable paths, and every flag beside ``--image``.

The contract: ``show`` exits 0 only when every output asked for is written and
complete; otherwise it exits 2 with one line on stderr, no traceback, and leaves
no output (nor a temporary) behind. The regressions of the fifth attack round
(R5-1: an upper-case suffix; R5-4: a name too long for the file system; R5-9: a
failed last output left the others written). Tests run as root, so the
unwritable paths are ones that fail for root too (a path under a regular file, a
symbolic link into a missing directory).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.viz.export import load_weights

transformers = pytest.importorskip("transformers")

_ERROR = re.compile(r"attnkit show: error: \S.*")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("paths") / "tiny-gpt2"
    torch.manual_seed(0)
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", *"the cat sat on a mat".split()])}
    cfg = GPT2Config(vocab_size=len(vocab), n_embd=16, n_layer=2, n_head=2, n_positions=32)
    GPT2LMHeadModel(cfg).save_pretrained(root)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]"
    ).save_pretrained(root)
    return root


def _show(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["show", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(code: int, out: str, err: str, pattern: str) -> None:
    assert code == 2, err
    assert "wrote" not in out and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and _ERROR.fullmatch(lines[0]), err
    assert re.search(pattern, lines[0]), lines[0]


# R5-1 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".NPZ", ".Safetensors"])
def test_an_upper_case_weights_suffix_is_written_under_that_name(
    capsys: pytest.CaptureFixture[str], gpt2_dir: Path, tmp_path: Path, suffix: str
) -> None:
    saved = tmp_path / f"w{suffix}"
    code, out, err = _show(capsys, "the cat sat", "--model", str(gpt2_dir), "--no-png", "--quiet",
                           "--out", str(tmp_path / "a.html"), "--save-weights", str(saved))  # fmt: skip
    assert code == 0, err
    assert f"wrote {saved}" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", saved.name]
    arrays, meta = load_weights(saved)
    assert arrays["self.weights"].shape[:2] == (2, 2) and meta["holds"] == "dense"


# R5-4 ------------------------------------------------------------------------------------------


_LONG = {
    "name": lambda tmp, suffix: str(tmp / ("n" * 300 + suffix)),
    "path": lambda tmp, suffix: str(tmp / "/".join(["d" * 99] * 50) / f"x{suffix}"),
}


@pytest.mark.parametrize("long", list(_LONG))
@pytest.mark.parametrize(
    ("flag", "suffix"),
    [("--out", ".html"), ("--png", ".png"), ("--save-weights", ".npz"), ("--model", ""),
     ("--compare-model", ""), ("--image", ".png"), ("--text-file", ".txt")],
)  # fmt: skip
def test_a_path_too_long_for_the_file_system_is_one_line(
    capsys: pytest.CaptureFixture[str], gpt2_dir: Path, tmp_path: Path, flag: str, suffix: str,
    long: str,
) -> None:  # fmt: skip
    value = _LONG[long](tmp_path, suffix)
    args = {"--out": str(tmp_path / "a.html"), "--png": str(tmp_path / "a.png"),
            "--model": str(gpt2_dir), flag: value}  # fmt: skip
    text = [] if flag in ("--image", "--text-file") else ["the cat"]
    code, out, err = _show(capsys, *text, *(x for kv in args.items() for x in kv))
    what = "the name is too long for the file system|File name too long"
    _one_line_error(code, out, err, rf"^attnkit show: error: {re.escape(flag)}: .*({what})")
    assert len(err) < 400  # the path is elided
    assert list(tmp_path.iterdir()) == []


# R5-9 ------------------------------------------------------------------------------------------


def test_a_failed_last_output_leaves_none_of_them(
    capsys: pytest.CaptureFixture[str], gpt2_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import attnkit.viz.export

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    page, picture = tmp_path / "a.html", tmp_path / "a.png"
    page.write_text("the page before")
    monkeypatch.setattr(attnkit.viz.export, "save_weights", full)
    code, out, err = _show(capsys, "the cat", "--model", str(gpt2_dir), "--quiet", "--out",
                           str(page), "--png", str(picture), "--save-weights",
                           str(tmp_path / "w.npz"))  # fmt: skip
    _one_line_error(code, out, err, r"--save-weights: cannot write .*w\.npz: No space left")
    assert out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html"]  # no temporaries either
    assert page.read_text() == "the page before"


def test_unwritable_outputs_are_refused_before_any_compute(
    capsys: pytest.CaptureFixture[str], gpt2_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import attnkit.commands.show as show

    def built(*args: object) -> None:
        raise AssertionError("a model was opened")

    monkeypatch.setattr(show, "open_source", built)
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling.npz").symlink_to(tmp_path / "missing" / "w.npz")
    (tmp_path / "real.png").write_text("x")
    (tmp_path / "pic.png").symlink_to(tmp_path / "real.png")
    base = ["the cat", "--model", str(gpt2_dir), "--out", str(tmp_path / "a.html")]
    cases = [
        (["--save-weights", str(tmp_path / "dangling.npz")], "a symbolic link to a missing file"),
        (["--png", str(tmp_path / "file" / "a.png")], "a part of the path is a file"),
        (["--png", str(tmp_path / "a.html")], "--png: expected a file name ending in .png"),
        (["--save-weights", str(tmp_path / "w.npz") + "/"], "--save-weights: .*directory"),
        (["--png", str(tmp_path / "pic.png"), "--out", str(tmp_path / "real.png")],
         "--png: .*pic.png is the same file as --out"),
        (["--png", "/dev/null"], "--png: cannot write /dev/null: not a regular file"),
    ]  # fmt: skip
    for extra, pattern in cases:
        code, out, err = _show(capsys, *base, *extra)
        _one_line_error(code, out, err, pattern)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.npz", "file", "pic.png",
                                                          "real.png"]  # fmt: skip
