"""The reference backend: attention written out, materializing the (L, S) logits.

This is the readable definition every other backend is held to:

    logits  = mods(scale * score(q, k)) + bias, blocked pairs set to -inf  # (..., L, S)
    weights = softmax(logits) over keys (fully masked rows: all 0)          # (..., L, S)
    output  = dropout(weights) @ v                                          # (..., L, Ev)
    lse     = logsumexp(logits) over keys (fully masked rows: -inf)         # (..., L)

Non-finite inputs (the policy every backend follows): a NaN or inf in a position
that is used propagates to the rows that use it (a NaN query row gives a NaN output
row and lse; a NaN key gives NaN in every row that keeps it; a non-finite value row
makes the output rows that keep it non-finite); a position masked out never
contributes, whatever it holds. Fully masked rows give output 0 and lse -inf.

Half-precision inputs are computed in float32 and the output cast back. The math
lives in :mod:`attnkit.backends._materialized`.
"""

from __future__ import annotations

from typing import ClassVar

from .._inputs import AttentionInputs
from ._materialized import materialized_attention
from .base import ALL_MOD_KINDS, Backend
from .records import AttentionResult

__all__ = ["ReferenceBackend"]


class ReferenceBackend(Backend):
    """Materialized math in float32/float64; any score, any mask, weights and lse."""

    name: ClassVar[str] = "reference"
    device_types: ClassVar[frozenset[str]] = frozenset({"cpu", "cuda", "mps", "xpu", "meta"})
    fused: ClassVar[bool] = False
    mod_kinds: ClassVar[frozenset[str]] = ALL_MOD_KINDS
    supports_head_scale: ClassVar[bool] = True
    gaussian_differences: ClassVar[bool] = True
    supports_transforms: ClassVar[bool] = True
    dense_masks: ClassVar[bool] = True

    def forward(self, inputs: AttentionInputs) -> AttentionResult:
        return materialized_attention(inputs)
