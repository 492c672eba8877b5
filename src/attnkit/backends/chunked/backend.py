"""The chunked backend class: capabilities, and a call turned into tile operands."""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from ..._host import readable
from ..._inputs import AttentionInputs
from ...blockplan import BlockPlan
from ...kernels import additive as _additive
from ...scores import Additive
from .._common import all_finite, clean_values, expand_kv
from .._dotform import clean_dot_form
from ..base import AttentionResult, Backend
from .autograd import ChunkedAttentionFunction
from .sizes import tile_shape
from .tiles import Operands, weights_tiles

__all__ = ["ChunkedBackend"]


class ChunkedBackend(Backend):
    """Tiled online softmax with recompute; any dot-reducible score and Additive, any mask."""

    name: ClassVar[str] = "chunked"
    device_types: ClassVar[frozenset[str]] = frozenset({"cpu", "cuda", "mps", "xpu"})
    fused: ClassVar[bool] = False
    supports_dropout: ClassVar[bool] = False
    averages_heads: ClassVar[bool] = True

    def not_supported_reasons(self, inputs: AttentionInputs) -> list[str]:
        reasons = [
            "dropout_p > 0 is not supported (the recomputing backward would have to replay "
            "the dropout mask)"
            if r == "does not support dropout_p > 0"
            else r
            for r in super().not_supported_reasons(inputs)
        ]
        if not inputs.score.dot_reducible and not isinstance(inputs.score, Additive):
            reasons.append(
                f"score {inputs.score.name!r} has no tiled form (dot-reducible scores and "
                "Additive have one)"
            )
        if torch.compiler.is_compiling():
            reasons.append(
                "under torch.compile: block skipping reads mask lengths on the host, which "
                "cannot be traced"
            )
        if any(not readable(t) for t in inputs.block_plan().host_tensors()):
            reasons.append(
                "per-batch block skipping reads the mask's lengths on the host, which would "
                "wait for the device"
            )
        if inputs.mask_needs_grad:
            reasons.append("a bias mask that requires grad (its gradient is L×S)")
        return reasons

    def describe(self, inputs: AttentionInputs) -> str:
        """One line: how the tiles of this call are computed (builds nothing)."""
        if isinstance(inputs.score, Additive):
            if inputs.compute_dtype != torch.float32 or inputs.device.type != "cpu":
                return "additive tiles: pure torch (the fused kernel is float32 on CPU only)"
            return f"additive tiles: {_additive.status()}"
        return "dot-product tiles: batched matrix products"

    def forward(self, inputs: AttentionInputs) -> AttentionResult:
        batch, L, S = inputs.batch_shape, inputs.L, inputs.S
        ops, row_const = _operands(inputs)
        plan = _plan(inputs)
        mean_only = inputs.weights_mean and not inputs.needs_grad
        want_weights = inputs.return_weights and not mean_only
        flags = {"bad_v": ops.bad_v, "nonfinite_qk": ops.nonfinite_qk}
        out, lse, weights = ChunkedAttentionFunction.apply(
            plan, ops.kind, ops.scale, want_weights, ops.qa, ops.ka, ops.w, ops.v, ops.kb, flags
        )
        out = out.reshape(*batch, L, inputs.Ev).to(inputs.dtype)  # (*batch, L, Ev)
        lse_out: torch.Tensor | None = None
        if inputs.return_lse:
            lse_out = lse.reshape(*batch, L)  # (*batch, L)
            if row_const is not None:  # an empty row stays -inf whatever its query holds
                shifted = lse_out + (row_const.to(lse.dtype) * inputs.scale).expand(*batch, L)
                lse_out = torch.where(torch.isneginf(lse_out), lse_out, shifted)
        if weights is not None:
            weights = weights.reshape(*batch, L, S)  # (*batch, L, S)
            if inputs.weights_mean:
                weights = weights.mean(dim=-3)  # (*batch[:-1], L, S)
        elif mean_only:
            weights = _head_mean_weights(ops, plan, lse.detach(), inputs)
        return AttentionResult(output=out, weights=weights, lse=lse_out)


