"""Tile sizes of the chunked backend: chosen per call, or fixed for tests and tuning."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["BLOCK_K", "BLOCK_Q", "TILE_ELEMENTS", "block_sizes", "tile_shape"]

BLOCK_Q: int | None = None
"""Query rows per tile; None = chosen per call by :func:`tile_shape`."""
BLOCK_K: int | None = None
"""Key columns per tile; None = chosen per call by :func:`tile_shape`."""
TILE_ELEMENTS = 1 << 21
"""Budget of one logits tile, rows x BLOCK_Q x BLOCK_K (8 MiB of float32): fixed, so
memory never grows with L·S, and large enough that few tiles (few thread-pool
round trips, which a shared small CPU makes expensive) cover a call."""


@contextmanager
def block_sizes(block_q: int, block_k: int) -> Iterator[None]:
    """Temporarily fix the tile sizes (for tests and tuning); restored on exit."""
    global BLOCK_Q, BLOCK_K
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block_sizes: expected positive sizes, got {block_q}, {block_k}")
    old = BLOCK_Q, BLOCK_K
    BLOCK_Q, BLOCK_K = int(block_q), int(block_k)
    try:
        yield
    finally:
        BLOCK_Q, BLOCK_K = old


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def tile_shape(
    rows: int, L: int, S: int, band: tuple[int | None, int | None] | None
) -> tuple[int, int]:
    """(block_q, block_k) for a call whose groups have ``rows`` rows each.

    ``band``: (lo, hi) of the mask's band (key j kept for query i when
    i + lo <= j <= i + hi), or None. A band of finite width w = hi - lo (causal
    excluded) gets query blocks of about w/2 rows and one key block spanning the
    band (about two thirds of each tile is kept).
    Otherwise key blocks of up to 1024 columns and as many query rows as fit
    :data:`TILE_ELEMENTS`.
    """
    if BLOCK_Q is not None and BLOCK_K is not None:
        return BLOCK_Q, BLOCK_K
    if band is not None and band[0] is not None and band[1] is not None:
        w = max(band[1] - band[0], 0)
        bq = min(max(64, _round_up(w // 2, 64)), 512, max(L, 1))
        return bq, _round_up(bq + w + 1, 64)
    bk = min(max(S, 1), 1024)
    bq = min(max(32, TILE_ELEMENTS // max(rows * bk, 1)), 1024, max(L, 1))
    return bq, bk
