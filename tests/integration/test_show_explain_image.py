"""``attnkit show --image --explain``: an image classifier's top class attributed to its
picture's tokens, against Chefer's definition on the eager model; the page and the weights
file hold it; the methods and checkpoints a picture cannot take are refused before any
model is built."""

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
from attnkit.viz.attribution_image import explain_image

from tolerance import assert_close_to_scale

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
transformers.logging.set_verbosity_error()

PREP = {"do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
        "image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 32},
        "resample": 2}  # fmt: skip


def _save(directory: Path, head: bool) -> Path:
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, num_hidden_layers=2,
                                 num_attention_heads=2, hidden_size=16, intermediate_size=32,
                                 num_labels=3)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(cfg) if head else transformers.ViTModel(cfg)
    with torch.no_grad():  # sharper attention than a fresh init
        for name, p in model.named_parameters():
            if name.endswith(("query.weight", "key.weight", "q_proj.weight", "k_proj.weight")):
                p.mul_(25)
    model.save_pretrained(directory)
    (directory / "preprocessor_config.json").write_text(json.dumps(PREP))
    return directory


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save(tmp_path_factory.mktemp("vit-classifier"), head=True)


@pytest.fixture(scope="module")
def picture_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    arr = (np.random.default_rng(0).random((48, 64, 3)) * 60).astype(np.uint8)
    arr[10:30, 20:50] = [220, 40, 40]
    path = tmp_path_factory.mktemp("pictures") / "scene.png"
    Image.fromarray(arr).save(path)
    return path


def _chefer(directory: Path, picture: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Chefer's R from the eager model's returned weights and their gradients, the head
    importance from each head's output (the output projection's input), and the top class."""
    from attnkit.models import hf_vision

    ck = hf_vision.ImageCheckpoint(directory)
    pixels = ck.image_input.pixels(ck.image_input.picture(picture))  # (1, 3, 32, 32)
    model = transformers.ViTForImageClassification.from_pretrained(
        str(directory), attn_implementation="eager"
    ).eval()
    heads: list[torch.Tensor] = []

    def keep(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        args[0].retain_grad()
        heads.append(args[0])

    projections = [m for name, m in model.named_modules()
                   if name.endswith(("attention.o_proj", "attention.output.dense"))]  # fmt: skip
    assert len(projections) == 2
    hooks = [p.register_forward_pre_hook(keep) for p in projections]
    out = model(pixel_values=pixels, output_attentions=True)
    for h in hooks:
        h.remove()
    for a in out.attentions:
        a.retain_grad()
    top = int(out.logits[0].argmax())
    out.logits[0, top].backward()
    n = out.attentions[0].shape[-1]
    r = torch.eye(n)
    for a in out.attentions:
        r = r + (a.grad * a)[0].clamp(min=0).mean(0) @ r  # (n, n)
    importance = torch.stack([(o * o.grad)[0].reshape(n, 2, -1).sum(dim=(0, 2)).abs()
                              for o in heads])  # fmt: skip
    return r, importance, top


def test_explain_image_is_chefer_on_the_picture(vit: Path, picture_file: Path) -> None:
    picture = Image.open(picture_file).convert("RGB")
    a = explain_image(vit, picture)
    r, importance, top = _chefer(vit, picture)
    assert a.tokens[:2] == ["[CLS]", "p(0,0)"] and len(a.tokens) == 17
    assert a.target.kind == "class" and a.target.index == top and a.target.position == 0
    assert a.relevance is not None and a.head_importance is not None
    assert_close_to_scale(a.relevance, r, what="R")
    assert_close_to_scale(a.scores, r[0], what="scores: the [CLS] row")
    assert_close_to_scale(a.head_importance, importance, what="head importance")
    roll = explain_image(vit, picture, method="rollout")
    assert roll.head_importance is None and roll.scores.shape == (17,)


def _payload(page: Path) -> dict[str, Any]:
    m = re.search(r'id="attention-data">(.*?)</script>', page.read_text(encoding="utf-8"), re.S)
    assert m is not None
    return dict(json.loads(m.group(1)))


def _floats(part: dict[str, Any]) -> torch.Tensor:
    raw = base64.b64decode(part["data"])
    raw = zlib.decompress(raw) if part["encoding"] == "deflate" else raw
    return torch.from_numpy(np.frombuffer(raw, dtype="<f4").astype(np.float64))


def test_cli_writes_the_explain_view_of_a_picture(
    vit: Path, picture_file: Path, tmp_path: Path
) -> None:
    from attnkit.viz.export import load_weights

    page, saved = tmp_path / "page.html", tmp_path / "w.safetensors"
    assert main(["show", "--image", str(picture_file), "--model", str(vit), "--explain",
                 "--save-weights", str(saved), "--no-png", "--quiet", "--out", str(page)]) == 0  # fmt: skip
    data = _payload(page)
    want = explain_image(vit, Image.open(picture_file).convert("RGB"))
    assert "image" in data and data["explain"]["tokens"] == want.tokens
    assert_close_to_scale(_floats(data["explain"]["scores"]), want.scores, what="page scores")
    arrays, meta = load_weights(saved)
    got = torch.from_numpy(arrays["explain.scores"].astype(np.float64))
    assert_close_to_scale(got, want.scores, what="saved scores")
    assert meta["explain"]["target"]["kind"] == "class"


def test_cli_reads_the_weights_once(
    vit: Path, picture_file: Path, tmp_path: Path, weights_read: list[str]
) -> None:
    """The page's forward runs on the classifier the Explain view attributes: one model."""
    page = tmp_path / "page.html"
    assert main(["show", "--image", str(picture_file), "--model", str(vit), "--explain",
                 "--no-png", "--quiet", "--out", str(page)]) == 0  # fmt: skip
    assert "explain" in _payload(page)
    assert weights_read == ["ViTForImageClassification"]


