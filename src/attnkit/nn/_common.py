"""Small argument checks shared by the layers of :mod:`attnkit.nn`.

Every check raises before any compute, naming the argument, what was received
and what was expected.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["check_dropout", "check_positive_int", "check_tensor", "shape_str"]


def shape_str(shape: Sequence[int] | torch.Tensor) -> str:
    """``(2, 3, 4)`` for a shape or a tensor."""
    dims = shape.shape if isinstance(shape, torch.Tensor) else shape
    return "(" + ", ".join(str(int(d)) for d in dims) + ")"


def check_positive_int(owner: str, name: str, value: object) -> int:
    """Return ``value`` if it is an int > 0, else raise naming ``owner`` and ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name} must be a positive int, got {value!r}")
    if value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value}")
    return value


def check_dropout(owner: str, value: object) -> float:
    """Return ``value`` as a float if it is a probability in [0, 1), else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}: dropout must be a float in [0, 1), got {value!r}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{owner}: dropout must be a float in [0, 1), got {value}")
    return float(value)


def check_tensor(owner: str, name: str, value: object, layout: str) -> torch.Tensor:
    """Return ``value`` if it is a floating-point tensor, else raise naming the layout."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"{owner}: {name} must be a torch.Tensor of shape {layout}, got {type(value).__name__}"
        )
    if not value.is_floating_point():
        raise TypeError(
            f"{owner}: {name} must be a floating-point tensor of shape {layout}, got dtype "
            f"{value.dtype}"
        )
    return value
