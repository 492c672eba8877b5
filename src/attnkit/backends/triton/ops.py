"""The kernels as torch ops with autograd, so ``torch.compile`` traces a call as a few
graph nodes instead of breaking the graph.

- ``attnkit::triton_attention(q, k, v, kb, w, vbad, records, keep, bias, ints, scale,
  with_weights) -> (out, lse, weights)``: the forward kernel, and with ``with_weights``
  the per-head weights kernel (else ``weights`` is empty). Autograd: one call of the
  backward op from (out, lse, d_out, d_lse) and the weights' gradient if any.
- ``attnkit::triton_attention_backward(q, k, v, kb, w, records, keep, bias, ints, scale,
  out, lse, d_out, d_lse, d_weights, weights) -> (dq, dk, dv, dkb, dw)``: the backward
  kernels, free of autograd state, so any caller holding (out, lse) can use it (a ring
  of context-parallel blocks, a backend-agnostic backward); each gradient given is
  optional. Absent results (no key bias, no w_v) come back as empty tensors.
- ``attnkit::triton_attention_weights(q, k, kb, w, records, keep, bias, ints, scale, lse,
  mean) -> weights``: exact weights from the lse, per head or averaged over heads
  inside the kernel; no autograd (the backend uses it for calls without gradients).

Shapes are those of :class:`.launch.Operands`; ``records``/``keep``/``bias``/``ints``
are a :class:`.maskargs.PackedMask`. Where the installed torch has
``torch.library.triton_op`` and the kernels are compiled (not interpreted), the ops
are triton ops (their kernels visible to the compiler); otherwise ``custom_op``s with
fake implementations, opaque to the compiler. ``torch.library.custom_op`` needs
torch >= 2.4.
"""

from __future__ import annotations

from typing import Any

import torch

from ..._lse import normalize_rows_
from ...kernels._ops import schema_ready
from .launch import WRAP_KERNELS, Operands, run_backward, run_forward, run_weights
from .runtime import interpreting

__all__ = ["attention_backward", "attention_forward", "attention_weights", "uses_triton_op"]

Tensor = torch.Tensor


def uses_triton_op() -> bool:
    """True when the ops are ``torch.library.triton_op``s (compiled kernels, torch >= 2.6)."""
    lib = torch.library
    return hasattr(lib, "triton_op") and hasattr(lib, "wrap_triton") and not interpreting()


def _register(name: str, fn: Any) -> Any:
    if uses_triton_op():
        WRAP_KERNELS[0] = True
        return torch.library.triton_op(name, fn, mutates_args=())
    return torch.library.custom_op(name, schema_ready(fn), mutates_args=())


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kb: Tensor | None,
    w: Tensor | None,
    vbad: Tensor | None,
    records: Tensor,
    keep: Tensor | None,
    bias: Tensor | None,
    ints: list[int],
    scale: float,
    with_weights: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    op = Operands(q, k, v, kb, w, vbad, records, keep, bias, list(ints), scale)
    out, lse = run_forward(op)
    weights = q.new_empty(0)
    if with_weights:
        # exp(s - lse) sums to 1 only within |lse| * eps (the rounding of lse): divided
        # by its own row sums, so the backward's rowsum(dW * W) cancels its p * dW
        weights = normalize_rows_(run_weights(op, lse, mean=False))  # (B, H, L, S)
    return out, lse, weights


def _backward(
    q: Tensor,
    k: Tensor,
    v: Tensor | None,
    kb: Tensor | None,
    w: Tensor | None,
    records: Tensor,
    keep: Tensor | None,
    bias: Tensor | None,
    ints: list[int],
    scale: float,
    out: Tensor | None,
    lse: Tensor,
    d_out: Tensor | None,
    d_lse: Tensor | None,
    d_weights: Tensor | None,
    weights: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    op = Operands(q, k, v, kb, w, None, records, keep, bias, list(ints), scale)
    dq, dk, dv, dkb, dw = run_backward(op, out, lse, d_out, d_lse, d_weights, weights)
    return dq, dk, _or(dv if v is not None else None, q), _or(dkb, q), _or(dw, q)


def _weights(
    q: Tensor,
    k: Tensor,
    kb: Tensor | None,
    w: Tensor | None,
    records: Tensor,
    keep: Tensor | None,
    bias: Tensor | None,
    ints: list[int],
    scale: float,
    lse: Tensor,
    mean: bool,
) -> Tensor:
    op = Operands(q, k, None, kb, w, None, records, keep, bias, list(ints), scale)
    return run_weights(op, lse, mean=mean)


def _or(t: Tensor | None, like: Tensor) -> Tensor:
    """An absent gradient as an empty tensor (op outputs are tensors, none aliased)."""
    return t if t is not None else like.new_empty(0)


attention_forward = _register("attnkit::triton_attention", _forward)
attention_backward = _register("attnkit::triton_attention_backward", _backward)
attention_weights = _register("attnkit::triton_attention_weights", _weights)

if not uses_triton_op():

    @attention_forward.register_fake
    def _forward_fake(q: Tensor, k: Tensor, v: Tensor, *rest: Any) -> tuple[Tensor, Tensor, Tensor]:
        B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        out = v.new_empty(B, H, L, v.shape[3])  # (B, H, L, Ev)
        lse = q.new_empty(B, H, L, dtype=torch.float32)  # (B, H, L)
        weights = q.new_empty((B, H, L, S) if rest[-1] else (0,), dtype=torch.float32)
        return out, lse, weights

    @attention_backward.register_fake
    def _backward_fake(
        q: Tensor, k: Tensor, v: Tensor | None, kb: Tensor | None, w: Tensor | None, *rest: Any
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        return (
            torch.empty_like(q),  # (B, H, L, E)
            torch.empty_like(k),  # (B, Hk, S, E)
            torch.empty_like(v) if v is not None else q.new_empty(0),
            torch.empty_like(kb) if kb is not None else q.new_empty(0),
            torch.empty_like(w) if w is not None else q.new_empty(0),
        )

    @attention_weights.register_fake
    def _weights_fake(q: Tensor, k: Tensor, *rest: Any) -> Tensor:
        B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        mean = rest[-1]
        shape = (B, L, S) if mean else (B, H, L, S)
        return q.new_empty(shape, dtype=torch.float32)


def _forward_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    q, k, v, kb, w, _vbad, records, keep, bias, ints, scale, with_weights = inputs
    out, lse, weights = output
    ctx.save_for_backward(q, k, v, kb, w, records, keep, bias, out, lse, weights)
    ctx.ints, ctx.scale, ctx.with_weights = list(ints), scale, with_weights


def _forward_grad(
    ctx: Any, d_out: Tensor | None, d_lse: Tensor | None, d_weights: Tensor | None
) -> tuple[Any, ...]:
    q, k, v, kb, w, records, keep, bias, out, lse, weights = ctx.saved_tensors
    if not ctx.with_weights:
        d_weights = None
    dq, dk, dv, dkb, dw = attention_backward(
        q, k, v, kb, w, records, keep, bias, ctx.ints, ctx.scale, out, lse, d_out, d_lse,
        d_weights, weights if d_weights is not None else None,
    )  # fmt: skip
    return (
        dq,
        dk,
        dv,
        dkb if kb is not None else None,
        dw if w is not None else None,
        *(None,) * 7,
    )


attention_forward.register_autograd(_forward_grad, setup_context=_forward_setup)
