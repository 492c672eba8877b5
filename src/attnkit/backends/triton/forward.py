"""The forward kernel: one program per (query block, row), online softmax over the key
blocks the mask leaves, output in the input dtype and lse in float32.

Grid: (cdiv(L, BLOCK_M), B * H). Query head h reads key/value head h // GROUPS.
A row whose keys are all masked gets output 0 and lse -inf. Non-finite value rows
arrive zeroed, flagged in VBAD (B, Hk, S): a row that keeps such a key gets NaN.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import LN2, LOG2E, add_bias, additive_logits, key_bounds, mm, tile_keep


@triton.jit
def attention_forward_kernel(
    Q,
    K,
    V,
    KB,
    W,
    OUT,
    LSE,
    s_q_b,
    s_q_h,
    s_q_l,
    s_q_e,
    s_k_b,
    s_k_h,
    s_k_s,
    s_k_e,
    s_v_b,
    s_v_h,
    s_v_s,
    s_v_e,
    s_kb_b,
    s_kb_h,
    s_kb_s,
    s_o_b,
    s_o_h,
    s_o_l,
    s_o_e,
    H,
    L,
    S,
    E,
    EV,
    GROUPS,
    scale,
    LO,
    HI,
    R,
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
    BIAS,
    s_bias_b,
    s_bias_h,
    s_bias_l,
    s_bias_s,
    VBAD,
    s_vb_b,
    s_vb_h,
    s_vb_s,
    ADDITIVE: tl.constexpr,
    HAS_KB: tl.constexpr,
    HAS_LO: tl.constexpr,
    HAS_HI: tl.constexpr,
    HAS_KLEN: tl.constexpr,
    HAS_QLEN: tl.constexpr,
    HAS_RLEN: tl.constexpr,
    HAS_KKEEP: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_VBAD: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    E_P2: tl.constexpr,
    EV_P2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid_m = tl.program_id(0)
    row = tl.program_id(1)
    b = row // H
    h = row % H
    hk = h // GROUPS
    b0 = row // R
    i0 = pid_m * BLOCK_M
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_e = tl.arange(0, E_P2)
    offs_v = tl.arange(0, EV_P2)
    q_base = Q + b.to(tl.int64) * s_q_b + h.to(tl.int64) * s_q_h
    k_base = K + b.to(tl.int64) * s_k_b + hk.to(tl.int64) * s_k_h
    v_base = V + b.to(tl.int64) * s_v_b + hk.to(tl.int64) * s_v_h
    kb_base = KB + b.to(tl.int64) * s_kb_b + hk.to(tl.int64) * s_kb_h
    qk_scale = scale * LOG2E

    if not ADDITIVE:
        q = tl.load(
            q_base + offs_m[:, None] * s_q_l + offs_e[None, :] * s_q_e,
            mask=(offs_m[:, None] < L) & (offs_e[None, :] < E),
            other=0.0,
        )  # (BLOCK_M, E_P2)

    vb_base = VBAD + b.to(tl.int64) * s_vb_b + hk.to(tl.int64) * s_vb_h
    bad_rows = tl.zeros((BLOCK_M,), dtype=tl.int32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, EV_P2), dtype=tl.float32)
    start, end = key_bounds(
        i0, L, S, b0, LO, HI, KLEN, QLEN, RLEN, s_rlen_b,
        HAS_LO, HAS_HI, HAS_KLEN, HAS_QLEN, HAS_RLEN, BLOCK_M, BLOCK_N,
    )  # fmt: skip
    for j0 in range(start, end, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        if ADDITIVE:
            s = additive_logits(
                q_base, s_q_l, s_q_e, k_base, s_k_s, s_k_e, W, offs_m, offs_n, L, S, E,
                BLOCK_M, BLOCK_N, BLOCK_H,
            ) * qk_scale  # fmt: skip
        else:
            k = tl.load(
                k_base + offs_n[:, None] * s_k_s + offs_e[None, :] * s_k_e,
                mask=(offs_n[:, None] < S) & (offs_e[None, :] < E),
                other=0.0,
            )  # (BLOCK_N, E_P2)
            s = mm(q, tl.trans(k), PRECISION, UPCAST) * qk_scale
        if HAS_KB:
            kb = tl.load(kb_base + offs_n * s_kb_s, mask=offs_n < S, other=0.0)
            s += kb.to(tl.float32)[None, :] * LOG2E
        if HAS_BIAS:
            s = add_bias(
                s, offs_m, offs_n, L, S, b, h, BIAS, s_bias_b, s_bias_h, s_bias_l, s_bias_s
            )
        keep = tile_keep(
            offs_m, offs_n, L, S, b, h, b0, LO, HI, KLEN, QLEN, RLEN, s_rlen_b, KKEEP, s_kkeep_b,
            KEEP, s_keep_b, s_keep_h, s_keep_l, s_keep_s,
            HAS_LO, HAS_HI, HAS_KLEN, HAS_QLEN, HAS_RLEN, HAS_KKEEP, HAS_KEEP,
        )  # fmt: skip
        s = tl.where(keep, s, float("-inf"))
        if HAS_VBAD:  # a kept key whose value row was not finite (zeroed by the host)
            vb = tl.load(vb_base + offs_n * s_vb_s, mask=offs_n < S, other=0.0)
            if tl.max(vb, axis=0) > 0:  # only tiles holding one pay for the (M, N) test
                used = s > float("-inf")  # kept, and not blocked by a -inf bias
                hit = tl.max(tl.where(used & (vb[None, :] > 0), 1, 0), axis=1)
                bad_rows = tl.maximum(bad_rows, hit)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - shift)
        p = tl.exp2(s - shift[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_base + offs_n[:, None] * s_v_s + offs_v[None, :] * s_v_e,
            mask=(offs_n[:, None] < S) & (offs_v[None, :] < EV),
            other=0.0,
        )  # (BLOCK_N, EV_P2)
        acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, PRECISION, UPCAST)
        m_i = m_new

    dead = l_i == 0.0
    denom = tl.where(dead, 1.0, l_i)
    shift = tl.where(m_i == float("-inf"), 0.0, m_i)
    out = acc / denom[:, None]
    if HAS_VBAD:  # a used value that is not finite propagates
        out = tl.where(bad_rows[:, None] > 0, float("nan"), out)
    lse = tl.where(dead, float("-inf"), (shift + tl.log2(denom)) * LN2)
    o_base = OUT + b.to(tl.int64) * s_o_b + h.to(tl.int64) * s_o_h
    tl.store(
        o_base + offs_m[:, None] * s_o_l + offs_v[None, :] * s_o_e,
        out.to(OUT.dtype.element_ty),
        mask=(offs_m[:, None] < L) & (offs_v[None, :] < EV),
    )
    tl.store(LSE + row.to(tl.int64) * L + offs_m, lse, mask=offs_m < L)
