"""The Triton backend class: capabilities, reasons, and a call turned into op operands."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ... import _torch_features as torch_features
from ..._far_rows import far_rows_at_risk
from ..._inputs import AttentionInputs
from ...scores import Additive, Dot
from .._backward import leaf_call, pull_back
from .._common import clean_values, unit_stride
from ..base import Backend
from ..operands import (
    DOT_FORM_GRAD_TERMS,
    ScoreOperands,
    dot_form_grads_at_risk,
    gaussian_dot_terms,
    lower_score,
)
from ..records import AttentionResult, BackwardCall, InputGrads
from .layout import bh_shape, bh_view, kv_lead
from .maskargs import pack_mask, plan_reason, spec_from_plan
from .runtime import arch_of, interpreting, missing_reason

__all__ = ["MAX_HEAD_DIM", "TritonBackend"]

MAX_HEAD_DIM = 256
"""Largest query/key and value feature size of the dot-form kernels (registers per tile)."""

MAX_GRID_ROWS = 65535
"""Most (batch × head) rows of a call: the kernels' grids put them on their second or
third axis, which CUDA holds to 65535 blocks (the first axis allows 2**31 - 1)."""


def _device_types() -> frozenset[str]:
    return frozenset({"cuda", "cpu"}) if interpreting() else frozenset({"cuda"})


class TritonBackend(Backend):
    """Fused FlashAttention-2-style Triton kernels, forward and backward, as torch ops.

    Dot-reducible scores run as ``q'·k' + key_bias`` (plus the per-query constant in
    lse), the Additive score as ``w_v · tanh(qa + ka)`` over the hidden dim in
    registers; every mask kind stays symbolic (see :mod:`.maskargs`). Runs on CUDA
    (tiles per architecture, sm_75 to sm_90), and on the CPU when
    ``TRITON_INTERPRET=1`` (Triton's interpreter, for tests). Traceable by
    ``torch.compile`` (the kernels are torch ops, see :mod:`.ops`).
    """

    name: ClassVar[str] = "triton"
    dtypes: ClassVar[frozenset[torch.dtype]] = frozenset(
        {torch.float16, torch.bfloat16, torch.float32}
    )
    device_types: ClassVar[frozenset[str]] = _device_types()
    fused: ClassVar[bool] = True
    supports_dropout: ClassVar[bool] = False
    averages_heads: ClassVar[bool] = True

    def __init__(self) -> None:
        # The interpreter may be switched on after this module was imported (tests):
        # each instance reads it when it is made.
        setattr(self, "device_types", _device_types())  # noqa: B010

    def is_available(self) -> str | None:
        return torch_features.missing("triton") or missing_reason()

    def not_supported_reasons(self, inputs: AttentionInputs) -> list[str]:
        reasons = super().not_supported_reasons(inputs)
        score = inputs.score
        if not score.dot_reducible and not isinstance(score, Additive):
            reasons.append(
                f"score {score.name!r} has no kernel form (dot-reducible scores and Additive)"
            )
        if score.dot_reducible and max(_dot_dims(inputs)) > MAX_HEAD_DIM:
            reasons.append(
                f"feature sizes {_dot_dims(inputs)} exceed {MAX_HEAD_DIM} (registers per tile)"
            )
        if dot_form_grads_at_risk(inputs):
            reasons.append(
                f"a Gaussian whose dot form has terms of {gaussian_dot_terms(inputs):.3g} "
                f"logits (beyond {DOT_FORM_GRAD_TERMS:g}) with a gradient of q, k or σ: the "
                "kernels' backward would round their row term at that size (chunked's "
                "tiles keep it)"
            )
        if far_rows_at_risk(inputs):
            reasons.append(
                "a bias row far from 0 for every key it keeps, with a gradient or head-mean "
                "weights: the kernels would take its weights from an lse that float32 "
                "rounds away"
            )
        if inputs.device.type == "cpu" and not interpreting():
            reasons.append("the CPU runs Triton kernels only under TRITON_INTERPRET=1")
        if inputs.device.type == "cuda":
            dims = max(_dot_dims(inputs)) if score.dot_reducible else inputs.Ev
            why = arch_reason(inputs.dtype, arch_of(inputs.device), dims, inputs.needs_grad)
            if why is not None:
                reasons.append(why)
        if inputs.mask_needs_grad:
            reasons.append("a mask tensor that requires grad (its gradient is L×S)")
        rows = math.prod(inputs.batch_shape)
        if rows > MAX_GRID_ROWS:
            reasons.append(
                f"{rows} (batch × head) rows: the kernels' grids put them on one axis, which "
                f"CUDA holds to {MAX_GRID_ROWS} blocks"
            )
        why = plan_reason(inputs.block_plan())
        if why is not None:
            reasons.append(why)
        return reasons

    def describe(self, inputs: AttentionInputs) -> str:
        if inputs.device.type == "cpu":
            where = "Triton interpreter (CPU)"
        else:
            arch = arch_of(inputs.device)
            where = f"Triton on CUDA sm_{arch}"
            if arch < 80:  # e.g. Triton 3.9: see `attnkit explain --gpu-targets`
                where += " (products may run on CUDA cores, not tensor cores, below sm_80)"
        if isinstance(inputs.score, Additive):
            return f"{where}: fused Additive tiles, tanh over the hidden dim in registers"
        return f"{where}: fused dot-form tiles, online softmax, backward from lse"

    def forward(self, inputs: AttentionInputs) -> AttentionResult:
        from . import ops

        batch, L, S = inputs.batch_shape, inputs.L, inputs.S
        k_ops = _kernel_operands(inputs)
        q4, k4, v4, kb3, w, vbad3, lowered = k_ops.tensors
        margs = k_ops.mask_args
        mean_only = inputs.return_weights and inputs.weights_mean and not inputs.needs_grad
        per_head = inputs.return_weights and not mean_only
        out4, lse3, w4 = ops.attention_forward(q4, k4, v4, kb3, w, vbad3, *margs, per_head)
        out = out4.reshape(*batch, L, inputs.Ev)  # (*batch, L, Ev)
        lse = lse3.reshape(*batch, L)  # (*batch, L)
        weights: torch.Tensor | None = None
        if per_head:
            weights = w4.reshape(*batch, L, S)  # (*batch, L, S)
            if inputs.weights_mean:
                weights = weights.mean(dim=-3)  # (*batch[:-1], L, S)
        elif mean_only:
            with torch.no_grad():
                mean = ops.attention_weights(q4, k4, kb3, w, *margs, lse3, True)  # (B, L, S)
            weights = mean.reshape(*batch[:-1], L, S)  # (..., L, S)
        lse_out: torch.Tensor | None = None
        if inputs.return_lse:
            lse_out = lowered.finish_lse(lse)  # (*batch, L)
        return AttentionResult(output=out, weights=weights, lse=lse_out)

    def backward(self, call: BackwardCall) -> InputGrads:
        """The backward kernels from a given (out, lse) (the backward op, no recomputation
        of the forward), then back through the score's lowering. A score with a per-query
        term (the Gaussian) gets one more feature of ones in q and k: the logits shift by
        the scale, the given lse with them, and that feature's query gradient is each
        row's sum of the logits' gradient, which the per-query term receives."""
        from . import ops

        inputs, given = call.inputs, call.given
        lse, grad_lse = given.lse, given.grad_lse
        batch, L = inputs.batch_shape, inputs.L
        B, H = bh_shape(batch)
        with torch.enable_grad():
            leaves, rec = leaf_call(inputs, return_lse=True)
            k_ops = _kernel_operands(rec, row_feature=True)
        q4, k4, v4, kb3, w, _, lowered = k_ops.tensors
        rows = lowered.row_constant is not None
        lse_l = lowered.lowered_lse(lse.detach().float()).reshape(B, H, L)  # (B, H, L)
        dead = torch.isneginf(lse_l)
        lse_l = torch.where(dead, torch.zeros((), dtype=lse_l.dtype), lse_l)
        if rows:
            lse_l = lse_l + inputs.scale  # every logit is one scale larger (the ones feature)
        d_out = given.grad_out.detach().to(inputs.dtype).reshape(B, H, L, -1)  # (B, H, L, Ev)
        d_out = d_out.masked_fill(dead.unsqueeze(-1), 0.0)
        d_lse = grad_lse.detach().float().reshape(B, H, L) if grad_lse is not None else None
        out4 = given.out.detach().to(inputs.dtype).reshape(B, H, L, -1)  # (B, H, L, Ev)
        dq, dk, dv, dkb, dw = ops.attention_backward(
            q4.detach(), k4.detach(), v4.detach(), None if kb3 is None else kb3.detach(),
            None if w is None else w.detach(), *k_ops.mask_args, out4, lse_l, d_out, d_lse,
            None, None,
        )  # fmt: skip
        pairs = [(q4, dq), (k4, dk), (v4, dv)]
        if kb3 is not None:
            pairs.append((kb3, dkb))
        if w is not None:
            pairs.append((w, dw))
        if rows:
            row_grad = dq[..., -1].float().reshape(*batch, L) / inputs.scale  # rows' sums of dS
            pairs[0] = (q4, torch.cat([dq[..., :-1], torch.zeros_like(dq[..., -1:])], -1))
            pairs += lowered.row_constant_pairs(lse, row_grad)
        return pull_back([(t, g.to(t.dtype)) for t, g in pairs], leaves, call.params)


@dataclass
class _KernelOperands:
    """A call's kernel operands: tensors (q4 (B, H, L, E), k4 (B, Hk, S, E), v4
    (B, Hk, S, Ev), kb3 (B, Hk, S) or None, w (hidden,) or None, vbad3 (B, Hk, S) or
    None, the lowered score) and the packed mask's arguments."""

    tensors: tuple[Any, ...]
    mask_args: tuple[Any, ...]


