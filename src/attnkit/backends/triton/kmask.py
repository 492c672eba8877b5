"""The mask in the kernels: the one place that reads the packed mask (see :mod:`.bits`).

Every kernel receives the mask as ``MASK`` (int32 per-batch records), ``KEEP`` (the
dense keep, uint8), ``BIAS`` (the dense bias), four band ints ``LO0, HI0, LO1, HI1``
and the compile-time mask bits ``MB``. This module turns them into:

- :func:`record`: batch element b0's record (once per program);
- :func:`key_range` / :func:`query_range`: the keys a query block may see, the queries
  a key block may be seen by (the loops visit nothing outside);
- :func:`tile_state`: EMPTY (0), PARTIAL (1) or FULL (2) for one tile, from the bands,
  ranges, key keep and document ids (FULL tiles skip the per-pair test);
- :func:`tile_keep`: the per-pair test of a PARTIAL tile;
- :func:`dense_bias`: the dense bias tile.

Adding a mask field: a bit in :mod:`.bits`, its data in
:func:`attnkit.backends.triton.maskargs.pack_mask`, its place in :func:`_fields` and
its test in :func:`tile_keep` (plus :func:`tile_state` and the ranges when it can
bound or fill tiles), all in this module. Nothing else in the kernels changes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import bits as _b

_LO = tl.constexpr(_b.LO)
_HI = tl.constexpr(_b.HI)
_KRANGE = tl.constexpr(_b.KRANGE)
_QRANGE = tl.constexpr(_b.QRANGE)
_RRANGE = tl.constexpr(_b.RRANGE)
_KKEEP = tl.constexpr(_b.KKEEP)
_DOC = tl.constexpr(_b.DOC)
_DOC_NE = tl.constexpr(_b.DOC_NE)
_DENSE = tl.constexpr(_b.DENSE)
_CMASK = tl.constexpr((1 << _b.CLAUSE_WIDTH) - 1)
_C1_DIV = tl.constexpr(1 << _b.CLAUSE_WIDTH)
_NC_DIV = tl.constexpr(1 << _b.NC_SHIFT)
_KEEP_DIV = tl.constexpr(1 << _b.KEEP_SHIFT)
_BIAS_DIV = tl.constexpr(1 << (_b.BIAS_SHIFT + 1))
_RECORD_B1 = tl.constexpr(_b.RECORD_B1)
_FOUR = tl.constexpr(4)
_SIXTEEN = tl.constexpr(16)
_D_B = tl.constexpr(_b.DIM_B)
_D_H = tl.constexpr(_b.DIM_H)
_D_L = tl.constexpr(_b.DIM_L)
_D_S = tl.constexpr(_b.DIM_S)
_BIG = tl.constexpr(2**30)
_SPARSE_CLAUSE = _b.KKEEP | _b.DOC | _b.DOC_NE
SPARSE_FIELDS = tl.constexpr(
    _SPARSE_CLAUSE | (_SPARSE_CLAUSE << _b.CLAUSE_WIDTH) | (2 << _b.NC_SHIFT)
)
"""Mask bits under which a tile inside a block's range may still be EMPTY (key keep,
documents, two clauses): the kernels then test each tile before computing it."""


@triton.jit
def _fields(CB: tl.constexpr, L, S):
    """Offsets of the fields of a clause record with bits ``CB``, in record order: (key
    range, query range, row ranges, key keep, documents, not documents, the record's
    width). An absent field's offset is unused. The one description of the layout in
    the kernels (the host's is :func:`attnkit.backends.triton.maskargs.pack_mask`)."""
    o = L * 0
    o_krange = o
    if (_KRANGE & CB) != 0:
        o += 2
    o_qrange = o
    if (_QRANGE & CB) != 0:
        o += 2
    o_rrange = o
    if (_RRANGE & CB) != 0:
        o += 2 * L
    o_kkeep = o
    if (_KKEEP & CB) != 0:
        o += S
    o_doc = o
    if (_DOC & CB) != 0:
        o += L + S
    o_doc_ne = o
    if (_DOC_NE & CB) != 0:
        o += L + S
    return o_krange, o_qrange, o_rrange, o_kkeep, o_doc, o_doc_ne, o


@triton.jit
def record(MASK, MB: tl.constexpr, b0, L, S):
    """Pointer to batch element b0's record (every clause's per-batch data, clause 0
    first); computed once per program."""
    NC: tl.constexpr = (MB // _NC_DIV) % _FOUR
    width = L * 0
    for c in tl.static_range(NC):
        _, _, _, _, _, _, w_c = _fields(_CMASK & (MB // (1 + (_C1_DIV - 1) * c)), L, S)
        width += w_c
    if (_RECORD_B1 & MB) != 0:
        width = width * 0
    return MASK + b0.to(tl.int64) * width


@triton.jit
def _dense_offsets(DIMS: tl.constexpr, b, h, rows, cols, H, L, S):
    """Element offsets (BLOCK_M, BLOCK_N) into a dense (B|1, H|1, L|1, S|1) contiguous
    tensor whose real dims are the bits of DIMS (B, H, L, S = 1, 2, 4, 8)."""
    off = (rows + cols).to(tl.int64) * 0  # (BLOCK_M, BLOCK_N)
    n_s = S * 0 + 1
    n_l = n_s
    n_h = n_s
    if (_D_S & DIMS) != 0:
        off += cols.to(tl.int64)
        n_s = S
    if (_D_L & DIMS) != 0:
        n_l = L
    if (_D_H & DIMS) != 0:
        n_h = H
    if (_D_L & DIMS) != 0:
        off += rows.to(tl.int64) * n_s
    if (_D_H & DIMS) != 0:
        off += h.to(tl.int64) * (n_l * n_s)
    if (_D_B & DIMS) != 0:
        off += b.to(tl.int64) * (n_h * n_l * n_s)
    return off


@triton.jit
def dense_bias(BIAS, MB: tl.constexpr, b, h, H, offs_m, offs_n, L, S):
    """(BLOCK_M, BLOCK_N) float32 tile of the dense bias (natural units)."""
    rows = offs_m[:, None]
    cols = offs_n[None, :]
    DIMS: tl.constexpr = (MB // _BIAS_DIV) % _SIXTEEN
    off = _dense_offsets(DIMS, b, h, rows, cols, H, L, S)
    t = tl.load(BIAS + off, mask=(rows < L) & (cols < S), other=0.0)
    return t.to(tl.float32)


@triton.jit
def tile_keep(rec, KEEP, MB: tl.constexpr, b, h, H, offs_m, offs_n, L, S, LO0, HI0, LO1, HI1):
    """(BLOCK_M, BLOCK_N) bool: which (query, key) pairs of the tile may attend: the OR
    over clauses of the AND of each clause's fields."""
    rows = offs_m[:, None]
    cols = offs_n[None, :]
    in_m = offs_m < L
    in_n = offs_n < S
    inside = (rows < L) & (cols < S)
    KEEP_DIMS: tl.constexpr = (MB // _KEEP_DIV) % _SIXTEEN
    NC: tl.constexpr = (MB // _NC_DIV) % _FOUR
    dense = inside
    if KEEP_DIMS != 0:
        off = _dense_offsets(KEEP_DIMS, b, h, rows, cols, H, L, S)
        dense = tl.load(KEEP + off, mask=inside, other=0) != 0
    any_clause = inside & (rows < 0)
    base = rec
    for c in tl.static_range(NC):
        CB = _CMASK & (MB // (1 + (_C1_DIV - 1) * c))  # constexpr, per clause
        lo = LO0 if c == 0 else LO1
        hi = HI0 if c == 0 else HI1
        o_kr, o_qr, o_rr, o_kk, o_doc, o_ne, width = _fields(CB, L, S)
        keep = inside
        if (_LO & CB) != 0:
            keep = keep & (cols >= rows + lo)
        if (_HI & CB) != 0:
            keep = keep & (cols <= rows + hi)
        if (_KRANGE & CB) != 0:
            keep = keep & (cols >= tl.load(base + o_kr)) & (cols < tl.load(base + o_kr + 1))
        if (_QRANGE & CB) != 0:
            keep = keep & (rows >= tl.load(base + o_qr)) & (rows < tl.load(base + o_qr + 1))
        if (_RRANGE & CB) != 0:
            r_lo = tl.load(base + o_rr + offs_m, mask=in_m, other=0)
            r_hi = tl.load(base + o_rr + L + offs_m, mask=in_m, other=0)
            keep = keep & (cols >= r_lo[:, None]) & (cols < r_hi[:, None])
        if (_KKEEP & CB) != 0:
            kk = tl.load(base + o_kk + offs_n, mask=in_n, other=0)
            keep = keep & (kk[None, :] != 0)
        if (_DOC & CB) != 0:
            qid = tl.load(base + o_doc + offs_m, mask=in_m, other=-1)
            kid = tl.load(base + o_doc + L + offs_n, mask=in_n, other=-1)
            keep = keep & (qid[:, None] == kid[None, :]) & (qid[:, None] >= 0)
        if (_DOC_NE & CB) != 0:
            qid = tl.load(base + o_ne + offs_m, mask=in_m, other=-1)
            kid = tl.load(base + o_ne + L + offs_n, mask=in_n, other=-1)
            keep = keep & ((qid[:, None] != kid[None, :]) | (qid[:, None] < 0))
        if (_DENSE & CB) != 0:
            keep = keep & dense
        any_clause = any_clause | keep
        base += width
    return any_clause


@triton.jit
def tile_state(rec, MB: tl.constexpr, i0, j0, L, S, LO0, HI0, LO1, HI1,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """0 (EMPTY: no pair kept), 1 (PARTIAL) or 2 (FULL: every pair kept, in range), from
    per-clause bounds that are conservative (a clause with a dense keep is never FULL)."""
    NC: tl.constexpr = (MB // _NC_DIV) % _FOUR
    i_last = tl.minimum(i0 + BLOCK_M, L) - 1
    j_last = tl.minimum(j0 + BLOCK_N, S) - 1
    interior = (i0 + BLOCK_M <= L) & (j0 + BLOCK_N <= S)
    any_full = i0 < 0
    all_none = i0 >= 0
    base = rec
    for c in tl.static_range(NC):
        CB = _CMASK & (MB // (1 + (_C1_DIV - 1) * c))  # constexpr, per clause
        lo = LO0 if c == 0 else LO1
        hi = HI0 if c == 0 else HI1
        o_kr, o_qr, o_rr, o_kk, o_doc, o_ne, width = _fields(CB, L, S)
        full = interior
        none = i0 < 0  # the ranges never hold a tile outside (L, S)
        if (_LO & CB) != 0:
            full = full & (j0 >= i_last + lo)
            none = none | (j_last < i0 + lo)
        if (_HI & CB) != 0:
            full = full & (j_last <= i0 + hi)
            none = none | (j0 > i_last + hi)
        if (_KRANGE & CB) != 0:
            k_lo = tl.load(base + o_kr)
            k_hi = tl.load(base + o_kr + 1)
            full = full & (k_lo <= j0) & (j_last < k_hi)
            none = none | (j_last < k_lo) | (j0 >= k_hi)
        if (_QRANGE & CB) != 0:
            q_lo = tl.load(base + o_qr)
            q_hi = tl.load(base + o_qr + 1)
            full = full & (q_lo <= i0) & (i_last < q_hi)
            none = none | (i_last < q_lo) | (i0 >= q_hi)
        if (_RRANGE & CB) != 0:
            offs_m = i0 + tl.arange(0, BLOCK_M)
            in_m = offs_m < L
            r_lo = tl.load(base + o_rr + offs_m, mask=in_m, other=0)
            r_hi = tl.load(base + o_rr + L + offs_m, mask=in_m, other=_BIG)
            full = full & (tl.max(r_lo, axis=0) <= j0) & (tl.min(r_hi, axis=0) > j_last)
            r_lo = tl.where(in_m, r_lo, _BIG)
            r_hi = tl.where(in_m, r_hi, 0)
            none = none | (tl.min(r_lo, axis=0) > j_last) | (tl.max(r_hi, axis=0) <= j0)
        if (_KKEEP & CB) != 0:
            offs_n = j0 + tl.arange(0, BLOCK_N)
            n_kept = tl.sum(tl.load(base + o_kk + offs_n, mask=offs_n < S, other=0), axis=0)
            full = full & (n_kept == BLOCK_N)
            none = none | (n_kept == 0)
        if ((_DOC | _DOC_NE) & CB) != 0:
            o_ids = o_doc if (_DOC & CB) != 0 else o_ne
            offs_m = i0 + tl.arange(0, BLOCK_M)
            offs_n = j0 + tl.arange(0, BLOCK_N)
            in_m = offs_m < L
            in_n = offs_n < S
            qid = tl.load(base + o_ids + offs_m, mask=in_m, other=-1)
            kid = tl.load(base + o_ids + L + offs_n, mask=in_n, other=-1)
            q_min = tl.min(tl.where(in_m, qid, _BIG), axis=0)
            q_max = tl.max(qid, axis=0)
            k_min = tl.min(tl.where(in_n, kid, _BIG), axis=0)
            k_max = tl.max(kid, axis=0)
            one_doc = (q_min == q_max) & (k_min == k_max) & (q_min == k_min) & (q_min >= 0)
            apart = (q_max < k_min) | (k_max < q_min) | (q_max < 0)
            if (_DOC & CB) != 0:
                full = full & one_doc
                none = none | apart
            if (_DOC_NE & CB) != 0:
                full = full & apart
                none = none | one_doc
        if (_DENSE & CB) != 0:
            full = full & (i0 < 0)
        any_full = any_full | full
        all_none = all_none & none
        base += width
    return tl.where(all_none, 0, tl.where(any_full, 2, 1))


@triton.jit
def key_range(rec, MB: tl.constexpr, i0, L, S, LO0, HI0, LO1, HI1,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """[start, end) of the keys query rows i0 .. i0+BLOCK_M-1 may see; start is a
    multiple of BLOCK_N, and end <= start when the block sees nothing. Two clauses:
    the hull of their ranges (the tiles between are found EMPTY and skipped)."""
    NC: tl.constexpr = (MB // _NC_DIV) % _FOUR
    i_last = tl.minimum(i0 + BLOCK_M, L) - 1
    start = i0 * 0 + S
    end = i0 * 0
    base = rec
    for c in tl.static_range(NC):
        CB = _CMASK & (MB // (1 + (_C1_DIV - 1) * c))  # constexpr, per clause
        lo = LO0 if c == 0 else LO1
        hi = HI0 if c == 0 else HI1
        o_kr, o_qr, o_rr, _, _, _, width = _fields(CB, L, S)
        s_c = i0 * 0
        e_c = s_c + S
        if (_LO & CB) != 0:
            s_c = tl.maximum(s_c, i0 + lo)
        if (_HI & CB) != 0:
            e_c = tl.minimum(e_c, i_last + hi + 1)
        if (_KRANGE & CB) != 0:
            s_c = tl.maximum(s_c, tl.load(base + o_kr))
            e_c = tl.minimum(e_c, tl.load(base + o_kr + 1))
        if (_QRANGE & CB) != 0:
            outside = (i_last < tl.load(base + o_qr)) | (i0 >= tl.load(base + o_qr + 1))
            e_c = tl.where(outside, 0, e_c)
        if (_RRANGE & CB) != 0:
            offs_m = i0 + tl.arange(0, BLOCK_M)
            r_lo = tl.load(base + o_rr + offs_m, mask=offs_m < L, other=_BIG)
            r_hi = tl.load(base + o_rr + L + offs_m, mask=offs_m < L, other=0)
            s_c = tl.maximum(s_c, tl.min(r_lo, axis=0))
            e_c = tl.minimum(e_c, tl.max(r_hi, axis=0))
        some = e_c > s_c  # an empty clause range does not widen the hull
        start = tl.where(some, tl.minimum(start, s_c), start)
        end = tl.where(some, tl.maximum(end, e_c), end)
        base += width
    start = tl.maximum(tl.minimum(start, end), 0)
    return (start // BLOCK_N) * BLOCK_N, end


@triton.jit
def query_range(rec, MB: tl.constexpr, j0, L, S, LO0, HI0, LO1, HI1,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """[start, end) of the query rows that may see keys j0 .. j0+BLOCK_N-1; start is a
    multiple of BLOCK_M, and end <= start when no row sees the block."""
    NC: tl.constexpr = (MB // _NC_DIV) % _FOUR
    j_last = tl.minimum(j0 + BLOCK_N, S) - 1
    start = j0 * 0 + L
    end = j0 * 0
    base = rec
    for c in tl.static_range(NC):
        CB = _CMASK & (MB // (1 + (_C1_DIV - 1) * c))  # constexpr, per clause
        lo = LO0 if c == 0 else LO1
        hi = HI0 if c == 0 else HI1
        o_kr, o_qr, _, _, _, _, width = _fields(CB, L, S)
        s_c = j0 * 0
        e_c = s_c + L
        if (_HI & CB) != 0:  # j <= i + hi  <=>  i >= j - hi
            s_c = tl.maximum(s_c, j0 - hi)
        if (_LO & CB) != 0:  # j >= i + lo  <=>  i <= j - lo
            e_c = tl.minimum(e_c, j_last - lo + 1)
        if (_QRANGE & CB) != 0:
            s_c = tl.maximum(s_c, tl.load(base + o_qr))
            e_c = tl.minimum(e_c, tl.load(base + o_qr + 1))
        if (_KRANGE & CB) != 0:
            outside = (j_last < tl.load(base + o_kr)) | (j0 >= tl.load(base + o_kr + 1))
            e_c = tl.where(outside, 0, e_c)
        some = e_c > s_c
        start = tl.where(some, tl.minimum(start, s_c), start)
        end = tl.where(some, tl.maximum(end, e_c), end)
        base += width
    start = tl.maximum(tl.minimum(start, end), 0)
    return (start // BLOCK_M) * BLOCK_M, end
