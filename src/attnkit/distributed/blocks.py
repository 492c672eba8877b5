"""What a full-sequence mask says about (query segment, key segment) blocks.

Context-parallel ranks evaluate one mask, defined on the full sequence, on blocks
of it (:meth:`attnkit.masks.Mask.shard`). Before computing or sending anything,
every rank must agree on which blocks the mask blocks entirely, so they can be
skipped on all ranks alike. :func:`block_is_empty` asks the block's plan
(:func:`attnkit.blockplan.build_plan` at the block's global positions): bands are
integer arithmetic; lengths, key padding, document ids and dense keep tensors held
on the CPU are read there, which costs nothing. On an accelerator they are never
read (that would synchronize), and such blocks are computed (and give -inf lse).
:func:`mask_fingerprint` condenses a mask's structure and its CPU-held values to an
integer, so ranks can check they hold the same mask.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import masks as _masks
from ..blockplan import build_plan, stable_hash

__all__ = ["block_is_empty", "mask_fingerprint", "slice_mask_heads", "stable_hash"]


def block_is_empty(
    mask: _masks.Mask | None,
    q0: int,
    k0: int,
    L: int,
    S: int,
    total_L: int,
    total_S: int,
    batch_shape: Sequence[int] | None = None,
) -> bool:
    """True when ``mask`` (of the full (total_L, total_S) problem) keeps no pair of
    queries [q0, q0+L) and keys [k0, k0+S), as far as it can tell without a device
    sync. False means "maybe not empty": the block is computed. ``batch_shape``: the
    call's leading dims (default: the mask's own batch dim, if any)."""
    if L == 0 or S == 0:
        return True
    if mask is None:
        return False
    if batch_shape is None:
        batch_shape = _batch_of(mask)
    plan = build_plan(mask, L, S, batch_shape, "cpu" if _all_cpu(mask) else _device(mask),
                      q_start=q0, k_start=k0, total_L=total_L, total_S=total_S)  # fmt: skip
    return bool(plan.is_empty())


def _all_cpu(mask: _masks.Mask) -> bool:
    return all(t.device.type == "cpu" for t in mask.tensors())


def _device(mask: _masks.Mask) -> torch.device:
    return next(t.device for t in mask.tensors() if t.device.type != "cpu")


def _batch_of(mask: _masks.Mask) -> tuple[int, ...]:
    """Leading dims that fit the mask's tensors: its per-batch dim, or a dense tensor's."""
    shape: tuple[int, ...] = ()

    def note(t: torch.Tensor, role: str) -> torch.Tensor:
        nonlocal shape
        dims = (int(t.shape[0]),) if role == "batch" else tuple(int(d) for d in t.shape[:-2])
        if len(dims) > len(shape):
            shape = dims
        return t

    mask.map_tensors(note)
    return shape


def mask_fingerprint(mask: _masks.Mask | None) -> int:
    """An int that equals on two ranks holding masks of the same structure: kinds,
    static parameters (bands, alignments, offsets) and tensor shapes, dtypes and
    devices. Tensor values are compared apart, by checksums
    (:mod:`attnkit.distributed.checksum`), so a difference there is named as such."""
    if mask is None:
        return 0
    return stable_hash([repr(mask.signature(0, 0))])


def _slice_dim(t: torch.Tensor, dim_from_end: int, start: int, size: int) -> torch.Tensor:
    if t.ndim < dim_from_end or t.shape[-dim_from_end] == 1:
        return t  # broadcast over that dim: every slice is the same
    return t.narrow(t.ndim - dim_from_end, start, size)


def slice_mask_heads(
    mask: _masks.Mask | None, batch_shape: Sequence[int], start: int, size: int
) -> _masks.Mask | None:
    """The mask of the same call restricted to heads [start, start+size) (dim -3 of the
    query, the last batch dim). Dense tensors are sliced along their head dim unless
    broadcast; per-batch tensors are sliced when the heads are the only batch dim."""
    if mask is None:
        return None
    heads_are_batch = len(batch_shape) == 1

    def cut(t: torch.Tensor, role: str) -> torch.Tensor:
        if role == "dense":
            return _slice_dim(t, 3, start, size)
        if heads_are_batch and t.shape[0] != 1:  # (one row is broadcast over the heads)
            return t[start : start + size]
        return t

    return mask.map_tensors(cut)
