"""Attention written out over the materialized (L, S) logits: the readable definition.

The reference backend is this module:

    logits  = mods(scale * score(q, k)) + bias, blocked pairs set to -inf  # (..., L, S)
    weights = softmax(logits) over keys (fully masked rows: all 0)          # (..., L, S)
    output  = dropout(weights) @ v                                          # (..., L, Ev)
    lse     = logsumexp(logits) over keys (fully masked rows: -inf)         # (..., L)

Non-finite inputs follow one policy: a NaN (or inf) in a position that is used
propagates to the rows that use it; a position masked out never contributes,
whatever it holds. So a blocked pair is -inf whatever its logit, and the values are
taken with non-finite rows zeroed, a row that uses such a value being set to NaN.
Half-precision inputs are computed in float32 and the output cast back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._inputs import AttentionInputs
from ._common import dense_mask, expand_kv, masked_softmax, score_logits
from .base import AttentionResult

__all__ = ["materialized_attention", "materialized_logits"]


def materialized_logits(inputs: AttentionInputs) -> torch.Tensor:
    """Masked, scaled logits (*batch, L, S) in the compute dtype; -inf where blocked."""
    cd = inputs.compute_dtype
    q = inputs.query.to(cd)
    k = expand_kv(inputs.key.to(cd), inputs.groups)  # (..., Hq, S, E)
    logits = score_logits(inputs, q, k) * inputs.scale  # (..., L, S)
    if inputs.head_scale is not None:
        hs = inputs.head_scale.to(cd)
        logits = logits * hs.view(-1, 1, 1)  # (..., H, L, S): one scale per query head
    for mod in inputs.mods:
        logits = mod.logits(logits, inputs.L, inputs.S)
    dm = dense_mask(inputs)
    if dm.bias is not None:
        bias = dm.bias.to(cd)
        logits = (logits + bias).masked_fill(bias == float("-inf"), float("-inf"))
    if dm.keep is not None:
        logits = logits.masked_fill(~dm.keep, float("-inf"))
    return logits.expand(*inputs.batch_shape, inputs.L, inputs.S)


def materialized_attention(inputs: AttentionInputs) -> AttentionResult:
    """The whole call, materialized: output, weights and lse (as asked)."""
    cd = inputs.compute_dtype
    logits = materialized_logits(inputs)  # (*batch, L, S)
    weights, lse = masked_softmax(logits)
    probs = F.dropout(weights, p=inputs.dropout_p) if inputs.dropout_p > 0 else weights
    v = expand_kv(inputs.value.to(cd), inputs.groups)  # (..., Hq, S, Ev)
    finite = torch.isfinite(v)
    out = probs @ torch.where(finite, v, torch.zeros((), dtype=cd, device=v.device))
    bad = (~finite).any(dim=-1, keepdim=True).to(cd)  # (..., S, 1) non-finite value rows
    used_bad = (logits > float("-inf")).to(cd) @ bad  # (*batch, L, 1)
    out = out.masked_fill(used_bad > 0, float("nan")).to(inputs.dtype)  # (*batch, L, Ev)
    return AttentionResult(
        output=out,
        weights=weights if inputs.return_weights else None,
        lse=lse if inputs.return_lse else None,
    )
