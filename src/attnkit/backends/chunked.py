"""The chunked backend: tiled online softmax for every score and every mask kind.

Queries are cut into blocks of ``block_q`` rows and keys into blocks of
``block_k`` columns (chosen per call by :func:`_tile_shape`, or fixed with
:func:`block_sizes`). For each query block the logits of one key block at a
time are computed, masked and folded into a running max, sum and output
(online softmax), so nothing larger than a (rows, block_q, block_k) tile is
ever held::

    for each query block Qi:                    m = -inf, l = 0, acc = 0
        for each key block Kj the mask keeps:   s   = scale * score(Qi, Kj) + bias
                                                m'  = max(m, rowmax(s))
                                                p   = exp(s - m')
                                                l   = l * exp(m - m') + rowsum(p)
                                                acc = acc * exp(m - m') + p @ Vj
        out = acc / l,  lse = m + log(l)        (l == 0: out 0, lse -inf)

Structured masks pay only for what they keep:

- causal and window masks (any alignment) give each query block a key range;
  key blocks outside it are never computed, tiles wholly inside the band need
  no mask at all, and the band's own mask is one cached additive tile folded
  into the matrix product; for a band of finite width the interior query
  blocks (all alike) run several at once as strided key windows;
- ``valid_lens`` and ``key_padding`` truncate each batch element's keys to its
  last kept key, and ``valid_lens(lens, queries=True)`` its queries too;
- dense ``keep``/``bias`` masks are sliced per tile.

Backward is a custom autograd function that saves only the inputs, the output
and the lse, and recomputes each tile's probabilities as ``exp(s - lse)``;
memory stays O((L + S)·E) per row, never O(L·S). Gradients reach the score's
parameters through the differentiable projections outside the function
(``dot_form`` for dot-reducible scores, ``W_q``/``W_k``/``w_v`` for Additive).

With ``return_weights=True`` the weights are written in a second pass over the
same tiles as ``exp(s - lse)``: exact, and no softmax is materialized in the
forward; :func:`head_averaged_weights` averages them over heads tile by tile,
never holding per-head weights. The Additive score's tile logits run the fused
kernel of :mod:`attnkit.kernels.additive` when it could be built (float32 on
CPU), else its pure-torch fallback; :meth:`ChunkedBackend.describe` says
which. ``exp`` of a tile runs the vectorized kernel of
:mod:`attnkit.kernels.softmax` under the same conditions.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch.autograd.function import once_differentiable

from .. import masks as _masks
from .._inputs import AttentionInputs, validate_inputs
from ..kernels import additive as _additive
from ..kernels.softmax import exp_rows_
from ..scores import Additive, Score
from ._common import expand_kv
from ._dotform import dot_form_in_compute_dtype
from .base import AttentionResult, Backend

__all__ = ["BLOCK_K", "BLOCK_Q", "ChunkedBackend", "block_sizes", "head_averaged_weights"]

BLOCK_Q: int | None = None
"""Query rows per tile; None = chosen per call by :func:`_tile_shape`."""
BLOCK_K: int | None = None
"""Key columns per tile; None = chosen per call by :func:`_tile_shape`."""
TILE_ELEMENTS = 1 << 21
"""Budget of one logits tile, rows x BLOCK_Q x BLOCK_K (8 MiB of float32): fixed, so
memory never grows with L·S, and large enough that few tiles (few thread-pool
round trips, which a shared small CPU makes expensive) cover a call."""


@contextmanager
def block_sizes(block_q: int, block_k: int) -> Iterator[None]:
    """Temporarily fix the tile sizes (for tests and tuning); restored on exit."""
    global BLOCK_Q, BLOCK_K
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block_sizes: expected positive sizes, got {block_q}, {block_k}")
    old = BLOCK_Q, BLOCK_K
    BLOCK_Q, BLOCK_K = int(block_q), int(block_k)
    try:
        yield
    finally:
        BLOCK_Q, BLOCK_K = old


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _tile_shape(
    rows: int, L: int, S: int, bands: list[tuple[int | None, int | None, int]]
) -> tuple[int, int]:
    """(block_q, block_k) for a call whose groups have ``rows`` rows each.

    A band of finite width w (causal excluded) gets query blocks of about w/2
    rows and one key block spanning the band (about two thirds of each tile is
    kept).
    Otherwise key blocks of up to 1024 columns and as many query rows as fit
    :data:`TILE_ELEMENTS`.
    """
    if BLOCK_Q is not None and BLOCK_K is not None:
        return BLOCK_Q, BLOCK_K
    widths = [left + right for left, right, _ in bands if left is not None and right is not None]
    if widths:
        w = min(widths)
        bq = min(max(64, _round_up(w // 2, 64)), 512, max(L, 1))
        return bq, _round_up(bq + w + 1, 64)
    bk = min(max(S, 1), 1024)
    bq = min(max(32, TILE_ELEMENTS // max(rows * bk, 1)), 1024, max(L, 1))
    return bq, bk


# --------------------------------------------------------------------------- the mask plan


@dataclass
class _Plan:
    """A call's mask, split into what limits ranges and what must be applied per tile.

    Rows are laid out as (B0, R) flattened to N = B0 * R, B0 the first batch dim.
    """

    L: int
    S: int
    batch_shape: tuple[int, ...]
    B0: int
    R: int
    bands: list[tuple[int | None, int | None, int]] = field(default_factory=list)
    key_lens: torch.Tensor | None = None  # (B0,) keys j < key_lens[b]
    query_lens: torch.Tensor | None = None  # (B0,) rows i >= query_lens[b] are padding
    row_lens: torch.Tensor | None = None  # (B0, L) per-query key lengths
    key_keep: torch.Tensor | None = None  # (B0, S) bool, False = padding key
    dense_keep: list[torch.Tensor] = field(default_factory=list)  # each -> (*batch, L, S)
    dense_bias: list[torch.Tensor] = field(default_factory=list)  # each -> (*batch, L, S)
    dtype: torch.dtype = torch.float32  # of the logits
    block_q: int = 256
    block_k: int = 512
    band_cache: dict[Any, torch.Tensor] = field(default_factory=dict)

    @property
    def per_batch(self) -> bool:
        return any(
            t is not None for t in (self.key_lens, self.query_lens, self.row_lens, self.key_keep)
        )

    def groups(self) -> list[tuple[slice, int | None, int, int, int]]:
        """(rows, b, query_end, key_start, key_end) for each independent group of rows."""
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

    def band_tile(self, lo_off: int, bq: int, span: int, device: torch.device) -> torch.Tensor:
        """The (bq, span) additive band tile of a block whose keys start at i0 + lo_off."""
        cut = tuple((left, right, off - lo_off) for left, right, off in self.bands)
        return self._band_bias(cut, bq, span, device)

    def key_range(self, i0: int, i1: int, k_start: int, k_end: int) -> tuple[int, int]:
        """Keys [lo, hi) that any band lets queries i0 .. i1-1 see."""
        lo, hi = k_start, k_end
        for left, right, off in self.bands:
            if left is not None:
                lo = max(lo, i0 + off - left)
            if right is not None:
                hi = min(hi, i1 - 1 + off + right + 1)
        return lo, hi

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
        self,
        cut: tuple[tuple[int | None, int | None, int], ...],
        bi: int,
        bj: int,
        device: torch.device,
    ) -> torch.Tensor:
        """Additive (bi, bj) tile, 0 inside every band and -inf outside, cached: interior
        tiles of a band all sit at the same position relative to it."""
        key = (cut, bi, bj)
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


def _build_plan(inputs: AttentionInputs) -> _Plan:
    """Sort the call's mask parts into bands, per-batch lengths and dense tiles; pick tiles."""
    batch = inputs.batch_shape
    B0 = batch[0] if batch else 1
    N = math.prod(batch)
    plan = _Plan(
        L=inputs.L,
        S=inputs.S,
        batch_shape=batch,
        B0=B0,
        R=N // B0 if B0 else 0,
        dtype=inputs.compute_dtype,
    )
    dev = inputs.device
    for part in inputs.mask_parts:
        if isinstance(part, _masks.WindowMask):  # causal included
            plan.bands.append((part.left, part.right, part.offset(inputs.L, inputs.S)))
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
                if part.queries:
                    plan.query_lens = (
                        lens if plan.query_lens is None else torch.minimum(plan.query_lens, lens)
                    )
        elif isinstance(part, _masks.KeyPaddingMask):
            keep = ~part.padding.to(dev)  # (B0, S)
            plan.key_keep = keep if plan.key_keep is None else plan.key_keep & keep
        elif isinstance(part, _masks.KeepMask):
            plan.dense_keep.append(part.tensor.to(dev))
        elif isinstance(part, _masks.BiasMask):
            plan.dense_bias.append(part.tensor.to(device=dev, dtype=inputs.compute_dtype))
        else:  # pragma: no cover - guarded by mask_kinds
            raise TypeError(f"chunked: unsupported mask {part!r}")
    rows = plan.R if plan.per_batch else N
    plan.block_q, plan.block_k = _tile_shape(rows, inputs.L, inputs.S, plan.bands)
    return plan


