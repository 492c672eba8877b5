"""One (rows, cols, Q, K) grid of attention matrices, shared by every picture and the page.

:func:`as_grid` reads what users hold (a tensor, an array, a list of per-layer
weights such as a Hugging Face model's ``outputs.attentions``) into one float32
array; :func:`max_pool` and :func:`tile` turn a grid into one image.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["as_grid", "check_finite", "max_pool", "tile"]


def check_finite(grid: np.ndarray, name: str) -> np.ndarray:
    """``grid`` when every entry is finite, else a ValueError naming the argument ``name``
    (the viewer's one refusal of NaN or infinite weights)."""
    if not np.isfinite(grid).all():
        raise ValueError(f"{name}: contains NaN or infinity")
    return grid


def _to_numpy(x: Any, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.is_complex():
            raise TypeError(f"{name}: expected real attention weights, got a {x.dtype} tensor")
        return x.detach().to("cpu", torch.float32).numpy()
    try:
        return np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError):
        raise TypeError(
            f"{name}: expected attention weights (a tensor, an array or a list of them), "
            f"got {type(x).__name__} {x!r:.40}"
        ) from None


def as_grid(
    matrices: Any, *, name: str = "matrices", dims: str = "rows, cols", batch_of_one: bool = False
) -> np.ndarray:
    """Any array-like of attention matrices as a float32 numpy array (rows, cols, Q, K).

    Accepted:
        - (rows, cols, Q, K): as is;
        - (rows, 1, cols, Q, K) when ``batch_of_one``: a batch of one per row, as
          :meth:`attnkit.viz.Capture.stack` gives;
        - (cols, Q, K): one row; (Q, K): one matrix;
        - a list or tuple with one (cols, Q, K) or (1, cols, Q, K) item per row,
          e.g. a Hugging Face model's ``outputs.attentions`` for a batch of one.

    Args:
        matrices: the weights (tensor, array or list of them).
        name: the argument's name in error messages.
        dims: what rows and cols are (``"layers, heads"``), for error messages.
        batch_of_one: accept a 5-D input whose dim 1 has size 1.

    Raises:
        ValueError: a shape that is none of the above, or an empty dim.
    """
    if isinstance(matrices, (list, tuple)):
        if not matrices:
            raise ValueError(
                f"{name}: expected at least one row, got an empty {type(matrices).__name__}"
            )
        rows = [_to_numpy(m, name) for m in matrices]
        rows = [r[0] if r.ndim == 4 and r.shape[0] == 1 else r for r in rows]  # each (cols, Q, K)
        shapes = {r.shape for r in rows}
        if len(shapes) != 1 or next(iter(shapes)).__len__() != 3:
            raise ValueError(
                f"{name}: a list needs one (cols, Q, K) or (1, cols, Q, K) array per row, all of "
                f"one shape, with ({dims}) = (rows, cols); got {[tuple(r.shape) for r in rows]}"
            )
        arr = np.stack(rows)  # (rows, cols, Q, K)
    else:
        arr = _to_numpy(matrices, name)
        if batch_of_one and arr.ndim == 5 and arr.shape[1] == 1:
            arr = arr[:, 0]  # (rows, cols, Q, K): a batch of one
        elif arr.ndim == 3:
            arr = arr[None]  # (1, cols, Q, K)
        elif arr.ndim == 2:
            arr = arr[None, None]  # (1, 1, Q, K)
    if arr.ndim != 4:
        raise ValueError(
            f"{name}: expected shape ({dims}, Q, K) (or (Q, K), (cols, Q, K), or a list "
            f"of per-row (cols, Q, K) weights), got {tuple(arr.shape)}"
        )
    if 0 in arr.shape:
        raise ValueError(f"{name}: expected no empty dim, got shape {tuple(arr.shape)}")
    return arr


def max_pool(grid: np.ndarray, factor: int) -> np.ndarray:
    """Max-pool every matrix of a (rows, cols, Q, K) grid over factor x factor blocks.

    Returns (rows, cols, ceil(Q / factor), ceil(K / factor)); ``factor`` 1 gives the grid.
    """
    if factor < 1:
        raise ValueError(f"factor: expected a positive integer, got {factor}")
    if factor == 1:
        return grid
    rows, cols, Q, K = grid.shape
    Qc, Kc = -(-Q // factor), -(-K // factor)
    padded = np.zeros((rows, cols, Qc * factor, Kc * factor), dtype=grid.dtype)
    padded[:, :, :Q, :K] = grid  # (rows, cols, Qc * f, Kc * f)
    return padded.reshape(rows, cols, Qc, factor, Kc, factor).max(
        axis=(3, 5)
    )  # (rows, cols, Qc, Kc)


def tile(grid: np.ndarray, gap: int) -> np.ndarray:
    """A (rows, cols, Q, K) grid as one image with ``gap`` NaN cells between panels.

    Returns (rows * Q + (rows - 1) * gap, cols * K + (cols - 1) * gap); panel
    (i, j) starts at row ``i * (Q + gap)``, column ``j * (K + gap)``.
    """
    rows, cols, Q, K = grid.shape
    H = rows * Q + (rows - 1) * gap
    W = cols * K + (cols - 1) * gap
    image = np.full((H, W), np.nan, dtype=np.float32)  # (H, W)
    for i in range(rows):
        for j in range(cols):
            y0, x0 = i * (Q + gap), j * (K + gap)
            image[y0 : y0 + Q, x0 : x0 + K] = grid[i, j]
    return image
