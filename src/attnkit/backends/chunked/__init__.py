"""The chunked backend: tiled online softmax for every score and every mask kind.

Queries are cut into blocks of ``block_q`` rows and keys into blocks of
``block_k`` columns (chosen per call by :func:`_tile_shape`, or fixed with
:func:`block_sizes`). For each query block the logits of one key block at a
time are computed, masked and folded into a running max, sum and output
(online softmax), so nothing larger than a (rows, block_q, block_k) tile is
ever held. Which tiles run comes from the mask's block plan
(:mod:`attnkit.blockplan`), shared with every other tiled backend::

    for each query block Qi:                    m = -inf, l = 0, acc = 0
        for each key block Kj the mask keeps:   s   = scale * score(Qi, Kj) + bias
                                                m'  = max(m, rowmax(s))
                                                p   = exp(s - m')
                                                l   = l * exp(m - m') + rowsum(p)
                                                acc = acc * exp(m - m') + p @ Vj
        out = acc / l,  lse = m + log(l)        (l == 0: out 0, lse -inf)

Structured masks pay only for what they keep:

- causal and window masks (any alignment) give each query block a key range;
  key blocks outside it are never computed, tiles wholly inside the band need
  no mask at all, and the band's own mask is one cached additive tile folded
  into the matrix product; for a band of finite width the interior query
  blocks (all alike) run several at once as strided key windows;
- ``valid_lens`` and ``key_padding`` truncate each batch element's keys to its
  last kept key, and ``valid_lens(lens, queries=True)`` its queries too;
- dense ``keep``/``bias`` masks are sliced per tile.

Backward is a custom autograd function that saves only the inputs, the output
and the lse, and recomputes each tile's probabilities as ``exp(s - lse)``;
memory stays O((L + S)·E) per row, never O(L·S). Gradients reach the score's
parameters through the differentiable projections outside the function
(``dot_form`` for dot-reducible scores, ``W_q``/``W_k``/``w_v`` for Additive).

With ``return_weights=True`` the weights are written in a second pass over the
same tiles as ``exp(s - lse)``: exact, and no softmax is materialized in the
forward; with ``return_weights="mean"`` they are averaged over heads tile by tile,
never holding per-head weights. The Additive score's tile logits run the fused
kernel of :mod:`attnkit.kernels.additive` when it could be built (float32 on
CPU), else its pure-torch fallback; :meth:`ChunkedBackend.describe` says
which. ``exp`` of a tile runs the vectorized kernel of
:mod:`attnkit.kernels.softmax` under the same conditions.
"""

from __future__ import annotations

from typing import Any

from . import sizes as _sizes
from .backend import ChunkedBackend
from .sizes import TILE_ELEMENTS, block_sizes

__all__ = ["BLOCK_K", "BLOCK_Q", "TILE_ELEMENTS", "ChunkedBackend", "block_sizes"]

# Files: sizes.py (tile sizes), tiles.py (forward, weights, backward over tiles),
# autograd.py (the autograd Function), backend.py (the Backend class and operands).


def __getattr__(name: str) -> Any:
    """``BLOCK_Q``/``BLOCK_K`` read through to :mod:`.sizes`, where block_sizes() sets them."""
    if name in ("BLOCK_Q", "BLOCK_K"):
        return getattr(_sizes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
