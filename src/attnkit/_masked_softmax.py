"""d2l's ``masked_softmax(X, valid_lens)`` on attnkit's own masks and softmax."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import masks as _masks
from .backends._common import masked_softmax as _softmax_where_blocked

__all__ = ["masked_softmax"]


def masked_softmax(
    X: torch.Tensor, valid_lens: torch.Tensor | Sequence[int] | None = None
) -> torch.Tensor:
    """Softmax over the last dim of logits ``X``, keeping the first ``valid_lens`` keys.

    d2l's ``masked_softmax`` with attnkit's masks: ``valid_lens`` becomes
    ``masks.valid_lens(valid_lens)`` and the softmax is attnkit's (the one every backend's
    weights come from).

    Args:
        X: logits (B, L, S) as in d2l, or any (B, ..., L, S) (the lengths broadcast over
            the middle dims, e.g. heads), or (B, S) (one row per batch element); with
            ``valid_lens=None`` any (..., S).
        valid_lens: None (a plain softmax), (B,) int: key ``j`` kept in every row of
            batch ``b`` when ``j < valid_lens[b]``, or (B, L) int: one length per query
            row (``X`` at least 3-D). Lengths in [0, S].

    Returns:
        the weights, shape of ``X``; float32 for half-precision ``X`` (the softmax
        accumulates in float32), else ``X``'s dtype.

    Wherever a length is >= 1 the weights are d2l's (d2l fills masked logits with -1e6;
    attnkit blocks them exactly, which gives the same weights up to float rounding,
    ``exp(-1e6)`` being 0). A length of 0 differs on purpose: the row keeps no key, and
    attnkit's policy for such a row is all zeros (never NaN, and no weight on padding),
    where d2l's -1e6 fill gives a uniform row ``1/S``.

    Raises:
        TypeError, ValueError: before any compute, naming ``X`` or ``valid_lens``.

    Examples:
        >>> import torch, attnkit
        >>> attnkit.masked_softmax(torch.zeros(2, 1, 4), torch.tensor([2, 0]))
        tensor([[[0.5000, 0.5000, 0.0000, 0.0000]],
        <BLANKLINE>
                [[0.0000, 0.0000, 0.0000, 0.0000]]])
    """
    if not isinstance(X, torch.Tensor) or not X.is_floating_point():
        got = X.dtype if isinstance(X, torch.Tensor) else type(X).__name__
        raise TypeError(f"X: expected a floating-point tensor of logits (..., S), got {got}")
    if X.dim() == 0:
        raise ValueError("X: expected logits (..., S) with at least one dim, got a scalar")
    compute = torch.float32 if X.dtype in (torch.float16, torch.bfloat16) else X.dtype
    logits = X.to(compute)  # (..., S)
    if valid_lens is None:
        return _softmax_where_blocked(logits)[0]
    mask = _masks.valid_lens(valid_lens)  # checks dtype, dims (1 or 2) and lengths >= 0
    rows = logits.unsqueeze(-2) if X.dim() == 2 else logits  # (B, S) -> (B, 1, S)
    if rows.dim() < 3:
        raise ValueError(
            f"X: expected logits (B, L, S), (B, ..., L, S) or (B, S) with valid_lens, got "
            f"shape {tuple(X.shape)}"
        )
    batch_shape, L, S = tuple(rows.shape[:-2]), rows.shape[-2], rows.shape[-1]
    lens = mask.lens
    if lens.shape[0] != batch_shape[0] or (
        lens.dim() == 2 and (X.dim() == 2 or lens.shape[1] != L)
    ):
        want = (
            f"({batch_shape[0]},)"
            if X.dim() == 2
            else f"({batch_shape[0]},) or ({batch_shape[0]}, {L})"
        )
        raise ValueError(
            f"valid_lens: shape {tuple(lens.shape)} does not fit X of shape {tuple(X.shape)}; "
            f"expected {want}"
        )
    mask.validate(batch_shape, L, S)  # lengths at most S (read on the host where free)
    keep = mask.dense(L, S, batch_shape, rows.device).keep  # (B, 1.., L|1, S), True = kept
    assert keep is not None
    blocked = rows.masked_fill(~keep, float("-inf"))  # (B, ..., L, S)
    weights = _softmax_where_blocked(blocked)[0]  # a row with no key: all 0
    return weights.view(X.shape)
