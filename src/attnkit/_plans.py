"""Plans of plain calls: what validation and dispatch decided, reused by the next call.

Inside a model the same call repeats with new tensors of the same shapes. For a
*plain* call (output only, a named score, no mask or a tensor-free causal/window
mask, ``backend`` None or a name) everything :func:`attnkit._inputs.validate_inputs`
checks and everything dispatch decides depends only on what :func:`plan_key` puts
in the key: shapes, dtypes, devices, grad flags, the score's name, the mask's
parameters, scale, dropout_p, the backend argument, the ``use_backend`` choice of
this thread and :func:`attnkit._host.strict`. So the first such call is validated
and dispatched in full, and later ones skip both: :func:`lookup` returns the plan, whose ``runner`` (a
backend's shortcut, :meth:`Backend.plain_runner`) takes the tensors, or else
:meth:`CallPlan.inputs` builds the call record for the backend's ``forward``.

Anything else (tensor masks, score objects with parameters, the Gaussian score, whose
dot form or differences are chosen from the inputs' values, weights or lse, a
recording in progress, code being traced by torch.compile) takes the full path
every time. The cache is cleared when a backend is registered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import _host
from . import masks as _masks
from ._inputs import SCALE_READ_ABOVE, AttentionInputs
from .backends import dispatch
from .backends.base import Backend, PlainRunner

__all__ = ["CallPlan", "lookup", "plan_key", "remember"]

_PLANS: dict[tuple[object, ...], CallPlan] = {}
_PLANS_MAX = 256


_PLANNED = (
    "score",
    "scale",
    "dropout_p",
    "batch_shape",
    "L",
    "S",
    "E",
    "Ev",
    "groups",
    "check_finite",
)
"""The fields of :class:`AttentionInputs` a plan fixes (besides the flags, all off)."""


@dataclass(frozen=True, slots=True)
class CallPlan:
    """The validated, dispatched parts of a plain call (no tensors are held): the
    :data:`_PLANNED` fields of its record, the backend and the backend's shortcut."""

    fields: dict[str, Any]
    backend: Backend
    runner: PlainRunner | None

    def inputs(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: _masks.Mask | None,
    ) -> AttentionInputs:
        """The call record for new tensors of the planned shapes."""
        return AttentionInputs(
            query=query,
            key=key,
            value=value,
            mask=mask,
            return_weights=False,
            return_lse=False,
            weights_mean=False,
            **self.fields,
        )


def plan_key(
    query: object,
    key: object,
    value: object,
    score: object,
    mask: object,
    scale: object,
    dropout_p: object,
    backend: object,
    check_finite: object = True,
) -> tuple[object, ...] | None:
    """The plan key of a plain call's arguments, or None when the call is not plain.

    ``return_weights``/``return_lse`` are checked by the caller (both must be False).
    """
    if (
        torch.compiler.is_compiling()  # traced code takes the full path (no dict guards)
        or type(score) is not str
        or score == "gaussian"  # its form is chosen from the inputs' values (operands.py)
        or not (mask is None or isinstance(mask, _masks.Mask))
        or not (scale is None or type(scale) is float)  # (1 and True would share a key)
        or (scale is not None and scale > SCALE_READ_ABOVE)  # checked against each call's values
        or type(dropout_p) is not float
        or not (backend is None or type(backend) is str)
        or type(check_finite) is not bool
        or not (
            type(query) is torch.Tensor
            and type(key) is torch.Tensor
            and type(value) is torch.Tensor
        )
        # dense strided only: a sparse or MKL-DNN tensor has the shape of a dense one;
        # it takes the full path, whose validation refuses it (a nested tensor of the
        # strided layout has no shape: reading it raises, below)
        or query.layout is not torch.strided
        or key.layout is not torch.strided
        or value.layout is not torch.strided
    ):
        return None
    mask_key: tuple[object, ...] | None = None
    if mask is not None:
        mask_key = mask.static_key()  # a Mask, checked above
        if mask_key is None:
            return None  # the mask holds data, read by each call
    try:
        shapes = (query.shape, key.shape, value.shape)
    except RuntimeError:  # a nested tensor (strided layout): the full path names it
        return None
    return (
        *shapes,
        query.dtype,
        key.dtype,
        value.dtype,
        query.device,
        key.device,
        value.device,
        torch.is_grad_enabled(),
        query.requires_grad,
        key.requires_grad,
        value.requires_grad,
        score,
        mask_key,
        scale,
        dropout_p,
        backend,
        dispatch.forced_backends(),
        _host.strict(),
        check_finite,
    )


def lookup(key: tuple[object, ...]) -> CallPlan | None:
    """The plan stored under ``key``, or None."""
    return _PLANS.get(key)


def remember(key: tuple[object, ...], inputs: AttentionInputs, backend: Backend) -> None:
    """Store the plan of a call that was just validated and dispatched in full."""
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = CallPlan(
        fields={name: getattr(inputs, name) for name in _PLANNED},
        backend=backend,
        runner=backend.plain_runner(inputs),
    )


dispatch.on_registry_change(_PLANS.clear)
