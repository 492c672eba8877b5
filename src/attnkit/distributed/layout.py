"""Sequence layouts of context parallelism: which global positions each rank holds.

A sequence of ``n`` positions is cut into contiguous chunks; a rank holds one or
two of them (its **segments**, each ``(start, length)`` in global positions):

- ``"contiguous"``: ``P`` chunks, rank ``r`` holds chunk ``r``;
- ``"zigzag"``: ``2P`` chunks, rank ``r`` holds chunks ``r`` and ``2P - 1 - r``, so
  under a causal mask every rank has as many early (cheap) rows as late (costly)
  ones and the work is balanced.

Lengths that do not divide: chunk ``c`` of ``m`` has ``n // m + 1`` positions when
``c < n % m``, else ``n // m`` (shards are uneven, by at most one position per
chunk; nothing is padded). :func:`shard` cuts a full tensor for one rank and
:func:`assemble` puts every rank's shard back in global order;
:func:`unshard` does the same across a process group (a collective).
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Sequence
from typing import Literal

import torch
import torch.distributed as dist

from ..blockplan import stable_hash
from .comm import all_gather, metadata_device, require_group

__all__ = [
    "LAYOUTS",
    "Layout",
    "Segment",
    "assemble",
    "check_layout",
    "rank_segments",
    "segments",
    "shard",
    "shard_lengths",
    "unshard",
]

Layout = Literal["zigzag", "contiguous"]
LAYOUTS: tuple[str, ...] = ("zigzag", "contiguous")

Segment = tuple[int, int]
"""(global start, length) of a contiguous run of positions held by one rank."""


def check_layout(layout: object) -> Layout:
    """Return ``layout`` if it names a layout, else raise ValueError."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'zigzag' or 'contiguous', got {layout!r}")
    return layout  # type: ignore[return-value]


MAX_WORLD_SIZE = 2**20
"""The most ranks a layout is computed for (a list per rank: a world size of 2**40 ran
for ever)."""


def _check_int(name: str, value: object, minimum: int, maximum: int = 2**60) -> int:
    """``value`` as a Python int (NumPy ints too) in [minimum, maximum], or a ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    n = operator.index(value)
    if n < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {n}")
    if n > maximum:
        raise ValueError(f"{name}: expected an int from {minimum} to {maximum}, got {n}")
    return n


def _chunks(n: int, m: int) -> list[Segment]:
    """``m`` contiguous chunks of ``n`` positions, the first ``n % m`` one longer."""
    base, extra = divmod(n, m)
    out, start = [], 0
    for c in range(m):
        size = base + (1 if c < extra else 0)
        out.append((start, size))
        start += size
    return out


def segments(n: int, world_size: int, layout: Layout = "zigzag") -> list[list[Segment]]:
    """Every rank's segments: ``segments(n, P, layout)[r]`` is rank r's list of
    ``(global start, length)``, in the order the rank stores them.

    Args:
        n: the full sequence length, an int >= 0.
        world_size: the number of ranks P, an int from 1 to 2**20.
        layout: ``"zigzag"`` (default; two segments per rank, chunks ``r`` and
            ``2P - 1 - r`` of 2P) or ``"contiguous"`` (one segment, chunk ``r`` of P).

    Returns:
        A list of P lists of ``(start, length)`` tuples; chunks that do not divide
        evenly are one position longer at the front.

    Raises:
        ValueError: ``n`` or ``world_size`` is not an int in range, or an unknown
            ``layout``.

    Examples:
        >>> from attnkit import distributed as cp
        >>> cp.segments(10, 2)
        [[(0, 3), (8, 2)], [(3, 3), (6, 2)]]
        >>> cp.segments(10, 2, "contiguous")
        [[(0, 5)], [(5, 5)]]
    """
    n = _check_int("n", n, 0)
    world_size = _check_int("world_size", world_size, 1, MAX_WORLD_SIZE)
    check_layout(layout)
    if layout == "contiguous":
        return [[c] for c in _chunks(n, world_size)]
    chunks = _chunks(n, 2 * world_size)
    return [[chunks[r], chunks[2 * world_size - 1 - r]] for r in range(world_size)]


def rank_segments(n: int, world_size: int, rank: int, layout: Layout = "zigzag") -> list[Segment]:
    """Rank ``rank``'s segments (see :func:`segments`).

    Args:
        n: the full sequence length, an int >= 0.
        world_size: the number of ranks P, an int from 1 to 2**20.
        rank: the rank, an int in [0, P).
        layout: ``"zigzag"`` (default) or ``"contiguous"``.

    Returns:
        The rank's list of ``(global start, length)``, in the order it stores them.

    Raises:
        ValueError: an argument out of range or an unknown ``layout``.

    Examples:
        >>> from attnkit import distributed as cp
        >>> cp.rank_segments(10, 2, 1)
        [(3, 3), (6, 2)]
    """
    rank = _check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank: expected an int in [0, {world_size}), got {rank}")
    return segments(n, world_size, layout)[rank]


def shard_lengths(n: int, world_size: int, layout: Layout = "zigzag") -> list[int]:
    """How many positions each rank holds.

    Args:
        n: the full sequence length, an int >= 0.
        world_size: the number of ranks P, an int from 1 to 2**20.
        layout: ``"zigzag"`` (default) or ``"contiguous"``.

    Returns:
        A list of P ints, rank r's shard length along the sequence dim (they add up
        to ``n`` and differ by at most 2 in the zigzag layout, 1 in the contiguous).

    Raises:
        ValueError: an argument out of range or an unknown ``layout``.

    Examples:
        >>> from attnkit import distributed as cp
        >>> cp.shard_lengths(10, 3)
        [3, 3, 4]
    """
    return [sum(length for _, length in segs) for segs in segments(n, world_size, layout)]


def _seq_dim(x: torch.Tensor, dim: object) -> int:
    """``dim`` as an index of ``x``'s dims; ValueError naming it when it is none of them."""
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.ndim <= dim < x.ndim:
        raise ValueError(
            f"dim: expected an int in [-{x.ndim}, {x.ndim}) for x of shape "
            f"{tuple(x.shape)}, got {dim!r}"
        )
    return dim % x.ndim


