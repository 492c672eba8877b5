"""Ring attention: K/V shards travel around the ranks, partials merge by lse.

Forward, on rank r at step t = 0 .. P-1 (it holds the K/V of origin o = (r - t) mod P):

1. post the send of that K/V shard to rank r+1 and the receive of the next one from
   rank r-1 (non-blocking, ``batch_isend_irecv``);
2. meanwhile compute every non-empty block of its query segments against origin
   o's key segments with :func:`attnkit.attention` (``return_lse=True``), each
   block's mask being the full mask evaluated at the block's global positions
   (:meth:`attnkit.masks.Mask.shard`), and merge it into the running result
   (:func:`attnkit._lse.merge`);
3. wait for the transfer (for every posted send and receive, also when the step fails:
   :func:`attnkit.distributed.comm.in_flight`, so no transfer outlives the call).

A shard travels only as far as the last rank that needs it (``CallPlan.last_hop``):
under a contiguous causal layout the last rank's K/V never leaves it.

Backward asks each block's backend for its share of the gradients given the saved
global (out, lse) (:func:`attnkit.functional.attention_backward`, i.e. the backend's
``backward`` from (out, lse): probabilities ``exp(s - lse)``, no recomputation of the
block's forward, nothing of size N/P x N/P kept between forward and backward, so
memory per rank is O(N/P)). Every score (Additive included) and its parameters get
exact gradients. dK/dV travel with their K/V around the ring and go home from the
last rank that used them.

Score parameter gradients are each rank's local part (the blocks of its queries):
sum them across the group (:func:`attnkit.distributed.all_reduce_grads`, or DDP
over a mesh that includes the context-parallel ranks), as for any weight applied
to a rank's own tokens.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from .. import _lse
from .._autocast import backward_without_autocast
from ..backends.autograd import as_held
from ..backends.records import OutputGrads
from ..functional import attention, attention_backward
from ..masks import Mask
from ..scores import is_shared_score
from .comm import P2P, in_flight, p2p, wait_all
from .errors import ContextParallelError
from .plan import Block, CallPlan

__all__ = ["ring_attention"]

BACKWARD_ROWS = 512
"""Query rows recomputed at once in the backward (bounds its transient memory)."""

_TAG_K, _TAG_V, _TAG_DK, _TAG_DV, _TAG_HOME_DK, _TAG_HOME_DV = 11, 12, 13, 14, 15, 16


def _resized(x: torch.Tensor, n: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialized tensor like ``x`` with ``n`` positions at dim -2."""
    shape = (*x.shape[:-2], n, x.shape[-1])
    return torch.empty(shape, dtype=dtype or x.dtype, device=x.device)


def _kv_transfers(
    plan: CallPlan,
    t: int,
    held: tuple[torch.Tensor, torch.Tensor] | None,
    k_like: torch.Tensor,
    v_like: torch.Tensor,
    tags: tuple[int, int],
    dtype: torch.dtype | None = None,
) -> tuple[list[P2P], tuple[torch.Tensor, torch.Tensor] | None]:
    """Ring step t: send the pair this rank holds to r+1 if it travels on, and receive
    the pair rank r-1 holds if it does. Returns (ops, receive buffers or None)."""
    r, P = plan.rank, plan.world_size
    o, prev = (r - t) % P, (r - 1 - t) % P
    ops: list[P2P] = []
    if held is not None and t < plan.last_hop[o]:
        ops += [("send", held[0], (r + 1) % P, tags[0]), ("send", held[1], (r + 1) % P, tags[1])]
    incoming = None
    if t < plan.last_hop[prev]:
        n = plan.kv_lengths[prev]
        incoming = (_resized(k_like, n, dtype), _resized(v_like, n, dtype))
        ops += [
            ("recv", incoming[0], (r - 1) % P, tags[0]),
            ("recv", incoming[1], (r - 1) % P, tags[1]),
        ]
    return ops, incoming


def _block_inputs(
    plan: CallPlan, blk: Block, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Mask | None]:
    """One block's query, key and value, and the full mask at the block's global positions."""
    qb = q.narrow(-2, blk.q_local, blk.L)  # (..., L_blk, E)
    kb = k.narrow(-2, blk.k_local, blk.S)  # (..., S_blk, Ek)
    vb = v.narrow(-2, blk.k_local, blk.S)  # (..., S_blk, Ev)
    mask = None
    if plan.mask is not None:
        mask = plan.mask.shard(blk.q_global, blk.k_global, blk.L, blk.S, plan.total_L, plan.total_S)
    return qb, kb, vb, mask


