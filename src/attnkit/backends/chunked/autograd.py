"""The chunked backend's tiles as a kernel call: tiles forward, recompute in backward.

Run through the shared :class:`attnkit.backends.autograd.KernelFunction`, which saves
only the operands, the output and the lse (and the weights when they were asked for,
since the caller holds them anyway); the backward recomputes each tile's
probabilities as ``exp(s - lse)``, so training memory stays O((L + S)·E) per row.
Double backward (``create_graph=True``, e.g. gradient penalties or
``gradgradcheck``) recomputes the call with differentiable, materialized operations
instead, since the tiles are exponentiated in place, unseen by autograd.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..._host import batched_by_autograd
from ...blockplan import BlockPlan
from .._common import masked_softmax
from ..records import OutputGrads
from .tiles import Operands, backward_tiles, forward_tiles

__all__ = ["ChunkedCall"]


@dataclass(frozen=True)
class ChunkedCall:
    """The tiles of one call as a :class:`attnkit.backends.autograd.KernelCall`.

    Operands, rows flattened to N: (qa (N, L, Eq), ka (N, S, Eq), w (hidden,) or None,
    v (N, S, Ev), kb (N, 1, S) or None, pos (H, L + S - 1) or None); out (N, L, Ev),
    lse (N, L), weights (N, L, S). ``flags`` carries the other fields of
    :class:`Operands` (``bad_v``, ``nonfinite_qk``, ``layout``, ``softcaps``).
    ``low["lse"]`` (N, L): the forward's lse rounding (:func:`.tiles.lse_low`), which
    its backward uses with the lse it saved (a backward from a given lse has none).
    """

    plan: BlockPlan
    kind: str
    scale: float
    flags: dict[str, Any]
    low: dict[str, torch.Tensor] = field(default_factory=dict)

    def operands(self, t: Sequence[torch.Tensor | None]) -> Operands:
        qa, ka, w, v, kb, pos = t
        assert qa is not None and ka is not None and v is not None
        return Operands(kind=self.kind, qa=qa, ka=ka, w=w, v=v, kb=kb, scale=self.scale,
                        pos=pos, **self.flags)  # fmt: skip

    def forward(
        self, operands: Sequence[torch.Tensor | None], want_weights: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        ops = self.operands(operands)
        low = torch.zeros(ops.qa.shape[0], self.plan.L, dtype=ops.qa.dtype, device=ops.qa.device)
        self.low["lse"] = low  # (N, L)
        return forward_tiles(ops, self.plan, want_weights, low)

    def backward(
        self,
        operands: Sequence[torch.Tensor | None],
        given: OutputGrads,
        d_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, ...]:
        """Operand gradients from ``given`` (out (N, L, Ev), lse (N, L), weights (N, L, S)
        or None); ``d_rows`` (N, L) accumulates each row's sum of the logits' gradient,
        for a per-row constant of the logits (see ``backward_tiles``)."""
        if batched_by_autograd(given.grad_out):  # (its tiles index and read rows)
            raise RuntimeError(
                "attention: the chunked backend's backward cannot take batched gradients "
                "(torch.autograd.grad(..., is_grads_batched=True)); run the call on "
                "backend='reference', or take one gradient per cotangent"
            )
        ops = self.operands(operands)
        d_pos = torch.zeros_like(ops.pos) if ops.pos is not None else None
        with torch.no_grad():
            dqa, dka, dw, dv, dkb = backward_tiles(
                ops, self.plan, given, d_rows, d_pos, self.low.get("lse")
            )
        return dqa, dka, dw, dv, dkb, d_pos

    def differentiable_backward(
        self, operands: Sequence[torch.Tensor | None], given: OutputGrads
    ) -> tuple[torch.Tensor | None, ...]:
        return _differentiable_grads(self.operands(operands), self.plan, given)


def dense_logits(ops: Operands, plan: BlockPlan) -> torch.Tensor:
    """The call's masked logits (N, L, S), materialized with differentiable operations."""
    N, L, S = ops.qa.shape[0], plan.L, plan.S
    if ops.kind == "dot":
        s = torch.bmm(ops.qa, ops.ka.transpose(1, 2)) * ops.scale  # (N, L, S)
        if ops.kb is not None:
            s = s + ops.kb  # (N, 1, S) broadcast
    elif ops.kind == "distance":
        assert ops.w is not None
        d = ops.qa.unsqueeze(2) - ops.ka.unsqueeze(1)  # (N, L, S, E)
        s = (d * d).sum(-1) * ops.w * -ops.scale  # (N, L, S)
    else:
        assert ops.w is not None
        hidden = torch.tanh(ops.qa.unsqueeze(2) + ops.ka.unsqueeze(1))  # (N, L, S, h)
        s = (hidden @ ops.w) * ops.scale  # (N, L, S)
    dev = s.device
    if ops.pos is not None:
        idx = torch.arange(S, device=dev).view(1, S) - torch.arange(L, device=dev).view(L, 1)
        tile = ops.pos[:, idx + (L - 1)].to(s.dtype)  # (H, L, S)
        s = ops.layout.add_per_row(s, tile, 0)  # (N, L, S)
    for cap in ops.softcaps:
        s = torch.tanh(s / cap) * cap
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
    ops: Operands, plan: BlockPlan, given: OutputGrads
) -> tuple[torch.Tensor | None, ...]:
    """(dqa, dka, dw, dv, dkb, dpos) of the materialized computation, with create_graph.

    Recomputed from the saved tensors themselves, so the gradients stay connected to
    the graph that produced them (second derivatives flow back through it).
    """
    d_out, d_lse, d_weights = given.grad_out, given.grad_lse, given.grad_weights
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
        inputs = (ops.qa, ops.ka, ops.w, ops.v, ops.kb, ops.pos)
        wanted = [t for t in inputs if t is not None and t.requires_grad]
        got = iter(
            torch.autograd.grad(outs, wanted, grads_in, create_graph=True, allow_unused=True)
        )
    return tuple(next(got) if t is not None and t.requires_grad else None for t in inputs)
