"""The reference backend: attention written out, materializing the (L, S) logits.

This is the readable definition every other backend is held to:

    logits  = scale * score(q, k) + bias, with blocked pairs set to -inf   # (..., L, S)
    weights = softmax(logits) over keys (fully masked rows: all 0)          # (..., L, S)
    output  = dropout(weights) @ v                                          # (..., L, Ev)
    lse     = logsumexp(logits) over keys (fully masked rows: -inf)         # (..., L)

Half-precision inputs are computed in float32 and the output cast back.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from .._inputs import AttentionInputs
from ._common import dense_mask, expand_kv, masked_softmax, score_logits
from .base import AttentionResult, Backend

__all__ = ["ReferenceBackend", "reference_logits"]


def reference_logits(inputs: AttentionInputs) -> torch.Tensor:
    """Masked, scaled logits (*batch, L, S) in the compute dtype; -inf where blocked."""
    cd = inputs.compute_dtype
    q = inputs.query.to(cd)
    k = expand_kv(inputs.key.to(cd), inputs.groups)  # (..., Hq, S, E)
    logits = score_logits(inputs, q, k) * inputs.scale  # (..., L, S)
    dm = dense_mask(inputs)
    if dm.bias is not None:
        logits = logits + dm.bias.to(cd)
    if dm.keep is not None:
        logits = logits.masked_fill(~dm.keep, float("-inf"))
    return logits.expand(*inputs.batch_shape, inputs.L, inputs.S)


class ReferenceBackend(Backend):
    """Materialized math in float32/float64; any score, any mask, weights and lse."""

    name: ClassVar[str] = "reference"
    device_types: ClassVar[frozenset[str]] = frozenset({"cpu", "cuda", "mps", "xpu"})
    fused: ClassVar[bool] = False

    def forward(self, inputs: AttentionInputs) -> AttentionResult:
        cd = inputs.compute_dtype
        logits = reference_logits(inputs)  # (*batch, L, S)
        weights, lse = masked_softmax(logits)
        probs = F.dropout(weights, p=inputs.dropout_p) if inputs.dropout_p > 0 else weights
        v = expand_kv(inputs.value.to(cd), inputs.groups)  # (..., Hq, S, Ev)
        out = (probs @ v).to(inputs.dtype)  # (*batch, L, Ev)
        return AttentionResult(
            output=out,
            weights=weights if inputs.return_weights else None,
            lse=lse if inputs.return_lse else None,
        )
