"""Triton helpers shared by every kernel: loop bounds, the keep rule of a tile, tanh
and the Additive score's logits.

Logits inside the kernels are in base-2 units (natural logits times log2(e)), so
the softmax uses ``exp2``; lse leaves the kernels in natural units.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def key_bounds(
    i0,
    L,
    S,
    b0,
    LO,
    HI,
    KLEN,
    QLEN,
    RLEN,
    s_rlen_b,
    HAS_LO: tl.constexpr,
    HAS_HI: tl.constexpr,
    HAS_KLEN: tl.constexpr,
    HAS_QLEN: tl.constexpr,
    HAS_RLEN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """[start, end) of the keys query rows i0 .. i0+BLOCK_M-1 may see; start is a
    multiple of BLOCK_N, and end <= start when the whole block is masked."""
    lo = i0 * 0
    hi = lo + S
    i_last = tl.minimum(i0 + BLOCK_M, L) - 1
    if HAS_LO:
        lo = tl.maximum(lo, i0 + LO)
    if HAS_HI:
        hi = tl.minimum(hi, i_last + HI + 1)
    if HAS_KLEN:
        hi = tl.minimum(hi, tl.load(KLEN + b0).to(tl.int32))
    if HAS_RLEN:
        rows = i0 + tl.arange(0, BLOCK_M)
        row_lens = tl.load(RLEN + b0 * s_rlen_b + rows, mask=rows < L, other=0)
        hi = tl.minimum(hi, tl.max(row_lens, axis=0).to(tl.int32))
    if HAS_QLEN:
        q_len = tl.load(QLEN + b0).to(tl.int32)
        hi = tl.where(i0 < q_len, hi, 0)
    start = (lo // BLOCK_N) * BLOCK_N
    return start, hi


@triton.jit
def query_bounds(
    j0,
    L,
    S,
    b0,
    LO,
    HI,
    KLEN,
    QLEN,
    HAS_LO: tl.constexpr,
    HAS_HI: tl.constexpr,
    HAS_KLEN: tl.constexpr,
    HAS_QLEN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """[start, end) of the query rows that may see keys j0 .. j0+BLOCK_N-1; start is a
    multiple of BLOCK_M, and end <= start when no query sees the block."""
    lo = j0 * 0
    hi = lo + L
    j_last = tl.minimum(j0 + BLOCK_N, S) - 1
    if HAS_HI:  # j <= i + HI  <=>  i >= j - HI
        lo = tl.maximum(lo, j0 - HI)
    if HAS_LO:  # j >= i + LO  <=>  i <= j - LO
        hi = tl.minimum(hi, j_last - LO + 1)
    if HAS_QLEN:
        hi = tl.minimum(hi, tl.load(QLEN + b0).to(tl.int32))
    if HAS_KLEN:
        hi = tl.where(j0 < tl.load(KLEN + b0).to(tl.int32), hi, 0)
    start = (lo // BLOCK_M) * BLOCK_M
    return start, hi


@triton.jit
def tile_keep(
    offs_m,
    offs_n,
    L,
    S,
    b,
    h,
    b0,
    LO,
    HI,
    KLEN,
    QLEN,
    RLEN,
    s_rlen_b,
    KKEEP,
    s_kkeep_b,
    KEEP,
    s_keep_b,
    s_keep_h,
    s_keep_l,
    s_keep_s,
    HAS_LO: tl.constexpr,
    HAS_HI: tl.constexpr,
    HAS_KLEN: tl.constexpr,
    HAS_QLEN: tl.constexpr,
    HAS_RLEN: tl.constexpr,
    HAS_KKEEP: tl.constexpr,
    HAS_KEEP: tl.constexpr,
):
    """(BLOCK_M, BLOCK_N) bool: which (query, key) pairs of the tile may attend."""
    rows = offs_m[:, None]
    cols = offs_n[None, :]
    inside = (rows < L) & (cols < S)
    keep = inside
    if HAS_LO:
        keep = keep & (cols >= rows + LO)
    if HAS_HI:
        keep = keep & (cols <= rows + HI)
    if HAS_KLEN:
        keep = keep & (cols < tl.load(KLEN + b0))
    if HAS_QLEN:
        keep = keep & (rows < tl.load(QLEN + b0))
    if HAS_RLEN:
        row_lens = tl.load(RLEN + b0 * s_rlen_b + offs_m, mask=offs_m < L, other=0)
        keep = keep & (cols < row_lens[:, None])
    if HAS_KKEEP:
        kept = tl.load(KKEEP + b0 * s_kkeep_b + offs_n, mask=offs_n < S, other=0)
        keep = keep & (kept[None, :] != 0)
    if HAS_KEEP:
        base = KEEP + b.to(tl.int64) * s_keep_b + h.to(tl.int64) * s_keep_h
        dense = tl.load(base + rows * s_keep_l + cols * s_keep_s, mask=inside, other=0)
        keep = keep & (dense != 0)
    return keep


@triton.jit
def tile_bias(offs_m, offs_n, L, S, b, h, BIAS, s_bias_b, s_bias_h, s_bias_l, s_bias_s):
    """(BLOCK_M, BLOCK_N) float32 tile of the dense additive bias (natural units)."""
    rows = offs_m[:, None]
    cols = offs_n[None, :]
    base = BIAS + b.to(tl.int64) * s_bias_b + h.to(tl.int64) * s_bias_h
    t = tl.load(base + rows * s_bias_l + cols * s_bias_s, mask=(rows < L) & (cols < S), other=0.0)
    return t.to(tl.float32)


@triton.jit
def add_bias(s, offs_m, offs_n, L, S, b, h, BIAS, s_bias_b, s_bias_h, s_bias_l, s_bias_s):
    """Logits s (base 2) plus the dense bias tile; a -inf bias blocks the pair whatever s
    holds (a NaN score of a blocked pair must not become NaN + -inf = NaN)."""
    t = tile_bias(offs_m, offs_n, L, S, b, h, BIAS, s_bias_b, s_bias_h, s_bias_l, s_bias_s)
    return tl.where(t == float("-inf"), float("-inf"), s + t * LOG2E)


@triton.jit
def mm(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot with float32 accumulation; ``UPCAST`` computes it on float32 copies of the
    operands (same values: the interpreter's bfloat16 products are not reliable)."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PRECISION)
    return out


@triton.jit
def tanh(x):
    """tanh in float32 from one exp, exact to rounding for every x (no overflow)."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x >= 0, t, -t)