def _rank_and_size(
    group: dist.ProcessGroup | None, rank: int | None, world_size: int | None
) -> tuple[int, int]:
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError("rank, world_size: give both, or a process group instead")
        _check_int("world_size", world_size, 1)
        return _check_int("rank", rank, 0), world_size
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "group: torch.distributed is not initialized; pass rank= and world_size= or "
            "call torch.distributed.init_process_group first"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def shard(
    x: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    layout: Layout = "zigzag",
    dim: int = -2,
) -> torch.Tensor:
    """This rank's shard of the full tensor ``x`` along ``dim`` (the sequence dim).

    Args:
        x: the full tensor, e.g. (B, H, N, E) with the sequence at ``dim``.
        group: the process group (its rank and size are used), or give ``rank``
            and ``world_size`` explicitly (no process group needed).
        rank: this rank, an int in [0, world_size), with ``world_size`` instead of a
            group (default None: the group's).
        world_size: the number of ranks P, with ``rank`` (default None: the group's).
        layout: ``"zigzag"`` or ``"contiguous"``.
        dim: the sequence dim.

    Returns:
        The positions of this rank's segments, concatenated in order: shape of ``x``
        with ``dim`` of size ``shard_lengths(N, P, layout)[rank]``. Differentiable.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    r, p = _rank_and_size(group, rank, world_size)
    if r >= p:
        raise ValueError(f"rank: expected an int in [0, {p}), got {r}")
    dim = _seq_dim(x, dim)
    n = x.shape[dim]
    parts = [x.narrow(dim, start, length) for start, length in segments(n, p, layout)[r]]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def assemble(
    shards: Sequence[torch.Tensor], *, layout: Layout = "zigzag", dim: int = -2
) -> torch.Tensor:
    """The full tensor from every rank's shard (``shards[r]`` from rank r), in global
    order along ``dim``. Differentiable; the inverse of :func:`shard`.

    No process group is needed (for shards gathered by other means, or in tests);
    :func:`unshard` is the collective form.

    Args:
        shards: one tensor per rank, in rank order, each of the rank's shard length
            along ``dim`` (:func:`shard_lengths` of the total) and equal elsewhere.
        layout: keyword-only, the layout they were cut with: ``"zigzag"`` (default) or
            ``"contiguous"``.
        dim: keyword-only, the sequence dim (default -2).

    Returns:
        The full tensor, of the shards' shape with ``dim`` of the total length.

    Raises:
        TypeError: ``shards`` is not a list of tensors.
        ValueError: no shards, shards that differ in a dim other than ``dim``, ``dim``
            not a dim of them, a shard's length is not what the layout gives its rank,
            or an unknown ``layout``.

    Examples:
        >>> import torch
        >>> from attnkit import distributed as cp
        >>> x = torch.arange(10.0).view(1, 10, 1)              # (B, N, E)
        >>> shards = [cp.shard(x, rank=r, world_size=2) for r in range(2)]
        >>> shards[0].flatten().tolist()
        [0.0, 1.0, 2.0, 8.0, 9.0]
        >>> torch.equal(cp.assemble(shards), x)
        True
    """
    if isinstance(shards, torch.Tensor) or not isinstance(shards, (list, tuple)):
        raise TypeError(
            f"shards: expected a list of tensors, one per rank, got {type(shards).__name__}"
        )
    if not shards:
        raise ValueError("shards: expected one tensor per rank, got none")
    for r, s in enumerate(shards):
        if not isinstance(s, torch.Tensor):
            raise TypeError(f"shards: rank {r}'s shard is a {type(s).__name__}, not a tensor")
    d = _seq_dim(shards[0], dim)
    first = shards[0]
    for r, s in enumerate(shards):
        if (
            s.ndim != first.ndim
            or s.shape[:d] != first.shape[:d]
            or s.shape[d + 1 :] != (first.shape[d + 1 :])
        ):
            raise ValueError(
                f"shards: rank {r}'s shard {tuple(s.shape)} differs from rank 0's "
                f"{tuple(first.shape)} in a dim other than dim {dim}, which every shard shares"
            )
    p = len(shards)
    n = sum(int(s.shape[dim]) for s in shards)
    segs = segments(n, p, layout)
    pieces: list[tuple[int, torch.Tensor]] = []
    for r, (s, rank_segs) in enumerate(zip(shards, segs, strict=True)):
        held = sum(length for _, length in rank_segs)
        if s.shape[dim] != held:
            raise ValueError(
                f"shards: rank {r}'s shard has {s.shape[dim]} positions along dim {dim}, "
                f"expected {held} for a {layout} layout of {n} positions over {p} ranks"
            )
        offset = 0
        for start, length in rank_segs:
            pieces.append((start, s.narrow(dim, offset, length)))
            offset += length
    pieces.sort(key=lambda item: item[0])
    return torch.cat([t for _, t in pieces], dim=dim)


def unshard(
    x: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    layout: Layout = "zigzag",
    dim: int = -2,
) -> torch.Tensor:
    """The full tensor on every rank, from each rank's shard ``x`` (a collective: every
    rank of ``group`` calls it). Shards may differ in length along ``dim`` as the
    layout cuts them; every other dim must match. Not differentiable.

    Args:
        x: this rank's shard, e.g. (B, H, N_r, E) with the sequence at ``dim``.
        group: keyword-only, the process group (default None: the default group).
        layout: keyword-only, ``"zigzag"`` (default) or ``"contiguous"``, as the
            shards were cut.
        dim: keyword-only, the sequence dim (default -2).

    Returns:
        The full tensor (detached), the same on every rank: ``x``'s shape with
        ``dim`` of the total length, in global order.

    Raises:
        TypeError: ``x`` is not a torch.Tensor (on that rank; every other rank raises a
            ValueError naming it).
        ValueError: a shard's length does not match the layout (see :func:`assemble`);
            the ranks' shards differ in dtype or in a dim other than ``dim`` (on every
            rank); ``dim`` is not a dim of ``x`` (on that rank; the others name it).
        ContextParallelError: an all_gather failed (a rank died or timed out).

    Example::

        out_local = cp.context_parallel_attention(q_local, k_local, v_local)
        out = cp.unshard(out_local)         # every rank: (B, H, N, Ev)
    """
    require_group("unshard")
    # this rank's own error travels in the first all_gather, so that every rank raises
    # (the others would wait in it until the group's timeout)
    own: Exception | None = None
    d = 0
    if not isinstance(x, torch.Tensor):
        own = TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    else:
        try:
            d = _seq_dim(x, dim)
        except ValueError as exc:
            own = exc
    p = dist.get_world_size(group)
    if own is None:
        # its length along d, and a hash of all the rest of its shape and its dtype:
        # shards that differ there would be gathered as bytes of another size or type
        rest = stable_hash([x.ndim, d, str(x.dtype), [*x.shape[:d], *x.shape[d + 1 :]]])
        fields = [x.shape[d], rest, 0]
    else:
        fields = [0, 0, 1]
    where = metadata_device(group, x)
    head = torch.tensor(fields, dtype=torch.long, device=where)  # (3,): length, rest, failed
    heads = [torch.zeros_like(head) for _ in range(p)]
    all_gather(heads, head, group, "the shard shapes of unshard")
    if own is not None:
        raise own
    failed = [r for r, h in enumerate(heads) if int(h[2])]
    if failed:
        raise ValueError(
            f"x, dim: rank {failed[0]} passed a shard unshard cannot take (its own error "
            "says why), so no rank gathers"
        )
    differ = [r for r, h in enumerate(heads) if int(h[1]) != int(heads[0][1])]
    if differ:  # (every rank sees every head: each raises the same)
        raise ValueError(
            f"x: rank {differ[0]}'s shard differs from rank 0's in its dtype, its number of "
            f"dims or a dim other than dim {dim}, which every rank must share (this rank's: "
            f"{tuple(x.shape)}, {x.dtype})"
        )
    sizes = [int(h[0]) for h in heads]
    longest = max(sizes)
    pad_shape = list(x.shape)
    pad_shape[d] = longest - x.shape[d]
    padded = torch.cat([x.detach(), x.new_zeros(pad_shape)], dim=d).contiguous()
    gathered = [torch.empty_like(padded) for _ in range(p)]
    all_gather(gathered, padded, group, "the shards of unshard")
    return assemble(
        [g.narrow(d, 0, size) for g, size in zip(gathered, sizes, strict=True)],
        layout=layout,
        dim=d,
    )
