"""An image as the source of a page: a vision transformer's patches laid out on its picture.

A ViT-family model reads a picture as a few non-patch tokens (``[CLS]``, DeiT's
distillation token ``[DIST]``, DINOv2's registers ``[REG0]`` ...) followed by
``rows × cols`` patches in row-major order. :class:`ImageLayout` holds that
geometry and the picture the model saw (after resize and crop); its tokens are
the non-patch labels, then ``p(r,c)`` for each patch, so every other view
(head, matrix, search, statistics) works on them unchanged. The page's image
view draws each head's attention from a token (the first non-patch token by
default, or a clicked patch) as a heatmap over the picture, and the rollout.

The picture travels inside the page as a PNG (a JPEG when that is much
smaller) at the model's resolution, so the page stays offline and small.

Pillow is optional (``pip install "attnkit[image]"``); :func:`require_pillow`
says so in one line when it is missing.
"""

from __future__ import annotations

import base64
import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..models.image_input import to_rgb
from .payload import blob, quantize
from .reduce import ReducedSet, SetReducer

__all__ = [
    "PILLOW_HINT",
    "ImageLayout",
    "ImageSetReducer",
    "image_payload",
    "open_image",
    "patch_label",
    "require_pillow",
]

PILLOW_HINT = 'pip install "attnkit[image]"'
# A PNG above this many bytes is replaced by a JPEG when that is smaller (photos).
_PNG_BYTES = 96 * 1024


def require_pillow() -> Any:
    """``PIL.Image``, or ImportError naming the extra that installs it."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(f"images need Pillow: {PILLOW_HINT}") from None
    return Image


def open_image(path: str | Path) -> Any:
    """A picture file as an RGB ``PIL.Image``, turned upright by its EXIF orientation and
    fully read (a truncated file fails here, not later); 16-bit grey scaled to 8 bits
    (:func:`attnkit.models.image_input.to_rgb`).

    Raises:
        ImportError: Pillow is not installed.
        ValueError: the file is missing, unreadable, not an image Pillow knows, larger
            than Pillow's limit against decompression bombs, or a 32-bit picture (one
            line, naming the file).
    """
    Image = require_pillow()
    from PIL import ImageOps, UnidentifiedImageError

    p = Path(path).expanduser()
    if p.is_dir():
        raise ValueError(f"{p}: a directory, not an image file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(p) as img:
                img.load()
                upright = ImageOps.exif_transpose(img)  # (a loaded copy)
    except FileNotFoundError:
        raise ValueError(f"{p}: no such file") from None
    except UnidentifiedImageError:
        raise ValueError(f"{p}: not an image (Pillow cannot identify the file)") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ValueError(f"{p}: too large to read safely ({exc})") from None
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt data
        raise ValueError(f"{p}: cannot read the image ({exc})") from None
    return to_rgb(upright, str(p))


def patch_label(r: int, c: int) -> str:
    """The token label of the patch at row r, column c: ``p(r,c)``."""
    return f"p({r},{c})"


@dataclass(frozen=True)
class ImageLayout:
    """Where each token of a vision transformer lies on its picture.

    Attributes:
        picture: (H, W, 3) uint8, the picture the model saw (resized and cropped).
        rows, cols: the patch grid; patch (r, c) covers pixels
            [r * ph, (r + 1) * ph) × [c * pw, (c + 1) * pw).
        patch: (ph, pw), a patch's size in pixels of ``picture``.
        prefix: labels of the non-patch tokens, which come before the patches.
        prefix_weights: (layers, heads, len(prefix), tokens) exact attention rows of the
            non-patch tokens, for a long page (which otherwise keeps only each row's
            top-k); None on a dense page, which holds every weight.
    """

    picture: np.ndarray
    rows: int
    cols: int
    patch: tuple[int, int]
    prefix: tuple[str, ...] = ("[CLS]",)
    prefix_weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        pic = self.picture
        if (
            not isinstance(pic, np.ndarray)
            or pic.ndim != 3
            or pic.shape[2] != 3
            or pic.dtype != np.uint8
        ):
            raise ValueError(
                "picture: expected an (H, W, 3) uint8 array, got "
                f"{getattr(pic, 'shape', type(pic).__name__)} {getattr(pic, 'dtype', '')}"
            )
        ph, pw = self.patch
        if min(self.rows, self.cols, ph, pw) < 1:
            raise ValueError(
                f"rows, cols, patch: expected positive sizes, got {self.rows}, "
                f"{self.cols}, {self.patch}"
            )
        if self.rows * ph > pic.shape[0] or self.cols * pw > pic.shape[1]:
            raise ValueError(
                f"rows, cols, patch: {self.rows} × {self.cols} patches of {ph} × {pw} px do not "
                f"fit a {pic.shape[0]} × {pic.shape[1]} picture"
            )

    @property
    def n_tokens(self) -> int:
        """Non-patch tokens plus patches."""
        return len(self.prefix) + self.rows * self.cols

    def tokens(self) -> list[str]:
        """The label of every token: the non-patch ones, then ``p(r,c)`` row by row."""
        return [
            *self.prefix,
            *(patch_label(r, c) for r in range(self.rows) for c in range(self.cols)),
        ]

    def describe(self) -> str:
        """``[CLS] + 14 × 14 patches of 16 px`` for messages and the page."""
        ph, pw = self.patch
        size = f"{ph} px" if ph == pw else f"{ph} × {pw} px"
        lead = " + ".join(self.prefix) + " + " if self.prefix else ""
        return f"{lead}{self.rows} × {self.cols} patches of {size}"


class ImageSetReducer(SetReducer):
    """A :class:`~attnkit.viz.reduce.SetReducer` that also keeps the exact rows of the
    ``prefix`` first query tokens (the non-patch tokens) of every shown layer and head, so a
    long page can draw their heatmaps from every weight rather than from the top-k.
    """

    def __init__(
        self,
        name: str,
        n_layers: int,
        n_heads: int,
        Q: int,
        K: int,
        *,
        prefix: int,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(name, n_layers, n_heads, Q, K, layers=layers, heads=heads, **options)
        self.prefix = prefix
        shown = sorted(layers) if layers is not None else range(n_layers)
        self._layer_at = {x: i for i, x in enumerate(shown)}
        self._heads = list(heads) if heads is not None else list(range(n_heads))
        self.prefix_rows = torch.zeros((len(self._layer_at), len(self._heads), prefix, K))

    def add(
        self,
        layer: int,
        row0: int,
        w: torch.Tensor,
        head0: int = 0,
        *,
        entropy: torch.Tensor | None = None,
        keys: torch.Tensor | None = None,
    ) -> None:
        super().add(layer, row0, w, head0, entropy=entropy, keys=keys)
        li = self._layer_at.get(layer)
        n = min(self.prefix - row0, w.shape[1])
        if li is None or n <= 0:
            return
        for dst, h in enumerate(self._heads):
            if head0 <= h < head0 + w.shape[0]:
                row = w[h - head0, :n].detach().to("cpu", torch.float32)  # (n, S)
                self.prefix_rows[li, dst, row0 : row0 + n, : row.shape[1]] = row

    def finish_layout(self, layout: ImageLayout, s: ReducedSet) -> ImageLayout:
        """``layout`` with the prefix rows, when the page is long (a dense one has them)."""
        if not s.long or not layout.prefix:
            return layout
        return replace(layout, prefix_weights=self.prefix_rows.numpy())


def _data_url(picture: np.ndarray) -> str:
    """The picture as a PNG data URL, or a JPEG one when the PNG is large and the JPEG smaller."""
    Image = require_pillow()
    img = Image.fromarray(picture)
    png = io.BytesIO()
    img.save(png, format="PNG", optimize=True)
    data, kind = png.getvalue(), "png"
    if len(data) > _PNG_BYTES:
        jpeg = io.BytesIO()
        img.save(jpeg, format="JPEG", quality=90)
        if len(jpeg.getvalue()) < len(data) // 2:
            data, kind = jpeg.getvalue(), "jpeg"
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


def _rows_part(rows: np.ndarray) -> dict[str, Any]:
    """(layers, heads, n, K) rows, one byte each against each (layer, head)'s largest."""
    raw, scales = quantize(rows)
    return {**blob(raw), "scales": scales, "shape": list(rows.shape)}