def _kernel_operands(inputs: AttentionInputs, *, row_feature: bool = False) -> _KernelOperands:
    """The call as kernel operands, from the one score and mask lowering. With
    ``row_feature``, a score with a per-query term gets one more feature of ones in q
    and k (see :meth:`TritonBackend.backward`)."""
    batch, L, S = inputs.batch_shape, inputs.L, inputs.S
    B, H = bh_shape(batch)
    lead_kv = kv_lead(batch, inputs.groups)
    Hk = H // inputs.groups
    qa, ka, kb, w, lowered = _operands(inputs)
    if row_feature and lowered.row_constant is not None:
        qa = torch.cat([qa, qa.new_ones(*qa.shape[:-1], 1)], dim=-1)  # (..., L, E + 1)
        ka = torch.cat([ka, ka.new_ones(*ka.shape[:-1], 1)], dim=-1)  # (..., S, E + 1)
    value, bad = clean_values(inputs.value)  # (..., S, Ev), (..., S) or None
    q4 = unit_stride(bh_view(qa, batch))  # (B, H, L, E)
    k4 = unit_stride(bh_view(ka, lead_kv))  # (B, Hk, S, E)
    v4 = unit_stride(bh_view(value, lead_kv))  # (B, Hk, S, Ev)
    kb3 = None
    if kb is not None:
        kb3 = bh_view(kb, lead_kv).reshape(B, Hk, S).float().contiguous()  # (B, Hk, S)
    vbad3 = None
    if bad is not None:
        flags = bad.unsqueeze(-1).to(torch.float32)  # (..., S, 1)
        vbad3 = bh_view(flags, lead_kv).reshape(B, Hk, S).contiguous()  # (B, Hk, S)
    mask = pack_mask(spec_from_plan(inputs.block_plan()), L, S, batch, inputs.device)
    margs = (mask.records, mask.keep, mask.bias, mask.ints, float(inputs.scale))
    return _KernelOperands((q4, k4, v4, kb3, w, vbad3, lowered), margs)


