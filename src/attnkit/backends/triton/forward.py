"""The forward kernel: one program per (query block, row), online softmax over the key
blocks the mask leaves, output in the input dtype and lse in float32.

Grid: (cdiv(L, BLOCK_M), B * H). Query head h reads key/value head h // GROUPS.
A row whose keys are all masked gets output 0 and lse -inf. Non-finite value rows
arrive zeroed, flagged in VBAD (B, Hk, S): a row that keeps such a key gets NaN.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kmask import SPARSE_FIELDS, key_range, tile_state
from .logits import (
    HAS_VBAD,
    LN2,
    LOG2E,
    load_tile,
    logits_tile,
    mm_narrow,
    narrow,
    operand_tile,
    program_row,
)


@triton.jit
def _step(
    q, acc, m_i, l_i, bad_rows, j0, state, k_base, v_base, kb_base, vb_base,
    q_base, W, BIAS, rec, KEEP, b, h, H, offs_m, offs_e, offs_v,
    L, S, E, EV, s_q_l, s_k_s, s_v_s, qk_scale, LO0, HI0, LO1, HI1,
    OPS: tl.constexpr, MB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr, E_P2: tl.constexpr,
):  # fmt: skip
    """One key tile of the online softmax: the updated (acc, m_i, l_i, bad_rows)."""
    offs_n = j0 + tl.arange(0, BLOCK_N)
    in_n = offs_n < S
    k = operand_tile(k_base, offs_n, s_k_s, S, offs_e, E, OPS, BLOCK_N, E_P2)  # (BLOCK_N, E_P2)
    s = logits_tile(
        q, k, q_base, k_base, W, kb_base, BIAS, rec, KEEP, b, h, H, offs_m, offs_n,
        L, S, E, s_q_l, s_k_s, qk_scale, LO0, HI0, LO1, HI1, state,
        OPS, MB, BLOCK_M, BLOCK_N, BLOCK_H,
    )  # fmt: skip
    if (HAS_VBAD & OPS) != 0:  # a kept key whose value row was not finite (zeroed)
        vb = tl.load(vb_base + offs_n, mask=in_n, other=0).to(tl.float32)
        if tl.max(vb, axis=0) > 0:  # only tiles holding one pay for the (M, N) test
            used = s > float("-inf")  # kept, and not blocked by a -inf bias
            hit = tl.max(tl.where(used & (vb[None, :] > 0), 1, 0), axis=1)
            bad_rows = tl.maximum(bad_rows, hit)
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - shift)
    p = tl.exp2(s - shift[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = load_tile(v_base, offs_n, s_v_s, S, offs_v, EV)  # (BLOCK_N, EV_P2)
    acc = acc * alpha[:, None] + mm_narrow(p, v, OPS)
    return acc, m_new, l_i, bad_rows


@triton.jit
def attention_forward_kernel(
    Q, K, V, KB, W, VBAD, MASK, KEEP, BIAS, OUT, LSE,
    s_q_b, s_q_h, s_q_l, s_k_b, s_k_h, s_k_s, s_v_b, s_v_h, s_v_s,
    H, L, S, E, EV, GROUPS, R, scale, LO0, HI0, LO1, HI1,
    OPS: tl.constexpr, MB: tl.constexpr, E_P2: tl.constexpr, EV_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    row = tl.program_id(1)
    b, h, rec, q_base, k_base, v_base, kv_rows = program_row(
        row, Q, K, V, MASK, H, GROUPS, R, L, S, s_q_b, s_q_h, s_k_b, s_k_h, s_v_b, s_v_h, MB
    )  # fmt: skip
    kb_base = KB + kv_rows
    vb_base = VBAD + kv_rows
    i0 = pid_m * BLOCK_M
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_e = tl.arange(0, E_P2)
    offs_v = tl.arange(0, EV_P2)
    qk_scale = scale * LOG2E
    SKIP_EMPTY: tl.constexpr = (SPARSE_FIELDS & MB) != 0

    q = operand_tile(q_base, offs_m, s_q_l, L, offs_e, E, OPS, BLOCK_M, E_P2)  # (BLOCK_M, E_P2)
    bad_rows = tl.zeros((BLOCK_M,), dtype=tl.int32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, EV_P2), dtype=tl.float32)
    start, end = key_range(rec, MB, i0, L, S, LO0, HI0, LO1, HI1, BLOCK_M, BLOCK_N)
    for j0 in range(start, end, BLOCK_N):
        state = tile_state(rec, MB, i0, j0, L, S, LO0, HI0, LO1, HI1, BLOCK_M, BLOCK_N)
        if SKIP_EMPTY:  # masks that leave empty tiles inside the range: skip those
            if state != 0:
                acc, m_i, l_i, bad_rows = _step(
                    q, acc, m_i, l_i, bad_rows, j0, state, k_base, v_base, kb_base, vb_base,
                    q_base, W, BIAS, rec, KEEP, b, h, H, offs_m, offs_e, offs_v,
                    L, S, E, EV, s_q_l, s_k_s, s_v_s, qk_scale, LO0, HI0, LO1, HI1,
                    OPS, MB, BLOCK_M, BLOCK_N, BLOCK_H, E_P2,
                )  # fmt: skip
        else:  # bands and lengths: the range is exact, the loads stay unconditional
            acc, m_i, l_i, bad_rows = _step(
                q, acc, m_i, l_i, bad_rows, j0, state, k_base, v_base, kb_base, vb_base,
                q_base, W, BIAS, rec, KEEP, b, h, H, offs_m, offs_e, offs_v,
                L, S, E, EV, s_q_l, s_k_s, s_v_s, qk_scale, LO0, HI0, LO1, HI1,
                OPS, MB, BLOCK_M, BLOCK_N, BLOCK_H, E_P2,
            )  # fmt: skip

    dead = l_i == 0.0
    denom = tl.where(dead, 1.0, l_i)
    shift = tl.where(m_i == float("-inf"), 0.0, m_i)
    out = acc / denom[:, None]
    if (HAS_VBAD & OPS) != 0:  # a used value that is not finite propagates
        out = tl.where(bad_rows[:, None] > 0, float("nan"), out)
    lse = tl.where(dead, float("-inf"), (shift + tl.log2(denom)) * LN2)
    o_base = OUT + row.to(tl.int64) * L * EV
    tl.store(
        o_base + offs_m[:, None] * EV + offs_v[None, :],
        narrow(out, OUT.dtype.element_ty, OPS),
        mask=(offs_m[:, None] < L) & (offs_v[None, :] < EV),
    )
    tl.store(LSE + row.to(tl.int64) * L + offs_m, lse, mask=offs_m < L)
