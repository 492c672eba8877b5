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

A backend whose kernels return an lse that autograd does not differentiate (torch's
fused SDPA kernels return it through private ops) gets a differentiable (out, lse) from
:func:`differentiable_lse_forward`: :class:`BackendFunction` runs the forward under
``no_grad`` and its backward is the backend's own :meth:`~.base.Backend.backward` from
(out, lse), given a :class:`.records.BackwardCall`. Gradients reach the query, key,
value, the score's parameters and the modifiers' parameters (:func:`trainable`); a
backward that autograd records (``create_graph=True``) recomputes the call as
materialized math and differentiates that, so higher derivatives exist. The Function
keeps the output in the dtype the forward computed it in (float32 for half inputs run
upcast) and the cast to the inputs' dtype comes after it, so the backward's
``rowsum(d_out * out)`` is not taken from an output rounded to half.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import torch

from .._autocast import backward_without_autocast
from .._inputs import AttentionInputs
from ..scores import is_shared_score
from ._materialized import materialized_attention
from .base import Backend
from .records import AttentionResult, BackwardCall, OutputGrads

__all__ = [
    "BackendFunction",
    "KernelCall",
    "KernelFunction",
    "as_held",
    "differentiable_lse_forward",
    "held",
    "trainable",
]

Grads = tuple[torch.Tensor | None, ...]
_M = TypeVar("_M", bound=torch.nn.Module)


class KernelCall(Protocol):
    """One call of a backend's kernels on its operand tensors (some may be None)."""

    def forward(
        self, operands: Sequence[torch.Tensor | None], want_weights: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(out, lse, weights or None) of the lowered logits."""
        ...

    def backward(self, operands: Sequence[torch.Tensor | None], given: OutputGrads) -> Grads:
        """One gradient per operand (None for an absent one), from ``given`` (out, lse,
        weights or None, and their gradients, in the kernels' layout)."""
        ...

    def differentiable_backward(
        self, operands: Sequence[torch.Tensor | None], given: OutputGrads
    ) -> Grads:
        """The same gradients with create_graph (double backward): from ``given``'s
        gradients only (the output, lse and weights are recomputed)."""
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
    @backward_without_autocast
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
        given = OutputGrads(out, lse, d_out, d_lse, weights, d_weights)
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
            grads = call.differentiable_backward(_distinct(operands), given)
        else:
            grads = call.backward(operands, replace(given, grad_out=d_out.contiguous()))
        return (None, None, *grads)


def _distinct(tensors: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """One graph node per slot (a view of each tensor): the gradient of a tensor listed
    twice is its whole gradient, twice, so the same tensor passed as query, key and value
    got three times its gradient from a backward with create_graph."""
    return [None if t is None else t.view_as(t) for t in tensors]


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


def held(inputs: AttentionInputs) -> AttentionInputs:
    """The call with its score and modifiers as they are now: copies of the modules that
    hold the parameter and buffer tensors they hold at this moment, for a backward that
    runs later. A parameter swapped for the forward alone
    (``torch.func.functional_call``) is the one the backward differentiates; reading
    the modules again at backward time gave the gradients of the parameters restored
    after it."""
    score = inputs.score if is_shared_score(inputs.score) else as_held(inputs.score)
    return replace(inputs, score=score, mods=tuple(as_held(m) for m in inputs.mods))


def as_held(module: _M) -> _M:
    """A copy of ``module`` (and of its submodules) holding the parameter and buffer
    tensors it holds now: see :func:`held`."""
    clone = copy.copy(module)  # (a new __dict__ sharing its values)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    clone._modules = {n: None if m is None else as_held(m) for n, m in module._modules.items()}
    return clone


Run = Callable[[AttentionInputs], AttentionResult]
"""A backend's forward of validated inputs (with ``return_lse``)."""


class BackendFunction(torch.autograd.Function):
    """(backend, run, inputs, n, *tensors) -> (out, lse): ``run(inputs)`` without a graph,
    differentiated by ``backend.backward`` from (out, lse); ``tensors`` are the call's
    query, key, value and its first ``n - 3`` :func:`trainable` tensors."""

    @staticmethod
    def forward(
        ctx: Any,
        backend: Backend,
        run: Run,
        inputs: AttentionInputs,
        n: int,
        *tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            res = run(inputs)
        assert res.lse is not None
        ctx.backend, ctx.inputs, ctx.n = backend, held(inputs), n
        # (the parameters too: an in-place change before the backward raises, as in torch)
        ctx.save_for_backward(res.output, res.lse, *tensors[3:n])
        return res.output, res.lse

    @staticmethod
    @backward_without_autocast
    def backward(ctx: Any, d_out: torch.Tensor, d_lse: torch.Tensor) -> tuple[Any, ...]:
        inputs: AttentionInputs = ctx.inputs
        out, lse, *_params = ctx.saved_tensors  # (unpacked: torch checks their versions)
        if torch.is_grad_enabled():  # create_graph=True: a backward autograd can differentiate
            return (None, None, None, None, *_recomputed_grads(inputs, ctx.n, d_out, d_lse))
        call = BackwardCall(inputs, OutputGrads(out, lse, d_out, d_lse), trainable(inputs))
        dq, dk, dv, dps = ctx.backend.backward(call)
        grads = [dq, dk, dv, *dps]
        return (None, None, None, None, *grads[: ctx.n])


def _recomputed_grads(
    inputs: AttentionInputs, n: int, d_out: torch.Tensor, d_lse: torch.Tensor
) -> Grads:
    """The gradients of (out, lse) with a graph (double backward): the call recomputed as
    materialized math (:func:`._materialized.materialized_attention`) and differentiated,
    for the first ``n`` of the query, key, value and :func:`trainable` tensors (the
    backend's own backward has no second derivative: a Hessian through the lse was 0)."""
    q, k, v = _distinct([inputs.query, inputs.key, inputs.value])
    assert q is not None and k is not None and v is not None
    tensors = [q, k, v, *trainable(inputs)][:n]
    again = replace(inputs, query=q, key=k, value=v, return_lse=True, return_weights=False)
    res = materialized_attention(again)
    assert res.lse is not None
    lse = torch.where(torch.isfinite(res.lse), res.lse, 0.0)  # (*batch, L): no key, no share
    loss = (res.output * d_out.to(res.output.dtype)).sum() + (lse * d_lse.to(lse.dtype)).sum()
    grads = torch.autograd.grad(loss, tensors, create_graph=True, allow_unused=True)
    return tuple(
        g if g is not None else torch.zeros_like(t) for g, t in zip(grads, tensors, strict=True)
    )


def differentiable_lse_forward(
    backend: Backend, inputs: AttentionInputs, run: Run
) -> AttentionResult:
    """``backend.forward(inputs)`` with an output and an lse that autograd differentiates,
    ``run`` being the backend's forward that returns them unrounded (see the module
    docstring). Weights, when asked for too, come from a second, differentiable pass."""
    tensors = [inputs.query, inputs.key, inputs.value, *trainable(inputs)]
    plain = replace(inputs, return_weights=False, weights_mean=False)
    out, lse = BackendFunction.apply(backend, run, plain, len(tensors), *tensors)
    out = out.to(inputs.dtype)  # (a no-op unless the forward ran upcast)
    weights = None
    if inputs.return_weights:
        weights = backend.forward(replace(inputs, return_lse=False)).weights
    return AttentionResult(output=out, weights=weights, lse=lse)