@triton.jit
def additive_logits(
    QA,
    s_qa_l,
    s_qa_h,
    KA,
    s_ka_s,
    s_ka_h,
    W,
    offs_m,
    offs_n,
    L,
    S,
    HID,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """(BLOCK_M, BLOCK_N) float32 ``sum_h w[h] tanh(qa[i, h] + ka[j, h])``, over the hidden
    dim in steps of BLOCK_H held in registers. QA/KA point at this row's (L, HID) and
    (S, HID) matrices."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for h0 in range(0, HID, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        in_h = offs_h < HID
        qa = tl.load(
            QA + offs_m[:, None] * s_qa_l + offs_h[None, :] * s_qa_h,
            mask=(offs_m[:, None] < L) & in_h[None, :],
            other=0.0,
        ).to(tl.float32)  # (BLOCK_M, BLOCK_H)
        ka = tl.load(
            KA + offs_n[:, None] * s_ka_s + offs_h[None, :] * s_ka_h,
            mask=(offs_n[:, None] < S) & in_h[None, :],
            other=0.0,
        ).to(tl.float32)  # (BLOCK_N, BLOCK_H)
        w = tl.load(W + offs_h, mask=in_h, other=0.0).to(tl.float32)  # (BLOCK_H,)
        t = tanh(qa[:, None, :] + ka[None, :, :])  # (BLOCK_M, BLOCK_N, BLOCK_H)
        acc += tl.sum(t * w[None, None, :], axis=2)
    return acc
