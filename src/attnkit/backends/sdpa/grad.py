"""The fused call with a backward that is itself differentiable (double backward).

torch's fused CPU kernel has a backward that cannot be differentiated again
("derivative for ..._backward is not implemented"), so ``gradgradcheck``, gradient
penalties or Hessian-vector products fail through it. :func:`fused_twice_differentiable`
wraps one fused call in an autograd Function:

- the forward runs the fused kernel and keeps its own graph;
- the backward, in an ordinary backward pass, is the fused kernel's backward
  (taken from that graph: no recomputation);
- the backward, when autograd records it (``create_graph=True``), recomputes the
  call from its inputs with differentiable operations (scores, masked softmax,
  weighted sum) and differentiates that, so every higher derivative exists.

Used only when an input requires a gradient outside torch.compile (which traces
the fused call itself) and without dropout (whose mask a recomputation could not
replay).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._common import expand_kv, masked_softmax

__all__ = ["fused_twice_differentiable", "math_attention"]

FusedCall = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    tuple[torch.Tensor, torch.Tensor | None],
]


def math_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    *,
    is_causal: bool,
    scale: float,
    groups: int,
) -> torch.Tensor:
    """The fused call's output (..., L, Ev) written out with differentiable operations.

    q (..., L, E), k (..., S, E), v (..., S, Ev) (k and v with ``Hq / groups`` heads),
    attn_mask None or (..., L or 1, S) bool (True keeps) or float (added to the scores).
    """
    k, v = expand_kv(k, groups), expand_kv(v, groups)  # (..., Hq, S, D)
    logits = torch.matmul(q * scale, k.transpose(-2, -1))  # (..., L, S)
    L, S = logits.shape[-2], logits.shape[-1]
    if is_causal:
        tri = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()  # (L, S)
        logits = logits.masked_fill(~tri, float("-inf"))
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        logits = logits.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        logits = (logits + attn_mask.to(logits.dtype)).masked_fill(
            attn_mask == float("-inf"), float("-inf")
        )
    weights, _ = masked_softmax(logits)
    return torch.matmul(weights, v.to(weights.dtype))  # (..., L, Ev)


class _TwiceDifferentiable(torch.autograd.Function):
    """out, lse = run(q, k, v, mask), with the backward described in the module."""

    @staticmethod
    def forward(
        ctx: Any,
        run: FusedCall,
        math: Callable[..., torch.Tensor],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        leaves = [
            None if t is None else t.detach().requires_grad_(t.requires_grad)
            for t in (q, k, v, attn_mask)
        ]
        with torch.enable_grad():
            out, lse = run(*leaves)  # type: ignore[arg-type]
        ctx.inner = (leaves, out)
        ctx.math = math
        ctx.save_for_backward(q, k, v, attn_mask)
        if lse is not None:
            lse = lse.detach()
            ctx.mark_non_differentiable(lse)
        return out.detach(), lse

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor, _d_lse: torch.Tensor | None) -> tuple[Any, ...]:
        q, k, v, attn_mask = ctx.saved_tensors
        wants = ctx.needs_input_grad[2:]
        if torch.is_grad_enabled():  # create_graph=True: differentiable recomputation
            out = ctx.math(q, k, v, attn_mask)
            sources = [t for t, w in zip((q, k, v, attn_mask), wants, strict=True) if w]
            grads = iter(torch.autograd.grad(out, sources, d_out, create_graph=True))
        else:
            leaves, out = ctx.inner
            sources = [t for t, w in zip(leaves, wants, strict=True) if w]
            grads = iter(torch.autograd.grad(out, sources, d_out, retain_graph=True))
        return (None, None, *(next(grads) if w else None for w in wants))


def fused_twice_differentiable(
    run: FusedCall,
    math: Callable[..., torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``run(q, k, v, attn_mask)`` -> (out, lse or None), differentiable to any order.

    ``math(q, k, v, attn_mask)`` must compute the same output with differentiable
    operations (see :func:`math_attention`); the lse is returned without a gradient.
    """
    out, lse = _TwiceDifferentiable.apply(run, math, q, k, v, attn_mask)
    return out, lse
