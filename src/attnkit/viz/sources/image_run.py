"""A picture's attention from a vision transformer: one forward with streaming capture.

:func:`attend_image` runs a vision model once on a picture and reduces its attention;
:func:`attend_checkpoint` does it for an :class:`~attnkit.models.hf_vision.ImageCheckpoint`
and :func:`attend_model` for a transformers model you hold with its image processor.
Each returns an :class:`ImageRun` ready for :func:`attnkit.viz.to_html`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ...models.hf import first_line
from ...models.hf_vision import ImageCheckpoint, family_of, image_input_of, patch_size
from ...models.image_input import ImageInput
from ..image import ImageLayout, ImageSetReducer
from ..model_modes import evaluating
from ..progress import Progress
from ..reduce import Budget, ReducedSet
from ..stream import Router
from .text_run import _forward

__all__ = ["ImageRun", "attend_checkpoint", "attend_image", "attend_model"]


@dataclass
class ImageRun:
    """The attention of one picture, ready for :func:`attnkit.viz.to_html` (``image=layout``).

    Attributes:
        sets: one reduced set (the encoder's self-attention).
        tokens: the token labels (non-patch tokens, then ``p(r,c)``).
        layout: where each token lies on the picture the model saw.
        notes: facts about the run for the page.
    """

    sets: list[ReducedSet]
    tokens: list[str]
    layout: ImageLayout
    notes: list[str] = field(default_factory=list)


def attend_image(
    model: nn.Module,
    image_input: ImageInput,
    image: Any,
    *,
    prefix: Sequence[str],
    patch: tuple[int, int],
    n_layers: int,
    n_heads: int,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    budget: Budget | None = None,
) -> ImageRun:
    """Run a vision transformer once on a picture and reduce its attention.

    Args:
        model: a transformers vision model, base or with a task head; it runs in eval
            mode and each module's ``training`` flag is restored after.
        image_input: how the checkpoint prepares a picture.
        image: an RGB ``PIL.Image``.
        prefix: labels of the non-patch tokens (see :class:`VisionFamily`).
        patch: (height, width) of a patch in pixels.
        n_layers, n_heads: the model's layers and heads.
        layers, heads: what to show (default all).
        budget: what the page keeps.
    """
    picture = image_input.picture(image)  # (H, W, 3) uint8
    H, W = picture.shape[:2]
    rows, cols = H // patch[0], W // patch[1]
    if rows < 1 or cols < 1:
        raise ValueError(
            f"image: the model's input is {H} × {W} px, smaller than one {patch[0]} × "
            f"{patch[1]} px patch; check preprocessor_config.json"
        )
    layout = ImageLayout(picture, rows, cols, patch, tuple(prefix))
    L = layout.n_tokens
    reducer = ImageSetReducer(
        "self-attention",
        n_layers,
        n_heads,
        L,
        L,
        prefix=len(prefix),
        layers=layers,
        heads=heads,
        budget=budget,
    )
    inputs: dict[str, Any] = {"pixel_values": image_input.pixels(picture)}  # (1, 3, H, W)
    size = getattr(model.config, "image_size", None)
    trained = (size, size) if isinstance(size, int) else tuple(size) if size else None
    takes = "interpolate_pos_encoding" in inspect.signature(model.forward).parameters
    if takes and trained != (H, W):
        inputs["interpolate_pos_encoding"] = True  # a position table made for another size
    progress = Progress(n_layers, "layer")
    router = Router({"self": reducer}, progress=progress)
    try:
        with evaluating(model):  # no dropout; each module's own mode restored after
            _forward(model, router, **inputs)
    except ValueError as exc:
        if "do not fit" not in str(exc):
            raise
        raise ValueError(
            f"the model's attention is not over {layout.describe()} ({L} tokens): {first_line(exc)}"
        ) from None
    finally:
        progress.close()
    s = reducer.finish()
    s.tokens = layout.tokens()
    return ImageRun([s], s.tokens, reducer.finish_layout(layout, s))


def attend_checkpoint(
    checkpoint: ImageCheckpoint,
    image: Any,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    budget: Budget | None = None,
) -> ImageRun:
    """Run a checkpoint's model on a picture (an RGB ``PIL.Image``) and reduce its
    attention (the model is built on first use)."""
    ck = checkpoint
    return attend_image(ck.model, ck.image_input, image, prefix=ck.prefix, patch=ck.patch,
                        n_layers=ck.num_layers, n_heads=ck.num_heads, layers=layers,
                        heads=heads, budget=budget)  # fmt: skip


def attend_model(
    model: nn.Module,
    image: Any,
    processor: Any,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    budget: Budget | None = None,
) -> ImageRun:
    """:func:`attend_image` for a transformers vision model you hold (family from its config)."""
    cfg = getattr(model, "config", None)
    family = family_of(getattr(cfg, "model_type", type(model).__name__), "model")
    if processor is None:
        raise TypeError(
            "processor: a vision model needs how its pictures are prepared: the checkpoint "
            "folder, or its image processor"
        )
    n_layers = int(getattr(cfg, "num_hidden_layers", 0))
    n_heads = int(getattr(cfg, "num_attention_heads", 0))
    return attend_image(
        model,
        image_input_of(processor),
        image,
        prefix=family.prefix(cfg),
        patch=patch_size(cfg, "model.config"),
        n_layers=n_layers,
        n_heads=n_heads,
        layers=layers,
        heads=heads,
        budget=budget,
    )
