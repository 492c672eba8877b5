"""``attnkit show`` against odd and unwritable paths, and every flag beside ``--image``.

The contract: ``show`` exits 0 only when every output asked for is written and
complete; otherwise it exits 2 with one line on stderr, no traceback, and leaves
no output (nor a temporary) behind. The regressions of the fifth attack round
(R5-1: an upper-case suffix; R5-4: a name too long for the file system; R5-9: a
failed last output left the others written) come first, then the campaign: a
small sample by default, every case under ``slow``. Tests run as root, so the
unwritable paths are ones that fail for root too (a path under a regular file, a
symbolic link into a missing directory).
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
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


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny ViT checkpoint (16 × 16 px, 8 px patches, 2 layers) and a picture for it."""
    image = pytest.importorskip("PIL.Image")
    from transformers import ViTConfig, ViTModel

    root = tmp_path_factory.mktemp("paths-vit")
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=16, patch_size=8, num_hidden_layers=2, num_attention_heads=2,
                    hidden_size=8, intermediate_size=16)  # fmt: skip
    ViTModel(cfg).save_pretrained(root / "tiny-vit")
    prep = {"do_resize": True, "size": {"height": 16, "width": 16}, "resample": 2,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5] * 3, "image_std": [0.5] * 3}  # fmt: skip
    (root / "tiny-vit" / "preprocessor_config.json").write_text(json.dumps(prep))
    picture = root / "scene.png"
    image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 24, 3), np.uint8)).save(picture)
    return root / "tiny-vit", picture


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
    saved, page = tmp_path / f"w{suffix}", tmp_path / "a.html"
    page.write_text("the page before")
    page.chmod(0o640)
    code, out, err = _show(capsys, "the cat sat", "--model", str(gpt2_dir), "--no-png", "--quiet",
                           "--out", str(tmp_path / "a.html"), "--save-weights", str(saved))  # fmt: skip
    assert code == 0, err
    assert f"wrote {saved}" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", saved.name]
    arrays, meta = load_weights(saved)
    assert arrays["self.weights"].shape[:2] == (2, 2) and meta["holds"] == "dense"
    # Written under a temporary name and renamed: the modes are those open() would give.
    umask = os.umask(0)
    os.umask(umask)
    assert (page.stat().st_mode & 0o777, saved.stat().st_mode & 0o777) == (0o640, 0o666 & ~umask)


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


