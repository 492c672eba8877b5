"""``exp(s - shift)`` over rows of logits, in place, with the row sums: the heart of a
softmax tile (with what a row's entropy needs as well, for the viewer). Compiled and vectorized where :mod:`attnkit.kernels._native` builds
(float32 on CPU), torch ops otherwise; ``exp(-inf)`` is exactly 0 either way."""

from __future__ import annotations

import torch

from . import _native
from ._ops import define_op

__all__ = ["exp_rows_", "exp_rows_entropy_", "exp_rows_entropy_op", "exp_rows_op"]


def exp_rows_(s: torch.Tensor, shift: torch.Tensor, *, want_sum: bool) -> torch.Tensor | None:
    """Replace s (..., C) by ``exp(s - shift[..., None])``; return the row sums (...) or None.

    Args:
        s: logits (..., C), modified in place; -inf where blocked.
        shift: (...), finite (the row max, or the lse of a finished row).
        want_sum: also return ``s.sum(-1)`` of the result.
    """
    sums = exp_rows_op(s, shift.to(s.dtype).expand(s.shape[:-1]))
    return sums if want_sum else None


def _exp_rows(s: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """The op: s (..., C) becomes ``exp(s - shift[..., None])``; returns its row sums (...)."""
    lib = _native.library() if _native.available(s.dtype, s.device) else None
    if lib is None or not s.is_contiguous() or s.numel() == 0:
        s.sub_(shift.unsqueeze(-1)).exp_()
        return s.sum(dim=-1)
    # The kernel reads one shift per row: a broadcast shift is expanded first, never over-read.
    sh = shift.to(s.dtype).expand(s.shape[:-1]).contiguous()  # (...)
    sums = torch.empty(sh.shape, dtype=s.dtype, device=s.device)
    rows = s.numel() // s.shape[-1]
    lib.ak_exp_rows(
        s.data_ptr(), sh.data_ptr(), sums.data_ptr(), rows, s.shape[-1], torch.get_num_threads()
    )
    return sums


def _exp_rows_fake(s: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return s.new_empty(s.shape[:-1])  # (...)


exp_rows_op = define_op(
    "exp_rows_(Tensor(a!) s, Tensor shift) -> Tensor", _exp_rows, _exp_rows_fake
)


def exp_rows_entropy_(
    s: torch.Tensor, shift: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Replace s (..., C) by ``e = exp(s - shift[..., None])``, in one pass with its rows'
    ``sum e``, ``sum e * (s - shift)`` (a key of e = 0 adds 0) and count of ``e > 0``.

    A row's softmax is ``e / sum e``, its entropy in nats ``log sum e - sum e x / sum e``
    with x = s - shift, and the count is how many of its weights are above 0.

    Args:
        s: logits (..., C), modified in place; -inf where blocked.
        shift: (...), finite (the row max).

    Returns:
        sums, px and positive, each (...) in s's dtype.
    """
    sums, px, positive = exp_rows_entropy_op(s, shift.to(s.dtype).expand(s.shape[:-1]))
    return sums, px, positive


def _exp_rows_entropy(
    s: torch.Tensor, shift: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op of :func:`exp_rows_entropy_`: s (..., C) becomes ``exp(s - shift[..., None])``."""
    lib = _native.library() if _native.available(s.dtype, s.device) else None
    if lib is None or not s.is_contiguous() or s.numel() == 0:
        x = s - shift.unsqueeze(-1)  # (..., C)
        s.copy_(x).exp_()
        px = torch.nansum(x.mul_(s), dim=-1)  # a blocked key's -inf * 0 counts 0
        return s.sum(dim=-1), px, (s > 0).sum(dim=-1).to(s.dtype)
    sh = shift.to(s.dtype).expand(s.shape[:-1]).contiguous()  # (...): one shift per row
    sums, px, positive = (torch.empty(sh.shape, dtype=s.dtype) for _ in range(3))
    rows = s.numel() // s.shape[-1]
    lib.ak_exp_rows_entropy(
        s.data_ptr(), sh.data_ptr(), sums.data_ptr(), px.data_ptr(), positive.data_ptr(),
        rows, s.shape[-1], torch.get_num_threads(),
    )  # fmt: skip
    return sums, px, positive


def _exp_rows_entropy_fake(
    s: torch.Tensor, shift: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return s.new_empty(s.shape[:-1]), s.new_empty(s.shape[:-1]), s.new_empty(s.shape[:-1])


exp_rows_entropy_op = define_op(
    "exp_rows_entropy_(Tensor(a!) s, Tensor shift) -> (Tensor, Tensor, Tensor)",
    _exp_rows_entropy,
    _exp_rows_entropy_fake,
)
