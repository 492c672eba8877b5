"""The model side of :func:`attnkit.viz.show_image`: a vision checkpoint (or a model you
hold) and a picture, run once with streaming capture, as a page.

The model is resolved as ``attnkit show --image`` resolves it
(:func:`attnkit.viz.sources.open_image_source`, over :mod:`attnkit.models.hf_vision`,
which runs the model and reduces its attention with
:class:`~attnkit.viz.image.ImageSetReducer`); :mod:`attnkit.viz.html` draws the page.
:mod:`attnkit.viz.image` below them holds the picture's layout, its reducer and its
payload, and imports neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..models.image_input import to_rgb
from .html import Page, render_html
from .image import open_image, require_pillow

if TYPE_CHECKING:
    from .options import ImageRunOptions

__all__ = ["attend_image", "show_image"]


def _as_picture(image: Any) -> Any:
    """An RGB ``PIL.Image`` from a path, a PIL image or an (H, W, 3) uint8 array."""
    Image = require_pillow()
    if isinstance(image, (str, Path)):
        return open_image(image)
    if isinstance(image, Image.Image):
        return to_rgb(image)
    if (
        isinstance(image, np.ndarray)
        and image.ndim == 3
        and image.shape[2] == 3
        and image.dtype == np.uint8
    ):
        return Image.fromarray(image)
    raise TypeError(
        "image: expected a file path, a PIL image or an (H, W, 3) uint8 array, got "
        f"{type(image).__name__}"
    )


def attend_image(source: Any, picture: Any, options: ImageRunOptions) -> Any:
    """Run an :class:`~attnkit.viz.sources.ImageSource` on a picture with one
    :class:`~attnkit.viz.options.ImageRunOptions`: the one picture run of
    ``attnkit show --image`` and :func:`show_image`.

    Args:
        source: the vision model (:func:`attnkit.viz.sources.open_image_source`); a
            checkpoint's model is built here unless :meth:`~attnkit.viz.sources.ImageSource.load`
            built it already.
        picture: an RGB ``PIL.Image``.
        options: the layers, heads, budget and progress.

    Returns:
        An :class:`~attnkit.viz.sources.image_run.ImageRun`: the sets (per layer × head, (T, T)
        over the T = prefix + patch tokens), the tokens and the layout.
    """
    from .progress import quiet

    with quiet(not options.progress):
        return source.attend(
            picture, layers=options.layers, heads=options.heads, budget=options.budget()
        )


def show_image(
    model: Any,
    image: Any,
    *,
    processor: Any = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    title: str | None = None,
    scale: str = "linear",
    top_k: int = 16,
) -> Any:
    """A page of a vision transformer's attention on a picture, as a :class:`~attnkit.viz.Page`.

    The same run as ``attnkit show --image``: the picture is prepared as the
    checkpoint prepares its own (``preprocessor_config.json``), every layer's exact
    weights are reduced while the model runs, and the page's image view draws each
    head's attention from ``[CLS]`` (or a clicked patch) and the rollout over the picture.

    Args:
        model: a checkpoint folder (str or Path) of a supported family (see
            :mod:`attnkit.models.hf_vision`), or a transformers vision model you hold.
        image: a file path, a ``PIL.Image`` or an (H, W, 3) uint8 array.
        processor: for a model you hold: its checkpoint folder, its image processor or its
            ``preprocessor_config.json`` as a dict (a folder brings its own).
        layers, heads: what to show (default all).
        title: the page's title (default: the model and the picture).
        scale: the colour scale ("linear", "power" or "log").
        top_k: keys kept per query row on a long page.

    Raises:
        ImportError: Pillow is not installed (``pip install "attnkit[image]"``).
        ValueError: the picture cannot be read, or the model is not a supported family.
    """
    from .options import ImageRunOptions
    from .sources import open_image_source

    picture = _as_picture(image)
    source = open_image_source(model, processor)
    run = attend_image(source, picture, ImageRunOptions(layers, heads, top_k))
    name = source.name
    shown = Path(image).name if isinstance(image, (str, Path)) else "the picture"
    return Page(
        render_html(
            run.sets,
            None,
            title=title or f"Attention of {name} on {shown}",
            subtitle=run.layout.describe(),
            notes=[*run.notes, *run.sets[0].notes],
            scale=scale,
            image=run.layout,
        )
    )
