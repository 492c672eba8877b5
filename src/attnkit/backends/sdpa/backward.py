"""SDPA's backward from a given (out, lse): torch's fused CPU flash backward.

torch's CPU flash kernel has a backward op that takes the output and the
log-sum-exp (``aten._scaled_dot_product_flash_attention_for_cpu_backward``, private,
feature-detected). Fed the global (out, lse) of a larger attention, it gives the
gradients of one part of it (a key block of a context-parallel ring) with no
recomputation of the forward and nothing of size L×S held. Two extra features carry
what the op has no argument for:

- a gradient of the lse: with ``v' = [v, 1]``, ``out' = [out, 0]`` and
  ``d_out' = [d_out, d_lse]`` the op's ``dP - D`` becomes ``dP - D + d_lse``, the
  logits' gradient through the lse;
- a score's key bias: ``[q', 1] · [k', b]`` as in the forward, whose key gradient's
  last column is the bias gradient.

Calls the op cannot take (non-finite inputs, keys excluded by construction, other
devices) use the materialized backward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..._far_rows import lost_rows
from ..._host import readable
from ..._inputs import AttentionInputs
from .._backward import leaf_call, materialized_backward, pull_back
from .._common import all_finite, dense_mask
from ..operands import lower_score
from ..records import BackwardCall, InputGrads
from .lse import _aten_op
from .plan import causal_shift

__all__ = ["BACKWARD_OP", "sdpa_backward"]

BACKWARD_OP = _aten_op("_scaled_dot_product_flash_attention_for_cpu_backward")


def _usable(inputs: AttentionInputs) -> bool:
    t = (inputs.query, inputs.key, inputs.value)
    return (
        BACKWARD_OP is not None
        and inputs.score.dot_reducible
        and inputs.device.type == "cpu"
        and inputs.dropout_p == 0
        and readable(inputs.query)
        and all_finite(*(x.detach() for x in t))
    )


def _reduce_to(g: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Sum a gradient over the dims a tensor of ``shape`` was broadcast along."""
    while g.ndim > len(shape):
        g = g.sum(0)
    dims = [d for d, n in enumerate(shape) if n == 1 and g.shape[d] != 1]
    return g.sum(dim=dims, keepdim=True) if dims else g


