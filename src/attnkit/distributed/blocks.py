"""What a full-sequence mask says about (query segment, key segment) blocks.

Context-parallel ranks evaluate one mask, defined on the full sequence, on blocks
of it (:meth:`attnkit.masks.Mask.shard`). Before computing or sending anything,
every rank must agree on which blocks the mask blocks entirely, so they can be
skipped on all ranks alike. :func:`block_is_empty` decides that from

- the bands (causal and window masks, any alignment): pure integer arithmetic;
- lengths and key padding held on the CPU (``valid_lens``, ``key_padding``): read
  on the host, which costs nothing there. On an accelerator they are never read
  (that would synchronize), and such blocks are computed (and give -inf lse).

Dense ``keep``/``bias`` tensors are never inspected: blocks they empty are computed.
:func:`mask_fingerprint` condenses the same information to integers, so ranks can
check they hold the same mask (a mismatch would make their schedules differ).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from .. import masks as _masks
from .._host import readable

__all__ = ["block_is_empty", "mask_fingerprint", "slice_mask_heads", "stable_hash"]


def stable_hash(items: Sequence[object]) -> int:
    """A 62-bit hash of the items' reprs, the same in every process (unlike ``hash``)."""
    digest = hashlib.blake2b(repr(list(items)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def _band_empty(
    part: _masks.WindowMask, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int
) -> bool:
    """True when no query of [q0, q0+L) keeps any key of [k0, k0+S) under this band."""
    off = part.offset(
        total_L, total_S
    )  # global query p keeps key c iff p+off-left <= c <= p+off+right
    lo = k0 if part.left is None else max(k0, q0 + off - part.left)
    hi = k0 + S - 1 if part.right is None else min(k0 + S - 1, q0 + L - 1 + off + part.right)
    return lo > hi


def _lengths_empty(part: _masks.ValidLensMask, q0: int, k0: int, L: int) -> bool:
    lens = part.lens
    if not readable(lens) or lens.numel() == 0:
        return lens.numel() == 0
    rows = lens if lens.ndim == 1 else lens[:, q0 : q0 + L]  # (B,) or (B, L)
    if rows.numel() == 0 or int(rows.max()) <= k0:
        return True  # every key of the block lies past every length
    ql = part.query_lens
    return ql is not None and readable(ql) and int(ql.max()) <= q0


def _padding_empty(part: _masks.KeyPaddingMask, k0: int, S: int) -> bool:
    pad = part.padding
    if not readable(pad):
        return False
    return bool(pad[:, k0 : k0 + S].all())


def block_is_empty(
    mask: _masks.Mask | None, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int
) -> bool:
    """True when ``mask`` (of the full (total_L, total_S) problem) keeps no pair of
    queries [q0, q0+L) and keys [k0, k0+S), as far as it can tell without a device
    sync. False means "maybe not empty": the block is computed."""
    if L == 0 or S == 0:
        return True
    if mask is None:
        return False
    for part in mask.parts():
        if isinstance(part, _masks.WindowMask):
            if _band_empty(part, q0, k0, L, S, total_L, total_S):
                return True
        elif isinstance(part, _masks.ValidLensMask):
            if _lengths_empty(part, q0, k0, L):
                return True
        elif isinstance(part, _masks.KeyPaddingMask) and _padding_empty(part, k0, S):
            return True
    return False


def mask_fingerprint(mask: _masks.Mask | None) -> int:
    """An int that equals on two ranks when their masks lead to the same block schedule:
    the bands' parameters and, for CPU-held lengths and padding, checksums of their
    values. Shapes of every mask tensor are included."""
    if mask is None:
        return 0
    items: list[object] = []
    for part in mask.parts():
        items.append(part.kind)
        for t in part._tensors():
            items.append(tuple(t.shape))
        if isinstance(part, _masks.WindowMask):
            items.extend((part.left, part.right, part.align, part.q_offset, part.k_offset))
        tensors: list[torch.Tensor] = []
        if isinstance(part, _masks.ValidLensMask):
            tensors = [part.lens] + ([part.query_lens] if part.query_lens is not None else [])
            items.append(part.queries)
        elif isinstance(part, _masks.KeyPaddingMask):
            tensors = [part.padding]
        for t in tensors:
            if readable(t):
                flat = t.reshape(-1).to(torch.long)
                weights = torch.arange(1, flat.numel() + 1, dtype=torch.long)
                items.append((int(flat.sum()), int((flat * weights).sum())))
    return stable_hash(items)


def _slice_dim(t: torch.Tensor, dim_from_end: int, start: int, size: int) -> torch.Tensor:
    if t.ndim < dim_from_end or t.shape[-dim_from_end] == 1:
        return t  # broadcast over that dim: every slice is the same
    return t.narrow(t.ndim - dim_from_end, start, size)


def slice_mask_heads(
    mask: _masks.Mask | None, batch_shape: Sequence[int], start: int, size: int
) -> _masks.Mask | None:
    """The mask of the same call restricted to heads [start, start+size) (dim -3 of the
    query, the last batch dim). Dense tensors are sliced along their head dim unless
    broadcast; per-batch lengths are sliced when the heads are the only batch dim."""
    if mask is None:
        return None
    heads_are_batch = len(batch_shape) == 1
    parts: list[_masks.Mask] = []
    for part in mask.parts():
        if isinstance(part, _masks.KeepMask):
            sliced_keep = _slice_dim(part.tensor, 3, start, size)
            parts.append(_masks.KeepMask(sliced_keep, source=part.source))
        elif isinstance(part, _masks.BiasMask):
            parts.append(_masks.bias(_slice_dim(part.tensor, 3, start, size)))
        elif heads_are_batch and isinstance(part, _masks.ValidLensMask):
            q_lens = part.query_lens
            sliced = _masks.valid_lens(part.lens[start : start + size], queries=part.queries)
            if q_lens is not None:
                sliced.query_lens = q_lens[start : start + size]  # (size,)
            parts.append(sliced)
        elif heads_are_batch and isinstance(part, _masks.KeyPaddingMask):
            parts.append(_masks.key_padding(part.padding[start : start + size]))
        else:
            parts.append(part)
    return parts[0] if len(parts) == 1 else _masks.AndMask(parts)
