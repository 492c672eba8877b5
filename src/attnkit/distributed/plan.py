"""Validate a context-parallel call on every rank at once, then plan it.

The ranks first agree on the call (:func:`attnkit.distributed.agree.agree`): one
all_gather of every rank's status and the fingerprints and checksums of every
argument, so bad input or a disagreement raises the same
:class:`ContextParallelError` on every rank and no rank is left waiting in a
collective. From that shared view every rank then derives the same
:class:`CallPlan`: where every rank's positions sit, which (query segment, key
segment) blocks the mask leaves non-empty and how far each rank's K/V shard must
travel on the ring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from .. import masks as _masks
from .._far_rows import far_limit, far_rows
from ..scores import Score
from .agree import STRATEGIES, agree
from .blocks import block_is_empty
from .errors import ContextParallelError
from .layout import Layout, Segment, segments

__all__ = [
    "STRATEGIES",
    "Block",
    "CallPlan",
    "ContextParallelError",
    "Strategy",
    "all_to_all_reasons",
    "call_batch_shape",
    "check_full_mask",
    "plan_blocks",
    "prepare",
]

Strategy = Literal["ring", "all_to_all"]


@dataclass(frozen=True)
class Block:
    """One (query segment, key segment) pair of a rank and a K/V origin, in both local
    and global coordinates."""

    q_index: int  # which of the rank's query segments
    q_local: int  # its offset in the rank's query shard
    q_global: int
    L: int
    k_local: int  # offset of the key segment in the origin's K/V shard
    k_global: int
    S: int


@dataclass
class CallPlan:
    """A validated context-parallel call: the same on every rank but ``rank``."""

    group: dist.ProcessGroup | None
    rank: int
    world_size: int
    layout: Layout
    strategy: Strategy
    why: str
    score: Score
    mask: _masks.Mask | None
    scale: float | torch.Tensor | None  # a tensor: one scale per query head (H,) or (1,)
    backend: str | Sequence[str] | None
    total_L: int
    total_S: int
    q_segments: list[list[Segment]]
    kv_segments: list[list[Segment]]
    kv_lengths: list[int]
    batch_shape: tuple[int, ...]
    blocks: list[
        list[list[Block]]
    ]  # blocks[r][o]: non-empty blocks of rank r's queries, origin o's keys
    last_hop: list[int]  # last_hop[o]: the last ring step at which origin o's K/V is needed

    @property
    def q_lengths(self) -> list[int]:
        return [sum(n for _, n in segs) for segs in self.q_segments]


def _local_segments(segs: list[Segment]) -> list[tuple[int, int, int]]:
    """(local offset, global start, length) of each segment."""
    out, offset = [], 0
    for start, length in segs:
        out.append((offset, start, length))
        offset += length
    return out


def plan_blocks(
    mask: _masks.Mask | None,
    q_segments: list[list[Segment]],
    kv_segments: list[list[Segment]],
    total_L: int,
    total_S: int,
    batch_shape: Sequence[int],
) -> tuple[list[list[list[Block]]], list[int]]:
    """The non-empty blocks of every (rank, K/V origin) pair and each origin's last ring
    step: origin o's K/V sits on rank (o + t) % P at step t and travels no further than
    the last step at which some rank needs it. ``batch_shape``: the call's leading dims
    (:func:`call_batch_shape`), which the mask's tensors broadcast against."""
    P = len(q_segments)
    blocks: list[list[list[Block]]] = []
    for r in range(P):
        row = []
        for o in range(P):
            found = []
            for qi, (ql, qg, L) in enumerate(_local_segments(q_segments[r])):
                for kl, kg, S in _local_segments(kv_segments[o]):
                    if not block_is_empty(mask, qg, kg, L, S, total_L, total_S,
                                          batch_shape):  # fmt: skip
                        found.append(Block(qi, ql, qg, L, kl, kg, S))
            row.append(found)
        blocks.append(row)
    last_hop = []
    for o in range(P):
        steps = [t for t in range(P) if blocks[(o + t) % P][o]]
        last_hop.append(max(steps, default=0))
    return blocks, last_hop


