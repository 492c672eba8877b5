"""Host-side layout: any batch rank as (B, H) rows with strides.

Kernels see every tensor as 4-D (B, H, X, D) with strides: B is the product of the
leading dims but the last, H the last leading dim (the head dim). Broadcast dims
keep stride 0, so nothing is copied for broadcasting or for grouped-query
attention (the key/value head of query head h is h // groups).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["bh_shape", "bh_view", "kv_lead"]


def bh_shape(batch_shape: Sequence[int]) -> tuple[int, int]:
    """(B, H) of a call's leading dims: H the last one, B the product of the others."""
    if not batch_shape:
        return 1, 1
    return math.prod(batch_shape[:-1]), int(batch_shape[-1])


def kv_lead(batch_shape: Sequence[int], groups: int) -> tuple[int, ...]:
    """Leading dims that key/value-side tensors are broadcast to: the call's, with the
    head dim divided by ``groups`` for grouped-query attention."""
    lead = tuple(int(d) for d in batch_shape)
    if groups > 1:
        lead = (*lead[:-1], lead[-1] // groups)
    return lead


def bh_view(t: torch.Tensor, lead: Sequence[int]) -> torch.Tensor:
    """t (*t_lead, X, D), broadcastable to (*lead, X, D), as (B, H, X, D).

    A view (stride 0 on broadcast dims) unless merging the leading dims but the last
    needs a copy (mixed broadcast and real strides among them).
    """
    X, D = t.shape[-2], t.shape[-1]
    full = t.expand(*lead, X, D)  # (*lead, X, D)
    if not lead:
        return full.reshape(1, 1, X, D)  # (1, 1, X, D)
    return full.reshape(-1, int(lead[-1]), X, D)  # (B, H, X, D)