def image_payload(layout: ImageLayout, s: ReducedSet) -> dict[str, Any]:
    """The page's ``image`` part for the set ``s`` whose queries and keys are the layout's tokens.

    Raises:
        ValueError: the set's token count differs from the layout's.
    """
    nL, nH, Q, K = s.shape
    if Q != layout.n_tokens or K != layout.n_tokens:
        raise ValueError(
            f"image: the layout has {layout.n_tokens} tokens ({layout.describe()}) but the "
            f"attention is {Q} × {K}"
        )
    out: dict[str, Any] = {
        "picture": _data_url(layout.picture),
        "height": int(layout.picture.shape[0]),
        "width": int(layout.picture.shape[1]),
        "rows": layout.rows,
        "cols": layout.cols,
        "patch": list(layout.patch),
        "prefix": list(layout.prefix),
    }
    if s.long and layout.prefix:
        if layout.prefix_weights is not None:
            rows = np.asarray(layout.prefix_weights, np.float32)
            if rows.shape != (nL, nH, len(layout.prefix), K):
                raise ValueError(
                    f"prefix_weights: expected {(nL, nH, len(layout.prefix), K)}, got {rows.shape}"
                )
            out["prefixRows"] = _rows_part(rows)
        if s.rollout is not None:
            roll = np.asarray(s.rollout[: len(layout.prefix)], np.float32)  # (n, K)
            out["rolloutRows"] = _rows_part(roll[None, None])  # (1, 1, n, K)
    return out
