"""explain_image(): which patches of a picture a vision transformer classifier's top class
depends on, and which heads.

The picture is prepared as :func:`attnkit.viz.show_image` prepares it (the checkpoint's
``preprocessor_config.json``), its tokens are the model's non-patch tokens then its
patches (:class:`~attnkit.viz.ImageLayout`), and the target is the logit of the
classifier's top class. Two methods read attention alone and so need no embedding of
the picture: ``"attention_x_gradient"`` (Chefer et al., 2021) and ``"rollout"``, each
as :func:`attnkit.viz.explain` computes it for a text. The scores are the row of R of
the token the classifier reads, or the mix of rows its head reads (:func:`pooled_rows`).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .attribution import Attribution, _attribute, _Task
from .model_modes import gradients_on

if TYPE_CHECKING:
    from ..models.hf_vision import ImageCheckpoint

__all__ = ["IMAGE_METHODS", "explain_image", "image_classifier_name", "pooled_rows"]

IMAGE_METHODS = ("attention_x_gradient", "rollout")


_HEADS = ("ForImageClassification", "ForImageClassificationWithTeacher")

# How a classifier head reads the final tokens, where it reads more than [CLS]:
_POOLING = {
    # (the [CLS] head's logits + the [DIST] head's) / 2
    "DeiTForImageClassificationWithTeacher": "cls_and_distillation",
    # one linear layer over [CLS] joined with the mean of the patch tokens
    "Dinov2ForImageClassification": "cls_and_patch_mean",
    "Dinov2WithRegistersForImageClassification": "cls_and_patch_mean",
    # the mean of every token (I-JEPA has no [CLS])
    "IJepaForImageClassification": "mean",
}


def image_classifier_name(config: Any) -> str | None:
    """The image classifier architecture a checkpoint's config names (a
    ``...ForImageClassification``, or DeiT's ``...ForImageClassificationWithTeacher``),
    or None.

    Args:
        config: a transformers config (its ``architectures``).
    """
    archs = list(getattr(config, "architectures", None) or [])
    return next((a for a in archs if a.endswith(_HEADS)), None)


def pooled_rows(head: str, prefix: int, n: int) -> tuple[torch.Tensor | None, int | None]:
    """The rows of R whose mix a classifier head reads, for its scores.

    Args:
        head: the classifier's class name.
        prefix: its non-patch tokens ([CLS], [DIST], registers), which come first.
        n: all its tokens.

    Returns:
        (None, 0) for a head that reads [CLS] alone (row 0). Otherwise (weights (n,),
        the target's position): DeiT with its teacher averages the logits of [CLS] and
        [DIST] (½ each, position 0); DINOv2 joins [CLS] with the patches' mean (½ on
        [CLS], ½ spread over the patches, position 0); I-JEPA means every token (1/n
        each, position None). A head that joins two tokens gives each half: Chefer et
        al. define the row of the one token a classifier reads, and a mean of tokens is
        read as the mean of their rows, as for a mean-pooled text.
    """
    how = _POOLING.get(head)
    if how is None:
        return None, 0
    w = torch.zeros(n, dtype=torch.float64)  # (n,)
    if how == "mean":
        return w + 1.0 / n, None
    w[0] = 0.5
    if how == "cls_and_distillation":
        w[1] = 0.5
    else:
        w[prefix:] = 0.5 / (n - prefix)
    return w, 0


def explain_image(
    directory: str | Path | ImageCheckpoint, image: Any, *, method: str = "attention_x_gradient"
) -> Attribution:
    """Attribute a vision transformer classifier's top class to its picture's tokens.

    Args:
        directory: a local checkpoint folder (str or Path) of a ``...ForImageClassification``
            model of a family :func:`attnkit.viz.show_image` reads, with
            ``preprocessor_config.json``; or that folder as an
            :class:`~attnkit.models.hf_vision.ImageCheckpoint`, whose model is built with its
            head once and kept (``attnkit show --image --explain`` runs its page on it too).
        image: the picture: an RGB ``PIL.Image``.
        method: ``"attention_x_gradient"`` (default) or ``"rollout"``.

    Returns:
        an :class:`~attnkit.viz.Attribution` over the n tokens (the non-patch tokens, then
        the patches row by row, labelled ``p(row,col)``): ``scores`` (n,), the row of
        ``relevance`` (n, n) of the token the classifier reads (the mix of rows its head
        reads, :func:`pooled_rows`); ``head_importance`` (layers, heads) for attention ×
        gradient; ``target``: the top class.

    Raises:
        ValueError: another method, or a checkpoint that is not an image classifier
            (before the model is built).
    """
    from ..models import hf_vision

    if method not in IMAGE_METHODS:
        raise ValueError(
            f"method: a picture is explained by {' or '.join(IMAGE_METHODS)}, got {method!r}"
        )
    ck = (
        directory
        if isinstance(directory, hf_vision.ImageCheckpoint)
        else hf_vision.ImageCheckpoint(directory)
    )
    if image_classifier_name(ck.config) is None:
        raise ValueError(
            f"model: {ck.name} has no classification head (its config names no "
            "...ForImageClassification); a picture's target is a classifier's top class"
        )
    with gradients_on():  # (inside a caller's no_grad or inference_mode too)
        return _explain_picture(ck, image, method)


def _explain_picture(ck: Any, image: Any, method: str) -> Attribution:
    """:func:`explain_image` of a checked image classifier's checkpoint."""
    from .image import ImageLayout

    ck.load(head=True)
    model: Any = ck.model
    picture = ck.image_input.picture(image)  # (H, W, 3) uint8
    H, W = picture.shape[:2]
    layout = ImageLayout(picture, H // ck.patch[0], W // ck.patch[1], ck.patch, tuple(ck.prefix))
    pixels = ck.image_input.pixels(picture)  # (1, 3, H, W)
    extra: dict[str, Any] = {}
    size = getattr(model.config, "image_size", None)
    trained = (size, size) if isinstance(size, int) else tuple(size) if size else None
    if "interpolate_pos_encoding" in inspect.signature(model.forward).parameters and (
        trained != (H, W)
    ):
        extra["interpolate_pos_encoding"] = True
    tokens = list(layout.tokens())
    ids = torch.zeros((1, len(tokens)), dtype=torch.long)  # only its length is read
    task = _Task(model, "classifier", False, ids, tokens, (None, None))
    task.pool, task.pool_position = pooled_rows(type(model).__name__, len(ck.prefix), len(tokens))
    return _attribute(task, method, 32, "gausslegendre", pixels=pixels, extra=extra)
