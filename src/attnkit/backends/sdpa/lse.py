"""Log-sum-exp from SDPA, and exact weights recomputed from it.

torch's fused kernels return the lse beside the output through private ops, used
only when present (feature-detected, never assumed):

- CPU: ``aten._scaled_dot_product_flash_attention_for_cpu``;
- CUDA: ``aten._scaled_dot_product_flash_attention`` (half precision, no mask,
  head size a multiple of 8 up to 256) or else
  ``aten._scaled_dot_product_efficient_attention`` with ``compute_log_sumexp``
  (any float dtype, an additive mask; see :func:`cuda_lse_op`).

The weights of a call are then the softmax of the logits ``scale * q k^T + bias``
recomputed in a second pass (no softmax is materialized in the forward), normalized
over those logits themselves: shifted by their own row maximum and divided by their
own row sum. The kernel's lse is not their shift: it comes from another computation
of the same logits, whose rounding grows with the logits (about ``|lse| * eps``), so
``exp(s - lse)`` is off by that much in every entry (entries above 1 and rows that
do not sum to 1 at large logits). The kernel's lse only marks the rows that use a
non-finite input (NaN). Returned weights are differentiable: their backward is the
softmax backward, recomputed from the logits, so it can be differentiated again.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ... import _host, _lse
from ..._autocast import backward_without_autocast
from ..._inputs import AttentionInputs
from ...kernels.softmax import exp_rows_
from .._common import all_finite, clean_rows, masked_softmax

__all__ = [
    "LSE_OP",
    "cuda_lse_op",
    "has_lse_kernel",
    "logits_of_call",
    "lse_call",
    "lse_of_logits",
    "softmax_rows_",
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


def has_lse_kernel(device: torch.device, dtype: torch.dtype) -> bool:
    """True when SDPA can also give the log-sum-exp on this device, for this dtype."""
    if device.type == "cpu":
        return LSE_OP is not None
    if device.type == "cuda":
        return cuda_lse_op(dtype, 8, has_mask=True, square=True) is not None or (
            cuda_lse_op(dtype, 8, has_mask=False, square=True) is not None
        )
    return False


def cuda_lse_op(
    dtype: torch.dtype, head_size: int, has_mask: bool, square: bool = True
) -> str | None:
    """Which CUDA op returns the lse of a call: "flash", "efficient" or None (none can).

    Flash takes half precision with no mask and a head size that is a multiple of 8
    up to 256; the efficient kernel takes float32 too and an additive mask. Head sizes
    are zero-padded to a multiple of 8 before the call (:func:`lse_call`). ``square``:
    False for a causal call with L != S, which flash would align to the bottom-right
    corner (FlashAttention-2's convention) where attnkit's is top-left, as the
    efficient kernel's.
    """
    padded = -(-head_size // 8) * 8
    if (
        CUDA_FLASH_OP is not None
        and dtype in _FLASH_DTYPES
        and not has_mask
        and padded <= 256
        and square
    ):
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
    choice = cuda_lse_op(q.dtype, q.shape[-1], bias is not None, square=not is_causal or L == S)
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


class _RowSoftmax(torch.autograd.Function):
    """weights = softmax(logits) over each row, with the softmax backward.

    logits (..., L, S) with -inf where blocked; nan_rows (..., L) bool, rows whose
    weights are NaN (they use a non-finite input) and that pass no gradient.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, nan_rows: torch.Tensor) -> torch.Tensor:
        weights = softmax_rows_(logits.contiguous().clone(), nan_rows)  # (..., L, S)
        ctx.save_for_backward(weights, logits, nan_rows)
        return weights

    @staticmethod
    @backward_without_autocast
    def backward(ctx: Any, d_weights: torch.Tensor) -> tuple[torch.Tensor, None]:
        weights, logits, nan_rows = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: weights as a function of the logits
            weights = masked_softmax(logits)[0]  # (..., L, S)
        row = (d_weights * weights).sum(dim=-1, keepdim=True)  # (..., L, 1)
        grad = weights * (d_weights - row)  # (..., L, S)
        # a NaN row (it uses a non-finite input; its weights are NaN) passes no gradient,
        # so a NaN never reaches the pairs it does not use (a row of padding that a
        # caller drops has d_weights 0, and NaN * 0 is NaN)
        return torch.where(nan_rows.unsqueeze(-1), 0.0, grad), None


def softmax_rows_(logits: torch.Tensor, nan_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Replace logits (..., L, S) by their softmax over each row, in place; return them.

    Three passes over (L, S): the row maximum, ``exp(s - max)`` with its row sums, the
    division by them. Every entry is at most 1 and every row that keeps a key sums to 1
    to float rounding, whatever the logits' magnitude; a row of -inf (fully masked)
    gives 0. ``nan_rows`` (..., L), None or bool: rows made NaN (as a NaN shift does).
    """
    m = logits.amax(dim=-1)  # (..., L)
    shift = _lse.safe_max(m)  # a fully masked row: 0, its exp stays 0
    if nan_rows is not None:
        shift = torch.where(nan_rows, float("nan"), shift)
    sums = exp_rows_(logits, shift, want_sum=True)  # (..., L)
    return _lse.normalize_rows_(logits, sums)


def weights_from_lse(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Exact weights (..., L, S): the softmax of the masked logits (..., L, S).

    ``lse`` (..., L) is the kernel's, from the same logits computed its own way: not
    used as the shift (see the module docstring), only its NaN rows, whose weights are
    NaN (they use a non-finite input)."""
    nan_rows = torch.isnan(lse)  # (..., L)
    if torch.is_grad_enabled() and logits.requires_grad:
        return _RowSoftmax.apply(logits, nan_rows)
    return softmax_rows_(logits.contiguous(), nan_rows)


def lse_of_logits(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """The lse (..., L) of masked logits (..., L, S), differentiable, its gradient the
    softmax normalized by its own row sums: ``m + log(sum_j exp(s_j - m))`` with the row
    maximum m held constant (its derivative, ``1 - sum_j p_j``, is 0).

    ``lse`` (..., L) is the kernel's: rows where it is -inf (no key) or NaN (a non-finite
    input) keep it and pass no gradient. (The kernel's own backward forms
    ``exp(s - lse)``, off by about ``|lse| * eps`` in every entry at large logits.)
    """
    dead = (torch.isneginf(lse) | torch.isnan(lse)).to(logits.device)  # (..., L)
    s = logits.masked_fill(dead.unsqueeze(-1), 0.0)  # (..., L, S)
    m = _lse.safe_max(s.detach().amax(dim=-1, keepdim=True))  # (..., L, 1)
    own = m.squeeze(-1) + torch.exp(s - m).sum(dim=-1).log()  # (..., L)
    return torch.where(dead, lse.to(own.dtype), own)


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
    """Exact weights (..., L, S) of one SDPA call: the softmax of its logits, recomputed.

    q (..., L, E'), k (..., S, E') as given to the call (k with its own heads when
    ``gqa``), lse (..., L); ``attn_mask``/``is_causal`` exactly as the call had them,
    ``alive`` (..., L, 1) marking rows that keep at least one key.
    """
    logits = logits_of_call(
        inputs, q, k, attn_mask=attn_mask, is_causal=is_causal, gqa=gqa, alive=alive
    )
    return weights_from_lse(logits, lse.to(inputs.compute_dtype))


def logits_of_call(
    inputs: AttentionInputs,
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    gqa: bool,
    alive: torch.Tensor | None = None,
) -> torch.Tensor:
    """The masked logits (..., L, S) of one SDPA call, recomputed (-inf where blocked);
    arguments as :func:`weights_of_call`'s."""
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
    return logits
