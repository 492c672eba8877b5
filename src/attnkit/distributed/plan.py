"""Validate a context-parallel call on every rank at once, then plan it.

Every rank checks its own arguments first and turns a failure into an error code
instead of raising, then all ranks exchange one small vector of metadata
(:func:`attnkit.distributed.comm.exchange_metadata`): shapes, dtype, layout,
strategy, score and a fingerprint of the mask. From that shared view every rank
reaches the same verdict, so bad input raises the same error on every rank and no
rank is left waiting in a collective. The :class:`CallPlan` that comes out says
where every rank's positions sit, which (query segment, key segment) blocks the
mask leaves non-empty and how far each rank's K/V shard must travel on the ring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from .. import masks as _masks
from ..functional import explain as _explain
from ..scores import Score, resolve_score
from .blocks import block_is_empty, mask_fingerprint, stable_hash
from .comm import exchange_metadata, metadata_device
from .layout import LAYOUTS, Layout, Segment, segments

__all__ = [
    "STRATEGIES",
    "Block",
    "CallPlan",
    "ContextParallelError",
    "Strategy",
    "all_to_all_reasons",
    "plan_blocks",
    "prepare",
]

Strategy = Literal["ring", "all_to_all"]
STRATEGIES: tuple[str, ...] = ("ring", "all_to_all")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_MAX_DIMS = 8


class ContextParallelError(ValueError):
    """Raised on every rank when any rank's arguments are bad or ranks disagree."""


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
    scale: float | None
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
) -> tuple[list[list[list[Block]]], list[int]]:
    """The non-empty blocks of every (rank, K/V origin) pair and each origin's last ring
    step: origin o's K/V sits on rank (o + t) % P at step t and travels no further than
    the last step at which some rank needs it."""
    P = len(q_segments)
    blocks: list[list[list[Block]]] = []
    for r in range(P):
        row = []
        for o in range(P):
            found = []
            for qi, (ql, qg, L) in enumerate(_local_segments(q_segments[r])):
                for kl, kg, S in _local_segments(kv_segments[o]):
                    if not block_is_empty(mask, qg, kg, L, S, total_L, total_S):
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


def choose_strategy(
    strategy: str | None, q_shape: Sequence[int], k_shape: Sequence[int], world_size: int
) -> tuple[Strategy, str, dict[str, list[str]]]:
    """(chosen strategy, why, reasons each strategy cannot run)."""
    reasons: dict[str, list[str]] = {
        "ring": [],
        "all_to_all": all_to_all_reasons(q_shape, k_shape, world_size),
    }
    if strategy is not None:
        if reasons[strategy]:
            raise ContextParallelError(
                f"strategy: {strategy!r} cannot run this call: {'; '.join(reasons[strategy])}; "
                "use strategy='ring' or strategy=None"
            )
        return strategy, f"strategy={strategy!r} was asked for", reasons  # type: ignore[return-value]
    if not reasons["all_to_all"]:
        why = (
            "all_to_all: heads divide by the world size; it moves q, k, v and the output "
            "once (about 4·N·H·E/P values per rank) and runs one attention call over the "
            "full sequence, where the ring moves K/V P-1 times (about 2·N·H·E values per rank)"
        )
        return "all_to_all", why, reasons
    why = "ring: all_to_all cannot run (" + "; ".join(reasons["all_to_all"]) + ")"
    return "ring", why, reasons


def _batch_shape(q_shape: Sequence[int], k_shape: Sequence[int]) -> tuple[int, ...]:
    """Leading dims of the call (query's heads win over key's under grouped-query)."""
    qb, kb = list(q_shape[:-2]), list(k_shape[:-2])
    if qb and kb and kb[-1] not in (1, qb[-1]):
        kb[-1] = qb[-1]
    return tuple(int(d) for d in torch.broadcast_shapes(torch.Size(qb), torch.Size(kb)))


def _padded(shape: Sequence[int]) -> list[int]:
    return [len(shape), *shape, *([-1] * (_MAX_DIMS - len(shape)))]


def _score_code(score: Score) -> int:
    items = [type(score).__name__] + [str(tuple(p.shape)) for p in score.parameters()]
    return stable_hash(items)


def _normalize_mask(mask: object) -> _masks.Mask | None:
    if mask is None or isinstance(mask, _masks.Mask):
        return mask
    if isinstance(mask, torch.Tensor) and mask.is_floating_point():
        return _masks.bias(mask)
    raise TypeError(
        "mask: expected an attnkit mask on the full sequence (masks.causal(), "
        f"masks.valid_lens(...), ...), a float bias tensor or None, got {type(mask).__name__}"
        + (f" of dtype {mask.dtype}" if isinstance(mask, torch.Tensor) else "")
    )


