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

__all__ = ["FAR", "add_far_rows", "check_given_lse", "shift_far_rows", "split_far_rows"]

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


def _blocks_only(bias: torch.Tensor) -> torch.Tensor:
    """A bias's blocking part alone: -inf where it blocks a key, else 0."""
    return torch.zeros((), dtype=bias.dtype, device=bias.device).masked_fill(
        torch.isneginf(bias.detach()), float("-inf")
    )  # (the shape of bias)


def shift_far_rows(
    mask: Mask | None, L: int, S: int, batch_shape: Sequence[int], device: torch.device
) -> tuple[Mask | None, torch.Tensor | None]:
    """``mask`` of a call of (L, S) keys with each far bias row shifted (see the module
    docstring), and the total shift (..., L, 1), broadcastable to (*batch, L, 1); or
    ``mask`` as given and None when no row is far (on the CPU, where that is read first).

    Each bias tensor of the mask is shifted by its own largest value over the keys the
    mask keeps, in its own dtype (that value is one of its entries, so the shifted row
    keeps every other value of it and of the other biases, whatever their order or
    dtypes); a bias broadcast over the rows then grows to (..., L, S)."""
    if mask is None or L == 0 or S == 0 or not mask.has_bias_beyond(FAR):
        return mask, None  # (without a value beyond ±FAR, no row is far)
    shifts: dict[int, torch.Tensor] = {}
    for target in {id(b): b for b in mask.biases()}.values():

        def others_blocking(b: torch.Tensor, t: torch.Tensor = target) -> torch.Tensor:
            return b if b is t else _blocks_only(b)

        alone = mask.map_biases(others_blocking)
        top = _kept_row_max(alone, L, S, batch_shape, device)  # (..., L, 1)
        top = top / sum(b is target for b in mask.biases())  # (the same tensor twice: each half)
        far = torch.isfinite(top) & (top.abs() > FAR)
        if readable(far) and not bool(far.any()):
            continue
        zero = torch.zeros((), dtype=top.dtype, device=top.device)
        shifts[id(target)] = torch.where(far, top, zero).to(target.dtype)  # (..., L, 1)
    if not shifts:
        return mask, None

    def take_off(b: torch.Tensor) -> torch.Tensor:
        shift = shifts.get(id(b))
        return b if shift is None else b - shift.to(b.device)  # (..., L, S)

    total = sum(s.to(device) for s in shifts.values())  # (..., L, 1), broadcast
    assert isinstance(total, torch.Tensor)
    return mask.map_biases(take_off), total


def split_far_rows(inputs: AttentionInputs) -> tuple[AttentionInputs, torch.Tensor | None]:
    """The call a backend runs, each far bias row shifted, and the shift to add to its
    lse, (*batch, L); or the call as given and None."""
    batch, L, S = inputs.batch_shape, inputs.L, inputs.S
    mask, shift = shift_far_rows(inputs.mask, L, S, batch, inputs.device)
    if shift is None:
        return inputs, None
    rows = shift.to(device=inputs.device)  # (its own dtype: -1e300 stays finite)
    rows = rows.expand(*batch, L, 1).squeeze(-1)  # (*batch, L)
    return replace(inputs, mask=mask), rows


def add_far_rows(lse: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``lse`` (*batch, L) with each row's shift (*batch, L) added back, held within the
    lse dtype's finite range (a float64 bias row of -1e300 has an lse below float32's:
    the lowest float32, not the -inf of a row with no key); a row with no key stays
    -inf."""
    big = torch.finfo(lse.dtype)
    shifted = (lse + shift).clamp(min=big.min, max=big.max).to(lse.dtype)  # (*batch, L)
    return torch.where(torch.isneginf(lse), lse, shifted)


def check_given_lse(inputs: AttentionInputs, lse: torch.Tensor) -> None:
    """Raise ValueError when a row of ``attention_backward``'s call has a far bias and a
    far given ``lse`` (*batch, L): that lse was rounded where the row's log-sum is lost
    (``-1e30 + log S`` is ``-1e30`` in float32), and the weights ``exp(s - lse)`` of the
    row cannot be recovered from it. A far bias row whose lse is ordinary (a block of a
    longer row that other keys dominate) is exact as given. Read on the CPU only."""
    _, shift = shift_far_rows(inputs.mask, inputs.L, inputs.S, inputs.batch_shape, inputs.device)
    if shift is None or not readable(lse):
        return
    rows = shift.to(lse.device).expand(*inputs.batch_shape, inputs.L, 1).squeeze(-1)  # (*batch, L)
    lost = (rows != 0) & (lse.detach().abs() > FAR) & torch.isfinite(lse.detach())
    if bool(lost.any()):
        where = tuple(int(i) for i in lost.nonzero()[0])
        raise ValueError(
            f"lse: {int(lost.sum())} row(s) of the mask's bias are far from 0 and so is their "
            f"lse (at {where}: largest kept bias {float(rows[where]):.3g}, lse "
            f"{float(lse[where]):.3g}), where the row's log-sum is lost in rounding and its "
            "weights exp(s - lse) cannot be recovered; take each such row's largest kept "
            "bias off the mask and off the lse before the forward, or differentiate "
            "attnkit.attention() itself, which does so"
        )
