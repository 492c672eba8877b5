"""The dot form of a dot-reducible score, computed in the call's compute dtype.

Half-precision inputs are upcast to float32 *before* the score's reduction, so
terms such as the Gaussian's ``-‖k‖²/2σ²`` are not rounded to half first. The
score's parameters are cast differentiably (their gradients stay in their own
dtype) by calling the score through :func:`torch.func.functional_call`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from .._inputs import AttentionInputs
from ..scores import Score

__all__ = ["dot_form_in_compute_dtype"]


class _DotForm(nn.Module):
    """Calls ``score.dot_form`` and ``score.row_constant`` as one forward."""

    def __init__(self, score: Score) -> None:
        super().__init__()
        self.score = score

    def forward(
        self, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        qd, kd, key_bias = self.score.dot_form(q, k)
        return qd, kd, key_bias, self.score.row_constant(q, k)


def dot_form_in_compute_dtype(
    inputs: AttentionInputs, *, row_constant: bool = True, key: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(q', k', key_bias, row_constant)`` of the call's score, in the compute dtype.

    Shapes: q' (..., L, E'), k' (..., S, E'), key_bias None or (..., 1, S),
    row_constant None or (..., L). ``row_constant=False`` skips computing it;
    ``key`` (..., S, E) replaces the call's keys (e.g. with non-finite rows cleaned).
    """
    score, cd = inputs.score, inputs.compute_dtype
    q, k = inputs.query.to(cd), (inputs.key if key is None else key).to(cd)
    params = dict(score.named_parameters())
    if params and any(p.dtype != cd for p in params.values()):
        cast = {f"score.{n}": p.to(cd) for n, p in params.items()}
        qd, kd, kb, rc = functional_call(_DotForm(score), cast, (q, k))
    else:
        qd, kd, kb = score.dot_form(q, k)
        rc = score.row_constant(q, k) if row_constant else None
    return qd, kd, kb, (rc if row_constant else None)
