"""The dot form of a dot-reducible score, computed in the call's compute dtype.

Half-precision inputs are upcast to float32 *before* the score's reduction, so
terms such as the Gaussian's ``-‖k‖²/2σ²`` are not rounded to half first. The
score's parameters are cast differentiably (their gradients stay in their own
dtype) by calling the score through :func:`torch.func.functional_call`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.func import functional_call

from .._host import readable
from .._inputs import AttentionInputs
from ..scores import Dot, Score
from ._common import all_finite, clean_keys, restore_nonfinite_keys

__all__ = ["DotForm", "clean_dot_form", "dot_form_in_compute_dtype"]


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


class DotForm(NamedTuple):
    """A call's score as a dot product: q' (..., L, E'), k' (..., S, E'), key_bias None or
    (..., 1, S), row_constant None or (..., L), and ``excluded`` None or (..., S) bool:
    keys infinitely far (Gaussian keys holding an inf), whose score is -inf by
    construction."""

    q: torch.Tensor
    k: torch.Tensor
    key_bias: torch.Tensor | None
    row_constant: torch.Tensor | None
    excluded: torch.Tensor | None


def clean_dot_form(inputs: AttentionInputs, *, row_constant: bool, upcast: bool) -> DotForm:
    """The call's dot form with its non-finite keys handled.

    A score's dot form may mix keys (the Gaussian centres on their mean), so unless the
    keys are known finite (read on the host for free) it gets them with non-finite rows
    zeroed, and :func:`restore_nonfinite_keys` puts those rows back after it. A score
    whose dot form passes the keys through (dot, scaled dot) needs none of this.

    ``upcast``: computed in the compute dtype (:func:`dot_form_in_compute_dtype`);
    else in the inputs' dtype.
    """
    score, key = inputs.score, inputs.key
    far: torch.Tensor | None = None
    nan_keys: torch.Tensor | None = None
    if type(score).dot_form is not Dot.dot_form and not (
        readable(key) and all_finite(key.detach())
    ):
        key, far, nan_keys = clean_keys(key)
    if upcast:
        q, k, kb, rc = dot_form_in_compute_dtype(inputs, row_constant=row_constant, key=key)
    else:
        q, k, kb = score.dot_form(inputs.query, key)
        rc = score.row_constant(inputs.query, key) if row_constant else None
    excluded: torch.Tensor | None = None
    if far is not None and nan_keys is not None:
        k, kb, excluded = restore_nonfinite_keys(k, kb, far, nan_keys)
    return DotForm(q, k, kb, rc, excluded)
