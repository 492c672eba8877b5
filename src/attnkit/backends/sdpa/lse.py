"""Log-sum-exp from SDPA, and exact weights recomputed from it.

torch's fused kernels return the lse beside the output through private ops, used
only when present (feature-detected, never assumed):

- CPU: ``aten._scaled_dot_product_flash_attention_for_cpu``;
- CUDA: ``aten._scaled_dot_product_flash_attention`` (half precision, no mask,
  head size a multiple of 8 up to 256) or else
  ``aten._scaled_dot_product_efficient_attention`` with ``compute_log_sumexp``
  (any float dtype, an additive mask; see :func:`cuda_lse_op`).

The weights of a call are then ``exp(scale * q k^T + bias - lse)`` in a second pass,
with no softmax materialized in the forward. Returned weights are differentiable:
their backward is the softmax backward, recomputed from the logits, so it can be
differentiated again.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ... import _host
from ..._inputs import AttentionInputs
from ...kernels.softmax import exp_rows_
from .._common import all_finite, clean_rows, masked_softmax

__all__ = [
    "LSE_OP",
    "cuda_lse_op",
    "has_lse_kernel",
    "lse_call",
    "weights_from_lse",
    "weights_of_call",
]


def _aten_op(name: str) -> Any:
    """A private aten op by name, or None where this torch does not have it."""
    try:
        return getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):  # pragma: no cover - older or newer torch
        return None


LSE_OP = _aten_op("_scaled_dot_product_flash_attention_for_cpu")
CUDA_FLASH_OP = _aten_op("_scaled_dot_product_flash_attention")
CUDA_EFFICIENT_OP = _aten_op("_scaled_dot_product_efficient_attention")

_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_EFFICIENT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def has_lse_kernel(device: torch.device) -> bool:
    """True when SDPA can also give the log-sum-exp on this device."""
    if device.type == "cpu":
        return LSE_OP is not None
    if device.type == "cuda":
        return CUDA_FLASH_OP is not None or CUDA_EFFICIENT_OP is not None
    return False


def cuda_lse_op(dtype: torch.dtype, head_size: int, has_mask: bool) -> str | None:
    """Which CUDA op returns the lse of a call: "flash", "efficient" or None (none can).

    Flash takes half precision with no mask and a head size that is a multiple of 8
    up to 256; the efficient kernel takes float32 too and an additive mask. Head sizes
    are zero-padded to a multiple of 8 before the call (:func:`lse_call`).
    """
    padded = -(-head_size // 8) * 8
    if CUDA_FLASH_OP is not None and dtype in _FLASH_DTYPES and not has_mask and padded <= 256:
        return "flash"
    if CUDA_EFFICIENT_OP is not None and dtype in _EFFICIENT_DTYPES:
        return "efficient"
    return None


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """SDPA's mask as an additive float mask (0 keeps, -inf removes) in ``dtype``."""
    if mask is None or mask.dtype != torch.bool:
        return None if mask is None else mask.to(dtype)
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, float("-inf"))


def lse_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    is_causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output (B, H, L, E) and lse (B, H, L) of one fused call on 4-D inputs of one
    head size (B, H, N, E); ``mask`` None or (B, H, L or 1, S), bool or additive."""
    bias = _additive(mask, q.dtype)
    if q.device.type != "cuda":
        # The private op trusts its inputs' layout (permuted views give wrong results):
        # hand it contiguous tensors, as the public entry point would.
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        bias = bias.contiguous() if bias is not None else None
        out, lse = LSE_OP(q, k, v, 0.0, is_causal, attn_mask=bias, scale=scale)[:2]
        return out, lse
    return _cuda_lse_call(q, k, v, bias, is_causal=is_causal, scale=scale)


def _cuda_lse_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    is_causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The CUDA flash or efficient op with the lse: head size padded to a multiple of 8,
    an additive mask padded to a multiple of 16 keys (its alignment), lse cut to L rows."""
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    pad = -E % 8
    if pad:
        q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))  # (B, H, N, E + pad)
    choice = cuda_lse_op(q.dtype, q.shape[-1], bias is not None)
    if choice == "flash":
        res = CUDA_FLASH_OP(q, k, v, 0.0, is_causal, False, scale=scale)
        out, lse = res[0], res[1]
    elif choice == "efficient":
        if bias is not None:
            bias = bias.expand(*q.shape[:-2], L, S)  # (B, H, L, S)
            if S % 16:
                wide = bias.new_zeros(*bias.shape[:-1], S + (-S % 16))  # (B, H, L, S')
                wide[..., :S] = bias
                bias = wide[..., :S]  # aligned storage, (B, H, L, S)
        res = CUDA_EFFICIENT_OP(q, k, v, bias, True, 0.0, is_causal, scale=scale)
        out, lse = res[0], res[1]
    else:
        raise RuntimeError(f"no CUDA kernel returns the log-sum-exp for dtype {q.dtype}")
    return out[..., :E], lse[..., :L]  # (B, H, L, E), (B, H, L)


