"""torch's fused CPU flash kernel and its backward, as a call of the generic autograd Function.

A call that needs gradients used to run torch's public SDPA inside a wrapper that
rebuilt an inner graph and took a nested ``autograd.grad`` in the backward (so that
the backward could itself be differentiated). :func:`flash_attention` calls the two
fused ops directly instead: the forward op returns the output and the lse, which are
saved; the backward op takes them: a :class:`FlashCall` run by the generic
:class:`attnkit.backends.autograd.KernelFunction`. A backward that autograd records
(``create_graph=True``) recomputes the call with differentiable operations
(:func:`.grad.math_attention`), so double backward still works.

CPU only (the ops are private and feature-detected), no dropout, and a mask that needs
no gradient (the backward op gives none for it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .._common import expand_kv, unit_stride
from ..autograd import Grads, KernelFunction
from ..records import OutputGrads
from .lse import LSE_OP, _aten_op

__all__ = ["FLASH_BACKWARD_OP", "FlashCall", "can_flash", "flash_attention"]

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
    """SDPA's mask as the ops take it: additive in q's dtype, 4-D, each dim the call's
    (B, H, L, S) or 1. The ops read a dim of size 1 with stride 0, so a key mask
    (B, 1, 1, S) stays that size instead of becoming an (L, S) copy per head."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.where(mask, torch.zeros((), dtype=q.dtype), float("-inf"))
    mask = mask.to(q.dtype)
    lead = max(mask.ndim - 4, 0)  # extra leading dims broadcast to the call's: all 1
    mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape[lead:]))  # (b, h, l, s)
    return mask if mask.shape[-1] == 1 or mask.stride(-1) == 1 else mask.contiguous()


@dataclass(frozen=True)
class FlashCall:
    """torch's fused CPU flash ops as a :class:`attnkit.backends.autograd.KernelCall`.

    Operands: q (B, H, L, D), k and v (B, Hk, S, D) (Hk divides H), attn_mask None or
    SDPA's mask (no gradient). ``recompute(q, k, v, attn_mask)`` gives the output with
    differentiable operations, for double backward.
    """

    is_causal: bool
    scale: float
    groups: int
    recompute: Callable[..., torch.Tensor]

    def forward(
        self, operands: Sequence[torch.Tensor | None], want_weights: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        q, k, v, attn_mask = operands
        assert q is not None and k is not None and v is not None
        ke, ve = expand_kv(k, self.groups), expand_kv(v, self.groups)  # (B, H, S, D)
        mask = _mask4(attn_mask, q, k.shape[2])
        qc, kc, vc = unit_stride(q), unit_stride(ke), unit_stride(ve)
        out, lse = LSE_OP(qc, kc, vc, 0.0, self.is_causal, attn_mask=mask, scale=self.scale)[:2]
        return out, lse, None

    def backward(self, operands: Sequence[torch.Tensor | None], given: OutputGrads) -> Grads:
        """(dq, dk, dv, None) from the saved (out, lse). The lse is not handed out
        (:func:`flash_attention` returns the output), so no gradient reaches it."""
        q, k, v, attn_mask = operands
        assert q is not None and k is not None and v is not None
        g = self.groups
        mask = _mask4(attn_mask, q, k.shape[2])
        ke, ve = unit_stride(expand_kv(k, g)), unit_stride(expand_kv(v, g))
        dq, dk, dv = FLASH_BACKWARD_OP(
            given.grad_out, unit_stride(q), ke, ve, given.out, given.lse, 0.0, self.is_causal,
            attn_mask=mask, scale=self.scale,
        )  # fmt: skip
        if g > 1:  # query heads j*g .. j*g+g-1 share key head j
            dk = dk.unflatten(1, (-1, g)).sum(2)  # (B, Hk, S, D)
            dv = dv.unflatten(1, (-1, g)).sum(2)  # (B, Hk, S, D)
        return dq, dk, dv, None

    def differentiable_backward(
        self, operands: Sequence[torch.Tensor | None], given: OutputGrads
    ) -> Grads:
        """The gradients of a differentiable recomputation, with create_graph."""
        q, k, v, attn_mask = operands
        assert q is not None and k is not None and v is not None
        wants = [t.requires_grad for t in (q, k, v)]
        again = self.recompute(q, k, v, attn_mask)
        src = [t for t, w in zip((q, k, v), wants, strict=True) if w]
        got = iter(torch.autograd.grad(again, src, given.grad_out, create_graph=True))
        return (*(next(got) if w else None for w in wants), None)


def flash_attention(
    call: FlashCall,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
) -> torch.Tensor:
    """out (B, H, L, D) of q (B, H, L, D), k and v (B, Hk, S, D) (Hk divides H), with
    torch's fused forward and backward ops as ``call`` describes them (causal, scale,
    ``call.groups == H // Hk``, the differentiable recomputation for double backward)."""
    out, _, _ = KernelFunction.apply(call, False, q, k, v, attn_mask)
    return out