def test_image_refusals_come_before_any_model(
    vit: Path, picture_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from attnkit.models import hf_vision

    def built(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model was built before the refusal")

    monkeypatch.setattr(hf_vision.ImageCheckpoint, "load", built)
    bare = _save(tmp_path / "vit-bare", head=False)
    capsys.readouterr()  # the progress of saving it
    for model, method, message in (
        (vit, "input_x_gradient", "--explain input_x_gradient and --image: a picture is"),
        (bare, "attention_x_gradient", "--explain and --image: vit-bare has no classification"),
    ):
        code = main(["show", "--image", str(picture_file), "--model", str(model),
                     f"--explain={method}", "--no-png", "--quiet",
                     "--out", str(tmp_path / "p.html")])  # fmt: skip
        err = capsys.readouterr().err.strip()
        assert code == 2 and "\n" not in err and message in err, err
    assert not (tmp_path / "p.html").exists()


def _relevance(directory: Path, picture: Any) -> torch.Tensor:
    """Chefer's R of any image classifier, from the eager model's returned weights and
    their gradients at its top class."""
    from attnkit.models import hf_vision

    ck = hf_vision.ImageCheckpoint(directory)
    pixels = ck.image_input.pixels(ck.image_input.picture(picture))  # (1, 3, 32, 32)
    model = transformers.AutoModelForImageClassification.from_pretrained(
        str(directory), attn_implementation="eager"
    ).eval()
    out = model(pixel_values=pixels, output_attentions=True)
    for a in out.attentions:
        a.retain_grad()
    out.logits[0, int(out.logits[0].argmax())].backward()
    n = out.attentions[0].shape[-1]
    r = torch.eye(n)
    for a in out.attentions:
        r = r + (a.grad * a)[0].clamp(min=0).mean(0) @ r  # (n, n)
    return r


def _classifier(directory: Path, model: Any) -> Path:
    with torch.no_grad():  # sharper attention than a fresh init
        for name, p in model.named_parameters():
            if name.endswith(("query.weight", "key.weight")):
                p.mul_(25)
    model.save_pretrained(directory)
    (directory / "preprocessor_config.json").write_text(json.dumps(PREP))
    return directory


def _deit_with_teacher() -> Any:
    cfg = transformers.DeiTConfig(intermediate_size=32, **SMALL)
    return transformers.DeiTForImageClassificationWithTeacher(cfg)


def _dinov2() -> Any:
    return transformers.Dinov2ForImageClassification(
        transformers.Dinov2Config(mlp_ratio=2, **SMALL)
    )


def _ijepa() -> Any:
    cfg = transformers.IJepaConfig(intermediate_size=32, **SMALL)
    return transformers.IJepaForImageClassification(cfg)


SMALL = {"image_size": 32, "patch_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
         "hidden_size": 16, "num_labels": 3}  # fmt: skip
POOLING = [
    pytest.param(_deit_with_teacher, lambda r: 0.5 * (r[0] + r[1]), 0, id="deit-with-teacher"),
    pytest.param(_dinov2, lambda r: 0.5 * (r[0] + r[1:].mean(0)), 0, id="dinov2"),
    pytest.param(_ijepa, lambda r: r.mean(0), None, id="ijepa"),
]


@pytest.mark.parametrize(("build", "pooled", "position"), POOLING)
def test_a_head_that_reads_several_tokens_mixes_their_rows(
    build: Any, pooled: Any, position: int | None, picture_file: Path, tmp_path: Path
) -> None:
    """DeiT's teacher averages [CLS]'s and [DIST]'s logits, DINOv2 joins [CLS] with the
    patches' mean, I-JEPA means every token: the scores mix the rows those heads read
    (row 0 alone left DINOv2's patch half and I-JEPA's every token but the first out,
    and the distilled DeiT was refused as having no head)."""
    torch.manual_seed(0)
    directory = _classifier(tmp_path / "classifier", build())
    picture = Image.open(picture_file).convert("RGB")
    a = explain_image(directory, picture)
    r = _relevance(directory, picture)
    assert a.relevance is not None and a.target.position == position
    assert_close_to_scale(a.relevance, r, what="R")
    assert_close_to_scale(a.scores, pooled(r), what="scores: the rows the head reads")
    roll = explain_image(directory, picture, method="rollout")
    assert roll.relevance is not None
    assert_close_to_scale(roll.scores, pooled(roll.relevance), what="rollout's scores")
