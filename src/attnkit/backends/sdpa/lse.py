"""Log-sum-exp from SDPA, and exact weights recomputed from it.

torch's CPU flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu``,
a private op, used only when present) returns the lse beside the output; the
weights of a call are then ``exp(scale * q k^T + bias - lse)`` in a second pass,
with no softmax materialized in the forward. Returned weights are differentiable:
their backward is the softmax backward, computed from the weights themselves.
"""

from __future__ import annotations

from typing import Any

import torch

from ..._inputs import AttentionInputs
from ...kernels.softmax import exp_rows_
from .._common import expand_kv

__all__ = ["LSE_OP", "has_lse_kernel", "weights_from_lse", "weights_of_call"]


def _lse_op() -> Any:
    try:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    except (AttributeError, RuntimeError):  # pragma: no cover - older or newer torch
        return None


LSE_OP = _lse_op()


def has_lse_kernel(device: torch.device) -> bool:
    """True when SDPA can also give the log-sum-exp on this device (CPU flash op)."""
    return LSE_OP is not None and device.type == "cpu"


class _SoftmaxFromLse(torch.autograd.Function):
    """weights = exp(logits - lse) with the softmax backward; lse is treated as given.

    logits (..., L, S) with -inf where blocked; lse (..., L), finite or -inf.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        safe = torch.where(torch.isfinite(lse), lse, torch.zeros((), dtype=lse.dtype))
        weights = logits.contiguous().clone()  # (..., L, S)
        exp_rows_(weights, safe, want_sum=False)
        ctx.save_for_backward(weights)
        return weights

    @staticmethod
    def backward(ctx: Any, d_weights: torch.Tensor) -> tuple[torch.Tensor, None]:
        (weights,) = ctx.saved_tensors
        row = (d_weights * weights).sum(dim=-1, keepdim=True)  # (..., L, 1)
        return weights * (d_weights - row), None


def weights_from_lse(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Exact weights (..., L, S) from masked logits (..., L, S) and lse (..., L)."""
    lse = lse.to(logits.dtype)  # (..., L)
    if torch.is_grad_enabled() and logits.requires_grad:
        return _SoftmaxFromLse.apply(logits, lse.detach())
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros((), dtype=lse.dtype))
    logits = logits.contiguous()
    exp_rows_(logits, safe, want_sum=False)
    return logits


def weights_of_call(
    inputs: AttentionInputs,
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    gqa: bool,
    alive: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact weights (..., L, S) of one SDPA call, recomputed from the lse it returned.

    q (..., L, E'), k (..., S, E') as given to the call (k with its own heads when
    ``gqa``), lse (..., L); ``attn_mask``/``is_causal`` exactly as the call had them,
    ``alive`` (..., L, 1) marking rows that keep at least one key.
    """
    cd = inputs.compute_dtype
    kf = expand_kv(k, inputs.groups) if gqa else k  # (..., S, E')
    qs = q.to(cd) * inputs.scale  # (..., L, E'): scaled here, not on (L, S)
    logits = torch.matmul(qs, kf.to(cd).transpose(-2, -1))  # (..., L, S)
    keep: torch.Tensor | None = None
    if is_causal:
        L, S = logits.shape[-2], logits.shape[-1]
        keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()  # (L, S)
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        keep = attn_mask
    elif attn_mask is not None:
        logits = logits + attn_mask.to(cd)
        keep = attn_mask > float("-inf")
    if alive is not None:
        keep = alive if keep is None else keep & alive
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))
    return weights_from_lse(logits, lse.to(cd))
