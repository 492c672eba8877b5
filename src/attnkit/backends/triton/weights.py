"""The weights kernel: exact weights exp(s - lse) written tile by tile.

Grid: (cdiv(L, BLOCK_M), cdiv(S, BLOCK_N), B * H) for per-head weights, or
(cdiv(L, BLOCK_M), cdiv(S, BLOCK_N), B) with ``MEAN``: the program loops over the H
heads of its tile and writes their average once, so per-head weights are never
held. Every tile is written (zeros where the mask leaves nothing), so the output
needs no separate clearing pass.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import LOG2E, add_bias, additive_logits, key_bounds, mm, tile_keep


@triton.jit
def attention_weights_kernel(
    Q,
    K,
    KB,
    W,
    LSE,
    OUT,
    s_q_b,
    s_q_h,
    s_q_l,
    s_q_e,
    s_k_b,
    s_k_h,
    s_k_s,
    s_k_e,
    s_kb_b,
    s_kb_h,
    s_kb_s,
    H,
    L,
    S,
    E,
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
    MEAN: tl.constexpr,
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
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    E_P2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_z = tl.program_id(2)
    i0 = pid_m * BLOCK_M
    j0 = pid_n * BLOCK_N
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_n = j0 + tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, E_P2)
    if MEAN:
        b = pid_z
        h_first = pid_z * 0
        n_heads = H
    else:
        b = pid_z // H
        h_first = pid_z % H
        n_heads = 1
    qk_scale = scale * LOG2E
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for h_step in range(0, n_heads):
        h = h_first + h_step  # a tensor in compiled code and in the interpreter alike
        row = b * H + h
        hk = h // GROUPS
        b0 = row // R
        start, end = key_bounds(
            i0, L, S, b0, LO, HI, KLEN, QLEN, RLEN, s_rlen_b,
            HAS_LO, HAS_HI, HAS_KLEN, HAS_QLEN, HAS_RLEN, BLOCK_M, BLOCK_N,
        )  # fmt: skip
        if (j0 < end) & (j0 + BLOCK_N > start):  # else the tile is empty for this head
            q_base = Q + b.to(tl.int64) * s_q_b + h.to(tl.int64) * s_q_h
            k_base = K + b.to(tl.int64) * s_k_b + hk.to(tl.int64) * s_k_h
            if ADDITIVE:
                s = additive_logits(
                    q_base, s_q_l, s_q_e, k_base, s_k_s, s_k_e, W, offs_m, offs_n, L, S, E,
                    BLOCK_M, BLOCK_N, BLOCK_H,
                ) * qk_scale  # fmt: skip
            else:
                q = tl.load(
                    q_base + offs_m[:, None] * s_q_l + offs_e[None, :] * s_q_e,
                    mask=(offs_m[:, None] < L) & (offs_e[None, :] < E),
                    other=0.0,
                )  # (BLOCK_M, E_P2)
                k = tl.load(
                    k_base + offs_n[:, None] * s_k_s + offs_e[None, :] * s_k_e,
                    mask=(offs_n[:, None] < S) & (offs_e[None, :] < E),
                    other=0.0,
                )  # (BLOCK_N, E_P2)
                s = mm(q, tl.trans(k), PRECISION, UPCAST) * qk_scale
            if HAS_KB:
                kb_base = KB + b.to(tl.int64) * s_kb_b + hk.to(tl.int64) * s_kb_h
                kb = tl.load(kb_base + offs_n * s_kb_s, mask=offs_n < S, other=0.0)
                s += kb.to(tl.float32)[None, :] * LOG2E
            if HAS_BIAS:
                s = add_bias(
                    s, offs_m, offs_n, L, S, b, h, BIAS, s_bias_b, s_bias_h, s_bias_l, s_bias_s
                )
            keep = tile_keep(
                offs_m, offs_n, L, S, b, h, b0, LO, HI, KLEN, QLEN, RLEN, s_rlen_b, KKEEP,
                s_kkeep_b, KEEP, s_keep_b, s_keep_h, s_keep_l, s_keep_s,
                HAS_LO, HAS_HI, HAS_KLEN, HAS_QLEN, HAS_RLEN, HAS_KKEEP, HAS_KEEP,
            )  # fmt: skip
            lse = tl.load(LSE + row.to(tl.int64) * L + offs_m, mask=offs_m < L, other=0.0)
            shift = tl.where(lse == float("-inf"), 0.0, lse * LOG2E)
            p = tl.exp2(s - shift[:, None])
            total += tl.where(keep, p, 0.0)
    if MEAN:
        total = total / H
    out_base = OUT + pid_z.to(tl.int64) * L * S
    tl.store(
        out_base + offs_m[:, None] * S + offs_n[None, :],
        total.to(OUT.dtype.element_ty),
        mask=(offs_m[:, None] < L) & (offs_n[None, :] < S),
    )
