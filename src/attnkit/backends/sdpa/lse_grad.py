"""A differentiable lse from SDPA: the forward without a graph, the backward from (out, lse).

torch's fused kernels return the lse through private ops that autograd does not
differentiate. A call that needs the lse's gradient (``return_lse`` with gradients,
sinks, a context-parallel all-to-all) runs the forward under ``no_grad`` and wraps it
in an autograd Function whose backward is the backend's own backward from
(out, lse) (:mod:`.backward`: torch's fused flash backward, the lse's gradient riding
in one more value feature). Gradients reach the query, key, value, the score's
parameters and the modifiers' parameters. Once differentiable (no double backward).

The Function keeps the output in the dtype the forward computed it in (float32 for
half inputs run upcast) and the cast to the inputs' dtype comes after it, so the
backward's ``rowsum(d_out * out)`` is not taken from an output rounded to half.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch.autograd.function import once_differentiable

from ..._inputs import AttentionInputs
from ...scores import is_shared_score
from ..records import AttentionResult

if TYPE_CHECKING:
    from .backend import SDPABackend

__all__ = ["differentiable_lse_forward", "trainable"]


def trainable(inputs: AttentionInputs) -> list[torch.Tensor]:
    """Tensors besides q, k, v that need a gradient: score and modifier parameters and a
    per-head scale."""
    out: list[torch.Tensor] = []
    if not is_shared_score(inputs.score):
        out += [p for p in inputs.score.parameters() if p.requires_grad]
    for m in inputs.mods:
        out += [t for t in m.tensors() if t.requires_grad]
    if inputs.head_scale is not None and inputs.head_scale.requires_grad:
        out.append(inputs.head_scale)
    return out


class _WithLse(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, backend: SDPABackend, inputs: AttentionInputs, n: int, *tensors: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            res = backend.forward_unrounded(inputs)
        assert res.lse is not None
        ctx.backend, ctx.inputs, ctx.n = backend, inputs, n
        ctx.save_for_backward(res.output, res.lse)
        return res.output, res.lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, d_out: torch.Tensor, d_lse: torch.Tensor) -> tuple[Any, ...]:
        out, lse = ctx.saved_tensors
        inputs: AttentionInputs = ctx.inputs
        params = [t for t in trainable(inputs)]
        dq, dk, dv, dps = ctx.backend.backward(inputs, out, lse, d_out, d_lse, params)
        grads = [dq, dk, dv, *dps]
        return (None, None, None, *grads[: ctx.n])


def differentiable_lse_forward(backend: SDPABackend, inputs: AttentionInputs) -> AttentionResult:
    """``backend.forward(inputs)`` with an output and an lse that autograd differentiates.
    Weights, when asked for too, come from a second, differentiable pass."""
    tensors = [inputs.query, inputs.key, inputs.value, *trainable(inputs)]
    plain = replace(inputs, return_weights=False, weights_mean=False)
    out, lse = _WithLse.apply(backend, plain, len(tensors), *tensors)
    out = out.to(inputs.dtype)  # (a no-op unless the forward ran upcast)
    weights = None
    if inputs.return_weights:
        weights = backend.forward(replace(inputs, return_lse=False)).weights
    return AttentionResult(output=out, weights=weights, lse=lse)
