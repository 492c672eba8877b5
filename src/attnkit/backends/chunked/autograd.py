"""The chunked backend's autograd Function: tiles forward, recompute in backward.

The forward saves only the inputs, the output and the lse (and the weights when
they were asked for, since the caller holds them anyway); the backward recomputes
each tile's probabilities as ``exp(s - lse)``, so training memory stays
O((L + S)·E) per row. Double backward (``create_graph=True``, e.g. gradient
penalties or ``gradgradcheck``) recomputes the call with differentiable, materialized
operations instead, since the tiles are exponentiated in place, unseen by autograd.
"""

from __future__ import annotations

from typing import Any

import torch

from ...blockplan import BlockPlan
from .._common import masked_softmax
from .tiles import Operands, backward_tiles, forward_tiles

__all__ = ["ChunkedAttentionFunction"]


class ChunkedAttentionFunction(torch.autograd.Function):
    """(plan, kind, scale, want_weights, qa, ka, w, v, kb, flags) -> (out, lse, weights or None).

    ``flags`` carries the non-finite markers of :class:`Operands` (``bad_v``, ``nonfinite_qk``).

    Shapes (rows flattened to N): qa (N, L, Eq), ka (N, S, Eq), w (hidden,) or None,
    v (N, S, Ev), kb (N, 1, S) or None; out (N, L, Ev), lse (N, L), weights (N, L, S).
    """

    @staticmethod
    def forward(
        ctx: Any,
        plan: BlockPlan,
        kind: str,
        scale: float,
        want_weights: bool,
        qa: torch.Tensor,
        ka: torch.Tensor,
        w: torch.Tensor | None,
        v: torch.Tensor,
        kb: torch.Tensor | None,
        flags: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        ops = Operands(kind=kind, qa=qa, ka=ka, w=w, v=v, kb=kb, scale=scale, **flags)
        out, lse, weights = forward_tiles(ops, plan, want_weights)
        ctx.plan, ctx.kind, ctx.scale, ctx.flags = plan, kind, scale, flags
        ctx.has_w, ctx.has_kb, ctx.has_weights = w is not None, kb is not None, want_weights
        saved = [qa, ka, v, out, lse]
        saved += [w] if w is not None else []
        saved += [kb] if kb is not None else []
        saved += [weights] if weights is not None else []
        ctx.save_for_backward(*saved)
        return out, lse, weights

    @staticmethod
    def backward(
        ctx: Any,
        d_out: torch.Tensor | None,
        d_lse: torch.Tensor | None,
        d_weights: torch.Tensor | None,
    ) -> tuple[Any, ...]:
        saved = list(ctx.saved_tensors)
        qa, ka, v, out, lse = saved[:5]
        rest = saved[5:]
        w = rest.pop(0) if ctx.has_w else None
        kb = rest.pop(0) if ctx.has_kb else None
        weights = rest.pop(0) if ctx.has_weights else None
        if d_out is None:
            d_out = torch.zeros_like(out)
        ops = Operands(kind=ctx.kind, qa=qa, ka=ka, w=w, v=v, kb=kb, scale=ctx.scale, **ctx.flags)
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
            grads = _differentiable_grads(ops, ctx.plan, d_out, d_lse, d_weights)
            return (None, None, None, None, *grads, None)
        with torch.no_grad():
            dqa, dka, dw, dv, dkb = backward_tiles(
                ops, ctx.plan, out, lse, d_out.contiguous(), d_lse, weights, d_weights
            )
        return None, None, None, None, dqa, dka, dw, dv, dkb, None


def dense_logits(ops: Operands, plan: BlockPlan) -> torch.Tensor:
    """The call's masked logits (N, L, S), materialized with differentiable operations."""
    N, L, S = ops.qa.shape[0], plan.L, plan.S
    if ops.kind == "dot":
        s = torch.bmm(ops.qa, ops.ka.transpose(1, 2)) * ops.scale  # (N, L, S)
        if ops.kb is not None:
            s = s + ops.kb  # (N, 1, S) broadcast
    else:
        assert ops.w is not None
        hidden = torch.tanh(ops.qa.unsqueeze(2) + ops.ka.unsqueeze(1))  # (N, L, S, h)
        s = (hidden @ ops.w) * ops.scale  # (N, L, S)
    dev = s.device
    R = max(plan.R, 1)
    n = torch.arange(N, device=dev)
    b = (n // R).view(N, 1, 1)  # (N, 1, 1) batch element of each row
    h = (n % R).view(N, 1, 1)  # (N, 1, 1) row within it
    i = torch.arange(L, device=dev).view(1, L, 1)  # (1, L, 1)
    j = torch.arange(S, device=dev).view(1, 1, S)  # (1, 1, S)
    keep = plan.keep_fn()(b, h, i, j).expand(N, L, S)  # (N, L, S)
    for t in plan.biases:
        s = s + t.to(s.dtype).expand(*plan.batch_shape, L, S).reshape(N, L, S)
    return s.masked_fill(~keep, float("-inf"))


def _differentiable_grads(
    ops: Operands,
    plan: BlockPlan,
    d_out: torch.Tensor,
    d_lse: torch.Tensor | None,
    d_weights: torch.Tensor | None,
) -> tuple[torch.Tensor | None, ...]:
    """(dqa, dka, dw, dv, dkb) of the materialized computation, with create_graph.

    Recomputed from the saved tensors themselves, so the gradients stay connected to
    the graph that produced them (second derivatives flow back through it).
    """
    with torch.enable_grad():
        weights, lse = masked_softmax(dense_logits(ops, plan))  # (N, L, S), (N, L)
        out = weights @ ops.v  # (N, L, Ev)
        outs, grads_in = [out], [d_out]
        if d_lse is not None:
            outs.append(torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)))
            grads_in.append(d_lse)
        if d_weights is not None:
            outs.append(weights)
            grads_in.append(d_weights)
        inputs = (ops.qa, ops.ka, ops.w, ops.v, ops.kb)
        wanted = [t for t in inputs if t is not None and t.requires_grad]
        got = iter(
            torch.autograd.grad(outs, wanted, grads_in, create_graph=True, allow_unused=True)
        )
    return tuple(next(got) if t is not None and t.requires_grad else None for t in inputs)
