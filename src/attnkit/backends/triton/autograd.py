"""The autograd Function around the kernels: forward saves the inputs, the output and
the lse; backward recomputes probabilities from the lse in the backward kernels.

Memory for training stays O((L + S)·E) per row: nothing of size L × S is saved
(except the weights, when the caller asked for them and holds them anyway).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ... import masks as _masks
from .launch import KernelCall
from .layout import reduce_grad

__all__ = ["TritonAttentionFunction"]


class TritonAttentionFunction(torch.autograd.Function):
    """(config, qa, ka, v, kb, w) -> (out, lse, weights or None).

    config: dict with ``scale``, ``mask``, ``batch_shape``, ``groups``, ``want_weights``,
    ``out_dtype`` and ``vbad`` (see :meth:`.launch.KernelCall.build`; v arrives with
    those rows zeroed). Shapes: qa (*Bq, L, E), ka (*Bk, S, E), v (*Bk, S, Ev), kb
    (*Bk, 1, S) pre-scaled or None, w (hidden,) or None (Additive). Returns out
    (*batch, L, Ev), lse (*batch, L) float32 (natural log, without the score's row
    constant) and weights (*batch, L, S) float32 or None.
    """

    @staticmethod
    def forward(
        ctx: Any,
        config: dict[str, Any],
        qa: torch.Tensor,
        ka: torch.Tensor,
        v: torch.Tensor,
        kb: torch.Tensor | None,
        w: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        call = _kernel_call(config, qa, ka, v, kb, w)
        batch, L = config["batch_shape"], call.L
        out4, lse3 = call.forward(config["out_dtype"])  # (B, H, L, Ev), (B, H, L)
        weights = call.weights(lse3, mean=False) if config["want_weights"] else None
        ctx.config = config
        ctx.has_kb, ctx.has_w = kb is not None, w is not None
        ctx.shapes = (qa.shape, ka.shape, v.shape, kb.shape if kb is not None else None)
        saved = [qa, ka, v, out4, lse3]
        saved += [kb] if kb is not None else []
        saved += [w] if w is not None else []
        saved += [weights] if weights is not None else []
        ctx.save_for_backward(*saved)
        out = out4.reshape(*batch, L, call.Ev)  # (*batch, L, Ev)
        lse = lse3.reshape(*batch, L)  # (*batch, L)
        if weights is not None:
            weights = weights.reshape(*batch, L, call.S)  # (*batch, L, S)
        return out, lse, weights

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any,
        d_out: torch.Tensor | None,
        d_lse: torch.Tensor | None,
        d_weights: torch.Tensor | None,
    ) -> tuple[Any, ...]:
        config = ctx.config
        saved = list(ctx.saved_tensors)
        qa, ka, v, out4, lse3 = saved[:5]
        rest = saved[5:]
        kb = rest.pop(0) if ctx.has_kb else None
        w = rest.pop(0) if ctx.has_w else None
        weights = rest.pop(0) if rest else None
        call = _kernel_call(config, qa, ka, v, kb, w)
        B, H = call.BH
        L, S = call.L, call.S
        if d_out is None:
            d_out = torch.zeros_like(out4)
        do4 = d_out.reshape(B, H, L, call.Ev)  # (B, H, L, Ev)
        delta = (do4.float() * out4.float()).sum(dim=-1)  # (B, H, L)
        if d_lse is not None:
            delta = delta - d_lse.reshape(B, H, L).float()
        dw4: torch.Tensor | None = None
        if d_weights is not None and weights is not None:
            dw4 = d_weights.reshape(B, H, L, S)  # (B, H, L, S)
            delta = delta + (dw4.float() * weights.reshape(B, H, L, S)).sum(dim=-1)
        dq, dk, dv, dkb, dw = call.backward(do4, lse3, delta, dw4)
        batch, groups = config["batch_shape"], config["groups"]
        q_shape, k_shape, v_shape, kb_shape = ctx.shapes
        grads: list[torch.Tensor | None] = [
            reduce_grad(dq, batch, 1, q_shape).to(qa.dtype),
            reduce_grad(dk, batch, groups, k_shape).to(ka.dtype),
            reduce_grad(dv, batch, groups, v_shape).to(v.dtype),
            reduce_grad(dkb, batch, groups, kb_shape).to(kb.dtype)
            if dkb is not None and kb is not None
            else None,
            dw.to(w.dtype) if dw is not None and w is not None else None,
        ]
        return (None, *grads)


def _kernel_call(
    config: dict[str, Any],
    qa: torch.Tensor,
    ka: torch.Tensor,
    v: torch.Tensor,
    kb: torch.Tensor | None,
    w: torch.Tensor | None,
) -> KernelCall:
    mask: _masks.Mask | None = config["mask"]
    return KernelCall.build(
        qa,
        ka,
        v,
        kb,
        w,
        scale=config["scale"],
        mask=mask,
        batch_shape=config["batch_shape"],
        groups=config["groups"],
        vbad=config.get("vbad"),
    )
