"""The dot form of a dot-reducible score as a tuple (kept for callers of the old name).

New code reads :func:`attnkit.backends.operands.lower_score`, the one lowering of scores.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._inputs import AttentionInputs
from .operands import lower_score

__all__ = ["DotForm", "clean_dot_form"]


class DotForm(NamedTuple):
    """q' (..., L, E'), k' (..., S, E'), key_bias None or (..., 1, S), row_constant None or
    (..., L), excluded None or (..., S) bool."""

    q: torch.Tensor
    k: torch.Tensor
    key_bias: torch.Tensor | None
    row_constant: torch.Tensor | None
    excluded: torch.Tensor | None


def clean_dot_form(inputs: AttentionInputs, *, row_constant: bool, upcast: bool) -> DotForm:
    """The call's dot form with its non-finite keys handled (see :func:`lower_score`)."""
    ops = lower_score(inputs, upcast=upcast, row_constant=row_constant)
    return DotForm(ops.q, ops.k, ops.key_bias, ops.row_constant, ops.excluded)
