"""The block structure of a mask: what any tiled kernel may skip, cut or load per tile.

A mask is sorted into the pieces a tiled kernel treats differently:

- **bands** (causal and window masks, any alignment and offset): ``(left, right,
  shift)`` with key ``j`` kept for query ``i`` iff ``i + shift - left <= j <= i +
  shift + right`` (``None`` = unbounded side). They give every query block a key
  range, so blocks outside it are never computed;
- **per-batch lengths** (``valid_lens``, ``key_padding``): ``key_lens`` (B0,),
  ``query_lens`` (B0,), ``row_lens`` (B0, L), ``key_keep`` (B0, S); they cut each
  batch element's queries and keys;
- **dense tensors** (``keep``/``bias``, also ``tf``/``block``): loaded tile by tile.

B0 is the first batch dim; rows are laid out as (B0, R) flattened to N = B0 * R.

:func:`build_plan` takes a mask and the sizes of a call, never the call record, so
every backend (the chunked tiles, GPU kernels, context-parallel ring steps) reuses
it; with ``q_start``/``k_start`` and the full sizes it plans one block of a longer
sequence at its true positions (:meth:`attnkit.masks.Mask.shard`). Building reads
nothing on the host. :meth:`BlockPlan.tile_states` classifies every (query block,
key block) tile as empty, partial or full with tensor operations on the mask's
device, and :meth:`BlockPlan.to_block_mask` turns the plan into a FlexAttention
``BlockMask`` when the installed torch has one (torch >= 2.5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import masks as _masks

__all__ = ["EMPTY", "FULL", "PARTIAL", "Band", "BlockPlan", "build_plan"]

Band = tuple[int | None, int | None, int]
"""(left, right, shift): query i keeps key j iff i + shift - left <= j <= i + shift + right."""

EMPTY, PARTIAL, FULL = 0, 1, 2
"""Tile states of :meth:`BlockPlan.tile_states`."""


@dataclass
class BlockPlan:
    """A mask sorted into bands, per-batch lengths and dense tiles, with block sizes.

    Attributes:
        L, S: queries and keys of the (local) call.
        batch_shape: leading dims of the call; B0 = batch_shape[0] (1 without batch
            dims) and R = prod(batch_shape[1:]) rows per batch element.
        bands: list of :data:`Band`.
        key_lens: (B0,) long, keys j < key_lens[b] kept; or None.
        query_lens: (B0,) long, rows i >= query_lens[b] are padding; or None.
        row_lens: (B0, L) long, per-query key lengths; or None.
        key_keep: (B0, S) bool, False = padding key; or None.
        dense_keep / dense_bias: tensors broadcastable to (*batch, L, S).
        dtype: dtype of the logits (for additive band tiles).
        block_q, block_k: tile sizes.
    """

    L: int
    S: int
    batch_shape: tuple[int, ...]
    B0: int
    R: int
    bands: list[Band] = field(default_factory=list)
    key_lens: torch.Tensor | None = None
    query_lens: torch.Tensor | None = None
    row_lens: torch.Tensor | None = None
    key_keep: torch.Tensor | None = None
    dense_keep: list[torch.Tensor] = field(default_factory=list)
    dense_bias: list[torch.Tensor] = field(default_factory=list)
    dtype: torch.dtype = torch.float32
    block_q: int = 128
    block_k: int = 128
    band_cache: dict[Any, torch.Tensor] = field(default_factory=dict)

    # ------------------------------------------------------------------ ranges

    @property
    def per_batch(self) -> bool:
        """True when batch elements have their own query/key ranges."""
        return any(
            t is not None for t in (self.key_lens, self.query_lens, self.row_lens, self.key_keep)
        )

    def groups(self) -> list[tuple[slice, int | None, int, int, int]]:
        """(rows, b, query_end, key_start, key_end) for each independent group of rows.

        Per-batch ranges are read on the host (one transfer of B0 numbers per length
        tensor); host loops over tiles need them. Kernels that take the lengths as
        tensors (GPU kernels) read the attributes instead.
        """
        if not self.per_batch:
            return [(slice(0, self.B0 * self.R), None, self.L, 0, self.S)]
        q_end = [self.L] * self.B0
        k_start, k_end = [0] * self.B0, [self.S] * self.B0
        if self.query_lens is not None:
            q_end = [min(self.L, int(x)) for x in self.query_lens.tolist()]
        if self.key_lens is not None:
            k_end = [min(e, int(x)) for e, x in zip(k_end, self.key_lens.tolist(), strict=True)]
        if self.row_lens is not None:
            longest = self.row_lens.amax(dim=1).tolist()
            k_end = [min(e, int(x)) for e, x in zip(k_end, longest, strict=True)]
        if self.key_keep is not None:
            kk = self.key_keep
            any_kept = kk.any(dim=1)
            first = torch.where(any_kept, kk.int().argmax(dim=1), self.S).tolist()
            last = torch.where(any_kept, self.S - kk.flip(1).int().argmax(dim=1), 0).tolist()
            k_start = [max(s, int(f)) for s, f in zip(k_start, first, strict=True)]
            k_end = [min(e, int(x)) for e, x in zip(k_end, last, strict=True)]
        R = self.R
        return [
            (slice(b * R, (b + 1) * R), b, q_end[b], k_start[b], k_end[b]) for b in range(self.B0)
        ]

    def key_range(self, i0: int, i1: int, k_start: int, k_end: int) -> tuple[int, int]:
        """Keys [lo, hi) that any band lets queries i0 .. i1-1 see, within [k_start, k_end)."""
        lo, hi = k_start, k_end
        for left, right, off in self.bands:
            if left is not None:
                lo = max(lo, i0 + off - left)
            if right is not None:
                hi = min(hi, i1 - 1 + off + right + 1)
        return lo, hi

    def band_offsets(self) -> tuple[int, int] | None:
        """(lo_off, hi_off) when every block's key range is [i0 + lo_off, i1 + hi_off) before
        clipping and the bands are the only per-tile masks; else None."""
        if self.row_lens is not None or self.key_keep is not None:
            return None
        if self.dense_keep or self.dense_bias or not self.bands:
            return None
        lefts = [off - left for left, _, off in self.bands if left is not None]
        rights = [off + right for _, right, off in self.bands if right is not None]
        if not lefts or not rights:
            return None
        return max(lefts), min(rights)

    # ------------------------------------------------------------------ tiles

    def band_tile(self, lo_off: int, bq: int, span: int, device: torch.device) -> torch.Tensor:
        """The (bq, span) additive band tile of a block whose keys start at i0 + lo_off."""
        cut = tuple((left, right, off - lo_off) for left, right, off in self.bands)
        return self._band_bias(cut, bq, span, device)

    def tile_mask(
        self, b: int | None, i0: int, i1: int, j0: int, j1: int, device: torch.device
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(keep, bias) of one tile, each None or broadcastable to (rows, i1-i0, j1-j0)."""
        keep: torch.Tensor | None = None
        bias: torch.Tensor | None = None

        def conj(t: torch.Tensor) -> None:
            nonlocal keep
            keep = t if keep is None else keep & t

        cols_j = torch.arange(j0, j1, device=device)  # (bj,)
        cut = tuple(
            (left, right, off + i0 - j0)
            for left, right, off in self.bands
            if not (
                (left is None or j0 >= i1 - 1 + off - left)
                and (right is None or j1 - 1 <= i0 + off + right)
            )
        )  # the bands that cut through this tile, by their position relative to it
        if cut:
            bias = self._band_bias(cut, i1 - i0, j1 - j0, device)  # (bi, bj)
        if self.row_lens is not None or self.key_keep is not None:
            assert b is not None  # per-batch masks always run one batch element at a time
        if self.row_lens is not None:
            lens = self.row_lens[b, i0:i1]  # (bi,)
            conj(cols_j < lens.unsqueeze(-1))  # (bi, bj)
        if self.key_keep is not None:
            conj(self.key_keep[b, j0:j1].unsqueeze(-2))  # (1, bj)
        for t in self.dense_keep:
            conj(self._dense_tile(t, b, i0, i1, j0, j1))  # (rows, bi, bj)
        for t in self.dense_bias:
            tile = self._dense_tile(t, b, i0, i1, j0, j1)  # (rows, bi, bj)
            bias = tile if bias is None else bias + tile
        return keep, bias

    def _band_bias(
        self, cut: tuple[Band, ...], bi: int, bj: int, device: torch.device
    ) -> torch.Tensor:
        """Additive (bi, bj) tile, 0 inside every band and -inf outside, cached: interior
        tiles of a band all sit at the same position relative to it."""
        key = (cut, bi, bj, str(device))
        hit = self.band_cache.get(key)
        if hit is not None:
            return hit
        rows = torch.arange(bi, device=device).unsqueeze(-1)  # (bi, 1)
        cols = torch.arange(bj, device=device)  # (bj,)
        keep = torch.ones(bi, bj, dtype=torch.bool, device=device)
        for left, right, rel in cut:  # key j - j0 is kept when rel - left <= (j - j0) - (i - i0)
            if left is not None:
                keep &= cols >= rows + (rel - left)
            if right is not None:
                keep &= cols <= rows + (rel + right)
        zero = torch.zeros((), dtype=self.dtype, device=device)
        tile = torch.where(keep, zero, float("-inf"))  # (bi, bj)
        if len(self.band_cache) < 64:
            self.band_cache[key] = tile
        return tile

    def _dense_tile(
        self, t: torch.Tensor, b: int | None, i0: int, i1: int, j0: int, j1: int
    ) -> torch.Tensor:
        full = t.expand(*self.batch_shape, self.L, self.S)  # (*batch, L, S), a view
        if b is not None:
            full = full[b]  # (*batch[1:], L, S)
        return full[..., i0:i1, j0:j1].reshape(-1, i1 - i0, j1 - j0)  # (rows, bi, bj)

    # ------------------------------------------------------------------ block states

    def tile_states(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Every tile's state: (B0, nq, nk) int8 of EMPTY, PARTIAL or FULL.

        Computed with tensor operations on ``device`` (default: the device of the
        plan's tensors, else the CPU): no host synchronization. Dense keep tensors
        are reduced per tile; a dense bias makes a tile PARTIAL (its values matter).
        """
        dev = torch.device(device) if device is not None else self._device()
        nq, nk = -(-self.L // self.block_q), -(-self.S // self.block_k)
        i0 = torch.arange(nq, device=dev) * self.block_q  # (nq,)
        i1 = torch.clamp(i0 + self.block_q, max=self.L)  # (nq,)
        j0 = torch.arange(nk, device=dev) * self.block_k  # (nk,)
        j1 = torch.clamp(j0 + self.block_k, max=self.S)  # (nk,)
        a0, a1 = i0.view(1, nq, 1), i1.view(1, nq, 1)  # (1, nq, 1)
        c0, c1 = j0.view(1, 1, nk), j1.view(1, 1, nk)  # (1, 1, nk)
        empty = torch.zeros(1, nq, nk, dtype=torch.bool, device=dev)
        full = torch.ones(1, nq, nk, dtype=torch.bool, device=dev)
        for left, right, off in self.bands:
            if left is not None:
                empty = empty | (c1 - 1 < a0 + off - left)
                full = full & (c0 >= a1 - 1 + off - left)
            if right is not None:
                empty = empty | (c0 > a1 - 1 + off + right)
                full = full & (c1 - 1 <= a0 + off + right)
        if self.key_lens is not None:
            kl = self.key_lens.to(dev).view(-1, 1, 1)  # (B0, 1, 1)
            empty = empty | (c0 >= kl)
            full = full & (c1 <= kl)
        if self.query_lens is not None:
            ql = self.query_lens.to(dev).view(-1, 1, 1)  # (B0, 1, 1)
            empty = empty | (a0 >= ql)
            full = full & (a1 <= ql)
        if self.row_lens is not None:
            rl = _pad_to_blocks(self.row_lens.to(dev), self.block_q, dim=1)  # (B0, nq*bq)
            rl = rl.view(rl.shape[0], nq, self.block_q)  # (B0, nq, bq)
            valid = _block_valid(self.L, nq, self.block_q, dev)  # (nq, bq)
            big, small = torch.iinfo(rl.dtype).max, torch.iinfo(rl.dtype).min
            longest = torch.where(valid, rl, small).amax(-1, keepdim=True)  # (B0, nq, 1)
            shortest = torch.where(valid, rl, big).amin(-1, keepdim=True)  # (B0, nq, 1)
            empty = empty | (c0 >= longest)
            full = full & (c1 <= shortest)
        if self.key_keep is not None:
            kk = _pad_to_blocks(self.key_keep.to(dev), self.block_k, dim=1)  # (B0, nk*bk)
            kk = kk.view(kk.shape[0], 1, nk, self.block_k)  # (B0, 1, nk, bk)
            valid = _block_valid(self.S, nk, self.block_k, dev)  # (nk, bk)
            empty = empty | ~(kk & valid).any(-1)  # (B0, 1, nk)
            full = full & (kk | ~valid).all(-1)
        for t in self.dense_keep:
            any_k, all_k = self._dense_keep_blocks(t.to(dev), nq, nk)  # (B0, nq, nk) each
            empty = empty | ~any_k
            full = full & all_k
        if self.dense_bias:
            full = torch.zeros_like(full)
        empty, full = torch.broadcast_tensors(empty, full)
        states = torch.full(empty.shape, PARTIAL, dtype=torch.int8, device=dev)
        states = states.masked_fill(full, FULL).masked_fill(empty, EMPTY)
        return states.expand(max(self.B0, 1), nq, nk) if states.shape[0] == 1 else states

    def _dense_keep_blocks(
        self, t: torch.Tensor, nq: int, nk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per tile: does any / every pair of the dense keep tensor attend, over all rows
        of each batch element. Returns two (B0 or 1, nq, nk) bool tensors."""
        lead = len(self.batch_shape)
        t = t.reshape(*([1] * (lead + 2 - t.ndim)), *t.shape)  # (*batch or 1s, L or 1, S or 1)
        t = t.expand(*t.shape[:-2], self.L, self.S)  # (..., L, S)
        b0 = t.shape[0] if lead else 1
        t = t.reshape(b0, -1, self.L, self.S)  # (B0 or 1, rows, L, S)

        def per_tile(fill: bool) -> torch.Tensor:
            pad = (0, nk * self.block_k - self.S, 0, nq * self.block_q - self.L)
            padded = torch.nn.functional.pad(t, pad, value=fill)  # (b0, rows, nq*bq, nk*bk)
            return padded.view(b0, -1, nq, self.block_q, nk, self.block_k)

        any_k = per_tile(False).any(-1).any(-2).any(1)  # (B0 or 1, nq, nk)
        all_k = per_tile(True).all(-1).all(-2).all(1)  # (B0 or 1, nq, nk)
        return any_k, all_k

    def _device(self) -> torch.device:
        for t in (self.key_lens, self.query_lens, self.row_lens, self.key_keep):
            if t is not None:
                return t.device
        for t in (*self.dense_keep, *self.dense_bias):
            return t.device
        return torch.device("cpu")

    # ------------------------------------------------------------------ dense form

    def keep_fn(
        self,
    ) -> Any:
        """``keep(b, i, j) -> bool tensor``: the plan's keep rule at index tensors
        (b: batch element, i: query row, j: key column), for element-wise kernels and
        FlexAttention's ``mask_mod``. Dense bias tensors are not part of it."""
        bands = list(self.bands)
        key_lens, query_lens, row_lens, key_keep = (
            self.key_lens,
            self.query_lens,
            self.row_lens,
            self.key_keep,
        )
        dense_keep = [t.expand(*self.batch_shape, self.L, self.S) for t in self.dense_keep]
        rows_per_b = self.R
        batch_rest = self.batch_shape[1:]

        def keep(b: torch.Tensor, h: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> Any:
            ok = i >= 0  # all True, of the broadcast shape
            for left, right, off in bands:
                if left is not None:
                    ok = ok & (j >= i + off - left)
                if right is not None:
                    ok = ok & (j <= i + off + right)
            if key_lens is not None:
                ok = ok & (j < key_lens[b])
            if query_lens is not None:
                ok = ok & (i < query_lens[b])
            if row_lens is not None:
                ok = ok & (j < row_lens[b, i])
            if key_keep is not None:
                ok = ok & key_keep[b, j]
            for t in dense_keep:
                flat = t.reshape(-1, rows_per_b, t.shape[-2], t.shape[-1]) if batch_rest else t
                ok = ok & (flat[b, h, i, j] if batch_rest else flat[b, i, j])
            return ok

        return keep

    def to_block_mask(self, heads: int | None = None) -> Any:
        """A FlexAttention ``BlockMask`` for this plan (torch >= 2.5).

        Batch is B0 and heads are the remaining leading dims flattened (``heads``
        overrides, e.g. 1 when the mask does not depend on the head). Full tiles are
        marked full (no ``mask_mod`` call), partial tiles carry the keep rule, empty
        tiles are skipped. A dense bias is not part of a BlockMask: pass it as a
        ``score_mod``. Raises RuntimeError when torch has no FlexAttention.
        """
        try:
            from torch.nn.attention.flex_attention import BlockMask
        except ImportError as exc:  # pragma: no cover - torch < 2.5
            raise RuntimeError(
                "to_block_mask: this torch has no FlexAttention (torch >= 2.5 needed)"
            ) from exc
        if self.block_q != self.block_k:
            raise ValueError(
                f"to_block_mask: FlexAttention needs square blocks, got block_q={self.block_q} "
                f"and block_k={self.block_k}"
            )
        states = self.tile_states()  # (B0, nq, nk)
        H = heads if heads is not None else max(self.R, 1)
        partial = (states == PARTIAL).unsqueeze(1).expand(-1, H, -1, -1)  # (B0, H, nq, nk)
        full = (states == FULL).unsqueeze(1).expand(-1, H, -1, -1)  # (B0, H, nq, nk)
        kv_num, kv_idx = _blocks_to_indices(partial)
        full_num, full_idx = _blocks_to_indices(full)
        return BlockMask.from_kv_blocks(
            kv_num,
            kv_idx,
            full_num,
            full_idx,
            BLOCK_SIZE=self.block_q,
            mask_mod=self.keep_fn(),
            seq_lengths=(self.L, self.S),
        )


def _blocks_to_indices(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, nq, nk) bool -> per row the count (B, H, nq) int32 and the selected column
    indices first, (B, H, nq, nk) int32 (a stable sort keeps them in order)."""
    num = sel.sum(-1, dtype=torch.int32)  # (B, H, nq)
    order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)  # selected first
    return num, order.to(torch.int32)


def _pad_to_blocks(t: torch.Tensor, block: int, dim: int) -> torch.Tensor:
    """Pad dim ``dim`` of t up to a multiple of ``block`` (with zeros / False)."""
    n = t.shape[dim]
    extra = -(-n // block) * block - n if n else block
    if extra == 0:
        return t
    pad = [0, 0] * (t.ndim - 1 - dim) + [0, extra]
    return torch.nn.functional.pad(t, pad)


def _block_valid(n: int, nb: int, block: int, device: torch.device) -> torch.Tensor:
    """(nb, block) bool: which positions of the padded blocks are real (< n)."""
    return (torch.arange(nb * block, device=device) < n).view(nb, block)


def build_plan(
    mask: _masks.Mask | None,
    L: int,
    S: int,
    batch_shape: Sequence[int],
    device: torch.device | str,
    *,
    dtype: torch.dtype = torch.float32,
    block_q: int = 128,
    block_k: int = 128,
    q_start: int = 0,
    k_start: int = 0,
    total_L: int | None = None,
    total_S: int | None = None,
) -> BlockPlan:
    """Sort ``mask`` into a :class:`BlockPlan` for a call of (batch_shape, L, S).

    Args:
        mask: an attnkit mask (already validated for these sizes) or None.
        L, S: queries and keys of this call (of this block, with offsets).
        batch_shape: the call's leading dims.
        device: where the plan's tensors go (the inputs' device).
        dtype: dtype of the logits (band tiles are additive in it).
        block_q, block_k: tile sizes.
        q_start, k_start, total_L, total_S: plan the block of queries
            [q_start, q_start + L) and keys [k_start, k_start + S) of a longer problem
            of total_L queries and total_S keys (default: this call is the whole).
    """
    batch = tuple(int(d) for d in batch_shape)
    dev = torch.device(device)
    if mask is not None and (total_L is not None or total_S is not None or q_start or k_start):
        mask = mask.shard(
            q_start,
            k_start,
            L,
            S,
            total_L if total_L is not None else q_start + L,
            total_S if total_S is not None else k_start + S,
        )
    B0 = batch[0] if batch else 1
    N = math.prod(batch)
    plan = BlockPlan(
        L=L,
        S=S,
        batch_shape=batch,
        B0=B0,
        R=N // B0 if B0 else 0,
        dtype=dtype,
        block_q=int(block_q),
        block_k=int(block_k),
    )
    parts = mask.parts() if mask is not None else ()
    for part in parts:
        if isinstance(part, _masks.WindowMask):  # causal included
            plan.bands.append((part.left, part.right, part.offset(L, S)))
        elif isinstance(part, _masks.ValidLensMask):
            lens = part.lens.to(dev)
            if lens.ndim == 2:
                plan.row_lens = (
                    lens if plan.row_lens is None else torch.minimum(plan.row_lens, lens)
                )
            else:
                plan.key_lens = (
                    lens if plan.key_lens is None else torch.minimum(plan.key_lens, lens)
                )
            if part.query_lens is not None:
                ql = part.query_lens.to(dev)
                plan.query_lens = (
                    ql if plan.query_lens is None else torch.minimum(plan.query_lens, ql)
                )
        elif isinstance(part, _masks.KeyPaddingMask):
            keep = ~part.padding.to(dev)  # (B0, S)
            plan.key_keep = keep if plan.key_keep is None else plan.key_keep & keep
        elif isinstance(part, _masks.KeepMask):
            plan.dense_keep.append(part.tensor.to(dev))
        elif isinstance(part, _masks.BiasMask):
            plan.dense_bias.append(part.tensor.to(device=dev, dtype=dtype))
        else:
            raise TypeError(f"build_plan: no block structure for mask {type(part).__name__}")
    return plan
