"""One SDPA call on equal leading dims: 4-D views, equal head sizes, the lse op.

torch's fused CPU kernels take 4-D inputs with one head size; anything else runs
torch's plain math. So inputs are viewed as 4-D, unequal query and value head
sizes are zero-padded to one size (zeros are free in the products), and the lse
op gets contiguous tensors, as the public entry point would give it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._common import expand_kv
from .lse import LSE_OP

__all__ = ["HAS_GQA", "call", "to4d"]

HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")  # torch >= 2.5


def to4d(t: torch.Tensor) -> torch.Tensor:
    """(..., N, D) -> (B', H, N, D) for the 4-D flash op."""
    if t.ndim == 4:
        return t
    if t.ndim < 4:
        return t.reshape(*([1] * (4 - t.ndim)), *t.shape)  # (1.., H, N, D)
    return t.reshape(-1, *t.shape[-3:])  # (B', H, N, D)


def call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    scale: float,
    gqa: bool,
    want_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SDPA on equal leading dims: out (..., L, Ev) and, with ``want_lse``, lse (..., L)."""
    E, Ev = q.shape[-1], v.shape[-1]
    if E != Ev:  # the fused CPU kernels need one head size (else: plain math); zeros are free
        if E > Ev:
            v = F.pad(v, (0, E - Ev))  # (..., S, E)
        else:
            q, k = F.pad(q, (0, Ev - E)), F.pad(k, (0, Ev - E))  # (..., L or S, Ev)
        out, lse = call(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                         scale=scale, gqa=gqa, want_lse=want_lse)  # fmt: skip
        return out[..., :Ev], lse
    mask_grad = attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled()
    if want_lse and (mask_grad or dropout_p > 0):
        # The lse kernel takes no gradient for attn_mask (a Gaussian key bias has one) and
        # no dropout: the output through the public path, the lse (of the logits before
        # dropout, never differentiated) apart.
        out, _ = call(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                       scale=scale, gqa=gqa, want_lse=False)  # fmt: skip
        with torch.no_grad():
            _, lse = call(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=0.0,
                           scale=scale, gqa=gqa, want_lse=True)  # fmt: skip
        return out, lse
    if want_lse and math.prod(q.shape[:-2]) == 0:
        # An empty batch: nothing to compute, and the lse op would divide by zero (SIGFPE).
        out, _ = call(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                       scale=scale, gqa=gqa, want_lse=False)  # fmt: skip
        return out, q.new_zeros(q.shape[:-1])  # (..., L): no rows
    if want_lse:
        if gqa:
            g = q.shape[-3] // k.shape[-3]
            k, v = expand_kv(k, g), expand_kv(v, g)  # (..., Hq, S, D)
        lead = q.shape[:-2]
        m4 = None
        if attn_mask is not None:
            full = attn_mask.expand(*lead, *attn_mask.shape[-2:])  # (..., L or 1, S)
            m4 = to4d(full)  # (B', H, L or 1, S)
            if m4.dtype == torch.bool:
                zero = torch.zeros((), dtype=q.dtype, device=q.device)
                m4 = torch.where(m4, zero, float("-inf"))  # (B', H, L or 1, S)
            else:
                m4 = m4.to(q.dtype)
        # The private op trusts its inputs' layout (permuted views give wrong results):
        # hand it contiguous tensors, as the public entry point would.
        q4, k4, v4 = (to4d(t).contiguous() for t in (q, k, v))  # (B', H, N, D)
        m4 = m4.contiguous() if m4 is not None else None
        out, lse = LSE_OP(q4, k4, v4, dropout_p, is_causal, attn_mask=m4, scale=scale)
        out = out.reshape(*lead, *out.shape[-2:])  # (..., L, Ev)
        return out, lse.reshape(*lead, lse.shape[-1])  # (..., L)
    kwargs = {"enable_gqa": True} if gqa else {}
    lead = q.shape[:-2]
    if q.ndim != 4:  # torch's fused CPU kernels take 4-D inputs only; others run plain math
        if attn_mask is not None and (q.ndim > 4 or attn_mask.ndim > q.ndim):
            attn_mask = to4d(attn_mask.expand(*lead, *attn_mask.shape[-2:]))  # (B', H, L, S)
        q, k, v = to4d(q), to4d(k), to4d(v)  # (B', H, N, D)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        **kwargs,
    )  # fmt: skip
    return out.reshape(*lead, *out.shape[-2:]), None  # (..., L, Ev)
