"""The SDPA backend: torch.nn.functional.scaled_dot_product_attention.

Runs every score that reduces exactly to a dot product (dot, scaled dot,
bilinear, Gaussian). A top-left causal mask alone stays symbolic
(``is_causal=True``); other masks are materialized into SDPA's ``attn_mask``.
Fully masked rows are given a harmless all-keep row for the kernel and their
output is then set to 0, so neither the output nor the gradients see NaN.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from .._inputs import AttentionInputs
from ._common import dense_mask, expand_kv
from .base import AttentionResult, Backend

__all__ = ["SDPABackend"]

_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")  # torch >= 2.5


class SDPABackend(Backend):
    """torch's fused scaled-dot-product attention for dot-reducible scores."""

    name: ClassVar[str] = "sdpa"
    any_score: ClassVar[bool] = False
    supports_weights: ClassVar[bool] = False
    supports_lse: ClassVar[bool] = False

    def forward(self, inputs: AttentionInputs) -> AttentionResult:
        q, k, key_bias = inputs.score.dot_form(inputs.query, inputs.key)
        v = inputs.value
        batch, L, S = inputs.batch_shape, inputs.L, inputs.S

        attn_mask: torch.Tensor | None = None
        is_causal = False
        alive: torch.Tensor | None = None  # (*batch, L, 1) rows with at least one key
        mask = inputs.mask
        if key_bias is None and mask is not None and len(mask.parts()) == 1:
            is_causal = mask.symbolic_causal(L, S)
        if (mask is not None and not is_causal) or key_bias is not None:
            dm = dense_mask(inputs)
            if dm.bias is None and key_bias is None:
                keep = dm.keep
                assert keep is not None
                alive = keep.any(dim=-1, keepdim=True)  # (..., L, 1)
                attn_mask = keep | ~alive  # dead rows attend everywhere, zeroed below
            else:
                bias = torch.zeros((), dtype=q.dtype, device=q.device)
                if key_bias is not None:
                    bias = bias + key_bias * inputs.scale  # (..., 1, S)
                if dm.bias is not None:
                    bias = bias + dm.bias.to(q.dtype)
                if dm.keep is not None:
                    bias = bias.masked_fill(~dm.keep, float("-inf"))
                bias = bias.expand(*bias.shape[:-2], L, S) if bias.ndim >= 2 else bias.expand(L, S)
                alive = (bias > float("-inf")).any(dim=-1, keepdim=True)  # (..., L, 1)
                attn_mask = bias.masked_fill(~alive, 0.0)  # dead rows: zeroed below

        if inputs.groups > 1 and not _HAS_GQA:
            k = expand_kv(k, inputs.groups)  # (..., Hq, S, E)
            v = expand_kv(v, inputs.groups)  # (..., Hq, S, Ev)
        # SDPA's fused kernels need equal leading dims: broadcast views, no copies.
        q = q.expand(*batch, L, q.shape[-1])  # (*batch, L, E')
        kv_batch = (*batch[:-1], k.shape[-3]) if batch and inputs.groups > 1 else batch
        k = k.expand(*kv_batch, S, k.shape[-1])  # (*kv_batch, S, E')
        v = v.expand(*kv_batch, S, v.shape[-1])  # (*kv_batch, S, Ev)
        kwargs = {"enable_gqa": True} if inputs.groups > 1 and _HAS_GQA else {}
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=inputs.dropout_p,
            is_causal=is_causal,
            scale=inputs.scale,
            **kwargs,
        )  # (*batch, L, Ev)
        if alive is not None:  # no host sync: stays torch.compile friendly
            out = torch.where(alive, out, torch.zeros((), dtype=out.dtype, device=out.device))
        return AttentionResult(output=out)
