"""Far bias rows: rows whose kept bias is all far from 0, whose lse float32 cannot hold.

A row of ``-1e30`` (or ``torch.finfo(torch.float32).min``, the value transformers
fills with, or TensorFlow's ``-1e9``) has logits ``s = q·k + b`` that round to ``b``:
softmax spreads it evenly over its keys, as torch's and every peer's softmax does, and
every backend's forward agrees. Its lse is ``-1e30 + log S``, which float32 rounds to
``-1e30``: a backward that recomputes each weight as ``exp(s - lse)`` from it (torch's
fused CPU op, the Triton kernels) gets ``exp(0) = 1`` instead of ``1 / S``, gradients
``S`` times too large.

So a call with such a row that needs a gradient (or head-mean weights, which the
Triton kernels also take from the lse) is kept off the Triton kernels
(:func:`far_rows_at_risk`, among dispatch's value-dependent reasons), sdpa runs it as
differentiable math, and a backward from (out, lse) asks :func:`lost_rows` for the rows
whose bias is far and whose lse is far too and hands a call that has one to the
materialized backward, which normalizes those rows by their own sums
(:func:`attnkit.backends._backward.materialized_backward`). ``attention_backward``,
given an lse that is not its call's own, refuses such rows (:func:`check_given_lse`):
their weights cannot be recovered from it. A far row whose lse is ordinary (a block of
a longer row that other keys dominate) is exact as given.

Rows are read only where that is free (:func:`attnkit._host.readable`): on an
accelerator and under ``torch.compile`` they are not detected.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._host import readable
from ._inputs import AttentionInputs
from .masks import Mask

__all__ = ["FAR", "check_given_lse", "far_limit", "far_rows", "far_rows_at_risk", "lost_rows"]

FAR = 64.0
"""A bias row whose largest kept value is beyond ±FAR, with an lse beyond it, is far:
float32 keeps an lse of that size to 4e-6 relative, the error of an ordinary logit."""

ROW_CHUNK = 1 << 22
"""Pairs read at once when a row's largest kept value is looked for: a row block of
``ROW_CHUNK // S`` queries, so no (L, S) tensor is built where the mask has none."""


def _kept_row_max(
    mask: Mask, L: int, S: int, batch_shape: Sequence[int], device: torch.device
) -> torch.Tensor:
    """Each row's largest bias over the keys the mask keeps, (..., L, 1) (-inf for a row
    that keeps none), read ``ROW_CHUNK`` pairs at a time."""
    step = max(1, ROW_CHUNK // S)
    tops = []
    with torch.no_grad():
        for r0 in range(0, L, step):
            n = min(step, L - r0)
            part = mask if n == L else mask.shard(r0, 0, n, S, L, S)
            dense = part.dense(n, S, batch_shape, device)
            assert dense.bias is not None  # (the mask holds a bias)
            bias = dense.bias.detach()
            if dense.keep is not None:
                bias = bias.masked_fill(~dense.keep.to(bias.device), float("-inf"))
            bias = bias.expand(*bias.shape[:-2], n, S) if bias.ndim >= 2 else bias.expand(n, S)
            tops.append(bias.amax(dim=-1, keepdim=True))  # (..., n, 1)
    lead = torch.broadcast_shapes(*(t.shape[:-2] for t in tops))
    return torch.cat([t.expand(*lead, *t.shape[-2:]) for t in tops], dim=-2)  # (..., L, 1)


def far_limit(dtype: torch.dtype) -> float:
    """How far from 0 a row's bias may lie before its lse loses the row's log-sum in
    ``dtype``'s compute dtype as float32 loses it beyond ±FAR: FAR for float32 and the
    half dtypes (computed in float32), FAR · 2**29 (3.4e10) for float64."""
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    return FAR * torch.finfo(torch.float32).eps / torch.finfo(compute).eps


def far_rows(
    mask: Mask | None,
    L: int,
    S: int,
    batch_shape: Sequence[int],
    device: torch.device,
    limit: float = FAR,
) -> torch.Tensor | None:
    """The rows of a call of (L, S) keys whose largest kept bias is finite and beyond
    ±``limit`` (default FAR), (..., L, 1) bool broadcastable to (*batch, L, 1); None when
    there is none or the mask's values cannot be read for free."""
    if mask is None or L == 0 or S == 0 or not mask.has_bias_beyond(limit):
        return None  # (without a value beyond ±limit, no row is far)
    if not all(readable(t) for t in mask.dense_tensors()):
        return None
    top = _kept_row_max(mask, L, S, batch_shape, device)  # (..., L, 1)
    far = torch.isfinite(top) & (top.abs() > limit)
    return far if bool(far.any()) else None


def far_rows_at_risk(inputs: AttentionInputs) -> bool:
    """Whether a call has a far bias row (see the module docstring) and asks for what a
    kernel would take from its lse: a gradient, or weights averaged over the heads
    (computed without each head's weights, as ``exp(s - lse)``). Read once per call
    (dispatch and the backends' reasons ask)."""
    if inputs.far_rows_at_risk is None:
        risky = inputs.mask is not None and (inputs.needs_grad or inputs.weights_mean)
        if risky:
            rows = far_rows(inputs.mask, inputs.L, inputs.S, inputs.batch_shape, inputs.device)
            risky = rows is not None
        inputs.far_rows_at_risk = risky
    return inputs.far_rows_at_risk


def lost_rows(inputs: AttentionInputs, lse: torch.Tensor) -> torch.Tensor | None:
    """The rows (*batch, L) of a call whose bias is far and whose ``lse`` (*batch, L) is
    far too, so that ``exp(s - lse)`` does not give their weights; None when there is
    none (or they cannot be read for free)."""
    if not readable(lse):
        return None
    rows = far_rows(inputs.mask, inputs.L, inputs.S, inputs.batch_shape, inputs.device)
    if rows is None:
        return None
    rows = rows.to(lse.device).expand(*inputs.batch_shape, inputs.L, 1).squeeze(-1)
    lse = lse.detach()
    lost = rows & (lse.abs() > FAR) & torch.isfinite(lse)  # (*batch, L)
    return lost if bool(lost.any()) else None


def check_given_lse(inputs: AttentionInputs, lse: torch.Tensor) -> None:
    """Raise ValueError when ``attention_backward`` is given an lse (*batch, L) that lost
    a far row's log-sum (see the module docstring)."""
    lost = lost_rows(inputs, lse)
    if lost is None:
        return
    where = tuple(int(i) for i in lost.nonzero()[0])
    raise ValueError(
        f"lse: {int(lost.sum())} row(s) have a bias far from 0 for every key they keep, "
        f"and an lse as far (at {where}: lse {float(lse[where]):.3g}), where float "
        "rounding lost the row's log-sum: its weights exp(s - lse) cannot be recovered "
        "from it. Block such keys with -inf or a keep mask, or differentiate "
        "attnkit.attention() itself, which normalizes those rows by their own sums"
    )
