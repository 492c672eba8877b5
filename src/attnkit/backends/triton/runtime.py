"""Whether Triton can run here, and the tile sizes of each kernel.

Nothing in this module imports Triton at import time: ``attnkit`` stays importable
without it, and the backend reports the missing package as its reason not to run.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

__all__ = ["Tiles", "interpreting", "missing_reason", "next_pow2", "tiles_for"]


def interpreting() -> bool:
    """True when ``TRITON_INTERPRET=1``: kernels run on CPU tensors, through NumPy."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def missing_reason() -> str | None:
    """Why Triton kernels cannot run on this install, or None when they can."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'triton>=3.0')"
    return None


def next_pow2(n: int, minimum: int = 16) -> int:
    """The smallest power of two >= n and >= ``minimum`` (tl.dot needs 16 on the GPU)."""
    p = minimum
    while p < n:
        p *= 2
    return p


@dataclass(frozen=True)
class Tiles:
    """Tile sizes and launch options of one kernel.

    block_m: query rows per tile; block_n: keys per tile; block_h: hidden features
    per step of the Additive score; num_warps / num_stages: CUDA launch options.
    """

    block_m: int
    block_n: int
    block_h: int
    num_warps: int
    num_stages: int


def tiles_for(
    kernel: str, head_dim: int, *, additive: bool, hidden: int = 0, wide: bool = False
) -> Tiles:
    """Tile sizes for ``kernel`` ("forward", "backward" or "weights").

    The interpreter gets 16 × 16 tiles (so small test shapes still span several
    blocks); CUDA gets FlashAttention-2's usual shapes, narrower for wide heads,
    for float32 operands (``wide``: twice the registers per element) and for the
    Additive score, whose (rows, keys, hidden) step lives in registers. These are
    starting points chosen without a GPU at hand, not measured optima.
    """
    if interpreting():
        return Tiles(16, 16, min(next_pow2(hidden), 32) if additive else 16, 4, 1)
    if wide and not additive:
        return Tiles(64, 32, 16, 4, 2) if kernel != "backward" else Tiles(32, 32, 16, 4, 1)
    if additive:
        block_h = 16 if hidden > 16 else next_pow2(hidden)
        return Tiles(32, 32, block_h, 4, 1)
    if kernel == "forward":
        if head_dim <= 64:
            return Tiles(128, 64, 16, 4, 3)
        if head_dim <= 128:
            return Tiles(128, 64, 16, 8, 2)
        return Tiles(64, 32, 16, 8, 2)
    if kernel == "weights":
        return Tiles(64, 64, 16, 4, 2)
    # backward: one (block_m, head_dim) and two (block_n, head_dim) accumulators
    if head_dim <= 64:
        return Tiles(64, 64, 16, 4, 2)
    if head_dim <= 128:
        return Tiles(64, 64, 16, 8, 1)
    return Tiles(32, 32, 16, 8, 1)