# --------------------------------------------------------------------------- tiles


@dataclass(frozen=True)
class _Operands:
    """The tensors a tile is computed from (all rows N = B0 * R flattened).

    kind "dot": s = scale * qa @ ka^T + kb (kb pre-scaled key bias or None);
    kind "additive": s = scale * sum_h w[h] tanh(qa[:, i, h] + ka[:, j, h]).
    """

    kind: str
    qa: torch.Tensor  # (N, L, Eq)
    ka: torch.Tensor  # (N, S, Eq)
    w: torch.Tensor | None  # (hidden,) for additive
    v: torch.Tensor  # (N, S, Ev)
    kb: torch.Tensor | None  # (N, 1, S)
    scale: float


def _tile_logits(
    ops: _Operands,
    plan: _Plan,
    rows: slice,
    b: int | None,
    i0: int,
    i1: int,
    j0: int,
    j1: int,
) -> torch.Tensor:
    """Masked logits of one tile: (rows, i1-i0, j1-j0), -inf where blocked."""
    qt = ops.qa[rows, i0:i1]  # (R, bi, Eq)
    kt = ops.ka[rows, j0:j1]  # (R, bj, Eq)
    keep, bias = plan.tile_mask(b, i0, i1, j0, j1, qt.device)
    if ops.kind == "dot":
        if ops.kb is not None:
            kb = ops.kb[rows, :, j0:j1]  # (R, 1, bj)
            bias = kb if bias is None else bias + kb
        if bias is not None:  # the bias rides in the matrix product's accumulator
            bias = bias.expand(qt.shape[0], i1 - i0, j1 - j0)  # (R, bi, bj)
            s = torch.baddbmm(bias, qt, kt.transpose(1, 2), alpha=ops.scale)
        else:
            s = torch.bmm(qt, kt.transpose(1, 2)).mul_(ops.scale)  # (R, bi, bj)
    else:
        assert ops.w is not None
        s = _additive.logits(qt, kt, ops.w).mul_(ops.scale)  # (R, bi, bj)
        if bias is not None:
            s = s.add_(bias)
    if keep is not None:
        s = s.masked_fill_(~keep, float("-inf"))
    return s


