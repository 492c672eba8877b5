"""BlockPlan: a mask of one call, lowered, with tile sizes: the one description every
backend reads (tiled loops, unpadding, GPU kernel arguments, context-parallel blocks).

A plan is a disjunction of :class:`~.clause.Clause` (one for any mask built with
``&`` only) plus the additive biases of the call. It answers, per tile of
``block_q`` queries by ``block_k`` keys, whether the tile is EMPTY, PARTIAL or FULL
(:meth:`BlockPlan.tile_states`, tensor operations, no host sync); per batch element
and query block, which rows and keys can be kept at all (:meth:`BlockPlan.groups`,
:meth:`BlockPlan.key_range`, host reads for CPU loops); the keep rule element by
element (:meth:`BlockPlan.keep_fn`, FlexAttention's ``mask_mod``); the layout of a
ragged batch (:meth:`BlockPlan.ragged`); and a fingerprint ranks compare.

B0 is the call's first batch dim (1 without batch dims); rows are laid out as
(B0, R) flattened to N = B0 * R.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .clause import Clause
from .ragged import RaggedSeq, ragged_layout

__all__ = ["EMPTY", "FULL", "PARTIAL", "BlockPlan", "RaggedSeq", "stable_hash"]

EMPTY, PARTIAL, FULL = 0, 1, 2
"""Tile states of :meth:`BlockPlan.tile_states`."""


def stable_hash(items: Sequence[object]) -> int:
    """A 62-bit hash of the items' reprs, the same in every process (unlike ``hash``)."""
    digest = hashlib.blake2b(repr(list(items)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


@dataclass
class BlockPlan:
    """A lowered mask for a call of (batch_shape, L, S) and its tile sizes.

    Attributes:
        L, S: queries and keys of the (local) call.
        batch_shape: leading dims; B0 = batch_shape[0] (1 without batch dims), R rows
            per batch element.
        clauses: the keep rule as a disjunction ([] keeps nothing).
        biases: additive tensors broadcastable to (*batch, L, S), in ``dtype``.
        dtype: dtype of the logits (additive tiles are in it).
        block_q, block_k: tile sizes.
    """

    L: int
    S: int
    batch_shape: tuple[int, ...]
    B0: int
    R: int
    clauses: list[Clause]
    biases: list[torch.Tensor] = field(default_factory=list)
    dtype: torch.dtype = torch.float32
    block_q: int = 128
    block_k: int = 128
    band_cache: dict[Any, torch.Tensor] = field(default_factory=dict)
    _host: dict[object, Any] = field(default_factory=dict)

    def with_blocks(self, block_q: int, block_k: int) -> BlockPlan:
        """The same plan with other tile sizes (shares everything else)."""
        if (block_q, block_k) == (self.block_q, self.block_k):
            return self
        return dataclasses.replace(self, block_q=int(block_q), block_k=int(block_k))

    # ------------------------------------------------------------------ facts

    @property
    def single(self) -> Clause | None:
        """The one clause of a conjunction, or None for a disjunction (or no clause)."""
        return self.clauses[0] if len(self.clauses) == 1 else None

    @property
    def per_batch(self) -> bool:
        """True when batch elements have their own rows or keys (lengths, ids, padding)."""
        return any(c.per_batch for c in self.clauses)

    @property
    def keeps_all(self) -> bool:
        """True for no mask at all (one clause with no condition, no bias)."""
        c = self.single
        return c is not None and not self.biases and c.lo is None and c.hi is None and c.band_only

    def band(self) -> tuple[int | None, int | None] | None:
        """(lo, hi) when the whole mask is one band (causal/window, any alignment):
        key j kept for query i iff i + lo <= j <= i + hi; else None."""
        c = self.single
        if c is None or self.biases or not c.band_only or not c.has_band:
            return None
        return c.lo, c.hi

    def is_causal(self, shift: int = 0) -> bool:
        """True when the whole mask is ``j <= i + shift`` (top-left causal for shift 0)."""
        band = self.band()
        return band is not None and band[0] is None and band[1] == shift

    def host_tensors(self) -> list[torch.Tensor]:
        """The per-batch tensors host loops (groups, ragged layouts) read."""
        out: list[torch.Tensor] = []
        for c in self.clauses:
            out += c.per_batch_tensors()
        return out

    def signature(self) -> tuple[object, ...]:
        """Structure without tensor values: clauses' fields and how many biases."""
        return (tuple(c.signature() for c in self.clauses), len(self.biases))

    def fingerprint(self) -> int:
        """An int equal on two ranks whose masks give the same block schedule: the
        structure and, for tensors on the CPU, checksums of their values."""
        from .._host import readable

        items: list[object] = [self.signature(), self.L, self.S, self.batch_shape]
        for t in self.host_tensors():
            items.append(tuple(t.shape))
            if readable(t):
                flat = t.reshape(-1).to(torch.long)
                weights = torch.arange(1, flat.numel() + 1, dtype=torch.long)
                items.append((int(flat.sum()), int((flat * weights).sum())))
        return stable_hash(items)

    # ------------------------------------------------------------------ host ranges

    def groups(self) -> list[tuple[slice, int | None, int, int, int, int]]:
        """(rows, b, q_lo, q_hi, k_lo, k_hi) for each independent group of rows: the hull
        of the rows and keys any clause keeps for batch element b (None: every element).

        Reads the per-batch tensors on the host (a few transfers of B0 numbers): host
        loops over tiles need them. GPU kernels read the tensors instead.
        """
        if not self.per_batch:
            return [(slice(0, self.B0 * self.R), None, 0, self.L, 0, self.S)]
        hit = self._host.get("groups")
        if hit is not None:
            return hit
        hulls = [c.host_ranges(self.B0, self.L, self.S) for c in self.clauses]
        self._host["clause_ranges"] = hulls
        out: list[tuple[slice, int | None, int, int, int, int]] = []
        R = self.R
        for b in range(self.B0):
            live = [h[b] for h in hulls if h[b][0] < h[b][1] and h[b][2] < h[b][3]]
            if live:
                q_lo, q_hi = min(h[0] for h in live), max(h[1] for h in live)
                k_lo, k_hi = min(h[2] for h in live), max(h[3] for h in live)
            else:
                q_lo = q_hi = k_lo = k_hi = 0
            out.append((slice(b * R, (b + 1) * R), b, q_lo, q_hi, k_lo, k_hi))
        self._host["groups"] = out
        return out

    def key_range(self, b: int | None, i0: int, i1: int, k_lo: int, k_hi: int) -> tuple[int, int]:
        """Keys [lo, hi) any clause may keep for queries i0 .. i1-1 (within [k_lo, k_hi))."""
        ranges = self._host.get("clause_ranges")
        lo_all, hi_all = k_hi, k_lo
        for n, c in enumerate(self.clauses):
            lo, hi = k_lo, k_hi
            if ranges is not None and b is not None:
                q0, q1, c_lo, c_hi = ranges[n][b]
                if i1 <= q0 or i0 >= q1:
                    continue
                lo, hi = max(lo, c_lo), min(hi, c_hi)
            lo, hi = c.block_key_range(i0, i1, lo, hi)
            if b is not None and c.docs:
                lo, hi = self._doc_key_range(c, b, i0, i1, lo, hi)
            if lo < hi:
                lo_all, hi_all = min(lo_all, lo), max(hi_all, hi)
        return (lo_all, hi_all) if lo_all < hi_all else (k_lo, k_lo)

    def _doc_key_range(
        self, c: Clause, b: int, i0: int, i1: int, lo: int, hi: int
    ) -> tuple[int, int]:
        """Narrow [lo, hi) to the keys of the documents of queries i0 .. i1-1, when the
        keys' ids are sorted (packed sequences)."""
        for d in c.docs:
            if not d.equal:
                continue
            key = ("sorted", id(d))
            k_ids = self._host.get(key)
            if k_ids is None:
                ids = d.k_ids.expand(self.B0, self.S).cpu()
                ordered = bool((ids[:, 1:] >= ids[:, :-1]).all()) if self.S > 1 else True
                k_ids = self._host[key] = (ids, d.q_ids.expand(self.B0, self.L).cpu(), ordered)
            ids_k, ids_q, ordered = k_ids
            if not ordered:
                continue
            rows = ids_q[b, i0:i1]
            first, last = int(rows.min()), int(rows.max())
            row = ids_k[b]
            lo = max(lo, int(torch.searchsorted(row, max(first, 0), right=False)))
            hi = min(hi, int(torch.searchsorted(row, last, right=True)))
        return lo, hi

    def band_offsets(self) -> tuple[int, int] | None:
        """(lo, hi) when a band bounded on both sides is the only per-tile condition (key
        and query lengths aside, which :meth:`groups` cuts): every query block's key range
        is then [i0 + lo, i1 - 1 + hi] before clipping; else None."""
        c = self.single
        if c is None or self.biases or c.dense_keep or c.docs or c.lo is None or c.hi is None:
            return None
        if any(t is not None for t in (c.row_lo, c.row_hi, c.key_keep, c.key_lo, c.query_lo)):
            return None
        return c.lo, c.hi

    # ------------------------------------------------------------------ tiles

    def band_tile(self, lo_off: int, bq: int, span: int, device: torch.device) -> torch.Tensor:
        """The (bq, span) additive band tile of a block whose keys start at i0 + lo_off."""
        c = self.single
        assert c is not None
        return self._band_bias(c.lo, c.hi, lo_off, bq, span, device)

    def tile_mask(
        self, b: int | None, i0: int, i1: int, j0: int, j1: int, device: torch.device
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(keep, bias) of one tile, each None or broadcastable to (rows, i1-i0, j1-j0).

        One clause: its band is a cached additive tile (folded into the matrix product)
        and its other fields a keep tile; a disjunction: the OR of every clause's keep.
        """
        bias: torch.Tensor | None = None
        keep: torch.Tensor | None = None

        def dense_tile(t: torch.Tensor) -> torch.Tensor:
            return self._dense_tile(t, b, i0, i1, j0, j1)

        c = self.single
        if c is not None:
            if c.has_band and not (
                (c.lo is None or j0 >= i1 - 1 + c.lo) and (c.hi is None or j1 - 1 <= i0 + c.hi)
            ):
                bias = self._band_bias(c.lo, c.hi, j0 - i0, i1 - i0, j1 - j0, device)  # (bi, bj)
            keep = c.tile_keep(b, i0, i1, j0, j1, device, dense_tile, with_band=False)
        else:
            kept_any = torch.zeros((), dtype=torch.bool, device=device)
            keep = kept_any
            for clause in self.clauses:
                k = clause.tile_keep(b, i0, i1, j0, j1, device, dense_tile, with_band=True)
                if k is None:
                    keep = None
                    break
                keep = keep | k
        for t in self.biases:
            tile = dense_tile(t)  # (rows, bi, bj)
            bias = tile if bias is None else bias + tile
        return keep, bias

    def _band_bias(
        self, lo: int | None, hi: int | None, rel: int, bi: int, bj: int, device: torch.device
    ) -> torch.Tensor:
        """Additive (bi, bj) tile, 0 where ``lo <= (j - j0) + rel - (i - i0) <= hi`` and -inf
        elsewhere (rel = j0 - i0), cached: interior tiles of a band all look alike."""
        key = (lo, hi, rel, bi, bj, str(device))
        hit = self.band_cache.get(key)
        if hit is not None:
            return hit
        rows = torch.arange(bi, device=device).unsqueeze(-1)  # (bi, 1)
        cols = torch.arange(bj, device=device) + rel  # (bj,)
        keep = torch.ones(bi, bj, dtype=torch.bool, device=device)
        if lo is not None:
            keep &= cols >= rows + lo
        if hi is not None:
            keep &= cols <= rows + hi
        zero = torch.zeros((), dtype=self.dtype, device=device)
        tile = torch.where(keep, zero, float("-inf"))  # (bi, bj)
        if len(self.band_cache) < 64:
            self.band_cache[key] = tile
        return tile

    def _dense_tile(
        self, t: torch.Tensor, b: int | None, i0: int, i1: int, j0: int, j1: int
    ) -> torch.Tensor:
        full = t.expand(*self.batch_shape, self.L, self.S)  # (*batch, L, S), a view
        if b is not None and self.batch_shape:  # (without batch dims, b is 0: no index)
            full = full[b]  # (*batch[1:], L, S)
        return full[..., i0:i1, j0:j1].reshape(-1, i1 - i0, j1 - j0)  # (rows, bi, bj)

    # ------------------------------------------------------------------ block states

    def tile_states(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Every tile's state: (B0, nq, nk) int8 of EMPTY, PARTIAL or FULL.

        Tensor operations on ``device`` (default: the device of the plan's tensors):
        no host synchronization. A tile is EMPTY when every clause keeps none of it,
        FULL when some clause keeps all of it (never with a bias: its values matter).
        """
        dev = torch.device(device) if device is not None else self._device()
        nq, nk = -(-self.L // self.block_q), -(-self.S // self.block_k)
        empty = torch.ones(1, nq, nk, dtype=torch.bool, device=dev)
        full = torch.zeros(1, nq, nk, dtype=torch.bool, device=dev)
        for c in self.clauses:
            e, f = c.tile_bounds(
                self.L, self.S, self.block_q, self.block_k, dev,
                lambda t: self._dense_keep_blocks(t, nq, nk),
            )  # fmt: skip
            empty, full = empty & e, full | f
        if self.biases:
            full = torch.zeros_like(full)
        empty, full = torch.broadcast_tensors(empty, full)
        states = torch.full(empty.shape, PARTIAL, dtype=torch.int8, device=dev)
        states = states.masked_fill(full, FULL).masked_fill(empty, EMPTY)
        return states.expand(max(self.B0, 1), nq, nk) if states.shape[0] == 1 else states

    def _dense_keep_blocks(
        self, t: torch.Tensor, nq: int, nk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per tile: does any / every pair of a dense keep tensor attend, over all rows of
        each batch element. Returns two (B0 or 1, nq, nk) bool tensors."""
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
        for t in (*self.host_tensors(), *self.biases):
            return t.device
        for c in self.clauses:
            for t in c.dense_keep:
                return t.device
        return torch.device("cpu")

    def is_empty(self) -> bool | None:
        """True when the mask keeps no pair at all, False when it keeps some, None when
        that would need a read from an accelerator (no sync is made)."""
        from .._host import readable

        if not self.clauses:
            return True
        if any(not readable(t) for t in self.host_tensors()):
            return None
        whole = self.with_blocks(max(self.L, 1), max(self.S, 1))
        return bool((whole.tile_states() == EMPTY).all())

    # ------------------------------------------------------------------ element-wise form

    def keep_fn(self) -> Any:
        """``keep(b, h, i, j) -> bool tensor``: the plan's keep rule at index tensors
        (b: batch element, h: row within it, i: query, j: key), for element-wise kernels
        and FlexAttention's ``mask_mod``. Biases are not part of it."""
        clauses = list(self.clauses)
        dense = [[self._as_b_r(t) for t in c.dense_keep] for c in clauses]

        def keep(b: torch.Tensor, h: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> Any:
            ok = (i < 0) & (j < 0)  # all False, of the broadcast shape
            for c, d in zip(clauses, dense, strict=True):
                ok = ok | c.keep(b, h, i, j, d)
            return ok

        return keep

    def _as_b_r(self, t: torch.Tensor) -> torch.Tensor:
        """A dense tensor viewed as (B0 or 1, R or 1, L or 1, S or 1)."""
        lead = len(self.batch_shape)
        t = t.reshape(*([1] * (lead + 2 - t.ndim)), *t.shape)  # (*batch or 1s, L', S')
        if lead == 0:
            return t.reshape(1, 1, *t.shape[-2:])
        rest = t.shape[1:-2]
        r = 1 if all(n == 1 for n in rest) else self.R
        if r != 1:
            t = t.expand(t.shape[0], *self.batch_shape[1:], *t.shape[-2:])
        return t.reshape(t.shape[0], r, *t.shape[-2:])  # (B0 or 1, R or 1, L', S')

    def to_block_mask(self, heads: int | None = None) -> Any:
        """A FlexAttention ``BlockMask`` for this plan (torch >= 2.5).

        Batch is B0 and heads are the remaining leading dims flattened (``heads``
        overrides, e.g. 1 when the mask does not depend on the head). Full tiles are
        marked full (no ``mask_mod`` call), partial tiles carry the keep rule, empty
        tiles are skipped. A bias is not part of a BlockMask: pass it as a
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

    # ------------------------------------------------------------------ ragged batches

    def ragged_structure(self) -> bool:
        """True when the mask (from its structure alone) is a ragged batch: each batch
        element, or each document of a packed one, is an independent sequence with a
        prefix of kept queries and its kept keys, optionally top-left causal within it."""
        c = self.single
        if c is None or self.biases or c.dense_keep or not c.per_batch or not self.batch_shape:
            return False
        if c.row_lo is not None or c.row_hi is not None or c.key_lo is not None:
            return False
        if c.query_lo is not None:
            return False
        if c.has_band and not (c.lo is None and c.hi == 0):
            return False
        if c.docs:
            d = c.docs[0]
            if len(c.docs) > 1 or not d.equal or d.k_ids is not d.q_ids or c.key_keep is not None:
                return False  # (self-attention ids only: each document is a square block)
        elif c.has_band and c.key_keep is not None:
            return False  # kept keys that are not a prefix would break the causal order
        return True

    def ragged_ready(self) -> bool:
        """True when :meth:`ragged` would give a layout: the structure is a ragged batch and
        its tensors can be read on the host (decided without reading any value)."""
        from .._host import readable

        return (
            self.ragged_structure()
            and not torch.compiler.is_compiling()
            and all(readable(t) for t in self.host_tensors())
        )

    def ragged(self) -> tuple[list[RaggedSeq], bool] | None:
        """The sequences of a ragged batch and whether each is top-left causal; None when
        :meth:`ragged_structure` is False or a length lives on an accelerator (no sync).
        Reads the per-batch tensors on the host, once per plan."""
        if not self.ragged_ready():
            return None
        hit = self._host.get("ragged")
        if hit is None:
            c = self.single
            assert c is not None
            hit = self._host["ragged"] = ragged_layout(c, self.B0, self.L, self.S)
        return hit


def _blocks_to_indices(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, nq, nk) bool -> per row the count (B, H, nq) int32 and the selected column
    indices first, (B, H, nq, nk) int32 (a stable sort keeps them in order)."""
    num = sel.sum(-1, dtype=torch.int32)  # (B, H, nq)
    order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)  # selected first
    return num, order.to(torch.int32)