def sdpa_backward(call: BackwardCall) -> InputGrads:
    """Gradients of ``call.inputs`` as a part of an attention with output and lse
    ``call.given`` (see :meth:`attnkit.backends.base.Backend.backward`)."""
    inputs, given = call.inputs, call.given
    out, lse, grad_lse = given.out, given.lse, given.grad_lse
    if not _usable(inputs) or lost_rows(inputs, lse) is not None:  # (see attnkit._far_rows)
        return materialized_backward(call)
    cd, batch, L, S = inputs.compute_dtype, inputs.batch_shape, inputs.L, inputs.S
    with torch.enable_grad():
        leaves, rec = leaf_call(inputs)
        ops = lower_score(rec, upcast=True, row_constant=True, fold_alibi=True)
        ops = ops.dot_products_only("sdpa")
        if ops.excluded is not None:
            return materialized_backward(call)
        qd, kd = ops.with_key_bias_feature()  # q'·k' + b == [q', 1]·[k', b]
        rows = ops.row_constant is not None
        if rows:  # [q', 1]·[k', 1] adds 1 to every logit: its query gradient sums each row
            qd = torch.cat([qd, qd.new_ones(*qd.shape[:-1], 1)], dim=-1)  # (..., L, E'')
            kd = torch.cat([kd, kd.new_ones(*kd.shape[:-1], 1)], dim=-1)  # (..., S, E'')
        vd = leaves[2].to(cd)
    lse_l = ops.lowered_lse(lse.detach().to(cd))  # (*batch, L)
    dead = torch.isneginf(lse_l)
    lse_l = torch.where(dead, torch.zeros((), dtype=cd), lse_l)  # every p of a dead row is 0
    if rows:
        lse_l = lse_l + inputs.scale  # the logits carry one more scale * 1
    d_out = given.grad_out.detach().to(cd).masked_fill(dead.unsqueeze(-1), 0.0)
    d_lse = torch.zeros_like(lse_l) if grad_lse is None else grad_lse.detach().to(cd)
    d_lse = d_lse.masked_fill(dead, 0.0)
    # the lse's gradient rides in one more value feature (see the module docstring)
    layout = inputs.layout
    k_full = layout.query_heads(kd.detach(), 2)  # (..., Hq, S, E')
    v_full = layout.query_heads(vd.detach(), 2)  # (..., Hq, S, Ev)
    v_aug = torch.cat([v_full, v_full.new_ones(*v_full.shape[:-1], 1)], -1)  # (..., S, Ev+1)
    out_aug = torch.cat([out.detach().to(cd), out.new_zeros(*out.shape[:-1], 1, dtype=cd)], -1)
    do_aug = torch.cat([d_out, d_lse.unsqueeze(-1)], -1)  # (*batch, L, Ev+1)
    q4 = qd.detach().expand(*batch, L, qd.shape[-1]).reshape(-1, 1, L, qd.shape[-1])
    k4 = k_full.expand(*batch, S, k_full.shape[-1]).reshape(-1, 1, S, k_full.shape[-1])
    v4 = v_aug.expand(*batch, S, v_aug.shape[-1]).reshape(-1, 1, S, v_aug.shape[-1])
    # (N, 1, L or S, D): the op takes 4-D inputs of one head size
    E1, Ev1 = q4.shape[-1], v4.shape[-1]
    width = max(E1, Ev1)
    q4, k4 = F.pad(q4, (0, width - E1)), F.pad(k4, (0, width - E1))
    v4 = F.pad(v4, (0, width - Ev1))
    o4 = F.pad(out_aug.reshape(-1, 1, L, Ev1), (0, width - Ev1))
    do4 = F.pad(do_aug.reshape(-1, 1, L, Ev1), (0, width - Ev1))
    shift = causal_shift(inputs)
    attn_mask: torch.Tensor | None = None
    if inputs.mask is not None and shift != 0:
        dm = dense_mask(inputs)
        bias = torch.zeros((), dtype=cd)
        mask_bias = dm.bias_in(cd)
        if mask_bias is not None:
            bias = bias + mask_bias
        if dm.keep is not None:
            bias = bias.masked_fill(~dm.keep, float("-inf"))
        attn_mask = bias.expand(*batch, L, S).reshape(-1, 1, L, S).contiguous()
    dq4, dk4, dv4 = BACKWARD_OP(
        do4.contiguous(), q4.contiguous(), k4.contiguous(), v4.contiguous(), o4.contiguous(),
        lse_l.reshape(-1, 1, L).contiguous(), 0.0, inputs.mask is not None and shift == 0,
        attn_mask=attn_mask, scale=inputs.scale,
    )  # fmt: skip
    dq = dq4[..., :E1].reshape(*batch, L, E1)  # (*batch, L, E')
    dk = dk4[..., :E1].reshape(*batch, S, E1)  # (*batch, S, E')
    dv = dv4[..., : Ev1 - 1].reshape(*batch, S, Ev1 - 1)  # (*batch, S, Ev)
    # query heads j*g .. j*g+g-1 share key head j
    dk = layout.sum_to_key_heads(dk, kd, 2)  # (..., Hk or Hq, S, E')
    dv = layout.sum_to_key_heads(dv, vd, 2)  # (..., Hk, S, Ev)
    extra = []
    if rows:
        row_grad = dq[..., -1] / inputs.scale  # (*batch, L): each row's sum of dS
        extra = ops.row_constant_pairs(lse, row_grad)
        dq = torch.cat([dq[..., :-1], torch.zeros_like(dq[..., -1:])], dim=-1)
    dq, dk, dv = _reduce_to(dq, qd.shape), _reduce_to(dk, kd.shape), _reduce_to(dv, vd.shape)
    return pull_back([(qd, dq), (kd, dk), (vd, dv), *extra], leaves, call.params)