def _block_call(
    plan: CallPlan, blk: Block, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (..., L_blk, Ev), lse (..., L_blk)) of one block, masked at its global positions."""
    qb, kb, vb, mask = _block_inputs(plan, blk, q, k, v)
    out, lse = attention(
        qb, kb, vb, score=plan.score, mask=mask, scale=plan.scale, return_lse=True,
        backend=plan.backend,
    )  # fmt: skip
    return out, lse


def _forward(
    plan: CallPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r, P = plan.rank, plan.world_size
    segs = plan.q_segments[r]
    acc: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(segs)
    held: tuple[torch.Tensor, torch.Tensor] | None = (k.contiguous(), v.contiguous())
    for t in range(P):
        o = (r - t) % P
        ops, incoming = _kv_transfers(plan, t, held, k, v, (_TAG_K, _TAG_V))
        with in_flight(p2p(ops, plan.group, f"ring forward, step {t} (K/V)")):
            for blk in plan.blocks[r][o]:
                assert held is not None
                block = _block_call(plan, blk, q, *held)
                prev = acc[blk.q_index]
                acc[blk.q_index] = block if prev is None else _lse.merge(*prev, *block)
        held = incoming
    outs, lses = [], []
    offset = 0
    for i, (_, length) in enumerate(segs):
        part = acc[i]
        if part is None:  # no key reaches these rows: output 0, lse -inf
            qs = q.narrow(-2, offset, length)  # (..., L_seg, E)
            part = attention(
                qs, k.narrow(-2, 0, 0), v.narrow(-2, 0, 0), score=plan.score,
                scale=plan.scale, return_lse=True,
            )  # fmt: skip
        assert part is not None
        outs.append(part[0])
        lses.append(part[1])
        offset += length
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)  # (..., L_r, Ev)
    lse = lses[0] if len(lses) == 1 else torch.cat(lses, dim=-1)  # (..., L_r)
    return out, lse


def _block_grads(
    plan: CallPlan,
    blk: Block,
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    given: OutputGrads,
    params: list[torch.Tensor],
    want: tuple[bool, bool, bool],
) -> list[torch.Tensor | None]:
    """Gradients (dq_blk, dk_blk, dv_blk, *d_params) of one block's share of the loss,
    from the block's backend's own backward given the global (out, lse) of this rank's
    queries (``given``: out (..., L_r, Ev), lse (..., L_r) and their gradients)."""
    qb, kb, vb, mask = _block_inputs(plan, blk, q, *kv)
    g = given.rows(blk.q_local, blk.L)  # (..., L_blk, Ev), (..., L_blk)
    dq, dk, dv, dps = attention_backward(
        qb, kb, vb, g.out, g.lse, g.grad_out, g.grad_lse, score=plan.score, mask=mask,
        scale=plan.scale, backend=plan.backend, params=params,
    )  # fmt: skip
    return [dq if want[0] else None, dk if want[1] else None, dv if want[2] else None, *dps]


def _row_pieces(blocks: list[Block]) -> list[Block]:
    """Blocks cut into pieces of at most ``BACKWARD_ROWS`` query rows: rows are independent,
    so recomputing a piece at a time bounds the backward's transient memory by
    ``BACKWARD_ROWS x S_blk`` per head instead of ``L_blk x S_blk``."""
    pieces = []
    for blk in blocks:
        for r0 in range(0, blk.L, BACKWARD_ROWS):
            rows = min(BACKWARD_ROWS, blk.L - r0)
            pieces.append(
                Block(blk.q_index, blk.q_local + r0, blk.q_global + r0, rows, blk.k_local,
                      blk.k_global, blk.S)
            )  # fmt: skip
    return pieces


def _backward(
    plan: CallPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    given: OutputGrads,
    params: list[torch.Tensor],
    want: tuple[bool, bool, bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    r, P = plan.rank, plan.world_size
    acc_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    d_params = [torch.zeros_like(p) for p in params]
    held: tuple[torch.Tensor, torch.Tensor] | None = (k.contiguous(), v.contiguous())
    grads: tuple[torch.Tensor, torch.Tensor] | None = (
        torch.zeros(k.shape, dtype=acc_dtype, device=k.device),
        torch.zeros(v.shape, dtype=acc_dtype, device=v.device),
    )
    mine: tuple[torch.Tensor, torch.Tensor] | None = None
    for t in range(P):
        o = (r - t) % P
        kv_ops, incoming = _kv_transfers(plan, t, held, k, v, (_TAG_K, _TAG_V))
        with in_flight(p2p(kv_ops, plan.group, f"ring backward, step {t} (K/V)")):
            for blk in _row_pieces(plan.blocks[r][o]):
                assert held is not None and grads is not None
                g = _block_grads(plan, blk, q, held, given, params, want)
                if g[0] is not None:
                    dq[..., blk.q_local : blk.q_local + blk.L, :] += g[0]
                if g[1] is not None:
                    grads[0][..., blk.k_local : blk.k_local + blk.S, :] += g[1]
                if g[2] is not None:
                    grads[1][..., blk.k_local : blk.k_local + blk.S, :] += g[2]
                for acc, gp in zip(d_params, g[3:], strict=True):
                    if gp is not None:
                        acc += gp
        # dK/dV of origin o travel on with their K/V, or go home from the last user.
        ops, incoming_grads = _kv_transfers(
            plan, t, grads, k, v, (_TAG_DK, _TAG_DV), dtype=acc_dtype
        )
        if grads is not None and t >= plan.last_hop[o]:
            if t == 0:
                mine = grads  # never left this rank
            else:
                ops += [("send", grads[0], o, _TAG_HOME_DK), ("send", grads[1], o, _TAG_HOME_DV)]
        if t > 0 and t == plan.last_hop[r]:
            n = plan.kv_lengths[r]
            mine = (_resized(k, n, acc_dtype), _resized(v, n, acc_dtype))
            home = (r + t) % P
            ops += [("recv", mine[0], home, _TAG_HOME_DK), ("recv", mine[1], home, _TAG_HOME_DV)]
        wait_all(p2p(ops, plan.group, f"ring backward, step {t} (dK/dV)"))
        held, grads = incoming, incoming_grads
    assert mine is not None
    return dq.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype), d_params


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        plan: CallPlan,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *params: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = _forward(plan, q, k, v)
        # the score as it is now (a parameter swapped for the forward alone stays), and
        # its parameters saved: an in-place change before the backward raises, as in torch
        score = plan.score if is_shared_score(plan.score) else as_held(plan.score)
        ctx.plan = replace(plan, score=score)
        ctx.save_for_backward(q, k, v, out, lse, *params)
        return out, lse

    @staticmethod
    @backward_without_autocast
    def backward(
        ctx: Any, d_out: torch.Tensor, d_lse: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        if torch.is_grad_enabled():  # create_graph=True: its block backwards have no graph
            raise ContextParallelError(
                "the ring's backward is differentiable once: a backward with "
                "create_graph=True (a gradient penalty, a Hessian) would drop every second "
                "derivative; use strategy='all_to_all', which has them"
            )
        q, k, v, out, lse, *params = ctx.saved_tensors
        plan: CallPlan = ctx.plan
        want = (ctx.needs_input_grad[1], ctx.needs_input_grad[2], ctx.needs_input_grad[3])
        given = OutputGrads(out, lse, d_out, d_lse)
        dq, dk, dv, d_params = _backward(plan, q, k, v, given, params, want)
        return (
            None,
            dq if want[0] else None,
            dk if want[1] else None,
            dv if want[2] else None,
            *d_params,
        )


def trainable_params(plan: CallPlan) -> list[torch.Tensor]:
    """The score parameters gradients flow to (none for the shared named scores), and a
    per-head scale that requires grad."""
    found: list[torch.Tensor] = []
    if not is_shared_score(plan.score):
        found += [p for p in plan.score.parameters() if p.requires_grad]
    if isinstance(plan.scale, torch.Tensor) and plan.scale.requires_grad:
        found.append(plan.scale)
    return found


def ring_attention(
    plan: CallPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (..., L_r, Ev), lse (..., L_r)) of this rank's queries over the full sequence."""
    params = trainable_params(plan) if torch.is_grad_enabled() else []
    out, lse = _RingAttention.apply(plan, q, k, v, *params)
    return out, lse
