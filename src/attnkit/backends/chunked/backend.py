"""The chunked backend class: capabilities, and a call turned into tile operands."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from ..._host import readable
from ..._inputs import AttentionInputs
from ...blockplan import BlockPlan
from ...kernels import additive as _additive
from ...scores import Additive, Score
from .._backward import leaf_call, pull_back
from .._common import all_finite, clean_values
from ..autograd import KernelFunction
from ..base import ALL_MOD_KINDS, Backend
from ..operands import ScoreOperands, gaussian_form, lower_score
from ..records import AttentionResult, BackwardCall, InputGrads, OutputGrads
from .autograd import ChunkedCall
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
    mod_kinds: ClassVar[frozenset[str]] = ALL_MOD_KINDS
    supports_head_scale: ClassVar[bool] = True
    gaussian_differences: ClassVar[bool] = True

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
                "under torch.compile: its tiles run in a Python loop, which a trace would "
                "unroll into one graph node per tile, and its block skipping reads the "
                "mask's lengths on the host"
            )
        if any(not readable(t) for t in inputs.block_plan().host_tensors()):
            reasons.append(
                "per-batch block skipping reads the mask's lengths on the host, which would "
                "wait for the device"
            )
        reasons += _mod_reasons(inputs)
        if inputs.mask_needs_grad:
            reasons.append("a bias mask that requires grad (its gradient is L×S)")
        return reasons

    def describe(self, inputs: AttentionInputs) -> str:
        """One line: how the tiles of this call are computed (builds nothing)."""
        if isinstance(inputs.score, Additive):
            if inputs.compute_dtype != torch.float32 or inputs.device.type != "cpu":
                return "additive tiles: pure torch (the fused kernel is float32 on CPU only)"
            return f"additive tiles: {_additive.status()}"
        if gaussian_form(inputs) != "dot":
            return "Gaussian tiles from the differences q - k (its dot form would cancel)"
        return "dot-product tiles: batched matrix products"

    def forward(self, inputs: AttentionInputs) -> AttentionResult:
        batch, L, S = inputs.batch_shape, inputs.L, inputs.S
        ops, score_ops = _operands(inputs)
        plan = _plan(inputs)
        mean_only = inputs.weights_mean and not inputs.needs_grad
        want_weights = inputs.return_weights and not mean_only
        call = ChunkedCall(plan, ops.kind, ops.scale, _flags(ops))
        out, lse, weights = KernelFunction.apply(
            call, want_weights, ops.qa, ops.ka, ops.w, ops.v, ops.kb, ops.pos
        )
        out = out.reshape(*batch, L, inputs.Ev).to(inputs.dtype)  # (*batch, L, Ev)
        lse_out: torch.Tensor | None = None
        if inputs.return_lse:
            lse_out = score_ops.finish_lse(lse.reshape(*batch, L))  # (*batch, L)
        if weights is not None:
            weights = weights.reshape(*batch, L, S)  # (*batch, L, S)
            if inputs.weights_mean:
                weights = weights.mean(dim=-3)  # (*batch[:-1], L, S)
        elif mean_only:
            weights = _head_mean_weights(ops, plan, lse.detach(), inputs, call.low.get("lse"))
        return AttentionResult(output=out, weights=weights, lse=lse_out)

    def backward(self, call: BackwardCall) -> InputGrads:
        """The tiles' own backward from a given (out, lse): each tile's probabilities are
        ``exp(s - lse)``, so nothing of size L×S is held; then back through the score's
        lowering (its projections) to the query, key, value and parameters."""
        inputs, given = call.inputs, call.given
        batch, L = inputs.batch_shape, inputs.L
        N, cd = math.prod(batch), inputs.compute_dtype
        with torch.enable_grad():
            leaves, rec = leaf_call(inputs, return_lse=True)  # (the lse's frame: row constant)
            ops, lowered = _operands(rec)
        lse_l = lowered.lowered_lse(given.lse.detach().to(cd)).reshape(N, L)  # (N, L)
        kernel = ChunkedCall(_plan(rec), ops.kind, ops.scale, _flags(ops))
        tensors = (ops.qa, ops.ka, ops.w, ops.v, ops.kb, ops.pos)
        grad_lse = given.grad_lse
        d_lse = grad_lse.detach().to(cd).reshape(N, L) if grad_lse is not None else None  # (N, L)
        d_rows = torch.zeros(N, L, dtype=cd, device=inputs.device)  # (N, L)
        rows = OutputGrads(
            given.out.detach().to(cd).reshape(N, L, -1),  # (N, L, Ev)
            lse_l,
            given.grad_out.detach().to(cd).reshape(N, L, -1).contiguous(),  # (N, L, Ev)
            d_lse,
        )
        grads = kernel.backward(tensors, rows, d_rows if lowered.row_constant is not None else None)
        pairs = [
            (t, g) for t, g in zip(tensors, grads, strict=True) if t is not None and g is not None
        ]
        pairs += lowered.row_constant_pairs(given.lse, d_rows.reshape(*inputs.batch_shape, L))
        return pull_back(pairs, leaves, call.params)


def _mod_reasons(inputs: AttentionInputs) -> list[str]:
    """The score modifier combinations the tiles do not take (others run)."""
    out: list[str] = []
    kinds = [m.kind for m in inputs.mods]
    if inputs.head_scale is not None and not inputs.score.dot_reducible:
        out.append("a per-head scale with a score that is not a dot product")
    if "softcap" in kinds:
        if type(inputs.score).row_constant is not Score.row_constant:
            out.append(
                f"softcap with score {inputs.score.name!r}, whose per-query term the cap would not ignore"
            )
        if any(m.additive for m in inputs.mods[kinds.index("softcap") :]):
            out.append("a position bias after softcap (the tiles add position biases first)")
    return out


def _flags(ops: Operands) -> dict[str, Any]:
    """The fields of the tile operands that are not tensors of the autograd Function."""
    return {"bad_v": ops.bad_v, "nonfinite_qk": ops.nonfinite_qk, "layout": ops.layout,
            "softcaps": ops.softcaps}  # fmt: skip


def _plan(inputs: AttentionInputs) -> BlockPlan:
    """The call's block plan with tile sizes chosen for its rows and band."""
    plan = inputs.block_plan()
    c = plan.single
    band = (c.lo, c.hi) if c is not None and c.has_band else None
    rows = plan.R if plan.per_batch else math.prod(inputs.batch_shape)
    return plan.with_blocks(*tile_shape(rows, inputs.L, inputs.S, band))


