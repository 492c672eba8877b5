"""``exp(s - shift)`` over rows of logits, in place, with the row sums: the heart of a
softmax tile. Compiled and vectorized where :mod:`attnkit.kernels._native` builds
(float32 on CPU), torch ops otherwise; ``exp(-inf)`` is exactly 0 either way."""

from __future__ import annotations

import torch

from . import _native

__all__ = ["exp_rows_"]


def exp_rows_(s: torch.Tensor, shift: torch.Tensor, *, want_sum: bool) -> torch.Tensor | None:
    """Replace s (..., C) by ``exp(s - shift[..., None])``; return the row sums (...) or None.

    Args:
        s: logits (..., C), modified in place; -inf where blocked.
        shift: (...), finite (the row max, or the lse of a finished row).
        want_sum: also return ``s.sum(-1)`` of the result.
    """
    lib = _native.library() if _native.available(s.dtype, s.device) else None
    if lib is None or not s.is_contiguous() or s.numel() == 0:
        s.sub_(shift.unsqueeze(-1)).exp_()
        return s.sum(dim=-1) if want_sum else None
    # The kernel reads one shift per row: a broadcast shift is expanded first, never over-read.
    sh = shift.to(s.dtype).expand(s.shape[:-1]).contiguous()  # (...)
    sums = torch.empty(sh.shape, dtype=s.dtype, device=s.device) if want_sum else None
    rows = s.numel() // s.shape[-1]
    lib.ak_exp_rows(
        s.data_ptr(), sh.data_ptr(), 0 if sums is None else sums.data_ptr(),
        rows, s.shape[-1], torch.get_num_threads(),
    )  # fmt: skip
    return sums