def _check_local(
    q: object,
    k: object,
    v: object,
    score: object,
    mask: object,
    scale: object,
    layout: object,
    strategy: object,
) -> tuple[Score, _masks.Mask | None]:
    """This rank's own checks, with the core's messages where it has them."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'zigzag' or 'contiguous', got {layout!r}")
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected 'ring', 'all_to_all' or None, got {strategy!r}")
    for name, t in (("query", q), ("key", k), ("value", v)):
        if isinstance(t, torch.Tensor) and t.ndim > _MAX_DIMS:
            raise ValueError(f"{name}: at most {_MAX_DIMS} dims are supported, got {t.ndim}")
    _explain(q, k, v, score=score, scale=scale)  # type: ignore[arg-type]
    return resolve_score(score), _normalize_mask(mask)  # type: ignore[arg-type]


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
) -> CallPlan:
    """Check the call on every rank together and plan it (a collective)."""
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
    local_error: Exception | None = None
    sc: Score | None = None
    m: _masks.Mask | None = None
    try:
        sc, m = _check_local(q, k, v, score, mask, scale, layout, strategy)
    except (TypeError, ValueError) as exc:
        local_error = exc
    ok = local_error is None
    meta = [0 if ok else 1]
    if ok:
        assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
        assert isinstance(v, torch.Tensor) and sc is not None
        meta += _padded(q.shape) + _padded(k.shape) + _padded(v.shape)
        meta += [
            _DTYPES.index(q.dtype),
            LAYOUTS.index(str(layout)),
            -1 if strategy is None else STRATEGIES.index(str(strategy)),
            _score_code(sc),
            mask_fingerprint(m),
            -1 if scale is None else int(float(scale) * 2**40),  # type: ignore[arg-type]
        ]
    meta += [0] * (1 + 3 * (_MAX_DIMS + 1) + 6 - len(meta))
    everyone = exchange_metadata(meta, group, metadata_device(group, q))
    bad = [r for r, row in enumerate(everyone) if row[0] != 0]
    if local_error is not None:
        raise local_error
    if bad:
        raise ContextParallelError(
            f"context_parallel_attention: rank(s) {bad} rejected their arguments (see the "
            "error raised there); no rank computed anything"
        )
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and sc is not None
    _check_agreement(everyone, rank)
    q_lens = [row[1 + (len(q.shape) - 2) + 1] for row in everyone]
    k_off = 1 + _MAX_DIMS + 1
    kv_lens = [row[k_off + (len(k.shape) - 2) + 1] for row in everyone]
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
    batch_shape = _batch_shape(q.shape, k.shape)
    if m is not None:
        try:
            m.validate(batch_shape, total_L, total_S)
        except ValueError as exc:
            raise ContextParallelError(
                f"mask: must describe the full sequence of {total_L} queries and {total_S} "
                f"keys (every rank passes the same mask): {exc}"
            ) from exc
    chosen, why, _ = choose_strategy(strategy, q.shape, k.shape, P)  # type: ignore[arg-type]
    blocks, last_hop = plan_blocks(m, q_segs, kv_segs, total_L, total_S)
    return CallPlan(
        group=group,
        rank=rank,
        world_size=P,
        layout=lay,
        strategy=chosen,
        why=why,
        score=sc,
        mask=m,
        scale=None if scale is None else float(scale),  # type: ignore[arg-type]
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


_FIELDS = ["query shape", "key shape", "value shape"]


def _check_agreement(everyone: list[list[int]], rank: int) -> None:
    """Raise the same error on every rank unless all ranks agree on everything but the
    sequence lengths."""
    width = _MAX_DIMS + 1
    first = everyone[0]
    for r, row in enumerate(everyone[1:], start=1):
        for f, name in enumerate(_FIELDS):
            a, b = (
                first[1 + f * width : 1 + (f + 1) * width],
                row[1 + f * width : 1 + (f + 1) * width],
            )
            na, nb = a[0], b[0]
            shape_a, shape_b = a[1 : 1 + na], b[1 : 1 + nb]
            if na != nb or shape_a[:-2] != shape_b[:-2] or shape_a[-1] != shape_b[-1]:
                raise ContextParallelError(
                    f"{name.split()[0]}: rank 0 has a shard of shape {tuple(shape_a)} and rank "
                    f"{r} has {tuple(shape_b)}; expected the same shape on every rank except "
                    "the sequence dim (-2)"
                )
        tail_a, tail_b = first[1 + 3 * width :], row[1 + 3 * width :]
        names = ["dtype", "layout", "strategy", "score", "mask", "scale"]
        for name, x, y in zip(names, tail_a, tail_b, strict=True):
            if x != y:
                raise ContextParallelError(
                    f"{name}: rank 0 and rank {r} passed different {name}s; every rank must "
                    "pass the same arguments (the mask and score defined on the full sequence)"
                )
