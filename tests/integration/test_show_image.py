"""Vision transformers in ``attnkit show --image`` and ``viz.show_image``, on tiny models built here.

Each checkpoint (every supported family: 32 × 32 pictures, 8 px
patches, 2 layers, 2 heads, q and k sharpened so the heads differ) is built from
a config with random weights and saved with a ``preprocessor_config.json`` to a
temporary directory; the picture is drawn with Pillow. Nothing is downloaded.
"""

from __future__ import annotations

import base64
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit import viz
from attnkit.cli import main
from attnkit.models import hf_vision
from attnkit.models.config_json import ConfigError
from attnkit.models.image_input import ImageInput, read_image_input
from attnkit.viz.reduce import Budget
from attnkit.viz.sources.image_run import attend_checkpoint

from tolerance import (
    BYTE_STEP,
    FLOAT32_REL,
    FLOAT32_ULPS_REL,
    assert_close_to_scale,
    half_step_rel,
    scaled_error,
)

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

SIZE, PATCH = 32, 8
GRID = SIZE // PATCH
# model_type -> (config fields beyond the shared ones, preprocessor_config.json, non-patch tokens)
FAMILIES = {
    "vit": (
        {},
        {
            "image_processor_type": "ViTImageProcessor",
            "size": {"height": SIZE, "width": SIZE},
            "resample": 2,
        },
        ["[CLS]"],
    ),
    "deit": (
        {},
        {
            "image_processor_type": "DeiTImageProcessor",
            "size": {"height": 40, "width": 40},
            "resample": 3,
            "do_center_crop": True,
            "crop_size": {"height": SIZE, "width": SIZE},
        },
        ["[CLS]", "[DIST]"],
    ),
    "dinov2_with_registers": (
        {"num_register_tokens": 2},
        {
            "image_processor_type": "BitImageProcessor",
            "size": {"shortest_edge": 36},
            "resample": 3,
            "do_center_crop": True,
            "crop_size": {"height": SIZE, "width": SIZE},
        },
        ["[CLS]", "[REG0]", "[REG1]"],
    ),
    "ijepa": ({}, {"size": {"height": SIZE, "width": SIZE}, "resample": 2}, []),
    "dinov2": ({}, {"size": {"height": SIZE, "width": SIZE}, "resample": 3}, ["[CLS]"]),
    "dinov3_vit": (
        {"num_register_tokens": 1},
        {"size": {"height": SIZE, "width": SIZE}, "resample": 2},
        ["[CLS]", "[REG0]"],
    ),
    "vit_msn": ({}, {"size": {"height": SIZE, "width": SIZE}, "resample": 2}, ["[CLS]"]),
}
# The default run checks the families with extra tokens (distillation, registers); the
# plain ViT and DINOv3 (the same code with fewer or other extra tokens) run under slow.
QUICK_FAMILIES = [
    m if m in ("deit", "dinov2_with_registers") else pytest.param(m, marks=pytest.mark.slow)
    for m in FAMILIES
]


