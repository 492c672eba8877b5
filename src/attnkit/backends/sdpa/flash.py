"""torch's fused CPU flash kernel and its backward, as one lean autograd Function.

A call that needs gradients used to run torch's public SDPA inside a wrapper that
rebuilt an inner graph and took a nested ``autograd.grad`` in the backward (so that
the backward could itself be differentiated). :func:`flash_attention` calls the two
fused ops directly instead: the forward op returns the output and the lse, which are
saved; the backward op takes them. A backward that autograd records
(``create_graph=True``) recomputes the call with differentiable operations
(:func:`.grad.math_attention`), so double backward still works.

CPU only (the ops are private and feature-detected), no dropout, and a mask that needs
no gradient (the backward op gives none for it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._common import expand_kv, unit_stride
from .lse import LSE_OP, _aten_op

__all__ = ["FLASH_BACKWARD_OP", "can_flash", "flash_attention"]

FLASH_BACKWARD_OP = _aten_op("_scaled_dot_product_flash_attention_for_cpu_backward")


def can_flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None
) -> bool:
    """True when :func:`flash_attention` takes this call: the CPU ops exist, 4-D inputs of
    one head size, a mask that needs no gradient."""
    return (
        LSE_OP is not None
        and FLASH_BACKWARD_OP is not None
        and q.device.type == "cpu"
        and q.ndim == 4
        and q.shape[-1] == v.shape[-1]
        and (attn_mask is None or not attn_mask.requires_grad)
        and not torch.compiler.is_compiling()
    )


def _mask4(mask: torch.Tensor | None, q: torch.Tensor, S: int) -> torch.Tensor | None:
    """SDPA's mask as the ops take it: additive in q's dtype, (B, H, L, S), contiguous."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.where(mask, torch.zeros((), dtype=q.dtype), float("-inf"))
    return mask.to(q.dtype).expand(*q.shape[:3], S).contiguous()  # (B, H, L, S)


class _Flash(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
        scale: float,
        recompute: Callable[..., torch.Tensor],
    ) -> torch.Tensor:
        groups = q.shape[1] // k.shape[1]
        ke, ve = expand_kv(k, groups), expand_kv(v, groups)  # (B, H, S, D)
        mask = _mask4(attn_mask, q, k.shape[2])
        qc, kc, vc = unit_stride(q), unit_stride(ke), unit_stride(ve)
        out, lse = LSE_OP(qc, kc, vc, 0.0, is_causal, attn_mask=mask, scale=scale)[:2]
        ctx.save_for_backward(q, k, v, attn_mask, out, lse)
        ctx.is_causal, ctx.scale, ctx.groups, ctx.recompute = is_causal, scale, groups, recompute
        return out

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, attn_mask, out, lse = ctx.saved_tensors
        wants = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # create_graph=True: differentiate a recomputation
            again = ctx.recompute(q, k, v, attn_mask)
            src = [t for t, w in zip((q, k, v), wants, strict=True) if w]
            got = iter(torch.autograd.grad(again, src, d_out, create_graph=True))
            return (*(next(got) if w else None for w in wants), None, None, None, None)
        g = ctx.groups
        mask = _mask4(attn_mask, q, k.shape[2])
        ke, ve = unit_stride(expand_kv(k, g)), unit_stride(expand_kv(v, g))
        dq, dk, dv = FLASH_BACKWARD_OP(
            d_out.contiguous(), unit_stride(q), ke, ve, out, lse, 0.0, ctx.is_causal,
            attn_mask=mask, scale=ctx.scale,
        )  # fmt: skip
        if g > 1:  # query heads j*g .. j*g+g-1 share key head j
            dk = dk.unflatten(1, (-1, g)).sum(2)  # (B, Hk, S, D)
            dv = dv.unflatten(1, (-1, g)).sum(2)  # (B, Hk, S, D)
        return dq, dk, dv, None, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    *,
    is_causal: bool,
    scale: float,
    recompute: Callable[..., torch.Tensor],
) -> torch.Tensor:
    """out (B, H, L, D) of q (B, H, L, D), k and v (B, Hk, S, D) (Hk divides H), with
    torch's fused forward and backward ops; ``recompute(q, k, v, attn_mask)`` gives the
    same output with differentiable operations, for double backward."""
    out: torch.Tensor = _Flash.apply(q, k, v, attn_mask, is_causal, scale, recompute)
    return out