def all_to_all_reasons(
    q_shape: Sequence[int], k_shape: Sequence[int], world_size: int
) -> list[str]:
    """Why the all-to-all strategy cannot run these shapes (empty when it can)."""
    if len(q_shape) < 3 or len(k_shape) < 3:
        return ["needs a head dim (-3) on query and key to split heads across ranks"]
    reasons = []
    hq, hk = int(q_shape[-3]), int(k_shape[-3])
    if hq % world_size:
        reasons.append(f"{hq} query heads do not divide by {world_size} ranks")
    if hk % world_size:
        reasons.append(f"{hk} key/value heads do not divide by {world_size} ranks")
    return reasons


def ring_reasons(
    mask: _masks.Mask | None,
    sizes: tuple[int, int, Sequence[int]] | None = None,
    dtype: torch.dtype = torch.float32,
) -> list[str]:
    """Why the ring cannot run a call with this mask (empty when it can); ``sizes``
    (total_L, total_S, batch_shape) of the full call, where known, to read its bias;
    ``dtype`` the inputs' (how far a bias row may lie, :func:`attnkit._far_rows.far_limit`)."""
    if mask is not None and torch.is_grad_enabled():
        if any(t.requires_grad for t in mask.tensors()):
            return [
                "a mask tensor requires grad (a learnable bias), and the ring's backward "
                "gives the mask no gradient"
            ]
    if mask is not None and sizes is not None:
        total_L, total_S, batch_shape = sizes
        device = next((t.device for t in mask.tensors()), torch.device("cpu"))
        limit = far_limit(dtype)
        if far_rows(mask, total_L, total_S, batch_shape, device, limit) is not None:
            compute = "float64" if dtype == torch.float64 else "float32"
            return [
                f"a bias row lies beyond ±{limit:.3g} for every key it keeps (-1e30, "
                f"finfo.min): its blocks' lse values, which the ring merges, round alike "
                f"in {compute} and lose each block's share (attnkit._far_rows)"
            ]
    return []


def choose_strategy(
    strategy: str | None,
    q_shape: Sequence[int],
    k_shape: Sequence[int],
    world_size: int,
    mask: _masks.Mask | None = None,
    sizes: tuple[int, int, Sequence[int]] | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Strategy, str, dict[str, list[str]]]:
    """(chosen strategy, why, reasons each strategy cannot run); ContextParallelError when
    the strategy asked for, or both when none is, cannot run the call. ``sizes``:
    (total_L, total_S, batch_shape) of the full call and ``dtype`` the inputs', for
    :func:`ring_reasons`."""
    reasons: dict[str, list[str]] = {
        "ring": ring_reasons(mask, sizes, dtype),
        "all_to_all": all_to_all_reasons(q_shape, k_shape, world_size),
    }
    if strategy is not None:
        if reasons[strategy]:
            other = "all_to_all" if strategy == "ring" else "ring"
            raise ContextParallelError(
                f"strategy: {strategy!r} cannot run this call: {'; '.join(reasons[strategy])}; "
                f"use strategy={other!r} or strategy=None"
            )
        return strategy, f"strategy={strategy!r} was asked for", reasons  # type: ignore[return-value]
    if not reasons["all_to_all"]:
        why = (
            "all_to_all: heads divide by the world size; it moves q, k, v and the output "
            "once (about 4·N·H·E/P values per rank) and runs one attention call over the "
            "full sequence, where the ring moves K/V P-1 times (about 2·N·H·E values per rank)"
        )
        return "all_to_all", why, reasons
    if reasons["ring"]:
        raise ContextParallelError(
            "strategy: neither strategy can run this call: all_to_all: "
            + "; ".join(reasons["all_to_all"])
            + "; ring: "
            + "; ".join(reasons["ring"])
        )
    why = "ring: all_to_all cannot run (" + "; ".join(reasons["all_to_all"]) + ")"
    return "ring", why, reasons


