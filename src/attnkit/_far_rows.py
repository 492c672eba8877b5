"""Far bias rows: a bias row whose largest value is far from 0 is shifted by it before a
backend runs, and that value is added back to the lse.

A row of ``-1e30`` (or ``torch.finfo(torch.float32).min``, the value transformers fills
with) has logits ``s = q·k + b`` of about ``-1e30``, where float32 (and float64) keep
nothing of ``q·k``, and an lse of ``-1e30 + log S``, which float32 rounds to ``-1e30``.
A forward normalizes by its own row maximum and spreads such a row evenly over its
keys; a backward that takes the lse (torch's fused CPU and Triton kernels, the generic
backward from (out, lse)) recomputes each weight as ``exp(s - lse) = exp(0) = 1``
instead of ``1 / S``, and its gradients were ``S`` times too large. A row of ``-1e4``
loses ``q·k`` below 1e-3 in the same way.

Softmax ignores a constant added to a row, so each bias row is shifted by its largest
value over the keys the mask keeps (held constant): the logits keep ``q·k`` in full, the weights are the exact
softmax of the call as written, the kernel's lse is near 0, and adding the shift back
gives the call's lse and its gradient exactly. Every call is shifted, with or without
a gradient, so a call's numbers do not depend on whether it is differentiated.

On the CPU the bias is read first, and a call with no far row runs as given (no copy).
Elsewhere the values are not read (that would sync): every row is shifted by its far
part, which is 0 for an ordinary row, whose numbers do not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from ._host import readable
from ._inputs import AttentionInputs
from .masks import Mask

__all__ = ["FAR", "add_far_rows", "shift_far_rows", "split_far_rows"]

FAR = 64.0
"""A bias row whose largest kept value is beyond ±FAR is shifted. float32 keeps an lse
of size FAR to 4e-6 relative, the error of an ordinary logit."""

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


def shift_far_rows(
    mask: Mask | None, L: int, S: int, batch_shape: Sequence[int], device: torch.device
) -> tuple[Mask | None, torch.Tensor | None]:
    """``mask`` of a call of (L, S) keys with each far bias row shifted (see the module
    docstring), and the shift (..., L, 1), broadcastable to (*batch, L, 1); or ``mask``
    as given and None when no row is far (on the CPU, where that is read first).

    A row's shift is its largest bias over the keys it keeps, taken off the mask's first
    bias tensor, which then grows to (..., L, S) where it was broadcast over the rows."""
    if mask is None or L == 0 or S == 0 or not mask.has_bias_beyond(FAR):
        return mask, None  # (without a value beyond ±FAR, no row is far)
    biases = mask.biases()
    top = _kept_row_max(mask, L, S, batch_shape, device)  # (..., L, 1)
    far = torch.isfinite(top) & (top.abs() > FAR)
    if readable(far) and not bool(far.any()):
        return mask, None
    shift = torch.where(far, top, torch.zeros((), dtype=top.dtype, device=top.device))
    first, done = biases[0], False

    def take_off(b: torch.Tensor) -> torch.Tensor:
        nonlocal done
        if done or b is not first:
            return b
        done = True
        return b - shift.to(device=b.device, dtype=b.dtype)  # (..., L, S)

    return mask.map_biases(take_off), shift


def split_far_rows(inputs: AttentionInputs) -> tuple[AttentionInputs, torch.Tensor | None]:
    """The call a backend runs, each far bias row shifted, and the shift to add to its
    lse, (*batch, L); or the call as given and None."""
    batch, L, S = inputs.batch_shape, inputs.L, inputs.S
    mask, shift = shift_far_rows(inputs.mask, L, S, batch, inputs.device)
    if shift is None:
        return inputs, None
    rows = shift.to(device=inputs.device, dtype=inputs.compute_dtype)
    rows = rows.expand(*batch, L, 1).squeeze(-1)  # (*batch, L)
    return replace(inputs, mask=mask), rows


def add_far_rows(lse: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``lse`` (*batch, L) with each row's shift (*batch, L) added back; a row with no
    key stays -inf."""
    return torch.where(torch.isneginf(lse), lse, lse + shift.to(lse.dtype))
