"""A picture as a vision transformer's input, from the checkpoint's ``preprocessor_config.json``.

A ViT-family checkpoint says how its pictures were prepared in training: resize
(to a fixed ``{"height", "width"}`` or so that the ``shortest_edge`` has a length),
with a resampling filter, then an optional centre crop, rescale (1/255) and
normalize by a mean and standard deviation per channel. :class:`ImageInput`
reads those fields and applies them with Pillow and numpy, the same steps as
transformers' Pillow image processors (``ViTImageProcessor``, ``DeiTImageProcessor``,
``BitImageProcessor``), so no torchvision and no download is needed on any
supported transformers version. Other fields of the file are not used.

The picture the model sees (after resize and crop, before rescale and
normalize) is kept as (H, W, 3) uint8 for the page, so the heatmaps lie on
exactly the pixels the patches cover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config_json import ConfigError, read_json

__all__ = ["PREPROCESSOR_CONFIG", "ImageInput", "read_image_input", "to_rgb"]

PREPROCESSOR_CONFIG = "preprocessor_config.json"
_MAX_SIDE = 8192  # pixels: larger model inputs are not a config anyone trained with
_RESAMPLE = range(6)  # PIL's filters: nearest, lanczos, bilinear, bicubic, box, hamming


_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")


def to_rgb(image: Any, where: str = "image") -> Any:
    """A PIL image as the 8-bit RGB picture a model sees: 8-bit modes as PIL converts
    them; 16-bit grey (``I;16``) scaled to 8 bits (65535 -> 255, where PIL's conversion
    would clip at 255).

    Raises:
        ValueError: a 32-bit integer or float picture (modes ``I`` and ``F``), whose
            range no convention fixes; naming ``where`` and the mode.
    """
    if image.mode in _SIXTEEN_BIT:
        from PIL import Image

        grey = (np.asarray(image, dtype=np.uint16) >> 8).astype(np.uint8)  # (H, W) high bytes
        return Image.fromarray(grey).convert("RGB")
    if image.mode in ("I", "F"):
        kind = "32-bit float" if image.mode == "F" else "32-bit integer"
        raise ValueError(
            f"{where}: a {kind} picture (mode {image.mode!r}) has no fixed range for 8-bit "
            "pixels; convert it to an 8-bit RGB picture first"
        )
    return image.convert("RGB")


def _side(value: Any, field: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_SIDE:
        raise ConfigError(
            f"{source}: {field} must be a number of pixels in 1..{_MAX_SIDE}, got {value!r}"
        )
    return value


def _size(value: Any, field: str, source: str, square: bool) -> tuple[str, int, int]:
    """("exact", height, width) or ("shortest", edge, 0), as transformers reads ``size``."""
    if isinstance(value, dict):
        if "height" in value and "width" in value:
            return (
                "exact",
                _side(value["height"], f"{field}.height", source),
                _side(value["width"], f"{field}.width", source),
            )
        if "shortest_edge" in value:
            if value.get("longest_edge") is not None:
                raise ConfigError(f"{source}: {field}.longest_edge is not supported")
            return ("shortest", _side(value["shortest_edge"], f"{field}.shortest_edge", source), 0)
        keys = sorted(value)
        raise ConfigError(
            f"{source}: {field} must hold height and width, or shortest_edge; got {keys}"
        )
    # A bare number: a square (ViT) or, with a centre crop after it, the shortest edge (BiT, CLIP).
    n = _side(value, field, source)
    return ("exact", n, n) if square else ("shortest", n, 0)


def _channels(value: Any, field: str, source: str, positive: bool) -> tuple[float, ...]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    ok = values and all(
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and (v > 0 if positive else True)
        for v in values
    )
    if not ok or len(values) not in (1, 3):
        what = "positive numbers" if positive else "finite numbers"
        raise ConfigError(f"{source}: {field} must be 1 or 3 {what}, got {value!r}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class ImageInput:
    """How a checkpoint prepares a picture (see the module docstring).

    Attributes:
        resize: ("exact", height, width), ("shortest", edge, 0), or None (no resize).
        resample: PIL's filter number (0 nearest, 2 bilinear, 3 bicubic, ...).
        crop: (height, width) of the centre crop, or None.
        rescale: the factor pixel values are multiplied by (1/255), or None.
        mean, std: per-channel normalization (1 or 3 values), or None.
    """

    resize: tuple[str, int, int] | None = ("exact", 224, 224)
    resample: int = 2
    crop: tuple[int, int] | None = None
    rescale: float | None = 1 / 255
    mean: tuple[float, ...] | None = (0.5, 0.5, 0.5)
    std: tuple[float, ...] | None = (0.5, 0.5, 0.5)

    @classmethod
    def from_config(cls, data: Any, source: str = PREPROCESSOR_CONFIG) -> ImageInput:
        """Read the fields of a ``preprocessor_config.json`` (a dict).

        Raises:
            ConfigError: a field that is missing where needed or out of range.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
        crop = None
        if data.get("do_center_crop", False):
            if "crop_size" not in data:
                raise ConfigError(f"{source}: do_center_crop is set but crop_size is missing")
            kind, h, w = _size(data["crop_size"], "crop_size", source, square=True)
            if kind != "exact":
                raise ConfigError(f"{source}: crop_size must hold height and width")
            crop = (h, w)
        resize = None
        if data.get("do_resize", True):
            if "size" not in data:
                raise ConfigError(f"{source}: do_resize is set but size is missing")
            resize = _size(data["size"], "size", source, square=crop is None)
        resample = data.get("resample", 2)
        if isinstance(resample, bool) or resample not in _RESAMPLE:
            raise ConfigError(
                f"{source}: resample must be one of PIL's filters 0..5, got {resample!r}"
            )
        rescale = None
        if data.get("do_rescale", True):
            (rescale,) = _channels(
                data.get("rescale_factor", 1 / 255), "rescale_factor", source, positive=True
            )
        mean = std = None
        if data.get("do_normalize", True):
            for field in ("image_mean", "image_std"):
                if field not in data:
                    raise ConfigError(f"{source}: do_normalize is set but {field} is missing")
            mean = _channels(data["image_mean"], "image_mean", source, positive=False)
            std = _channels(data["image_std"], "image_std", source, positive=True)
        return cls(resize, int(resample), crop, rescale, mean, std)

    def picture(self, image: Any) -> np.ndarray:
        """The picture the model sees: ``image`` (a PIL image) resized and cropped,
        as (H, W, 3) uint8."""
        img = to_rgb(image)
        if self.resize is not None:
            kind, a, b = self.resize
            if kind == "exact":
                h, w = a, b
            else:  # the shorter side becomes `a`, the longer keeps the aspect ratio (truncated)
                W0, H0 = img.size
                short, long = min(W0, H0), max(W0, H0)
                other = max(1, int(a * long / short))
                h, w = (a, other) if H0 <= W0 else (other, a)
            if (w, h) != img.size:
                img = img.resize((w, h), resample=self.resample)
        pic = np.asarray(img, dtype=np.uint8)  # (H, W, 3)
        if self.crop is not None:
            pic = _center_crop(pic, *self.crop)
        return np.ascontiguousarray(pic)

    def pixels(self, picture: np.ndarray) -> torch.Tensor:
        """``pixel_values`` (1, 3, H, W) float32 of a picture from :meth:`picture`."""
        x: np.ndarray = picture.astype(np.float32)  # (H, W, 3)
        if self.rescale is not None:
            x = x * np.float32(self.rescale)
        if self.mean is not None and self.std is not None:
            x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))[None]  # (1, 3, H, W)


