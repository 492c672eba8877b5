"""One conjunction of a mask's atoms, folded into the fields kernels read.

A :class:`Clause` keeps a pair (b, i, j) when every field keeps it:

- ``lo``/``hi``: the band ``i + lo <= j <= i + hi`` (None = unbounded);
- ``key_lo``/``key_hi`` (B0,): ``key_lo[b] <= j < key_hi[b]``;
- ``query_lo``/``query_hi`` (B0,): ``query_lo[b] <= i < query_hi[b]``;
- ``row_lo``/``row_hi`` (B0, L): ``row_lo[b, i] <= j < row_hi[b, i]``;
- ``key_keep`` (B0, S) bool: ``key_keep[b, j]``;
- ``docs``: :class:`~.atoms.Document` conditions (ids equal, or not);
- ``dense_keep``: bool tensors broadcastable to (*batch, L, S).

Per-batch tensors have a first dim of B0 or 1. Every method here computes with
tensor operations on the tensors' device; the few that read values on the host say
so (``host_*``), for host loops over tiles on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .atoms import Document

__all__ = ["Clause"]


def _tmax(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return b if a is None else a if b is None else torch.maximum(a, b)


def _tmin(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return b if a is None else a if b is None else torch.minimum(a, b)


def _imax(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _imin(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


@dataclass
class Clause:
    """A conjunction of conditions (see the module docstring for the fields)."""

    lo: int | None = None
    hi: int | None = None
    has_band: bool = False
    key_lo: torch.Tensor | None = None
    key_hi: torch.Tensor | None = None
    query_lo: torch.Tensor | None = None
    query_hi: torch.Tensor | None = None
    row_lo: torch.Tensor | None = None
    row_hi: torch.Tensor | None = None
    key_keep: torch.Tensor | None = None
    docs: list[Document] = field(default_factory=list)
    dense_keep: list[torch.Tensor] = field(default_factory=list)
    biases: list[torch.Tensor] = field(default_factory=list)

    # ------------------------------------------------------------------ folding atoms

    def intersect_band(self, lo: int | None, hi: int | None) -> None:
        self.lo, self.hi, self.has_band = _imax(self.lo, lo), _imin(self.hi, hi), True

    def intersect_keys(self, lo: torch.Tensor | None, hi: torch.Tensor | None) -> None:
        self.key_lo, self.key_hi = _tmax(self.key_lo, lo), _tmin(self.key_hi, hi)

    def intersect_queries(self, lo: torch.Tensor | None, hi: torch.Tensor | None) -> None:
        self.query_lo, self.query_hi = _tmax(self.query_lo, lo), _tmin(self.query_hi, hi)

    def intersect_rows(self, lo: torch.Tensor | None, hi: torch.Tensor | None) -> None:
        self.row_lo, self.row_hi = _tmax(self.row_lo, lo), _tmin(self.row_hi, hi)

    def intersect_key_keep(self, keep: torch.Tensor) -> None:
        self.key_keep = keep if self.key_keep is None else self.key_keep & keep

    # ------------------------------------------------------------------ facts

    def per_batch_tensors(self) -> list[torch.Tensor]:
        """The per-batch tensors (lengths, ranges, kept keys, ids)."""
        out = [
            t
            for t in (
                self.key_lo,
                self.key_hi,
                self.query_lo,
                self.query_hi,
                self.row_lo,
                self.row_hi,
                self.key_keep,
            )
            if t is not None
        ]
        for d in self.docs:
            out += [d.q_ids, d.k_ids]
        return out

    @property
    def per_batch(self) -> bool:
        return bool(self.per_batch_tensors())

    @property
    def band_only(self) -> bool:
        """True when the band is the clause's only condition (or it has none)."""
        return not (self.per_batch or self.dense_keep)

    # ------------------------------------------------------------------ element-wise

    def keep(self, b: torch.Tensor, h: torch.Tensor, i: torch.Tensor, j: torch.Tensor,
             dense: Sequence[torch.Tensor]) -> torch.Tensor:  # fmt: skip
        """Bool of the broadcast shape of the index tensors: does the clause keep (b, h, i, j)?

        ``dense``: this clause's dense keep tensors, each viewed as (B0, R, L, S) (or with
        size-1 dims), indexed by (b, h, i, j).
        """
        ok = _band(self.lo, self.hi, i, j) & self.batch_keep(b, i, j)
        for t in dense:
            ok = ok & _at4(t, b, h, i, j)
        return ok

    def batch_keep(self, b: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """The per-batch fields' part of :meth:`keep` (ranges, rows, kept keys, documents)."""
        ok = (i >= 0) & (j >= 0)
        for lo_t, hi_t, x in ((self.key_lo, self.key_hi, j), (self.query_lo, self.query_hi, i)):
            if lo_t is not None:
                ok = ok & (x >= _at(lo_t, b))
            if hi_t is not None:
                ok = ok & (x < _at(hi_t, b))
        if self.row_lo is not None:
            ok = ok & (j >= _at(self.row_lo, b, i))
        if self.row_hi is not None:
            ok = ok & (j < _at(self.row_hi, b, i))
        if self.key_keep is not None:
            ok = ok & _at(self.key_keep, b, j)
        for d in self.docs:
            qi, kj = _at(d.q_ids, b, i), _at(d.k_ids, b, j)
            same = (qi == kj) & (qi >= 0)
            ok = ok & (same if d.equal else ~same)
        return ok

    # ------------------------------------------------------------------ tiles

    def tile_bounds(
        self, L: int, S: int, block_q: int, block_k: int, device: torch.device,
        dense_blocks: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """(empty, full): bool tensors broadcastable to (B0, nq, nk), True where the clause
        keeps no pair / every pair of a tile. ``dense_blocks(t)`` reduces a dense keep
        tensor to its per-tile (any, all)."""
        nq, nk = -(-L // block_q), -(-S // block_k)
        i0 = torch.arange(nq, device=device) * block_q  # (nq,)
        i1 = torch.clamp(i0 + block_q, max=L)  # (nq,)
        j0 = torch.arange(nk, device=device) * block_k  # (nk,)
        j1 = torch.clamp(j0 + block_k, max=S)  # (nk,)
        a0, a1 = i0.view(1, nq, 1), i1.view(1, nq, 1)  # (1, nq, 1)
        c0, c1 = j0.view(1, 1, nk), j1.view(1, 1, nk)  # (1, 1, nk)
        empty = torch.zeros(1, nq, nk, dtype=torch.bool, device=device)
        full = torch.ones(1, nq, nk, dtype=torch.bool, device=device)
        if self.lo is not None:
            empty = empty | (c1 - 1 < a0 + self.lo)
            full = full & (c0 >= a1 - 1 + self.lo)
        if self.hi is not None:
            empty = empty | (c0 > a1 - 1 + self.hi)
            full = full & (c1 - 1 <= a0 + self.hi)
        for lo_t, hi_t, x0, x1 in (
            (self.key_lo, self.key_hi, c0, c1),
            (self.query_lo, self.query_hi, a0, a1),
        ):
            if lo_t is not None:
                lo_v = lo_t.to(device).view(-1, 1, 1)  # (B0, 1, 1)
                empty = empty | (x1 <= lo_v)
                full = full & (x0 >= lo_v)
            if hi_t is not None:
                hi_v = hi_t.to(device).view(-1, 1, 1)  # (B0, 1, 1)
                empty = empty | (x0 >= hi_v)
                full = full & (x1 <= hi_v)
        valid_q = _block_valid(L, nq, block_q, device)  # (nq, bq)
        if self.row_hi is not None:
            rows = _blocks_of(self.row_hi.to(device), nq, block_q)  # (B0, nq, bq)
            big, small = torch.iinfo(rows.dtype).max, torch.iinfo(rows.dtype).min
            longest = torch.where(valid_q, rows, small).amax(-1, keepdim=True)  # (B0, nq, 1)
            shortest = torch.where(valid_q, rows, big).amin(-1, keepdim=True)  # (B0, nq, 1)
            empty = empty | (c0 >= longest)
            full = full & (c1 <= shortest)
        if self.row_lo is not None:
            rows = _blocks_of(self.row_lo.to(device), nq, block_q)  # (B0, nq, bq)
            big, small = torch.iinfo(rows.dtype).max, torch.iinfo(rows.dtype).min
            first = torch.where(valid_q, rows, big).amin(-1, keepdim=True)  # (B0, nq, 1)
            last = torch.where(valid_q, rows, small).amax(-1, keepdim=True)  # (B0, nq, 1)
            empty = empty | (c1 <= first)
            full = full & (c0 >= last)
        if self.key_keep is not None:
            kk = _blocks_of(self.key_keep.to(device), nk, block_k)  # (B0, nk, bk)
            valid = _block_valid(S, nk, block_k, device)  # (nk, bk)
            empty = empty | ~(kk & valid).any(-1).unsqueeze(1)  # (B0, 1, nk)
            full = full & (kk | ~valid).all(-1).unsqueeze(1)
        for d in self.docs:
            e, f = _doc_bounds(d, L, S, nq, nk, block_q, block_k, device)  # (B0, nq, nk) each
            empty, full = empty | e, full & f
        for t in self.dense_keep:
            any_k, all_k = dense_blocks(t.to(device))  # (B0 or 1, nq, nk) each
            empty, full = empty | ~any_k, full & all_k
        return empty, full

    def tile_keep(self, b: int | None, i0: int, i1: int, j0: int, j1: int,
                  device: torch.device, dense_tile: Any, *,
                  with_band: bool = True) -> torch.Tensor | None:  # fmt: skip
        """The clause's keep over one tile, broadcastable to (rows, i1-i0, j1-j0), or None
        when it keeps the whole tile. ``dense_tile(t)`` slices a dense keep tensor to the
        tile; ``with_band=False`` leaves the band out (the caller adds it as a bias)."""
        keep: torch.Tensor | None = None

        def conj(t: torch.Tensor) -> None:
            nonlocal keep
            keep = t if keep is None else keep & t

        rows_i = torch.arange(i0, i1, device=device).unsqueeze(-1)  # (bi, 1)
        cols_j = torch.arange(j0, j1, device=device)  # (bj,)
        if with_band and self.lo is not None and j0 < i1 - 1 + self.lo:
            conj(cols_j >= rows_i + self.lo)  # (bi, bj)
        if with_band and self.hi is not None and j1 - 1 > i0 + self.hi:
            conj(cols_j <= rows_i + self.hi)  # (bi, bj)
        if self.per_batch:
            assert b is not None  # per-batch clauses run one batch element at a time
            bb = torch.full((1, 1, 1), b, device=device)  # (1, 1, 1)
            conj(self.batch_keep(bb, rows_i.unsqueeze(0), cols_j.view(1, 1, -1)))  # (1, bi, bj)
        for t in self.dense_keep:
            conj(dense_tile(t))  # (rows, bi, bj)
        return keep

    # ------------------------------------------------------------------ host ranges

    def host_ranges(self, B0: int, L: int, S: int) -> list[tuple[int, int, int, int]]:
        """Per batch element the hull (q_lo, q_hi, k_lo, k_hi) of rows and keys this clause
        may keep (q_lo >= q_hi: nothing). Reads the per-batch tensors on the host."""
        q_lo, q_hi = [0] * B0, [L] * B0
        k_lo, k_hi = [0] * B0, [S] * B0

        def fold(t: torch.Tensor | None, dest: list[int], pick: Any) -> None:
            if t is not None:
                vals = t.expand(B0).tolist()
                for n in range(B0):
                    dest[n] = pick(dest[n], int(vals[n]))

        fold(self.query_lo, q_lo, max)
        fold(self.query_hi, q_hi, min)
        fold(self.key_lo, k_lo, max)
        fold(self.key_hi, k_hi, min)
        if self.row_hi is not None:
            fold(self.row_hi.expand(B0, L).amax(dim=1), k_hi, min)
        if self.row_lo is not None:
            fold(self.row_lo.expand(B0, L).amin(dim=1), k_lo, max)
        if self.key_keep is not None:
            kk = self.key_keep.expand(B0, S)
            any_kept = kk.any(dim=1)
            first = torch.where(any_kept, kk.int().argmax(dim=1), S)
            last = torch.where(any_kept, S - kk.flip(1).int().argmax(dim=1), 0)
            fold(first, k_lo, max)
            fold(last, k_hi, min)
        return [(q_lo[n], q_hi[n], k_lo[n], k_hi[n]) for n in range(B0)]

    def block_key_range(self, i0: int, i1: int, k_lo: int, k_hi: int) -> tuple[int, int]:
        """Keys [lo, hi) the band lets queries i0 .. i1-1 see, within [k_lo, k_hi)."""
        lo, hi = k_lo, k_hi
        if self.lo is not None:
            lo = max(lo, i0 + self.lo)
        if self.hi is not None:
            hi = min(hi, i1 - 1 + self.hi + 1)
        return lo, hi

    def signature(self) -> tuple[object, ...]:
        """The clause's structure without tensor values (which fields are present)."""
        present = tuple(t is not None for t in (self.key_lo, self.key_hi, self.query_lo,
                                                 self.query_hi, self.row_lo, self.row_hi,
                                                 self.key_keep))  # fmt: skip
        docs = tuple(d.equal for d in self.docs)
        return (self.lo, self.hi, self.has_band, present, docs, len(self.dense_keep))


def _at(t: torch.Tensor, b: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
    """t[b] for (B0 or 1,) tensors, t[b, x] for (B0 or 1, N) ones (size-1 dims broadcast)."""
    bi = b if t.shape[0] != 1 else torch.zeros_like(b)
    if x is None:
        return t[bi]
    return t[bi, x]


def _at4(t: torch.Tensor, b: torch.Tensor, h: torch.Tensor, i: torch.Tensor,
         j: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """t[b, h, i, j] of a (B0 or 1, R or 1, L or 1, S or 1) tensor, size-1 dims broadcast."""
    idx = [x if n != 1 else torch.zeros_like(x) for x, n in zip((b, h, i, j), t.shape, strict=True)]
    return t[idx[0], idx[1], idx[2], idx[3]]


def _band(lo: int | None, hi: int | None, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    ok = (i >= 0) & (j >= 0)
    if lo is not None:
        ok = ok & (j >= i + lo)
    if hi is not None:
        ok = ok & (j <= i + hi)
    return ok


def _block_valid(n: int, nb: int, block: int, device: torch.device) -> torch.Tensor:
    """(nb, block) bool: which positions of the padded blocks are real (< n)."""
    return (torch.arange(nb * block, device=device) < n).view(nb, block)


def _blocks_of(t: torch.Tensor, nb: int, block: int) -> torch.Tensor:
    """(B0, N) -> (B0, nb, block), padded at the end with zeros / False."""
    pad = nb * block - t.shape[-1]
    if pad:
        t = torch.nn.functional.pad(t, (0, pad))  # (B0, nb * block)
    return t.view(t.shape[0], nb, block)  # (B0, nb, block)


def _doc_bounds(d: Document, L: int, S: int, nq: int, nk: int, bq: int, bk: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(empty, full) (B0, nq, nk) of a document condition from the id ranges of each
    query block and key block (a padding id, < 0, keeps nothing)."""
    qv = _block_valid(L, nq, bq, device)  # (nq, bq)
    kv = _block_valid(S, nk, bk, device)  # (nk, bk)
    q = _blocks_of(d.q_ids.to(device), nq, bq)  # (B0, nq, bq)
    k = _blocks_of(d.k_ids.to(device), nk, bk)  # (B0, nk, bk)
    big, small = torch.iinfo(q.dtype).max, torch.iinfo(q.dtype).min
    q_min = torch.where(qv, q, big).amin(-1).unsqueeze(-1)  # (B0, nq, 1)
    q_max = torch.where(qv, q, small).amax(-1).unsqueeze(-1)  # (B0, nq, 1)
    k_min = torch.where(kv, k, big).amin(-1).unsqueeze(-2)  # (B0, 1, nk)
    k_max = torch.where(kv, k, small).amax(-1).unsqueeze(-2)  # (B0, 1, nk)
    disjoint = (q_max < k_min) | (k_max < q_min) | (q_max < 0)
    one_doc = (q_min == q_max) & (k_min == k_max) & (q_min == k_min) & (q_min >= 0)
    return (disjoint, one_doc) if d.equal else (one_doc, disjoint)
