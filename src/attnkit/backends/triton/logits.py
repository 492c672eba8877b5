"""The one logits tile every kernel computes, and the arithmetic it needs.

:func:`logits_tile` is the score (dot form or Additive), the key bias, the dense bias,
the scale and the mask of one (BLOCK_M, BLOCK_N) tile, in base-2 units (natural
logits times log2(e)), so the softmax uses ``exp2``; lse leaves the kernels in natural
units. The forward, backward and weights kernels all call it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import bits as _b
from .kmask import dense_bias, record, tile_keep

LOG2E = tl.constexpr(1.4426950408889634)
BIAS_FLOOR = tl.constexpr(-2.35e38)
"""The lowest finite bias the kernels add: its log2 form, -3.39e38, is still finite."""
LN2 = tl.constexpr(0.6931471805599453)
ADDITIVE = tl.constexpr(_b.ADDITIVE)
HAS_KB = tl.constexpr(_b.HAS_KB)
HAS_VBAD = tl.constexpr(_b.HAS_VBAD)
IEEE = tl.constexpr(_b.IEEE)
EMULATE_BF16 = tl.constexpr(_b.EMULATE_BF16)
HAS_DO = tl.constexpr(_b.HAS_DO)
HAS_DW = tl.constexpr(_b.HAS_DW)
MEAN = tl.constexpr(_b.MEAN)
_HAS_BIAS = tl.constexpr(1 << _b.BIAS_SHIFT)
FULL = tl.constexpr(2)


@triton.jit
def load_tile(base, offs_r, stride, n_rows, offs_c, n_cols):
    """The tile ``base[r * stride + c]`` for rows ``offs_r`` and columns ``offs_c`` (unit
    stride), 0 outside ``r < n_rows`` and ``c < n_cols``: (len(offs_r), len(offs_c))."""
    return tl.load(
        base + offs_r[:, None] * stride + offs_c[None, :],
        mask=(offs_r[:, None] < n_rows) & (offs_c[None, :] < n_cols),
        other=0.0,
    )


@triton.jit
def operand_tile(base, offs_r, stride, n_rows, offs_e, E, OPS: tl.constexpr,
                 ROWS: tl.constexpr, E_P2: tl.constexpr):  # fmt: skip
    """A (ROWS, E_P2) tile of q' or k' for the dot form; zeros under the Additive score,
    whose logits read the projections themselves (:func:`additive_logits`)."""
    if (ADDITIVE & OPS) != 0:
        tile = tl.zeros((ROWS, E_P2), dtype=tl.float32)  # unused
    else:
        tile = load_tile(base, offs_r, stride, n_rows, offs_e, E)
    return tile


@triton.jit
def program_row(row, Q, K, V, MASK, H, GROUPS, R, L, S, s_q_b, s_q_h, s_k_b, s_k_h,
                s_v_b, s_v_h, MB: tl.constexpr):  # fmt: skip
    """What the program of row ``row = b * H + h`` (batch element b, query head h) reads:
    (b, h, its mask record, the start of its q (L, E), of the k (S, E) and v (S, Ev) of
    its key head h // GROUPS, and the offset of that key head's per-key rows (S,): key
    bias, value flags)."""
    b = row // H
    h = row % H
    hk = h // GROUPS
    q_base = Q + b.to(tl.int64) * s_q_b + h.to(tl.int64) * s_q_h
    k_base = K + b.to(tl.int64) * s_k_b + hk.to(tl.int64) * s_k_h
    v_base = V + b.to(tl.int64) * s_v_b + hk.to(tl.int64) * s_v_h
    kv_rows = (b * (H // GROUPS) + hk).to(tl.int64) * S
    rec = record(MASK, MB, row // R, L, S)
    return b, h, rec, q_base, k_base, v_base, kv_rows


@triton.jit
def mm(a, b, OPS: tl.constexpr):
    """tl.dot with float32 accumulation. float32 operands: IEEE products (no TF32) when
    ``IEEE``; the interpreter's bfloat16 products are taken on float32 copies (the same
    values: its bfloat16 products are not reliable)."""
    if (EMULATE_BF16 & OPS) != 0:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif (IEEE & OPS) != 0:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def mm_narrow(a, b, OPS: tl.constexpr):
    """``mm(narrow(a, b.dtype), b)``: a float32 tile cast to the operands' dtype (as the
    GPU's matrix units take it), then the product."""
    if (EMULATE_BF16 & OPS) != 0:
        u = a.to(tl.uint32, bitcast=True)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        a = tl.where(a != a, a, u.to(tl.float32, bitcast=True))
        out = tl.dot(a.to(b.dtype).to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif (IEEE & OPS) != 0:
        out = tl.dot(a.to(b.dtype), b, input_precision="ieee")
    else:
        out = tl.dot(a.to(b.dtype), b)
    return out


@triton.jit
def narrow(x, dtype: tl.constexpr, OPS: tl.constexpr):
    """float32 ``x`` cast to the operands' ``dtype``, rounded to nearest even.

    GPUs round so; Triton's interpreter truncates float32 to bfloat16, a bias of up to
    one unit in the last place, always toward zero, which made interpreted bfloat16
    results several times less exact than plain bfloat16 math. There the rounding is
    done on the bits first (the cast of the rounded value is then exact)."""
    if (EMULATE_BF16 & OPS) != 0:
        u = x.to(tl.uint32, bitcast=True)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        x = tl.where(x != x, x, u.to(tl.float32, bitcast=True))
    return x.to(dtype)


@triton.jit
def tanh(x):
    """tanh in float32 from one exp, without overflow: to rounding where |x| is not
    small; below, ``1 - e`` cancels (relative error about eps/|x|: 3e-5 at x = 1e-3)."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x >= 0, t, -t)


@triton.jit
def additive_logits(QA, s_qa_l, KA, s_ka_s, W, offs_m, offs_n, L, S, HID,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    """(BLOCK_M, BLOCK_N) float32 ``sum_h w[h] tanh(qa[i, h] + ka[j, h])``, over the hidden
    dim in steps of BLOCK_H held in registers. QA/KA point at this row's (L, HID) and
    (S, HID) matrices (unit stride along HID)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for h0 in range(0, HID, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        in_h = offs_h < HID
        qa = load_tile(QA, offs_m, s_qa_l, L, offs_h, HID).to(tl.float32)  # (BLOCK_M, BLOCK_H)
        ka = load_tile(KA, offs_n, s_ka_s, S, offs_h, HID).to(tl.float32)  # (BLOCK_N, BLOCK_H)
        w = tl.load(W + offs_h, mask=in_h, other=0.0).to(tl.float32)  # (BLOCK_H,)
        t = tanh(qa[:, None, :] + ka[None, :, :])  # (BLOCK_M, BLOCK_N, BLOCK_H)
        acc += tl.sum(t * w[None, None, :], axis=2)
    return acc


@triton.jit
def logits_tile(
    q, k, q_base, k_base, W, kb_base, BIAS, rec, KEEP,
    b, h, H, offs_m, offs_n, L, S, E, s_q_l, s_k_s, qk_scale,
    LO0, HI0, LO1, HI1, state,
    OPS: tl.constexpr, MB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """Base-2 logits (BLOCK_M, BLOCK_N) float32 of one tile, -inf where masked.

    q (BLOCK_M, E_P2) and k (BLOCK_N, E_P2): the dot-form tiles (the Additive score
    reads its projections from q_base/k_base instead). kb_base: this row's key bias;
    rec: the mask record of this row's batch element (:func:`.kmask.record`).
    ``state`` is the tile's :func:`.kmask.tile_state`: a FULL tile skips the mask test.
    A -inf bias blocks its pair whatever the score holds there (NaN included)."""
    if (ADDITIVE & OPS) != 0:
        s = (
            additive_logits(
                q_base, s_q_l, k_base, s_k_s, W, offs_m, offs_n, L, S, E, BLOCK_M, BLOCK_N, BLOCK_H
            )
            * qk_scale
        )
    else:
        s = mm(q, tl.trans(k), OPS) * qk_scale
    if (HAS_KB & OPS) != 0:
        kb = tl.load(kb_base + offs_n, mask=offs_n < S, other=0.0)
        s += kb.to(tl.float32)[None, :] * LOG2E
    if (_HAS_BIAS & MB) != 0:
        t = dense_bias(BIAS, MB, b, h, H, offs_m, offs_n, L, S)
        # (a finite bias below -FLT_MAX / LOG2E would turn -inf in log2 units, and its row
        # read as masked: it is held at BIAS_FLOOR, a uniform row as on the other backends)
        t = tl.where(t == float("-inf"), t, tl.maximum(t, BIAS_FLOOR))
        s = tl.where(t == float("-inf"), float("-inf"), s + t * LOG2E)
    if state != FULL:
        keep = tile_keep(rec, KEEP, MB, b, h, H, offs_m, offs_n, L, S, LO0, HI0, LO1, HI1)
        s = tl.where(keep, s, float("-inf"))
    return s