def _save(model_type: str, directory: Path) -> Path:
    from transformers import CONFIG_MAPPING, AutoModel

    extra, prep, _ = FAMILIES[model_type]
    cfg = CONFIG_MAPPING[model_type](
        image_size=SIZE, patch_size=PATCH, num_hidden_layers=2, num_attention_heads=2,
        hidden_size=16, intermediate_size=32, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModel.from_config(cfg)
    with torch.no_grad():  # sharper attention than a fresh init, so heads and patches differ
        for name, p in model.named_parameters():
            if name.endswith(("query.weight", "key.weight", "q_proj.weight", "k_proj.weight")):
                p.mul_(25)
            if name.endswith(("cls_token", "distillation_token", "register_tokens")):
                p.normal_()
    model.save_pretrained(directory)
    prep = {"do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], **prep}  # fmt: skip
    (directory / "preprocessor_config.json").write_text(json.dumps(prep))
    return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vision")
    return {t: _save(t, root / f"tiny-{t}") for t in FAMILIES}


@pytest.fixture(scope="module")
def picture_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    # (H, W, 3): noise, a red box, blue ground
    arr = (rng.random((48, 64, 3)) * 60).astype(np.uint8)
    arr[10:30, 20:50] = [220, 40, 40]
    arr[34:, :, 2] = 200
    path = tmp_path_factory.mktemp("pictures") / "scene.png"
    Image.fromarray(arr).save(path)
    return path


def _eager(directory: Path, picture: object) -> tuple[torch.Tensor, torch.nn.Module, torch.Tensor]:
    """(layers, heads, L, L) eager weights, the eager model and its pixel values."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    prep = read_image_input(directory)
    pixels = prep.pixels(prep.picture(picture))  # (1, 3, H, W)
    with torch.no_grad():
        out = model(pixel_values=pixels, output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]), model, pixels


@pytest.mark.parametrize("model_type", QUICK_FAMILIES)
def test_captured_weights_equal_eager_attention(checkpoints, picture_file, model_type) -> None:  # type: ignore[no-untyped-def]
    import attnkit.integrations.transformers as integration

    picture = viz.image.open_image(picture_file)
    want, model, pixels = _eager(checkpoints[model_type], picture)
    # attnkit reaches the family's attention: one attnkit.attention call per layer
    model.set_attn_implementation(integration.IMPLEMENTATION)
    with torch.no_grad(), viz.capture(model) as cap:
        model(pixel_values=pixels)
    assert len(cap) == 2
    assert_close_to_scale(cap.stack(batch_index=0), want, what="attnkit's weights")

    run = attend_checkpoint(hf_vision.ImageCheckpoint(checkpoints[model_type]), picture)
    s = run.sets[0]
    assert s.dense is not None
    assert_close_to_scale(torch.from_numpy(s.dense), want, what="streamed weights")
    assert scaled_error(want[:, 0], want[:, 1]) > FLOAT32_REL  # the heads differ: the test can fail


@pytest.mark.parametrize("model_type", QUICK_FAMILIES)
def test_patch_grid_geometry(checkpoints, picture_file, model_type) -> None:  # type: ignore[no-untyped-def]
    prefix = FAMILIES[model_type][2]
    ck = hf_vision.ImageCheckpoint(checkpoints[model_type])
    assert (ck.patch, list(ck.prefix), ck.num_layers, ck.num_heads) == (
        (PATCH, PATCH),
        prefix,
        2,
        2,
    )
    run = attend_checkpoint(ck, viz.image.open_image(picture_file))
    lay = run.layout
    assert (lay.rows, lay.cols, lay.patch, lay.picture.shape) == (GRID, GRID, (8, 8), (32, 32, 3))
    P = len(prefix)
    assert lay.n_tokens == P + GRID * GRID == run.sets[0].shape[2]
    assert run.tokens[:P] == prefix
    for r in range(GRID):
        for c in range(GRID):
            assert run.tokens[P + r * GRID + c] == f"p({r},{c})"
    label = " + ".join([*prefix, ""]) if prefix else ""
    assert lay.describe() == f"{label}{GRID} × {GRID} patches of 8 px"


@pytest.mark.parametrize("model_type", ["vit", "deit", "dinov2_with_registers"])
def test_pictures_are_prepared_as_transformers_prepares_them(
    checkpoints, picture_file, model_type
) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoImageProcessor

    picture = Image.open(picture_file).convert("RGB")
    want = AutoImageProcessor.from_pretrained(checkpoints[model_type])(
        picture, return_tensors="pt"
    )["pixel_values"]
    prep = read_image_input(checkpoints[model_type])
    got = prep.pixels(prep.picture(picture))
    assert_close_to_scale(got, want, rel=FLOAT32_ULPS_REL, what="pixel values")


def test_rollout_over_the_image_and_a_long_page_keeps_the_cls_rows(
    checkpoints, picture_file
) -> None:  # type: ignore[no-untyped-def]
    picture = viz.image.open_image(picture_file)
    want, _, _ = _eager(checkpoints["deit"], picture)
    ck = hf_vision.ImageCheckpoint(checkpoints["deit"])
    run = attend_checkpoint(ck, picture)
    rollout = viz.attention_rollout(want.mean(1, keepdim=True))  # (L, L)
    assert run.sets[0].rollout is not None
    assert_close_to_scale(torch.from_numpy(run.sets[0].rollout), torch.as_tensor(rollout))

    long = attend_checkpoint(ck, picture, budget=Budget(dense_cells=100, top_k=3))
    s, lay = long.sets[0], long.layout
    assert s.long and lay.prefix_weights is not None
    assert_close_to_scale(torch.from_numpy(lay.prefix_weights), want[:, :, :2], what="[CLS] rows")
    part = viz.image.image_payload(lay, s)
    for key, exact in (
        ("prefixRows", want[:, :, :2]),
        ("rolloutRows", torch.as_tensor(rollout)[:2]),
    ):
        raw = np.frombuffer(base64.b64decode(part[key]["data"]), np.uint8)
        scales = np.asarray(part[key]["scales"], np.float32)
        shape = part[key]["shape"]
        got = raw.reshape(shape[0] * shape[1], -1) * scales[:, None] / 255
        assert_close_to_scale(torch.from_numpy(got.reshape(shape)), exact.reshape(shape),
                              rel=half_step_rel(BYTE_STEP), what=key)  # fmt: skip


def test_cli_writes_an_image_page(checkpoints, picture_file, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out, png = tmp_path / "vit.html", tmp_path / "vit.png"
    rc = main(["show", "--image", str(picture_file), "--model", str(checkpoints["deit"]),
               "--out", str(out), "--png", str(png)])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "[CLS] + [DIST] + 4 × 4 patches of 8 px on scene.png (seen at 32 × 32 px)" in text
    assert png.stat().st_size > 0
    page = out.read_text(encoding="utf-8")
    data = json.loads(
        re.search(r'id="attention-data">(.*?)</script>', page, re.S).group(1)  # type: ignore[union-attr]
    )
    # The closing line names the page's views, the neuron view where a set kept q and k.
    last = "rollout and neuron views)" if "neuron" in data["sets"][0] else "and rollout views)"
    assert "open it in a browser: image, head, matrix, model, statistics" in text
    assert last in text
    image = data["image"]
    assert (image["rows"], image["cols"], image["patch"], image["prefix"]) == (4, 4, [8, 8],
                                                                            ["[CLS]", "[DIST]"])  # fmt: skip
    head, payload = image["picture"].split(",", 1)
    assert head == "data:image/png;base64"
    seen = np.asarray(Image.open(io.BytesIO(base64.b64decode(payload))))
    prep = read_image_input(checkpoints["deit"])
    assert np.array_equal(seen, prep.picture(Image.open(picture_file)))  # what the model saw
    assert data["sets"][0]["tokens"][:3] == ["[CLS]", "[DIST]", "p(0,0)"]
    assert "scene.png" in data["meta"]["image"]


def _bad_checkpoint(root: Path, kind: str, checkpoints: dict[str, Path]) -> Path:
    d = root / kind
    d.mkdir()
    if kind in ("text-model", "swin"):
        (d / "config.json").write_text(json.dumps({"model_type": "bert" if kind == "text-model"
                                                   else "swin"}))  # fmt: skip
    else:  # a ViT without preprocessor_config.json
        for f in checkpoints["vit"].iterdir():
            if f.name != "preprocessor_config.json":
                (d / f.name).write_bytes(f.read_bytes())
    return d


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("not-an-image", "not an image (Pillow cannot identify the file)"),
        ("missing-file", "no such file"),
        ("truncated", "cannot read the image"),
        ("text-too", "--image and TEXT: a vision transformer reads the picture alone"),
        ("pair", "--image and --pair: --pair is for a text"),
        ("no-model", "--image needs --model DIR"),
        ("text-model", "a 'bert' model is not a vision transformer attnkit reads; supported: ViT"),
        ("swin", "a 'swin' model is not supported: it attends within shifted windows"),
        ("no-preprocessor", "missing preprocessor_config.json"),
        ("no-pillow", "--image needs Pillow, which is not installed: pip install 'attnkit[image]'"),
    ],
)
def test_cli_errors_are_one_line_before_any_model_is_built(
    checkpoints, picture_file, tmp_path, capsys, monkeypatch, case, expected
) -> None:  # type: ignore[no-untyped-def]
    def built(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("a model was built")

    monkeypatch.setattr(hf_vision.ImageCheckpoint, "load", built)
    picture, model = str(picture_file), str(checkpoints["vit"])
    extra: list[str] = []
    if case == "not-an-image":
        picture = str(tmp_path / "notes.png")
        Path(picture).write_text("not a picture")
    elif case == "missing-file":
        picture = str(tmp_path / "absent.png")
    elif case == "truncated":
        picture = str(tmp_path / "cut.png")
        Path(picture).write_bytes(picture_file.read_bytes()[:200])
    elif case == "text-too":
        extra = ["a cat"]
    elif case == "pair":
        extra = ["--pair", "a dog"]
    elif case in ("text-model", "swin", "no-preprocessor"):
        model = str(_bad_checkpoint(tmp_path, case, checkpoints))
    elif case == "no-pillow":
        monkeypatch.setitem(sys.modules, "PIL", None)
    args = ["show", *extra, "--image", picture, "--out", str(tmp_path / "x.html"), "--no-png"]
    if case != "no-model":
        args += ["--model", model]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnkit show: error: "), err
    assert expected in err, err
    assert not (tmp_path / "x.html").exists()


def test_a_text_run_on_a_vision_checkpoint_points_to_image(checkpoints, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    rc = main(["show", "a cat", "--model", str(checkpoints["vit"]), "--out",
               str(tmp_path / "x.html"), "--no-png"])  # fmt: skip
    assert rc == 2
    assert "is an image model; give it a picture with --image PATH" in capsys.readouterr().err


def test_show_image_from_python(checkpoints, picture_file) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModel

    page = viz.show_image(checkpoints["vit"], picture_file)
    assert '"image": {' in page.html and "Attention of tiny-vit on scene.png" in page.html
    model = AutoModel.from_pretrained(checkpoints["vit"], attn_implementation="eager")
    array = np.asarray(Image.open(picture_file).convert("RGB"))
    held = viz.show_image(model, array, processor=checkpoints["vit"], title="mine")
    data = [json.loads(re.search(r'id="attention-data">(.*?)</script>', p.html, re.S).group(1))  # type: ignore[union-attr]
            for p in (page, held)]  # fmt: skip
    assert data[0]["sets"][0]["data"] == data[1]["sets"][0]["data"]  # the same weights either way
    assert data[0]["image"] == data[1]["image"]
    with pytest.raises(TypeError, match="processor: a vision model needs"):
        viz.show_image(model, array)
    with pytest.raises(TypeError, match="image: expected a file path"):
        viz.show_image(checkpoints["vit"], [[1, 2, 3]])


def test_the_command_and_show_image_hand_one_record(  # type: ignore[no-untyped-def]
    checkpoints, picture_file, tmp_path, monkeypatch
) -> None:
    """``attnkit show --image`` and ``viz.show_image`` run one ImageRunOptions through one
    function (image_show.attend_image)."""
    from attnkit.viz import image_show
    from attnkit.viz.options import ImageRunOptions

    seen: list[ImageRunOptions] = []
    attend_image = image_show.attend_image

    def recording(source: object, picture: object, options: ImageRunOptions) -> object:
        seen.append(options)
        return attend_image(source, picture, options)

    monkeypatch.setattr(image_show, "attend_image", recording)
    out = tmp_path / "a.html"
    assert main(["show", "--image", str(picture_file), "--model", str(checkpoints["vit"]),
                 "--out", str(out), "--no-png", "--layers", "1", "--top-k", "8"]) == 0  # fmt: skip
    viz.show_image(checkpoints["vit"], picture_file, layers=[1], heads=[0, 1], top_k=8)
    cli, python = seen
    assert cli == python == ImageRunOptions([1], [0, 1], top_k=8)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"size": {"height": 0, "width": 4}}, "size.height must be a number of pixels"),
        ({"size": {"longest": 3}}, "size must hold height and width, or shortest_edge"),
        ({"do_center_crop": True}, "do_center_crop is set but crop_size is missing"),
        ({"resample": 9}, "resample must be one of PIL's filters"),
        ({"image_std": [0.5, 0, 0.5]}, "image_std must be 1 or 3 positive numbers"),
        ({"image_mean": [float("nan")] * 3}, "image_mean must be 1 or 3 finite numbers"),
    ],
)
def test_bad_preprocessor_fields_are_named(fields, message) -> None:  # type: ignore[no-untyped-def]
    base = {"size": {"height": 8, "width": 8}, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    with pytest.raises(ConfigError, match=re.escape(message)):
        ImageInput.from_config({**base, **fields}, "p.json")


def test_a_centre_crop_larger_than_the_picture_pads_it() -> None:
    prep = ImageInput(resize=None, crop=(6, 4), rescale=None, mean=None, std=None)
    pic = prep.picture(Image.fromarray(np.full((2, 8, 3), 9, np.uint8)))
    assert pic.shape == (6, 4, 3)
    assert pic[:2].sum() == 0 and pic[2:4].min() == 9 and pic[4:].sum() == 0  # centred rows


def test_sixteen_bit_grey_is_scaled_and_32_bit_pictures_are_refused(tmp_path: Path) -> None:
    """A 16-bit grey PNG is seen with its high bytes (PIL's own conversion clips at 255);
    a float or 32-bit integer picture has no fixed range and is refused by name."""
    prep = ImageInput(resize=None, crop=None, rescale=None, mean=None, std=None)
    values = np.array([[0, 255, 256, 65535], [1000, 32768, 40000, 65280]], dtype=np.uint16)
    grey = Image.fromarray(values)
    if grey.mode not in ("I;16", "I;16L"):
        pytest.skip(f"this Pillow makes mode {grey.mode} of uint16 pixels")
    path = tmp_path / "grey16.png"
    grey.save(path)
    for picture in (prep.picture(grey), prep.picture(viz.image.open_image(path))):
        np.testing.assert_array_equal(picture[..., 0], values >> 8)
        assert picture.shape == (2, 4, 3) and (picture == picture[..., :1]).all()
    for mode, pixels in (("F", values.astype(np.float32) / 65535), ("I", values.astype(np.int32))):
        image = Image.fromarray(pixels)
        assert image.mode == mode
        with pytest.raises(ValueError, match=rf"32-bit .* picture \(mode '{mode}'\)"):
            prep.picture(image)
        image.save(tmp_path / f"p{mode}.tiff")
        with pytest.raises(ValueError, match=r"p[FI]\.tiff: a 32-bit"):
            viz.image.open_image(tmp_path / f"p{mode}.tiff")


def test_every_supported_family_is_tested_here() -> None:
    assert set(FAMILIES) == set(hf_vision.FAMILIES)
    assert not set(hf_vision.NOT_SUPPORTED) & set(hf_vision.FAMILIES)


def test_save_weights_with_image_writes_them(checkpoints, picture_file, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """R5-3: --save-weights beside --image exited 0 and wrote no file."""
    from attnkit.viz.export import load_weights

    saved = tmp_path / "vit.npz"
    rc = main(["show", "--image", str(picture_file), "--model", str(checkpoints["vit"]), "--out",
               str(tmp_path / "vit.html"), "--no-png", "--save-weights", str(saved), "--quiet"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0 and err == "", err  # --quiet is honoured too
    assert f"wrote {saved}" in out
    arrays, meta = load_weights(saved)
    n = 1 + GRID * GRID  # [CLS] and the patches
    assert arrays["self.weights"].shape == (2, 2, n, n)
    assert (
        meta["sets"][0]["tokens"][:2] == ["[CLS]", "p(0,0)"]
        and "scene.png" in meta["meta"]["image"]
    )


@pytest.mark.parametrize(
    "flag",
    [
        ["--words"],
        ["--no-special"],
        ["--neuron-window", "0:2"],
        ["--neuron-window", "0:900"],
        ["--neuron-token", "p(1"],
    ],
    ids=lambda f: f[0] + (f[1] if len(f) > 1 else ""),
)
def test_text_only_view_flags_with_image_are_refused(  # type: ignore[no-untyped-def]
    checkpoints, picture_file, tmp_path, capsys, flag
) -> None:
    """R5-3: --words, --no-special and any neuron window were accepted and dropped."""
    rc = main(["show", "--image", str(picture_file), "--model", str(checkpoints["vit"]), *flag,
               "--out", str(tmp_path / "x.html"), "--no-png"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and err == f"attnkit show: error: --image and {flag[0]}: {flag[0]} is for a " \
        "text; leave it out\n"  # fmt: skip
    assert list(tmp_path.iterdir()) == []