def test_a_failed_rename_puts_the_earlier_files_back(
    capsys: pytest.CaptureFixture[str], gpt2_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Every file is written; then the second rename into place fails (a full disk): the
    first output, already renamed, is taken back and the earlier file it replaced is
    there again, as it was."""
    import attnkit.commands.outputs as outputs

    page, picture = tmp_path / "a.html", tmp_path / "a.png"
    page.write_text("the page before")
    picture.write_bytes(b"the picture before")
    real, calls = os.replace, []

    def second_fails(src: object, dst: object) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(outputs.os, "replace", second_fails)
    code, out, err = _show(capsys, "the cat", "--model", str(gpt2_dir), "--quiet", "--out",
                           str(page), "--png", str(picture))  # fmt: skip
    _one_line_error(code, out, err, r"--png: cannot write .*a\.png: No space left")
    assert page.read_text() == "the page before"
    assert picture.read_bytes() == b"the picture before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", "a.png"]  # no temporaries


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
        (["--png", str(tmp_path / "a.png"), "--no-png"], "--png and --no-png: give one"),
        (["--save-weights", str(tmp_path / "w.npz") + "/."], "--save-weights: .*directory"),
    ]  # fmt: skip
    for extra, pattern in cases:
        code, out, err = _show(capsys, *base, *extra)
        _one_line_error(code, out, err, pattern)
    code, out, err = _show(capsys, "--text-file", str(tmp_path / "file"), "--model",
                           str(gpt2_dir), "--no-png", "--out", str(tmp_path / "file"))  # fmt: skip
    _one_line_error(code, out, err, "--out: .*file is the input file of --text-file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.npz", "file", "pic.png",
                                                          "real.png"]  # fmt: skip


def test_an_output_in_a_checkpoint_folder_is_refused(
    capsys: pytest.CaptureFixture[str], gpt2_dir: Path, tmp_path: Path
) -> None:
    """--save-weights or --out inside the folder of --model, --compare-model or the
    default model could replace the model's own files (its weights): refused before
    any compute, the checkpoint untouched."""
    from attnkit.models.bert.loading import default_checkpoint

    weights = gpt2_dir / "model.safetensors"
    before = weights.read_bytes()
    page = str(tmp_path / "p.html")
    for extra, option in (
        (["--model", str(gpt2_dir), "--save-weights", str(weights)], "--model"),
        (["--model", str(gpt2_dir), "--out", str(gpt2_dir / "tokenizer.json")], "--model"),
        (["--model", str(gpt2_dir), "--compare-model", str(gpt2_dir), "--save-weights",
          str(gpt2_dir / "new.npz")], "--model"),
        (["--save-weights", str(default_checkpoint() / "model.safetensors")], "the default model"),
    ):  # fmt: skip
        code, out, err = _show(capsys, "the cat sat", "--no-png", "--out", page, *extra)
        _one_line_error(code, out, err, f"lies in the checkpoint folder of {option}")
    assert weights.read_bytes() == before and not (gpt2_dir / "new.npz").exists()


def test_a_model_whose_attention_is_not_finite_is_one_line(
    capsys: pytest.CaptureFixture[str], gpt2_dir: Path, tmp_path: Path
) -> None:
    """Weights that hold NaN (here from NaN embeddings) have nothing to draw: one line,
    exit 2, no page (and the Python API raises the same, a ValueError)."""
    from transformers import GPT2LMHeadModel

    from attnkit import viz
    from attnkit.viz.reduce import NonFiniteAttention

    folder = tmp_path / "nan-gpt2"
    model = GPT2LMHeadModel.from_pretrained(gpt2_dir)
    with torch.no_grad():
        model.transformer.wte.weight.fill_(float("nan"))
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (gpt2_dir / name).exists():
            (folder / name).write_bytes((gpt2_dir / name).read_bytes())
    page = tmp_path / "p.html"
    capsys.readouterr()  # (transformers' loading bars)
    code, out, err = _show(capsys, "the cat sat", "--model", str(folder), "--quiet",
                           "--no-png", "--out", str(page))  # fmt: skip
    _one_line_error(code, out, err, r"the model's self-attention .* weights hold NaN or infinity")
    assert not page.exists()
    with pytest.raises(NonFiniteAttention, match="hold NaN or infinity"):
        viz.show(str(folder), text="the cat sat")


# The campaign ----------------------------------------------------------------------------------

# Each kind of output path: (how to make it in a folder, whether it can be written).
PathMaker = Callable[[Path, str], str]


def _symlink(link: Path, target: Path) -> str:
    link.symlink_to(target)
    return str(link)


def _under_file(tmp: Path, suffix: str) -> str:
    (tmp / "afile").write_text("x")
    return str(tmp / "afile" / f"o{suffix}")


def _a_dir(tmp: Path, suffix: str) -> str:
    (tmp / f"adir{suffix}").mkdir()
    return str(tmp / f"adir{suffix}")


def _existing(tmp: Path, suffix: str) -> str:
    (tmp / f"old{suffix}").write_bytes(b"old")
    return str(tmp / f"old{suffix}")


def _link_to_file(tmp: Path, suffix: str) -> str:
    (tmp / f"real{suffix}").write_bytes(b"old")
    return _symlink(tmp / f"link{suffix}", tmp / f"real{suffix}")


PATHS: dict[str, tuple[PathMaker, bool]] = {
    "plain": (lambda tmp, s: str(tmp / f"o{s}"), True),
    "upper-suffix": (lambda tmp, s: str(tmp / f"o{s.upper()}"), True),
    "mixed-suffix": (lambda tmp, s: str(tmp / f"o{s[:2].upper()}{s[2:]}"), True),
    "existing-file": (_existing, True),
    "link-to-a-file": (_link_to_file, True),
    "long-name": (_LONG["name"], False),
    "long-path": (_LONG["path"], False),
    "dangling-link": (lambda tmp, s: _symlink(tmp / f"l{s}", tmp / "gone" / f"o{s}"), False),
    "dangling-link-here": (lambda tmp, s: _symlink(tmp / f"l{s}", tmp / f"gone{s}"), False),
    "link-loop": (lambda tmp, s: _symlink(tmp / f"loop{s}", tmp / f"loop{s}"), False),
    "a-directory": (_a_dir, False),
    "under-a-file": (_under_file, False),
    "missing-folder": (lambda tmp, s: str(tmp / "nowhere" / f"o{s}"), False),
    "trailing-slash": (lambda tmp, s: str(tmp / f"o{s}") + "/", False),
    "trailing-dot": (lambda tmp, s: str(tmp / f"o{s}") + "/.", False),
    "a-device": (lambda tmp, s: "/dev/null", False),
    "empty": (lambda tmp, s: "", False),
    "nul-byte": (lambda tmp, s: str(tmp / f"o\0{s}"), False),
}
OUTPUTS = {"--out": ".html", "--png": ".png", "--save-weights": ".npz"}

# Every flag beside --image: each one is used (and its output complete) or refused with one line.
IMAGE_FLAGS: dict[str, list[str]] = {
    "text": ["a cat"],
    "text-file": ["--text-file", "{tmp}/t.txt"],
    "pair": ["--pair", "a dog"],
    "max-length": ["--max-length", "4"],
    "generate": ["--generate", "2"],
    "seed": ["--seed", "1"],
    "compare": ["--compare", "a dog"],
    "compare-model": ["--compare-model", "{gpt2}"],
    "words": ["--words"],
    "no-special": ["--no-special"],
    "neuron-window": ["--neuron-window", "0:2"],
    "neuron-window-outside": ["--neuron-window", "99:100"],
    "neuron-token": ["--neuron-token", "p(0"],
    "save-weights-npz": ["--save-weights", "{tmp}/w.npz"],
    "save-weights-safetensors": ["--save-weights", "{tmp}/w.safetensors"],
    "save-weights-upper": ["--save-weights", "{tmp}/w.SAFETENSORS"],
    "quiet": ["--quiet"],
    "scale": ["--scale", "log"],
    "top-k": ["--top-k", "3"],
    "top-k-zero": ["--top-k", "0"],
    "layers": ["--layers", "1"],
    "layers-outside": ["--layers", "5"],
    "heads": ["--heads", "0"],
    "no-png": ["--no-png"],
    "svg": ["--png", "{tmp}/p.svg"],
    "jpg": ["--png", "{tmp}/p.jpg"],
    "png-is-the-picture": ["--png", "{image}"],
    "png-and-no-png": ["--png", "{tmp}/p.png", "--no-png"],
    "open": ["--open"],
}


def _state(path: str) -> object:
    """What is at ``path`` now: nothing, a link and its target, a folder, or a file's bytes."""
    try:
        if os.path.islink(path):
            return ("link", os.readlink(path))
        if os.path.isdir(path):
            return ("dir",)
        with open(path, "rb") as f:
            return ("file", f.read())
    except (OSError, ValueError):
        return None


def _complete(path: str) -> None:
    """The output at ``path`` is whole: a page, a picture or a weights file."""
    suffix = Path(path).suffix.lower()
    data = Path(path).read_bytes()
    if suffix == ".html":
        assert b'id="attention-data"' in data and data.rstrip().endswith(b"</html>"), path
    elif suffix == ".png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[-8:-4] == b"IEND", path
    elif suffix == ".svg":
        assert data.rstrip().endswith(b"</svg>"), path
    else:
        arrays, meta = load_weights(path)
        assert arrays and meta["sets"], path


def _asked(args: list[str]) -> list[str]:
    """The outputs a command line asks for (in the current folder by default)."""
    value = {flag: args[i + 1] for i, flag in enumerate(args[:-1]) if flag in OUTPUTS}
    asked = [value.get("--out", "attention.html")]
    if "--no-png" not in args:
        asked.append(value.get("--png", "attention.png"))
    if "--save-weights" in value:
        asked.append(value["--save-weights"])
    return asked


def _run_case(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp: Path,
    args: list[str],
) -> tuple[int, str, str]:  # fmt: skip
    """Run ``show`` in ``tmp`` and assert the contract; the exit status and output."""
    import webbrowser

    monkeypatch.chdir(tmp)
    monkeypatch.setattr(webbrowser, "open", lambda url: True)
    asked = _asked(args)
    before = {p: _state(p) for p in asked}
    listing = {str(p) for p in tmp.rglob("*")}
    code, out, err = _show(capsys, *args)
    assert "Traceback" not in err
    if code == 0:
        for p in asked:
            _complete(p)
            assert f"wrote {p}" in out or f"wrote {Path(p)}" in out, out
    else:
        _one_line_error(code, out, err, ".")
        assert {p: _state(p) for p in asked} == before  # nothing written, nothing removed
        assert {str(p) for p in tmp.rglob("*")} == listing
    assert not [p for p in tmp.rglob(".attnkit-*")], "a temporary was left behind"
    return code, out, err


def _output_case(tmp: Path, gpt2: Path, vit: tuple[Path, Path], source: str, flag: str,
                 kind: str) -> list[str]:  # fmt: skip
    suffix = OUTPUTS[flag]
    if flag == "--save-weights" and kind in ("upper-suffix", "mixed-suffix"):
        suffix = ".safetensors" if kind == "mixed-suffix" else suffix
    path = PATHS[kind][0](tmp, suffix)
    args = {"--out": str(tmp / "a.html"), "--png": str(tmp / "a.png"), flag: path}
    head = ["the cat sat", "--model", str(gpt2)] if source == "text" else [
        "--image", str(vit[1]), "--model", str(vit[0])]  # fmt: skip
    return [*head, "--quiet", *(x for kv in args.items() for x in kv)]


OUTPUT_CASES = [(source, flag, kind) for source in ("text", "image") for flag in OUTPUTS
                for kind in PATHS]  # fmt: skip
SAMPLE = {("text", "--save-weights", "upper-suffix"), ("text", "--save-weights", "dangling-link"),
          ("image", "--out", "long-name"), ("image", "--png", "under-a-file"),
          ("text", "--png", "link-to-a-file")}  # fmt: skip


def _marks(case: tuple[str, ...]) -> list[pytest.MarkDecorator]:
    return [] if case in SAMPLE else [pytest.mark.slow]


@pytest.mark.parametrize(
    ("source", "flag", "kind"),
    [pytest.param(*c, id="-".join(c), marks=_marks(c)) for c in OUTPUT_CASES],
)
def test_campaign_odd_output_paths(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    gpt2_dir: Path, vit: tuple[Path, Path], source: str, flag: str, kind: str,
) -> None:  # fmt: skip
    args = _output_case(tmp_path, gpt2_dir, vit, source, flag, kind)
    code, _, err = _run_case(capsys, monkeypatch, tmp_path, args)
    writable = PATHS[kind][1]
    assert (code == 0) == writable, err
    if kind == "link-to-a-file" and code == 0:  # written through the link, which stays
        assert Path(args[args.index(flag) + 1]).is_symlink()


IMAGE_SAMPLE = {"words", "save-weights-upper", "neuron-window-outside", "quiet"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[] if n in IMAGE_SAMPLE else [pytest.mark.slow]) for n in IMAGE_FLAGS],
)
def test_campaign_every_flag_with_image(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    gpt2_dir: Path, vit: tuple[Path, Path], name: str,
) -> None:  # fmt: skip
    (tmp_path / "t.txt").write_text("a cat")
    extra = [a.format(tmp=tmp_path, gpt2=gpt2_dir, image=vit[1]) for a in IMAGE_FLAGS[name]]
    args = ["--image", str(vit[1]), "--model", str(vit[0]), *extra]
    code, _, err = _run_case(capsys, monkeypatch, tmp_path, args)
    if code == 0 and name == "quiet":
        assert err == ""
    flag = next((a for a in extra if a.startswith("--")), "TEXT")
    if code == 2:
        assert flag in err, err  # the line names the flag it refuses


INPUTS = {"--model": "", "--compare-model": "", "--image": ".png", "--text-file": ".txt"}
INPUT_KINDS = ["long-name", "long-path", "dangling-link", "link-loop", "under-a-file",
               "missing-folder", "empty", "nul-byte", "a-device"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kind", INPUT_KINDS)
@pytest.mark.parametrize("flag", list(INPUTS))
def test_campaign_odd_input_paths(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    gpt2_dir: Path, vit: tuple[Path, Path], flag: str, kind: str,
) -> None:  # fmt: skip
    path = PATHS[kind][0](tmp_path, INPUTS[flag])
    if flag == "--image":
        args = ["--image", path, "--model", str(vit[0])]
    elif flag == "--text-file":
        args = ["--text-file", path, "--model", str(gpt2_dir)]
    else:
        args = ["the cat", "--model", str(gpt2_dir), flag, path]
    code, _, err = _run_case(capsys, monkeypatch, tmp_path, [*args, "--out", "a.html"])
    assert code == 2 and flag in err, err
