"""Small argument checks shared by the layers of :mod:`attnkit.nn`.

Every check raises before any compute, naming the argument, what was received
and what was expected.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .. import masks
from ..functional import attention

__all__ = [
    "attend",
    "check_dropout",
    "check_key_value",
    "check_param_dtype",
    "check_positive_int",
    "check_tensor",
    "shape_str",
]


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


def check_key_value(owner: str, key: torch.Tensor, value: torch.Tensor) -> None:
    """Raise unless ``key`` and ``value`` agree on every dim but the last (features)."""
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(
            f"{owner}: key and value must agree on every dim but the last, got key "
            f"{shape_str(key)} and value {shape_str(value)}"
        )


def check_param_dtype(owner: str, module: nn.Module, **inputs: torch.Tensor) -> None:
    """Raise TypeError unless every input has the dtype and device of ``module``'s parameters.

    Caught here, before any compute, instead of as a bare error from deep inside
    ``F.linear`` or ``torch.einsum``.
    """
    param = next(module.parameters(), None)
    if param is None:
        return
    for name, t in inputs.items():
        if t.dtype != param.dtype or t.device != param.device:
            raise TypeError(
                f"{owner}: {name} is {t.dtype} on {t.device}, but the layer's parameters are "
                f"{param.dtype} on {param.device}; convert the input or the layer "
                f"(layer.to(dtype=..., device=...))"
            )


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: masks.Mask | None,
    dropout_p: float,
    need_weights: bool,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`attnkit.attention` of (..., L, E), (..., S, E), (..., S, Ev) heads.

    Returns ``(output (..., L, Ev), weights (..., L, S) or None)``; the weights
    are computed only when ``need_weights``.
    """
    if need_weights:
        out, weights = attention(
            q, k, v, mask=mask, scale=scale, dropout_p=dropout_p, return_weights=True
        )
        return out, weights
    return attention(q, k, v, mask=mask, scale=scale, dropout_p=dropout_p), None