def _plan(inputs: AttentionInputs) -> BlockPlan:
    """The call's block plan with tile sizes chosen for its rows and band."""
    plan = inputs.block_plan()
    c = plan.single
    band = (c.lo, c.hi) if c is not None and c.has_band else None
    rows = plan.R if plan.per_batch else math.prod(inputs.batch_shape)
    return plan.with_blocks(*tile_shape(rows, inputs.L, inputs.S, band))


def _head_mean_weights(
    ops: Operands, plan: BlockPlan, lse: torch.Tensor, inputs: AttentionInputs
) -> torch.Tensor:
    """Weights averaged over the head dim (-3), tile by tile: (*batch[:-1], L, S).

    Never holds every head's weights: each tile's ``exp(s - lse)`` is averaged over
    the heads as it is produced.
    """
    heads = inputs.batch_shape[-1]
    with torch.no_grad():
        if plan.per_batch and plan.R % heads:
            # (H, L, E) with a per-batch mask: its batch dim is the head dim, so each group
            # holds one head and there is no run of heads to average tile by tile.
            weights = weights_tiles(ops, plan, lse).mean(dim=0, keepdim=True)  # (1, L, S)
        else:
            weights = weights_tiles(ops, plan, lse, heads=heads)  # (N // H, L, S)
    return weights.reshape(*inputs.batch_shape[:-1], inputs.L, inputs.S)  # (..., L, S)


def _operands(inputs: AttentionInputs) -> tuple[Operands, torch.Tensor | None]:
    """The call's tile operands, rows flattened to N, and the score's row constant (or None).

    The projections here (``dot_form``, Additive's ``W_q``/``W_k``) run under
    autograd, so gradients reach the score's parameters through them.
    """
    cd = inputs.compute_dtype
    score = inputs.score
    batch, L, S = inputs.batch_shape, inputs.L, inputs.S
    N = math.prod(batch)
    row_const: torch.Tensor | None = None
    w: torch.Tensor | None = None
    kb: torch.Tensor | None = None
    if score.dot_reducible:
        kind = "dot"
        qa, ka, kb, row_const, _ = clean_dot_form(
            inputs, row_constant=inputs.return_lse, upcast=True
        )
    else:
        assert isinstance(score, Additive)
        kind = "additive"
        qa, ka = score.project(inputs.query, inputs.key)  # (..., L, h), (..., S, h)
        w = score.w_v.weight.reshape(-1).to(cd)  # (h,)
    qa, ka, v = qa.to(cd), ka.to(cd), inputs.value.to(cd)
    if inputs.groups > 1:
        ka = expand_kv(ka, inputs.groups)  # (..., Hq, S, Eq)
        v = expand_kv(v, inputs.groups)  # (..., Hq, S, Ev)
        if kb is not None and kb.ndim >= 3 and kb.shape[-3] != 1:
            kb = expand_kv(kb, inputs.groups)  # (..., Hq, 1, S)
    qa = qa.expand(*batch, L, qa.shape[-1]).reshape(N, L, qa.shape[-1])  # (N, L, Eq)
    ka = ka.expand(*batch, S, ka.shape[-1]).reshape(N, S, ka.shape[-1])  # (N, S, Eq)
    v = v.expand(*batch, S, v.shape[-1]).reshape(N, S, v.shape[-1])  # (N, S, Ev)
    if kb is not None:
        kb = (kb.to(cd) * inputs.scale).expand(*batch, 1, S).reshape(N, 1, S)  # (N, 1, S)
    bad_v: torch.Tensor | None = None
    nonfinite_qk = False
    if readable(v):  # free on the CPU; elsewhere non-finite inputs are not looked for
        v, bad = clean_values(v)  # (N, S, Ev), (N, S) or None
        bad_v = bad.to(cd) if bad is not None else None  # (N, S)
        nonfinite_qk = not all_finite(qa.detach(), ka.detach())
    ops = Operands(
        kind=kind,
        qa=qa.contiguous(),
        ka=ka.contiguous(),
        w=w,
        v=v.contiguous(),
        kb=kb.contiguous() if kb is not None else None,
        scale=inputs.scale,
        bad_v=bad_v,
        nonfinite_qk=nonfinite_qk,
    )
    return ops, row_const
