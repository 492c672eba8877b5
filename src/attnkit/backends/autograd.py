"""One autograd Function for every backend whose kernels run on lowered operands.

A backend's kernels see the call's score as operands (:mod:`.operands`, laid out as the
backend likes) and give back (out, lse, weights). Their backward needs only those
operands and (out, lse): probabilities are recomputed as ``exp(s - lse)``. A backend
describes one call as a :class:`KernelCall` and :class:`KernelFunction` wires it into
autograd: the forward saves the operands, the output and the lse (and the weights,
which the caller holds anyway), the backward asks the call for the operands'
gradients. Gradients reach the query, key and score parameters through the lowering,
which ran under autograd before the Function. The same ``KernelCall.backward`` serves
:meth:`attnkit.backends.base.Backend.backward`, e.g. for a context-parallel ring that
hands in the global (out, lse).

Double backward (``create_graph=True``): the call's ``differentiable_backward``
recomputes with differentiable operations; a call without one raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

__all__ = ["KernelCall", "KernelFunction"]

Grads = tuple[torch.Tensor | None, ...]


class KernelCall(Protocol):
    """One call of a backend's kernels on its operand tensors (some may be None)."""

    def forward(
        self, operands: Sequence[torch.Tensor | None], want_weights: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(out, lse, weights or None) of the lowered logits."""
        ...

    def backward(
        self,
        operands: Sequence[torch.Tensor | None],
        out: torch.Tensor,
        lse: torch.Tensor,
        d_out: torch.Tensor,
        d_lse: torch.Tensor | None,
        weights: torch.Tensor | None,
        d_weights: torch.Tensor | None,
    ) -> Grads:
        """One gradient per operand (None for an absent one), from (out, lse)."""
        ...

    def differentiable_backward(
        self,
        operands: Sequence[torch.Tensor | None],
        d_out: torch.Tensor,
        d_lse: torch.Tensor | None,
        d_weights: torch.Tensor | None,
    ) -> Grads:
        """The same gradients with create_graph (double backward)."""
        ...


class KernelFunction(torch.autograd.Function):
    """(call, want_weights, *operands) -> (out, lse, weights or None)."""

    @staticmethod
    def forward(
        ctx: Any, call: KernelCall, want_weights: bool, *operands: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        out, lse, weights = call.forward(operands, want_weights)
        ctx.call, ctx.n = call, len(operands)
        ctx.save_for_backward(*operands, out, lse, weights)
        return out, lse, weights

    @staticmethod
    def backward(
        ctx: Any,
        d_out: torch.Tensor | None,
        d_lse: torch.Tensor | None,
        d_weights: torch.Tensor | None,
    ) -> tuple[Any, ...]:
        saved = ctx.saved_tensors
        operands, (out, lse, weights) = saved[: ctx.n], saved[ctx.n :]
        if d_out is None:
            d_out = torch.zeros_like(out)
        call: KernelCall = ctx.call
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
            grads = call.differentiable_backward(operands, d_out, d_lse, d_weights)
        else:
            grads = call.backward(operands, out, lse, d_out.contiguous(), d_lse, weights, d_weights)
        return (None, None, *grads)