def check_full_mask(
    mask: _masks.Mask | None, batch_shape: Sequence[int], total_L: int, total_S: int, hint: str
) -> None:
    """Raise :class:`ContextParallelError` (a ``ValueError``) naming ``mask`` when it does
    not describe the full problem: ``batch_shape + (total_L, total_S)``; ``hint`` says
    where the lengths come from."""
    if mask is None:
        return
    try:
        mask.validate(batch_shape, total_L, total_S)
    except ValueError as exc:
        raise ContextParallelError(
            f"mask: must describe the full sequence of {total_L} queries and {total_S} keys "
            f"({hint}): {exc}"
        ) from exc


def call_batch_shape(q_shape: Sequence[int], k_shape: Sequence[int]) -> tuple[int, ...]:
    """Leading dims of the call (query's heads win over key's under grouped-query)."""
    qb, kb = list(q_shape[:-2]), list(k_shape[:-2])
    if qb and kb and kb[-1] != 1 and kb[-1] != qb[-1]:
        kb[-1] = qb[-1]
    return tuple(int(d) for d in torch.broadcast_shapes(torch.Size(qb), torch.Size(kb)))


def _plan_scale(scale: object) -> float | torch.Tensor | None:
    """The agreed scale: None, a float, or a per-head tensor (it travels as it is, like a
    score parameter; the all-to-all gives each rank its heads' part)."""
    if scale is None or isinstance(scale, torch.Tensor):
        return scale
    return float(scale)  # type: ignore[arg-type]


def prepare(
    q: object,
    k: object,
    v: object,
    *,
    group: dist.ProcessGroup | None,
    score: object,
    mask: object,
    scale: object,
    layout: object,
    strategy: object,
    backend: str | Sequence[str] | None,
    problem: Exception | None = None,
) -> CallPlan:
    """Check the call on every rank together and plan it (a collective). ``problem``:
    an error the caller found with this rank's call, shipped in the agreement."""
    if not dist.is_available() or not dist.is_initialized():
        raise ContextParallelError(
            "group: torch.distributed is not initialized; call "
            "torch.distributed.init_process_group first (torchrun sets up the environment)"
        )
    P = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if P < 2:
        raise ContextParallelError(
            f"group: context parallelism needs a process group of at least 2 ranks, got {P}; "
            "on one process call attnkit.attention on the full sequence"
        )
    agreed = agree(
        q, k, v, group=group, score=score, mask=mask, scale=scale, layout=layout,
        strategy=strategy, backend=backend, problem=problem,
    )  # fmt: skip
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
    sc, m = agreed.score, agreed.mask
    q_lens = [agreed.shape(r, "query")[-2] for r in range(P)]
    kv_lens = [agreed.shape(r, "key")[-2] for r in range(P)]
    total_L, total_S = sum(q_lens), sum(kv_lens)
    lay: Layout = layout  # type: ignore[assignment]
    q_segs, kv_segs = segments(total_L, P, lay), segments(total_S, P, lay)
    for what, lens, segs, total in (
        ("query", q_lens, q_segs, total_L),
        ("key/value", kv_lens, kv_segs, total_S),
    ):
        expected = [sum(n for _, n in s) for s in segs]
        if lens != expected:
            raise ContextParallelError(
                f"{what}: the ranks hold {lens} positions (dim -2); a {layout} layout of "
                f"{total} positions over {P} ranks holds {expected}; cut the sequence with "
                f"attnkit.distributed.shard(x, group=..., layout={layout!r})"
            )
    batch_shape = call_batch_shape(q.shape, k.shape)
    check_full_mask(m, batch_shape, total_L, total_S, "every rank passes the same mask")
    sizes = (total_L, total_S, batch_shape)
    chosen, why, _ = choose_strategy(strategy, q.shape, k.shape, P, m, sizes, q.dtype)  # type: ignore[arg-type]
    blocks, last_hop = plan_blocks(m, q_segs, kv_segs, total_L, total_S, batch_shape)
    return CallPlan(
        group=group,
        rank=rank,
        world_size=P,
        layout=lay,
        strategy=chosen,
        why=why,
        score=sc,
        mask=m,
        scale=_plan_scale(scale),
        backend=backend,
        total_L=total_L,
        total_S=total_S,
        q_segments=q_segs,
        kv_segments=kv_segs,
        kv_lengths=kv_lens,
        batch_shape=batch_shape,
        blocks=blocks,
        last_hop=last_hop,
    )