class _SoftmaxFromLse(torch.autograd.Function):
    """weights = exp(logits - lse) with the softmax backward; lse is treated as given.

    logits (..., L, S) with -inf where blocked; lse (..., L), finite or -inf.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        weights = logits.contiguous().clone()  # (..., L, S)
        exp_rows_(weights, _shift(lse), want_sum=False)
        ctx.save_for_backward(weights, logits, lse)
        return weights

    @staticmethod
    def backward(ctx: Any, d_weights: torch.Tensor) -> tuple[torch.Tensor, None]:
        weights, logits, lse = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: weights as a function of the logits
            weights = masked_softmax(logits)[0]  # (..., L, S)
        row = (d_weights * weights).sum(dim=-1, keepdim=True)  # (..., L, 1)
        grad = weights * (d_weights - row)  # (..., L, S)
        # a row whose lse is NaN (it uses a non-finite input; its weights are NaN) passes
        # no gradient, so a NaN never reaches the pairs it does not use (a row of padding
        # that a caller drops has d_weights 0, and NaN * 0 is NaN)
        return torch.where(torch.isnan(lse).unsqueeze(-1), 0.0, grad), None


def _shift(lse: torch.Tensor) -> torch.Tensor:
    """The lse as an exp shift: -inf (an empty row) -> 0; a NaN row stays NaN."""
    return torch.where(torch.isinf(lse), torch.zeros((), dtype=lse.dtype), lse)


def weights_from_lse(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Exact weights (..., L, S) from masked logits (..., L, S) and lse (..., L)."""
    lse = lse.to(logits.dtype)  # (..., L)
    if torch.is_grad_enabled() and logits.requires_grad:
        return _SoftmaxFromLse.apply(logits, lse.detach())
    logits = logits.contiguous()
    exp_rows_(logits, _shift(lse), want_sum=False)
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
    # Non-finite rows zeroed, so a gradient never multiplies a NaN: a pair holding one is
    # blocked or in a row whose lse is NaN (its weights are NaN), except a key holding
    # -inf only (a Gaussian key infinitely far, its -inf in a bias feature): -inf below.
    # (Finite q and k, known without a device sync or promised by check_finite=False,
    # skip all of it.)
    keep: torch.Tensor | None = None
    finite = not inputs.check_finite or (
        _host.readable(q) and _host.readable(k) and all_finite(q.detach(), k.detach())
    )
    if not finite:
        far = torch.isneginf(k).any(dim=-1) & ~(torch.isnan(k) | torch.isposinf(k)).any(dim=-1)
        q, k = clean_rows(q)[0], clean_rows(k)[0]  # far: (..., S)
        far = inputs.layout.query_heads(far, 1) if gqa else far  # (..., Hq, S)
        keep = ~far.unsqueeze(-2)  # (..., 1, S): joins the mask below, one pass in all
    kf = inputs.layout.query_heads(k, 2) if gqa else k  # (..., Hq, S, E')
    qs = q.to(cd) * inputs.scale  # (..., L, E'): scaled here, not on (L, S)
    logits = torch.matmul(qs, kf.to(cd).transpose(-2, -1))  # (..., L, S)
    call_keep: torch.Tensor | None = None
    if is_causal:
        L, S = logits.shape[-2], logits.shape[-1]
        call_keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()  # (L, S)
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        call_keep = attn_mask
    elif attn_mask is not None:
        logits = (
            logits.add_(attn_mask.to(cd)) if not logits.requires_grad else logits + attn_mask.to(cd)
        )
        call_keep = attn_mask > float("-inf")
    for part in (call_keep, alive):
        if part is not None:
            keep = part if keep is None else keep & part
    if keep is not None:
        if logits.requires_grad:  # (autograd needs the unfilled logits kept intact)
            logits = logits.masked_fill(~keep, float("-inf"))
        else:  # in place: one pass, no copy of the (L, S) logits
            logits = logits.masked_fill_(~keep, float("-inf"))
    return weights_from_lse(logits, lse.to(cd))