def _center_crop(pic: np.ndarray, h: int, w: int) -> np.ndarray:
    """The centre (h, w) of (H, W, 3); a smaller picture is padded with zeros around it."""
    H, W = pic.shape[:2]
    if H < h or W < w:  # pad first, centred, so the crop below always fits
        top, left = max(0, math.ceil((h - H) / 2)), max(0, math.ceil((w - W) / 2))
        padded = np.zeros((max(H, h), max(W, w), 3), np.uint8)  # (H', W', 3)
        padded[top : top + H, left : left + W] = pic
        pic, H, W = padded, padded.shape[0], padded.shape[1]
    top, left = (H - h) // 2, (W - w) // 2
    return pic[top : top + h, left : left + w]


def read_image_input(directory: Path) -> ImageInput:
    """The checkpoint's ``preprocessor_config.json`` as an :class:`ImageInput`.

    Raises:
        ConfigError: the file is missing, unreadable, or holds fields out of range.
    """
    path = Path(directory) / PREPROCESSOR_CONFIG
    if not path.is_file():
        raise ConfigError(
            f"{directory}: missing {PREPROCESSOR_CONFIG} (how the checkpoint resizes and "
            "normalizes its pictures); save the model's image processor beside it"
        )
    return ImageInput.from_config(read_json(path), str(path))
