"""Pieces shared by backends: GQA expansion, dense masks, the masked softmax policy.

Fully masked rows follow one policy on every path: output 0, weights 0,
lse -inf, gradients 0, never NaN.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from .._inputs import AttentionInputs
from ..masks import DenseMask

__all__ = ["dense_mask", "expand_kv", "masked_softmax", "score_logits"]


def expand_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Grouped-query attention: (..., Hk, S, D) -> (..., Hk*groups, S, D), key head j
    serving query heads j*groups .. j*groups+groups-1 (torch's enable_gqa order)."""
    if groups == 1:
        return t
    return t.repeat_interleave(groups, dim=-3)  # (..., Hq, S, D)


def dense_mask(inputs: AttentionInputs) -> DenseMask:
    """The call's mask as keep/bias tensors broadcastable to (*batch, L, S)."""
    if inputs.mask is None:
        return DenseMask(keep=None, bias=None)
    return inputs.mask.dense(inputs.L, inputs.S, inputs.batch_shape, inputs.device)


def score_logits(inputs: AttentionInputs, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Unscaled logits (..., L, S) of the call's score, with its parameters in q's dtype.

    Parameters are cast (differentiably) when the inputs were upcast for
    half-precision accumulation.
    """
    score = inputs.score
    params = dict(score.named_parameters())
    if params and any(p.dtype != q.dtype for p in params.values()):
        cast = {name: p.to(q.dtype) for name, p in params.items()}
        return functional_call(score, cast, (q, k))
    return score.logits(q, k)


def masked_softmax(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the last dim where ``-inf`` means blocked.

    Returns weights (..., L, S) and lse (..., L). A row with every entry ``-inf``
    gets weights 0 and lse ``-inf``, with zero gradients.
    """
    m = logits.amax(dim=-1, keepdim=True).detach()  # (..., L, 1)
    m = torch.where(torch.isfinite(m), m, torch.zeros((), dtype=m.dtype, device=m.device))
    e = torch.exp(logits - m)  # (..., L, S)
    denom = e.sum(dim=-1, keepdim=True)  # (..., L, 1)
    alive = denom > 0
    safe = torch.where(alive, denom, torch.ones((), dtype=denom.dtype, device=denom.device))
    weights = e / safe
    neg_inf = torch.full((), float("-inf"), dtype=m.dtype, device=m.device)
    lse = torch.where(alive, m + torch.log(safe), neg_inf).squeeze(-1)  # (..., L)
    return weights, lse