def _blocks(start: int, end: int, size: int) -> Iterator[tuple[int, int]]:
    """Half-open ranges [a, b) of at most ``size`` covering [start, end)."""
    for a in range(start, end, size):
        yield a, min(a + size, end)


def _forward_tiles(
    ops: _Operands, plan: _Plan, want_weights: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Online-softmax forward over all tiles: out (N, L, Ev), lse (N, L), weights or None."""
    N, L, Ev = ops.qa.shape[0], plan.L, ops.v.shape[-1]
    dt, dev = ops.qa.dtype, ops.qa.device
    out = torch.zeros(N, L, Ev, dtype=dt, device=dev)
    lse = torch.full((N, L), float("-inf"), dtype=dt, device=dev)
    zero = torch.zeros((), dtype=dt, device=dev)
    band = plan.band_offsets() if ops.kind == "dot" else None
    for rows, b, q_end, k_start, k_end in plan.groups():
        done: set[int] = set()
        if band is not None:
            done = _forward_band_runs(ops, plan, rows, q_end, k_start, k_end, band, out, lse)
        for i0, i1 in _blocks(0, q_end, plan.block_q):
            if i0 in done:
                continue
            lo, hi = plan.key_range(i0, i1, k_start, k_end)
            if lo >= hi:
                continue  # every row of this block is fully masked
            m: torch.Tensor | None = None
            acc: torch.Tensor | None = None
            denom: torch.Tensor | None = None
            for j0, j1 in _blocks(lo, hi, plan.block_k):
                s = _tile_logits(ops, plan, rows, b, i0, i1, j0, j1)  # (R, bi, bj)
                tile_max = s.amax(dim=-1)  # (R, bi)
                m_new = tile_max if m is None else torch.maximum(m, tile_max)
                m_safe = torch.where(torch.isfinite(m_new), m_new, zero)  # (R, bi)
                tile_sum = exp_rows_(s, m_safe, want_sum=True)  # s becomes p = exp(s - m)
                assert tile_sum is not None
                pv = torch.bmm(s, ops.v[rows, j0:j1])  # (R, bi, Ev)
                if acc is None or denom is None or m is None:
                    acc, denom = pv, tile_sum
                else:
                    alpha = torch.exp(m - m_safe)  # (R, bi); exp(-inf) = 0
                    denom = denom.mul_(alpha).add_(tile_sum)
                    acc = acc.mul_(alpha.unsqueeze(-1)).add_(pv)
                m = m_new
            assert acc is not None and denom is not None and m is not None
            alive = denom > 0  # (R, bi)
            safe = torch.where(alive, denom, torch.ones((), dtype=dt, device=dev))
            out[rows, i0:i1] = acc / safe.unsqueeze(-1)
            m_fin = torch.where(torch.isfinite(m), m, zero)
            lse[rows, i0:i1] = torch.where(alive, m_fin + torch.log(safe), lse[rows, i0:i1])
    weights = _weights_tiles(ops, plan, lse) if want_weights else None
    return out, lse, weights


def _forward_band_runs(
    ops: _Operands,
    plan: _Plan,
    rows: slice,
    q_end: int,
    k_start: int,
    k_end: int,
    band: tuple[int, int],
    out: torch.Tensor,
    lse: torch.Tensor,
) -> set[int]:
    """Forward of the interior blocks of a band mask, many query blocks per operation.

    A full query block i0 .. i0+bq whose key range is exactly [i0 + lo_off, i0 + bq + hi_off),
    unclipped, sees the band at the same relative position as every other such block: its
    keys are a strided window of K, its mask one cached tile. Runs of these blocks go
    through batched matrix products over (rows, blocks) instead of one loop step each,
    in chunks of at most 2 * TILE_ELEMENTS logits. Returns the i0 of the blocks done.
    """
    lo_off, hi_off = band
    bq = plan.block_q
    span = bq + hi_off - lo_off
    if span <= 0:
        return set()
    first = max(0, -(-(k_start - lo_off) // bq))  # smallest block index with lo unclipped
    last = min(q_end // bq, (k_end - hi_off) // bq)  # blocks n < last end at or before k_end
    if last - first < 2:
        return set()
    qa, ka, v = ops.qa[rows], ops.ka[rows], ops.v[rows]  # (R, L, E'), (R, S, E'), (R, S, Ev)
    R, E, Ev = qa.shape[0], qa.shape[-1], v.shape[-1]
    bias = plan.band_tile(lo_off, bq, span, qa.device)  # (bq, span)
    kb = ops.kb[rows] if ops.kb is not None else None  # (R, 1, S)
    per_chunk = max(1, (2 * TILE_ELEMENTS) // max(R * bq * span, 1))
    dt = qa.dtype
    zero = torch.zeros((), dtype=dt, device=qa.device)
    for n0 in range(first, last, per_chunk):
        g = min(per_chunk, last - n0)
        i0, j0 = n0 * bq, n0 * bq + lo_off
        qb = qa[:, i0 : i0 + g * bq].reshape(R, g, bq, E)  # (R, g, bq, E')
        kw = ka.as_strided(
            (R, g, span, E), (ka.stride(0), bq * E, E, 1), ka.storage_offset() + j0 * E
        )
        vw = v.as_strided(
            (R, g, span, Ev), (v.stride(0), bq * Ev, Ev, 1), v.storage_offset() + j0 * Ev
        )
        s = torch.matmul(qb, kw.transpose(-2, -1))  # (R, g, bq, span)
        s.mul_(ops.scale).add_(bias)
        if kb is not None:
            s.add_(
                kb.as_strided(
                    (R, g, 1, span), (kb.stride(0), bq, span, 1), kb.storage_offset() + j0
                )
            )
        m = s.amax(dim=-1)  # (R, g, bq)
        m = torch.where(torch.isfinite(m), m, zero)
        denom = exp_rows_(s, m, want_sum=True)  # s becomes p = exp(s - m)
        assert denom is not None
        o = torch.matmul(s, vw)  # (R, g, bq, Ev)
        alive = denom > 0  # (R, g, bq)
        safe = torch.where(alive, denom, torch.ones((), dtype=dt, device=qa.device))
        out[rows, i0 : i0 + g * bq] = (o / safe.unsqueeze(-1)).reshape(R, g * bq, Ev)
        lse_b = torch.where(alive, m + torch.log(safe), float("-inf"))  # (R, g, bq)
        lse[rows, i0 : i0 + g * bq] = lse_b.reshape(R, g * bq)
    return {n * bq for n in range(first, last)}


def _weights_tiles(
    ops: _Operands, plan: _Plan, lse: torch.Tensor, *, heads: int = 1
) -> torch.Tensor:
    """Exact weights exp(s - lse), tile by tile; skipped tiles stay 0.

    Returns (N, L, S), or with ``heads`` > 1 the mean over each run of ``heads``
    consecutive rows (the head dim, last of the batch dims): (N // heads, L, S),
    never holding more than one tile of per-head weights.
    """
    N, L, S = ops.qa.shape[0], plan.L, plan.S
    dt, dev = ops.qa.dtype, ops.qa.device
    weights = torch.zeros(N // heads, L, S, dtype=dt, device=dev)
    lse_safe = torch.where(torch.isfinite(lse), lse, torch.zeros((), dtype=dt, device=dev))
    for rows, b, q_end, k_start, k_end in plan.groups():
        out_rows = slice(rows.start // heads, rows.stop // heads)
        for i0, i1 in _blocks(0, q_end, plan.block_q):
            lo, hi = plan.key_range(i0, i1, k_start, k_end)
            shift = lse_safe[rows, i0:i1]  # (R, bi)
            for j0, j1 in _blocks(lo, hi, plan.block_k):
                s = _tile_logits(ops, plan, rows, b, i0, i1, j0, j1)  # (R, bi, bj)
                exp_rows_(s, shift, want_sum=False)
                if heads > 1:
                    s = s.view(-1, heads, i1 - i0, j1 - j0).mean(dim=1)  # (R // heads, bi, bj)
                weights[out_rows, i0:i1, j0:j1] = s
    return weights


def _backward_tiles(
    ops: _Operands,
    plan: _Plan,
    out: torch.Tensor,
    lse: torch.Tensor,
    d_out: torch.Tensor,
    d_lse: torch.Tensor | None,
    weights: torch.Tensor | None,
    d_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """Gradients (dqa, dka, dw, dv, dkb) by recomputing each tile's probabilities.

    With p = exp(s - lse), the gradient of the logits of a tile is
    ``p * (dO @ V^T - rowsum(dO * O) + dlse)`` plus, when the weights were returned,
    ``p * (dW - rowsum(dW * W))``.
    """
    dt, dev = ops.qa.dtype, ops.qa.device
    dqa = torch.zeros_like(ops.qa)
    dka = torch.zeros_like(ops.ka)
    dv = torch.zeros_like(ops.v)
    dkb = torch.zeros_like(ops.kb) if ops.kb is not None else None
    dw = torch.zeros_like(ops.w) if ops.w is not None else None
    row_term = (d_out * out).sum(dim=-1)  # (N, L)
    if d_lse is not None:
        row_term = row_term - d_lse
    if d_weights is not None and weights is not None:
        row_term = row_term + (d_weights * weights).sum(dim=-1)
    lse_safe = torch.where(torch.isfinite(lse), lse, torch.zeros((), dtype=dt, device=dev))
    for rows, b, q_end, k_start, k_end in plan.groups():
        for i0, i1 in _blocks(0, q_end, plan.block_q):
            lo, hi = plan.key_range(i0, i1, k_start, k_end)
            if lo >= hi:
                continue
            do_t = d_out[rows, i0:i1]  # (R, bi, Ev)
            shift = lse_safe[rows, i0:i1]  # (R, bi)
            rt = row_term[rows, i0:i1].unsqueeze(-1)  # (R, bi, 1)
            qt = ops.qa[rows, i0:i1]  # (R, bi, Eq)
            for j0, j1 in _blocks(lo, hi, plan.block_k):
                p = _tile_logits(ops, plan, rows, b, i0, i1, j0, j1)  # (R, bi, bj)
                exp_rows_(p, shift, want_sum=False)  # p = exp(s - lse)
                vt = ops.v[rows, j0:j1]  # (R, bj, Ev)
                dv[rows, j0:j1] += torch.bmm(p.transpose(1, 2), do_t)  # (R, bj, Ev)
                dp = torch.bmm(do_t, vt.transpose(1, 2))  # (R, bi, bj)
                if d_weights is not None:
                    dp += d_weights[rows, i0:i1, j0:j1]
                ds = dp.sub_(rt).mul_(p)  # (R, bi, bj): gradient of the logits s
                if dkb is not None:
                    dkb[rows, :, j0:j1] += ds.sum(dim=1, keepdim=True)  # (R, 1, bj)
                kt = ops.ka[rows, j0:j1]  # (R, bj, Eq)
                if ops.kind == "dot":
                    ds.mul_(ops.scale)
                    dqa[rows, i0:i1] += torch.bmm(ds, kt)  # (R, bi, Eq)
                    dka[rows, j0:j1] += torch.bmm(ds.transpose(1, 2), qt)  # (R, bj, Eq)
                else:
                    assert ops.w is not None and dw is not None
                    gq, gk, gw = _additive.grads(qt, kt, ops.w, ds.mul_(ops.scale))
                    dqa[rows, i0:i1] += gq
                    dka[rows, j0:j1] += gk
                    dw += gw
    return dqa, dka, dw, dv, dkb


class _ChunkedAttentionFunction(torch.autograd.Function):
    """Tiled attention with recompute: saves inputs, output and lse (and the weights
    only when they were asked for, since the caller holds them anyway)."""

    @staticmethod
    def forward(
        ctx: Any,
        plan: _Plan,
        kind: str,
        scale: float,
        want_weights: bool,
        qa: torch.Tensor,
        ka: torch.Tensor,
        w: torch.Tensor | None,
        v: torch.Tensor,
        kb: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        ops = _Operands(kind=kind, qa=qa, ka=ka, w=w, v=v, kb=kb, scale=scale)
        out, lse, weights = _forward_tiles(ops, plan, want_weights)
        ctx.plan, ctx.kind, ctx.scale = plan, kind, scale
        ctx.has_w, ctx.has_kb, ctx.has_weights = w is not None, kb is not None, want_weights
        saved = [qa, ka, v, out, lse]
        saved += [w] if w is not None else []
        saved += [kb] if kb is not None else []
        saved += [weights] if weights is not None else []
        ctx.save_for_backward(*saved)
        if weights is None:
            return out, lse, None
        return out, lse, weights

    @staticmethod
    @once_differentiable  # the tiles are exp'd in place, unseen by autograd: no double backward
    def backward(
        ctx: Any,
        d_out: torch.Tensor | None,
        d_lse: torch.Tensor | None,
        d_weights: torch.Tensor | None,
    ) -> tuple[Any, ...]:
        saved = list(ctx.saved_tensors)
        qa, ka, v, out, lse = saved[:5]
        rest = saved[5:]
        w = rest.pop(0) if ctx.has_w else None
        kb = rest.pop(0) if ctx.has_kb else None
        weights = rest.pop(0) if ctx.has_weights else None
        if d_out is None:
            d_out = torch.zeros_like(out)
        ops = _Operands(kind=ctx.kind, qa=qa, ka=ka, w=w, v=v, kb=kb, scale=ctx.scale)
        dqa, dka, dw, dv, dkb = _backward_tiles(
            ops, ctx.plan, out, lse, d_out.contiguous(), d_lse, weights, d_weights
        )
        return None, None, None, None, dqa, dka, dw, dv, dkb


# --------------------------------------------------------------------------- the backend


class ChunkedBackend(Backend):
    """Tiled online softmax with recompute; any dot-reducible score and Additive, any mask."""

    name: ClassVar[str] = "chunked"
    supports_dropout: ClassVar[bool] = False

    def not_supported_reasons(self, inputs: AttentionInputs) -> list[str]:
        reasons = [
            "dropout_p > 0 is not supported (the recomputing backward would have to replay "
            "the dropout mask)"
            if r == "does not support dropout_p > 0"
            else r
            for r in super().not_supported_reasons(inputs)
        ]
        if not inputs.score.dot_reducible and not isinstance(inputs.score, Additive):
            reasons.append(
                f"score {inputs.score.name!r} has no tiled form (dot-reducible scores and "
                "Additive have one)"
            )
        if torch.compiler.is_compiling():
            reasons.append(
                "under torch.compile: block skipping reads mask lengths on the host, which "
                "cannot be traced"
            )
        if torch.is_grad_enabled() and any(
            isinstance(p, _masks.BiasMask) and p.tensor.requires_grad for p in inputs.mask_parts
        ):
            reasons.append("a bias mask that requires grad (its gradient is L×S)")
        return reasons

    def describe(self, inputs: AttentionInputs) -> str:
        """One line: how the tiles of this call are computed."""
        if isinstance(inputs.score, Additive):
            if _additive.available(inputs.compute_dtype, inputs.device):
                return f"additive tiles: {_additive.status()}"
            if inputs.compute_dtype != torch.float32 or inputs.device.type != "cpu":
                return "additive tiles: pure torch (the fused kernel is float32 on CPU only)"
            return f"additive tiles: {_additive.status()}"
        return "dot-product tiles: batched matrix products"

    def forward(self, inputs: AttentionInputs) -> AttentionResult:
        batch, L, S = inputs.batch_shape, inputs.L, inputs.S
        ops, row_const = _operands(inputs)
        plan = _build_plan(inputs)
        out, lse, weights = _ChunkedAttentionFunction.apply(
            plan, ops.kind, ops.scale, inputs.return_weights, ops.qa, ops.ka, ops.w, ops.v, ops.kb
        )
        out = out.reshape(*batch, L, inputs.Ev).to(inputs.dtype)  # (*batch, L, Ev)
        lse_out: torch.Tensor | None = None
        if inputs.return_lse:
            lse_out = lse.reshape(*batch, L)  # (*batch, L)
            if row_const is not None:
                lse_out = lse_out + (row_const.to(lse.dtype) * inputs.scale).expand(*batch, L)
        if weights is not None:
            weights = weights.reshape(*batch, L, S)  # (*batch, L, S)
        return AttentionResult(output=out, weights=weights, lse=lse_out)


def _operands(inputs: AttentionInputs) -> tuple[_Operands, torch.Tensor | None]:
    """The call's tile operands, rows flattened to N, and the score's row constant (or None).

    The projections here (``dot_form``, Additive's ``W_q``/``W_k``) run under
    autograd, so gradients reach the score's parameters through them.
    """
    cd = inputs.compute_dtype
    score = inputs.score
    batch, L, S = inputs.batch_shape, inputs.L, inputs.S
    N = math.prod(batch)
    row_const: torch.Tensor | None = None
    w: torch.Tensor | None = None
    kb: torch.Tensor | None = None
    if score.dot_reducible:
        kind = "dot"
        qa, ka, kb, row_const = dot_form_in_compute_dtype(inputs, row_constant=inputs.return_lse)
    else:
        assert isinstance(score, Additive)
        kind = "additive"
        qa, ka = score.project(inputs.query, inputs.key)  # (..., L, h), (..., S, h)
        w = score.w_v.weight.reshape(-1).to(cd)  # (h,)
    qa, ka, v = qa.to(cd), ka.to(cd), inputs.value.to(cd)
    if inputs.groups > 1:
        ka = expand_kv(ka, inputs.groups)  # (..., Hq, S, Eq)
        v = expand_kv(v, inputs.groups)  # (..., Hq, S, Ev)
        if kb is not None and kb.ndim >= 3 and kb.shape[-3] != 1:
            kb = expand_kv(kb, inputs.groups)  # (..., Hq, 1, S)
    qa = qa.expand(*batch, L, qa.shape[-1]).reshape(N, L, qa.shape[-1])  # (N, L, Eq)
    ka = ka.expand(*batch, S, ka.shape[-1]).reshape(N, S, ka.shape[-1])  # (N, S, Eq)
    v = v.expand(*batch, S, v.shape[-1]).reshape(N, S, v.shape[-1])  # (N, S, Ev)
    if kb is not None:
        kb = (kb.to(cd) * inputs.scale).expand(*batch, 1, S).reshape(N, 1, S)  # (N, 1, S)
    ops = _Operands(
        kind=kind,
        qa=qa.contiguous(),
        ka=ka.contiguous(),
        w=w,
        v=v.contiguous(),
        kb=kb.contiguous() if kb is not None else None,
        scale=inputs.scale,
    )
    return ops, row_const


def head_averaged_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    score: str | Score = "scaled_dot",
    mask: _masks.Mask | torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Exact attention weights averaged over heads, without per-head weights in memory.

    For ``torch.nn.MultiheadAttention``-style ``average_attn_weights=True``: the
    lse comes from a chunked forward, then each tile's weights ``exp(s - lse)``
    are averaged over the head dim (-3 of the query) as they are produced, so
    the largest buffer is the (B, L, S) result, not (B, H, L, S). No autograd.

    Args:
        query: (..., H, L, E); key (..., Hk, S, Ek); value (..., Hk, S, Ev).
        score, mask, scale: as for :func:`attnkit.attention`.

    Returns:
        (..., L, S) in the compute dtype (float32 for half inputs); rows with no
        key to attend are 0.
    """
    inputs = validate_inputs(query, key, value, score=score, mask=mask, scale=scale)
    if len(inputs.batch_shape) < 1:
        raise ValueError(
            f"query: head_averaged_weights needs a head dim, shape (..., H, L, E); got "
            f"{tuple(query.shape)}"
        )
    reasons = ChunkedBackend().not_supported_reasons(inputs)
    if reasons:
        raise ValueError(f"head_averaged_weights: cannot run this call ({'; '.join(reasons)})")
    heads = inputs.batch_shape[-1]
    if heads == 0 or inputs.L == 0 or inputs.S == 0 or math.prod(inputs.batch_shape) == 0:
        shape = (*inputs.batch_shape[:-1], inputs.L, inputs.S)
        return torch.zeros(shape, dtype=inputs.compute_dtype, device=inputs.device)
    with torch.no_grad():
        ops, _ = _operands(inputs)
        plan = _build_plan(inputs)
        _, lse, _ = _forward_tiles(ops, plan, want_weights=False)
        if plan.per_batch and plan.R % heads:
            # (H, L, E) with a per-batch mask: its batch dim is the head dim, so each group
            # holds one head and there is no run of heads to average tile by tile.
            weights = _weights_tiles(ops, plan, lse).mean(dim=0, keepdim=True)  # (1, L, S)
        else:
            weights = _weights_tiles(ops, plan, lse, heads=heads)  # (N // H, L, S)
    return weights.reshape(*inputs.batch_shape[:-1], inputs.L, inputs.S)  # (..., L, S)