def arch_reason(dtype: torch.dtype, arch: int, head_dim: int = 0, grad: bool = False) -> str | None:
    """Why the kernels do not run a call on sm_``arch`` (0: the interpreter), or None.

    bfloat16 needs sm_80: sm_75 (T4) has no bfloat16 arithmetic in its tensor cores or
    its ALUs, so the kernels would emulate every product; float16 runs there. The
    backward of head dims over 128 needs 65 KiB of shared memory on sm_75 (64 there)."""
    if 0 < arch < 80 and dtype == torch.bfloat16:
        return (
            f"bfloat16 on sm_{arch} (T4 class): no native bfloat16 before sm_80; "
            "use float16 here (another backend takes bfloat16)"
        )
    if 0 < arch < 80 and grad and head_dim > 128:
        return (
            f"the backward of feature sizes over 128 on sm_{arch}: 65 KiB of shared memory "
            "a block, 64 KiB there"
        )
    return None


def _dot_dims(inputs: AttentionInputs) -> tuple[int, int]:
    """(query/key feature size of the score's dot form, value feature size): Bilinear's
    products have the key's size, every other dot form the query's."""
    key_dim = inputs.score.key_dim()
    return (key_dim if key_dim is not None else inputs.E), inputs.Ev


def _operands(
    inputs: AttentionInputs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, ScoreOperands]:
    """(qa, ka, kb, w, lowered) for the kernels, from the one score lowering.

    Dot and scaled dot use the inputs as they are (no copy). Other scores are lowered
    in the compute dtype (differentiably, so the score's parameters get their
    gradients through it), their products cast back to the input dtype for the
    kernel's matrix units, the key bias kept in float32 and pre-scaled.
    """
    score, dtype = inputs.score, inputs.dtype
    plain = type(score).dot_form is Dot.dot_form and type(score).row_constant is Dot.row_constant
    lowered = lower_score(inputs, upcast=not plain, row_constant=inputs.return_lse)
    kb = lowered.key_bias * inputs.scale if lowered.key_bias is not None else None  # (..., 1, S)
    return lowered.q.to(dtype), lowered.k.to(dtype), kb, lowered.w, lowered
