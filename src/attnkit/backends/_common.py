"""Pieces shared by backends: GQA expansion, dense masks, the masked softmax policy.

Fully masked rows follow one policy on every path: output 0, weights 0,
lse -inf, gradients 0, never NaN.
"""

from __future__ import annotations

import math

import torch

from .._host import readable
from .._inputs import AttentionInputs
from ..masks import DenseMask

__all__ = [
    "all_finite",
    "clean_keys",
    "clean_rows",
    "clean_values",
    "dense_mask",
    "expand_kv",
    "graph_link",
    "masked_softmax",
    "nan_rows",
    "restore_nonfinite_keys",
    "score_logits",
    "unit_stride",
]


def expand_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Grouped-query attention: (..., Hk, S, D) -> (..., Hk*groups, S, D), key head j
    serving query heads j*groups .. j*groups+groups-1 (torch's enable_gqa order)."""
    if groups == 1:
        return t
    return t.repeat_interleave(groups, dim=-3)  # (..., Hq, S, D)


def graph_link(*tensors: torch.Tensor) -> torch.Tensor:
    """A 0-d zero joined to the autograd graph of ``tensors``, whatever values they hold.

    Added to a result that no input reaches (every row fully masked, an empty call), it
    keeps the graph connected, so backward gives the inputs zero gradients rather than
    "does not require grad". It is the sum of an empty slice of each tensor, never
    ``t.sum() * 0``, which is NaN when ``t`` holds a NaN or an inf."""
    link = torch.zeros((), dtype=tensors[0].dtype, device=tensors[0].device)
    for t in tensors:
        link = link + t.narrow(-1, 0, 0).sum().to(link.dtype)  # 0, differentiable
    return link


def all_finite(*tensors: torch.Tensor) -> bool:
    """True when every value of the tensors is finite, from one sum per tensor read on
    the host: only for tensors :func:`attnkit._host.readable` allows to read, which need
    no gradient. Much cheaper than ``isfinite(t).all()`` on the CPU. A sum that
    overflows on finite values (half precision, huge values) only answers False:
    callers then take their exact per-element path, so the answer is never wrong in the
    direction that matters.
    """
    total = 0.0
    for t in tensors:
        total += t.sum().item()
    return math.isfinite(total)


def clean_keys(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw keys (..., S, E) with non-finite rows zeroed, before a score's dot form (which
    may mix keys, e.g. centring on their mean), and two flags (..., S) bool: rows
    holding an inf but no NaN, and rows holding a NaN. The caller puts the flagged
    rows back into the dot form (NaN rows as NaN; inf rows of a score with a key bias,
    the Gaussian, as an infinitely far key whose score is -inf)."""
    nan_rows = torch.isnan(k).any(dim=-1)  # (..., S)
    inf_rows = torch.isinf(k).any(dim=-1) & ~nan_rows  # (..., S)
    bad = (nan_rows | inf_rows).unsqueeze(-1)  # (..., S, 1)
    return torch.where(bad, torch.zeros((), dtype=k.dtype), k), inf_rows, nan_rows


def unit_stride(t: torch.Tensor) -> torch.Tensor:
    """``t`` as fused kernels read it: any layout whose last dim is dense is taken as it
    is (the heads-second view of a (B, L, H, D) projection, with no copy)."""
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def clean_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` (..., N, D) with its rows holding a NaN or an inf zeroed, and those rows
    (..., N) bool. Computed from the cleaned rows, a row-wise map (a projection, a
    score's dot form) sends no ``0 * NaN`` into its parameters' gradients; the caller
    puts the rows back as NaN (:func:`nan_rows`)."""
    bad = ~torch.isfinite(t).all(dim=-1)  # (..., N)
    return torch.where(bad.unsqueeze(-1), torch.zeros((), dtype=t.dtype, device=t.device), t), bad


def nan_rows(t: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """``t`` (..., N, D) with the rows ``bad`` (..., N) set to NaN (no gradient there)."""
    return torch.where(bad.unsqueeze(-1), torch.full((), float("nan"), dtype=t.dtype), t)


def clean_values(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Values (..., S, Ev) with non-finite rows zeroed, so that a key masked out for a row
    adds 0, not 0 * NaN, to it; and the flags (..., S) bool of those rows (True = not
    finite), from which a backend makes NaN every row that keeps such a key.

    ``(v, None)`` when ``v`` can be read on the host and is all finite (one sum); else
    tensor operations only (no sync)."""
    if readable(v) and all_finite(v.detach()):
        return v, None
    finite = torch.isfinite(v).all(dim=-1)  # (..., S)
    zero = torch.zeros((), dtype=v.dtype, device=v.device)
    return torch.where(finite.unsqueeze(-1), v, zero), ~finite


def restore_nonfinite_keys(
    k: torch.Tensor,
    key_bias: torch.Tensor | None,
    far: torch.Tensor,
    nan_keys: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Put the key rows :func:`clean_keys` zeroed back into a score's dot form.

    Args:
        k: (..., S, E') the dot form's keys, computed from the cleaned keys.
        key_bias: None or (..., 1, S), the dot form's per-key bias.
        far, nan_keys: (..., S) bool from :func:`clean_keys`.

    Returns:
        ``(k, key_bias, excluded)``: a NaN key row becomes a NaN row of k, so every
        query that uses it scores NaN; under a score with a key bias (the Gaussian) an
        inf key is infinitely far, its bias -inf whatever the query, and ``excluded``
        (..., S) marks it (None otherwise: an inf key is then a non-finite input too).
    """
    excluded: torch.Tensor | None = None
    if key_bias is not None:
        key_bias = key_bias.masked_fill(far.unsqueeze(-2), float("-inf"))  # (..., 1, S)
        excluded = far
    else:
        nan_keys = nan_keys | far
    nan = torch.full((), float("nan"), dtype=k.dtype, device=k.device)
    k = torch.where(nan_keys.unsqueeze(-1), nan, k)  # (..., S, E')
    return k, key_bias, excluded


def dense_mask(inputs: AttentionInputs) -> DenseMask:
    """The call's mask as keep/bias tensors broadcastable to (*batch, L, S)."""
    if inputs.mask is None:
        return DenseMask(keep=None)
    return inputs.mask.dense(inputs.L, inputs.S, inputs.batch_shape, inputs.device)


def score_logits(inputs: AttentionInputs, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Unscaled logits (..., L, S) of the call's score, with its parameters in q's dtype.

    Parameters are cast (differentiably, on a shallow copy of the score: the module
    itself is never changed) when the inputs were upcast for half-precision accumulation.
    """
    return inputs.score.cast(q.dtype).logits(q, k)


def masked_softmax(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the last dim where ``-inf`` means blocked.

    Returns weights (..., L, S) and lse (..., L). A row with every entry ``-inf``
    gets weights 0 and lse ``-inf``, with zero gradients. A NaN logit makes its row's
    weights NaN on every pair that is not blocked, and its lse NaN (a used NaN
    propagates); a blocked pair keeps weight 0 and passes no gradient. With no key
    (S = 0) every row is such a row.
    """
    if logits.shape[-1] == 0:  # (amax has nothing to reduce)
        return logits.clone(), logits.sum(dim=-1) + float("-inf")  # (..., L, 0), (..., L)
    m = logits.amax(dim=-1, keepdim=True).detach()  # (..., L, 1)
    m = torch.where(torch.isinf(m), torch.zeros((), dtype=m.dtype, device=m.device), m)
    e = torch.exp(logits - m)  # (..., L, S)
    blocked = torch.isneginf(logits)
    zero = torch.zeros((), dtype=e.dtype, device=e.device)
    e = torch.where(blocked, zero, e)  # a blocked pair: exactly 0, no gradient
    denom = e.sum(dim=-1, keepdim=True)  # (..., L, 1)
    dead = denom == 0  # NaN rows are not dead: their NaN reaches weights and lse
    safe = torch.where(dead, torch.ones((), dtype=denom.dtype, device=denom.device), denom)
    weights = torch.where(blocked, zero, e / safe)  # 0, not 0 / NaN, in a NaN row
    neg_inf = torch.full((), float("-inf"), dtype=m.dtype, device=m.device)
    lse = torch.where(dead, neg_inf, m + torch.log(safe)).squeeze(-1)  # (..., L)
    return weights, lse
