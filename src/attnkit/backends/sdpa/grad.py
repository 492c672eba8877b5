"""The fused call with a backward that is itself differentiable (double backward).

torch's fused CPU kernel has a backward that cannot be differentiated again
("derivative for ..._backward is not implemented"), so ``gradgradcheck``, gradient
penalties or Hessian-vector products fail through it. :func:`fused_twice_differentiable`
runs one fused call as a :class:`TwiceDifferentiableCall` of the generic
:class:`attnkit.backends.autograd.KernelFunction`:

- the forward runs the fused kernel and keeps its own graph;
- the backward, in an ordinary backward pass, is the fused kernel's backward
  (taken from that graph: no recomputation);
- the backward, when autograd records it (``create_graph=True``), recomputes the
  call from its inputs with differentiable operations (scores, masked softmax,
  weighted sum) and differentiates that, so every higher derivative exists.

Used only when an input requires a gradient outside torch.compile (which traces
the fused call itself) and without dropout (whose mask a recomputation could not
replay).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .._common import expand_kv, masked_softmax
from ..autograd import Grads, KernelFunction
from ..records import OutputGrads

__all__ = ["TwiceDifferentiableCall", "fused_twice_differentiable", "math_attention"]

FusedCall = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    tuple[torch.Tensor, torch.Tensor | None],
]


def math_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    *,
    is_causal: bool,
    scale: float,
    groups: int,
) -> torch.Tensor:
    """The fused call's output (..., L, Ev) written out with differentiable operations.

    q (..., L, E), k (..., S, E), v (..., S, Ev) (k and v with ``Hq / groups`` heads),
    attn_mask None or (..., L or 1, S) bool (True keeps) or float (added to the scores).
    """
    k, v = expand_kv(k, groups), expand_kv(v, groups)  # (..., Hq, S, D)
    logits = torch.matmul(q * scale, k.transpose(-2, -1))  # (..., L, S)
    L, S = logits.shape[-2], logits.shape[-1]
    if is_causal:
        tri = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()  # (L, S)
        logits = logits.masked_fill(~tri, float("-inf"))
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        logits = logits.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        logits = (logits + attn_mask.to(logits.dtype)).masked_fill(
            attn_mask == float("-inf"), float("-inf")
        )
    weights, _ = masked_softmax(logits)
    return torch.matmul(weights, v.to(weights.dtype))  # (..., L, Ev)


@dataclass
class TwiceDifferentiableCall:
    """One fused call as a :class:`attnkit.backends.autograd.KernelCall` whose backward is
    itself differentiable (see the module docstring).

    Operands: q (..., L, E), k and v (..., S, E or Ev), attn_mask None or SDPA's mask (a
    float mask may require grad: a Gaussian key bias). ``run(q, k, v, attn_mask)`` ->
    (out, lse or None) is the fused call; ``math(q, k, v, attn_mask)`` the same output
    with differentiable operations (:func:`math_attention`). The lse is returned without
    a gradient reaching the operands.
    """

    run: FusedCall
    math: Callable[..., torch.Tensor]
    inner: tuple[list[torch.Tensor | None], torch.Tensor] | None = None
    """The forward's own graph: (its leaves, its output)."""

    def forward(
        self, operands: Sequence[torch.Tensor | None], want_weights: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        leaves = [
            None if t is None else t.detach().requires_grad_(t.requires_grad) for t in operands
        ]
        q, k, v, attn_mask = leaves
        assert q is not None and k is not None and v is not None
        # the inner graph keeps its own saved tensors (what the fused backward reads: the
        # inputs, output and lse, no L x S): an activation checkpoint around the call
        # (saved-tensor hooks) would otherwise replay it for a backward that the
        # checkpoint counts as its second (selective checkpointing refuses that). Only
        # under such hooks: hooks of its own cost the call about 60 µs.
        keep = _keep_saved() if _saved_tensor_hooks_on() else contextlib.nullcontext()
        with torch.enable_grad(), keep:
            out, lse = self.run(q, k, v, attn_mask)
        self.inner = (leaves, out)
        return out.detach(), None if lse is None else lse.detach(), None

    def backward(self, operands: Sequence[torch.Tensor | None], given: OutputGrads) -> Grads:
        """The fused kernel's backward, taken from the forward's graph (no recomputation)."""
        assert self.inner is not None
        leaves, out = self.inner
        return _grads(out, leaves, given.grad_out, create_graph=False)

    def differentiable_backward(
        self, operands: Sequence[torch.Tensor | None], given: OutputGrads
    ) -> Grads:
        """The gradients of a differentiable recomputation, with create_graph."""
        return _grads(self.math(*operands), operands, given.grad_out, create_graph=True)


def _keep(t: torch.Tensor) -> torch.Tensor:
    """A saved tensor, kept as it is (see :meth:`TwiceDifferentiableCall.forward`)."""
    return t


def _keep_saved() -> contextlib.AbstractContextManager[None]:
    return torch.autograd.graph.saved_tensors_hooks(_keep, _keep)


_top_hooks: Callable[[bool], object] | None = getattr(
    torch._C._autograd, "_top_saved_tensors_default_hooks", None
)


def _saved_tensor_hooks_on() -> bool:
    """Whether saved-tensor hooks (an activation checkpoint's) are on; True on a torch
    without the probe (2.6 has none)."""
    return _top_hooks is None or _top_hooks(False) is not None


def _grads(
    out: torch.Tensor,
    sources: Sequence[torch.Tensor | None],
    d_out: torch.Tensor,
    *,
    create_graph: bool,
) -> Grads:
    """The gradient of ``out`` (given ``d_out``) for each source that requires grad, None for
    the others."""
    wants = [t is not None and t.requires_grad for t in sources]
    src = [t for t, w in zip(sources, wants, strict=True) if w and t is not None]
    got = iter(torch.autograd.grad(out, src, d_out, retain_graph=True, create_graph=create_graph))
    return tuple(next(got) if w else None for w in wants)


def fused_twice_differentiable(
    run: FusedCall,
    math: Callable[..., torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``run(q, k, v, attn_mask)`` -> (out, lse or None), differentiable to any order.

    ``math(q, k, v, attn_mask)`` must compute the same output with differentiable
    operations (see :func:`math_attention`); the lse is returned without a gradient.
    """
    call = TwiceDifferentiableCall(run, math)
    out, lse, _ = KernelFunction.apply(call, False, q, k, v, attn_mask)
    return out, None if lse is None else lse.detach()
