"""Per-row reductions of a block of weights for the viewer's long pages, in one pass.

:func:`row_top_k` gives each row's exact top-k keys and its max and sum over every
``b`` keys from one read of the weights (:mod:`attnkit.kernels._native`); where the compiled
library does not run (another dtype or device, no compiler), it returns None and the
caller takes its torch path (:mod:`attnkit.viz.blocks`).
"""

from __future__ import annotations

import torch

from . import _native

__all__ = ["row_top_k"]


def row_top_k(
    w: torch.Tensor, k: int, b: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The k largest weights of each row, their keys, and the max and sum of every b keys.

    Args:
        w: (..., S) weights (>= 0), float32 on the CPU.
        k: keys kept per row (>= 1); a row of fewer keys is padded with weight 0 at
            keys S .. k - 1. NaN is never chosen while k keys are not NaN; past that,
            NaN keys fill the slots left with weight -1.
        b: keys per block of the maxima (>= 1).

    Returns:
        (..., k) weights, largest first (equal weights: the lower key first), (..., k)
        int64 keys, and (..., ceil(S / b)) block maxima and block sums (the last block
        may be short); None where the compiled kernel does not run these tensors.
    """
    if k < 1 or b < 1 or w.shape[-1] == 0 or not _native.available(w.dtype, w.device):
        return None
    lib = _native.library()
    assert lib is not None
    w = w.contiguous()
    S = w.shape[-1]
    lead = w.shape[:-1]
    vals = torch.empty(*lead, k, dtype=w.dtype)  # (..., k)
    keys = torch.empty(*lead, k, dtype=torch.int64)  # (..., k)
    bmax = torch.empty(*lead, -(-S // b), dtype=w.dtype)  # (..., ceil(S / b))
    bsum = torch.empty_like(bmax)  # (..., ceil(S / b))
    rows = w.numel() // S
    lib.ak_row_topk(
        w.data_ptr(), rows, S, k, b, vals.data_ptr(), keys.data_ptr(), bmax.data_ptr(),
        bsum.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return vals, keys, bmax, bsum
