"""All-to-all (Ulysses) context parallelism: trade the sequence split for a head split.

Each rank holds all heads of its sequence shard. One ``all_to_all`` per tensor
gives every rank ``H/P`` heads over the **full** sequence (its shard of heads from
every rank, put back in global order by :func:`attnkit.distributed.layout.assemble`);
:func:`attnkit.attention` then runs once on the full sequence with the full mask
(its dense tensors and a per-head scale restricted to the rank's heads), and a second ``all_to_all``
returns the output (and lse) to the sequence split. The exchanges are
differentiable (the backward of an all-to-all is the inverse all-to-all), so
autograd does the rest; score parameter gradients are each rank's local part (its
heads), summed across the group like the ring's.

Needs the query and key/value head counts (dim -3) to divide by the world size.
"""

from __future__ import annotations

import math

import torch

from ..functional import attention
from .blocks import slice_mask_heads
from .comm import all_to_all
from .layout import assemble, shard
from .plan import CallPlan

__all__ = ["all_to_all_attention"]


def _seq_to_heads(x: torch.Tensor, lengths: list[int], plan: CallPlan, what: str) -> torch.Tensor:
    """(..., H, L_r, E) sequence shard -> (..., H/P, N, E) head shard over the full sequence."""
    P = plan.world_size
    *prefix, H, Lr, E = x.shape
    h = H // P
    split = x.reshape(*prefix, P, h, Lr, E)  # (..., P, H/P, L_r, E)
    outgoing = split.movedim(-4, 0).reshape(-1)  # (P * ... * H/P * L_r * E,)
    per_position = math.prod(prefix) * h * E
    received = all_to_all(
        outgoing,
        [outgoing.numel() // P] * P,
        [per_position * n for n in lengths],
        plan.group,
        what,
    )
    pieces = received.split([per_position * n for n in lengths])
    shards = [
        p.view(*prefix, h, n, E) for p, n in zip(pieces, lengths, strict=True)
    ]  # (..., H/P, L_s, E)
    return assemble(shards, layout=plan.layout, dim=-2)  # (..., H/P, N, E)


def _heads_to_seq(y: torch.Tensor, lengths: list[int], plan: CallPlan, what: str) -> torch.Tensor:
    """(..., H/P, N, E) head shard -> (..., H, L_r, E) sequence shard: the inverse."""
    P, r = plan.world_size, plan.rank
    *prefix, h, _, E = y.shape
    parts = [
        shard(y, rank=d, world_size=P, layout=plan.layout, dim=-2).reshape(-1)  # (... * L_d * E,)
        for d in range(P)
    ]
    mine = math.prod(prefix) * h * lengths[r] * E
    splits = [p.numel() for p in parts]
    received = all_to_all(torch.cat(parts), splits, [mine] * P, plan.group, what)
    pieces = [p.view(*prefix, h, lengths[r], E) for p in received.split([mine] * P)]
    return torch.cat(pieces, dim=-3)  # (..., H, L_r, E)


def all_to_all_attention(
    plan: CallPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (..., H, L_r, Ev), lse (..., H, L_r)) of this rank's queries."""
    P, r = plan.world_size, plan.rank
    q_lengths, kv_lengths = plan.q_lengths, plan.kv_lengths
    q_full = _seq_to_heads(q, q_lengths, plan, "the queries")  # (..., Hq/P, N_L, E)
    k_full = _seq_to_heads(k, kv_lengths, plan, "the keys")  # (..., Hk/P, N_S, Ek)
    v_full = _seq_to_heads(v, kv_lengths, plan, "the values")  # (..., Hk/P, N_S, Ev)
    h = q.shape[-3] // P
    mask = slice_mask_heads(plan.mask, plan.batch_shape, r * h, h)
    scale = plan.scale
    if isinstance(scale, torch.Tensor) and scale.shape[0] != 1:
        scale = scale.narrow(0, r * h, h)  # (H/P,): this rank's heads
    out_full, lse_full = attention(
        q_full, k_full, v_full, score=plan.score, mask=mask, scale=scale,
        return_lse=True, backend=plan.backend,
    )  # fmt: skip
    out = _heads_to_seq(out_full, q_lengths, plan, "the output")  # (..., Hq, L_r, Ev)
    lse_col = _heads_to_seq(lse_full.unsqueeze(-1), q_lengths, plan, "the lse")  # (..., Hq, L_r, 1)
    lse = lse_col.squeeze(-1)  # (..., Hq, L_r)
    return out, lse