def _head_mean_weights(
    ops: Operands,
    plan: BlockPlan,
    lse: torch.Tensor,
    inputs: AttentionInputs,
    low: torch.Tensor | None,
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
            weights = weights_tiles(ops, plan, lse, low=low).mean(dim=0, keepdim=True)  # (1, L, S)
        else:
            weights = weights_tiles(ops, plan, lse, heads=heads, low=low)  # (N // H, L, S)
    return weights.reshape(*inputs.batch_shape[:-1], inputs.L, inputs.S)  # (..., L, S)


def _operands(inputs: AttentionInputs) -> tuple[Operands, ScoreOperands]:
    """The call's tile operands, rows flattened to N, from the score lowered once
    (:func:`attnkit.backends.operands.lower_score`, in the compute dtype, under
    autograd so gradients reach the score's parameters)."""
    cd, layout = inputs.compute_dtype, inputs.layout
    batch, L, S = inputs.batch_shape, inputs.L, inputs.S
    N = math.prod(batch)
    differences = gaussian_form(inputs) != "dot"  # "unknown" too: never the cancelling form
    lowered = lower_score(
        inputs, upcast=True, row_constant=inputs.return_lse, differences=differences
    )
    qa, ka, kb, w = lowered.q, lowered.k, lowered.key_bias, lowered.w
    if lowered.kind == "distance":
        assert w is not None
        w = w.expand(*batch, 1, 1).reshape(N, 1, 1)  # (N, 1, 1) 1/2σ² of each row
    ka = layout.query_heads(ka, 2)  # (..., Hq, S, Eq)
    v = layout.query_heads(inputs.value.to(cd), 2)  # (..., Hq, S, Ev)
    if kb is not None:
        kb = layout.query_heads(kb, 2)  # (..., Hq, 1, S)
    qa = qa.expand(*batch, L, qa.shape[-1]).reshape(N, L, qa.shape[-1])  # (N, L, Eq)
    ka = ka.expand(*batch, S, ka.shape[-1]).reshape(N, S, ka.shape[-1])  # (N, S, Eq)
    v = v.expand(*batch, S, v.shape[-1]).reshape(N, S, v.shape[-1])  # (N, S, Ev)
    if kb is not None:
        kb = (kb.to(cd) * inputs.scale).expand(*batch, 1, S).reshape(N, 1, S)  # (N, 1, S)
    # non-finite inputs: looked for on the host where that is free; elsewhere the tiles
    # take the policy's tensor-op path (values cleaned, -inf of the mask kept hard)
    bad_v: torch.Tensor | None = None
    nonfinite_qk = False
    if inputs.check_finite:  # (check_finite=False: the caller guarantees finite inputs)
        v, bad = clean_values(v)  # (N, S, Ev), (N, S) or None
        bad_v = bad.to(cd) if bad is not None else None  # (N, S)
        nonfinite_qk = not all_finite(qa.detach(), ka.detach()) if readable(v) else True
    ops = Operands(
        kind=lowered.kind,
        qa=qa.contiguous(),
        ka=ka.contiguous(),
        w=w,
        v=v.contiguous(),
        kb=kb.contiguous() if kb is not None else None,
        scale=inputs.scale,
        bad_v=bad_v,
        nonfinite_qk=nonfinite_qk,
        pos=lowered.pos.to(cd) if lowered.pos is not None else None,
        layout=layout,
        softcaps=lowered.softcaps,
    )
    return ops, lowered
