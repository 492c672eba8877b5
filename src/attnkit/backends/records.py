"""The records a backend hands back and takes: what a forward returns, what a backward needs.

This module sits at the bottom of ``backends/``: it imports no other module of it, so
every backend, the autograd wrappers (:mod:`.autograd`) and the context-parallel ring
import these records without reaching upward.

- :class:`AttentionResult`: a forward's (output, weights, lse).
- :class:`BackwardCall`: what a backward from (out, lse) needs: the call's inputs, the
  (out, lse) of the attention the call is a part of, their gradients, and the extra
  tensors (score parameters) to differentiate.
- :data:`InputGrads`: what a backward returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import torch

from .._inputs import AttentionInputs

__all__ = ["AttentionResult", "BackwardCall", "InputGrads"]


@dataclass(frozen=True)
class AttentionResult:
    """What every backend returns: output (..., L, Ev), weights (..., L, S) or None, lse (..., L) or None."""

    output: torch.Tensor
    weights: torch.Tensor | None = None
    lse: torch.Tensor | None = None


InputGrads: TypeAlias = tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor | None]]
"""(d query, d key, d value, [d param for each parameter asked for])."""


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
        out: (*batch, L, Ev) the output of the attention this call is a part of.
        lse: (*batch, L) its log-sum-exp (-inf for rows with no key anywhere).
        grad_out: like ``out``, the loss's gradient of it.
        grad_lse: like ``lse``, or None (no gradient reaches the lse).
        params: tensors the call's operands depend on (score parameters, a per-head
            scale) whose gradients are asked for too, in this order.
    """

    inputs: AttentionInputs
    out: torch.Tensor
    lse: torch.Tensor
    grad_out: torch.Tensor
    grad_lse: torch.Tensor | None = None
    params: Sequence[torch.Tensor] = ()
