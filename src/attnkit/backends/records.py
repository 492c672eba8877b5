"""The records a backend hands back and takes: what a forward returns, what a backward needs.

This module sits at the bottom of ``backends/``: it imports no other module of it, so
every backend, the autograd wrappers (:mod:`.autograd`) and the context-parallel ring
import these records without reaching upward.

- :class:`AttentionResult`: a forward's (output, weights, lse).
- :class:`OutputGrads`: an attention's (out, lse) and their gradients, where a backward
  from (out, lse) starts (for a backend's call, and for its kernels' operands).
- :class:`BackwardCall`: what a backend's backward needs: the call's inputs, the
  :class:`OutputGrads` of the attention the call is a part of, and the extra tensors
  (score parameters) to differentiate.
- :data:`InputGrads`: what a backward returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import torch

from .._inputs import AttentionInputs

__all__ = ["AttentionResult", "BackwardCall", "InputGrads", "OutputGrads"]


@dataclass(frozen=True)
class AttentionResult:
    """What every backend returns: output (..., L, Ev), weights (..., L, S) or None, lse (..., L) or None."""

    output: torch.Tensor
    weights: torch.Tensor | None = None
    lse: torch.Tensor | None = None


InputGrads: TypeAlias = tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor | None]]
"""(d query, d key, d value, [d param for each parameter asked for])."""


@dataclass(frozen=True)
class OutputGrads:
    """The output an attention gave and the loss's gradients of it: what a backward from
    (out, lse) starts from, in the layout of whoever holds it (a call's (*batch, L, ...),
    a kernel's rows flattened to N).

    Attributes:
        out: (..., L, Ev) the attention's output.
        lse: (..., L) its log-sum-exp (-inf for rows with no key anywhere).
        grad_out: like ``out``, the loss's gradient of it.
        grad_lse: like ``lse``, or None (no gradient reaches the lse).
        weights: (..., L, S) the weights the forward returned, or None.
        grad_weights: like ``weights``, or None.
    """

    out: torch.Tensor
    lse: torch.Tensor
    grad_out: torch.Tensor
    grad_lse: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    grad_weights: torch.Tensor | None = None

    def rows(self, start: int, length: int) -> OutputGrads:
        """The same record for query rows ``start .. start + length - 1`` (dim -2 of the
        output, -1 of the lse); weights are not sliced (a part of the rows has none)."""
        assert self.weights is None and self.grad_weights is None
        return OutputGrads(
            self.out.narrow(-2, start, length),  # (..., length, Ev)
            self.lse.narrow(-1, start, length),  # (..., length)
            self.grad_out.narrow(-2, start, length),  # (..., length, Ev)
            None if self.grad_lse is None else self.grad_lse.narrow(-1, start, length),
        )


@dataclass(frozen=True)
class BackwardCall:
    """One backward from (out, lse): a call taken as one part of an attention.

    The part's gradients are those of the whole attention's loss through this call's
    logits, given the whole attention's output and log-sum-exp: e.g. one key block of a
    context-parallel ring, given the global (out, lse). For a whole call, its own
    (out, lse).

    Attributes:
        inputs: the call (query (..., L, E), key (..., S, Ek), value (..., S, Ev), score,
            mask, modifiers, scale).
        given: the attention's output (*batch, L, Ev) and lse (*batch, L) and their
            gradients (:class:`OutputGrads`; no weights).
        params: tensors the call's operands depend on (score parameters, a per-head
            scale) whose gradients are asked for too, in this order.
    """

    inputs: AttentionInputs
    given: OutputGrads
    params: Sequence[torch.Tensor] = ()
