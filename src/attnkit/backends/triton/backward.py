"""The backward kernels: probabilities recomputed from the lse, FlashAttention-2 style.

With p = exp(s - lse) and delta = rowsum(dO * O) - dlse (+ rowsum(dW * W) when the
weights were returned and receive a gradient), the gradient of a logit is
``ds = p * (dO @ V^T + dW - delta)``.

- :func:`attention_backward_dkdv_kernel`, grid (cdiv(S, BLOCK_N), B * H): one key
  block per program, looping over the query blocks that can see it; writes dK, dV,
  the key bias' gradient and, for the Additive score, d(ka) and its share of d(w_v).
- :func:`attention_backward_dq_kernel`, grid (cdiv(L, BLOCK_M), B * H): one query
  block per program, looping over its key blocks; writes dQ (or d(qa)).

Gradients are written per query head in float32 (B, H, ...); the host sums query
heads that share a key/value head and broadcast dims.

For the Additive score, d(qa)/d(ka) accumulate in float32 global memory one hidden
step at a time (each program owns its rows, so no two programs write one place).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import LOG2E, add_bias, additive_logits, key_bounds, mm, query_bounds, tanh, tile_keep


@triton.jit
def _probabilities(
    q,
    k,
    QA_base,
    KA_base,
    W,
    KB_base,
    s_q_l,
    s_q_e,
    s_k_s,
    s_k_e,
    s_kb_s,
    offs_m,
    offs_n,
    lse,
    L,
    S,
    E,
    b,
    h,
    b0,
    qk_scale,
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
    BIAS,
    s_bias_b,
    s_bias_h,
    s_bias_l,
    s_bias_s,
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """p = exp(s - lse) of one (BLOCK_M, BLOCK_N) tile, 0 where masked (float32).

    q (BLOCK_M, E_P2) and k (BLOCK_N, E_P2) are the dot-form tiles (unused by the
    Additive score, which reads its projections from QA_base/KA_base)."""
    if ADDITIVE:
        s = additive_logits(
            QA_base, s_q_l, s_q_e, KA_base, s_k_s, s_k_e, W, offs_m, offs_n, L, S, E,
            BLOCK_M, BLOCK_N, BLOCK_H,
        ) * qk_scale  # fmt: skip
    else:
        s = mm(q, tl.trans(k), PRECISION, UPCAST) * qk_scale
    if HAS_KB:
        kb = tl.load(KB_base + offs_n * s_kb_s, mask=offs_n < S, other=0.0)
        s += kb.to(tl.float32)[None, :] * LOG2E
    if HAS_BIAS:
        s = add_bias(s, offs_m, offs_n, L, S, b, h, BIAS, s_bias_b, s_bias_h, s_bias_l, s_bias_s)
    keep = tile_keep(
        offs_m, offs_n, L, S, b, h, b0, LO, HI, KLEN, QLEN, RLEN, s_rlen_b, KKEEP, s_kkeep_b,
        KEEP, s_keep_b, s_keep_h, s_keep_l, s_keep_s,
        HAS_LO, HAS_HI, HAS_KLEN, HAS_QLEN, HAS_RLEN, HAS_KKEEP, HAS_KEEP,
    )  # fmt: skip
    shift = tl.where(lse == float("-inf"), 0.0, lse * LOG2E)
    p = tl.exp2(s - shift[:, None])
    return tl.where(keep, p, 0.0)


@triton.jit
def attention_backward_dkdv_kernel(
    Q,
    K,
    V,
    KB,
    W,
    DO,
    LSE,
    DELTA,
    DW_OUT,
    DK,
    DV,
    DKB,
    DWV,
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
    s_do_b,
    s_do_h,
    s_do_l,
    s_do_e,
    s_dw_b,
    s_dw_h,
    s_dw_l,
    s_dw_s,
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
    ADDITIVE: tl.constexpr,
    HAS_KB: tl.constexpr,
    HAS_DW: tl.constexpr,
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
    EV_P2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    b = row // H
    h = row % H
    hk = h // GROUPS
    b0 = row // R
    j0 = pid_n * BLOCK_N
    offs_n = j0 + tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, E_P2)
    offs_v = tl.arange(0, EV_P2)
    q_base = Q + b.to(tl.int64) * s_q_b + h.to(tl.int64) * s_q_h
    k_base = K + b.to(tl.int64) * s_k_b + hk.to(tl.int64) * s_k_h
    v_base = V + b.to(tl.int64) * s_v_b + hk.to(tl.int64) * s_v_h
    kb_base = KB + b.to(tl.int64) * s_kb_b + hk.to(tl.int64) * s_kb_h
    do_base = DO + b.to(tl.int64) * s_do_b + h.to(tl.int64) * s_do_h
    dw_base = DW_OUT + b.to(tl.int64) * s_dw_b + h.to(tl.int64) * s_dw_h
    qk_scale = scale * LOG2E
    in_n = offs_n < S

    if ADDITIVE:
        k = tl.zeros((BLOCK_N, E_P2), dtype=tl.float32)  # unused: the logits read ka
    else:
        k = tl.load(
            k_base + offs_n[:, None] * s_k_s + offs_e[None, :] * s_k_e,
            mask=in_n[:, None] & (offs_e[None, :] < E),
            other=0.0,
        )  # (BLOCK_N, E_P2)
    v = tl.load(
        v_base + offs_n[:, None] * s_v_s + offs_v[None, :] * s_v_e,
        mask=in_n[:, None] & (offs_v[None, :] < EV),
        other=0.0,
    )  # (BLOCK_N, EV_P2)
    dk = tl.zeros((BLOCK_N, E_P2), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, EV_P2), dtype=tl.float32)
    dkb = tl.zeros((BLOCK_N,), dtype=tl.float32)
    start, end = query_bounds(
        j0, L, S, b0, LO, HI, KLEN, QLEN, HAS_LO, HAS_HI, HAS_KLEN, HAS_QLEN, BLOCK_M, BLOCK_N
    )
    for i0 in range(start, end, BLOCK_M):
        offs_m = i0 + tl.arange(0, BLOCK_M)
        in_m = offs_m < L
        q = tl.load(
            q_base + offs_m[:, None] * s_q_l + offs_e[None, :] * s_q_e,
            mask=in_m[:, None] & (offs_e[None, :] < E),
            other=0.0,
        )  # (BLOCK_M, E_P2); unused by the Additive score
        do = tl.load(
            do_base + offs_m[:, None] * s_do_l + offs_v[None, :] * s_do_e,
            mask=in_m[:, None] & (offs_v[None, :] < EV),
            other=0.0,
        )  # (BLOCK_M, EV_P2)
        lse = tl.load(LSE + row.to(tl.int64) * L + offs_m, mask=in_m, other=float("-inf"))
        delta = tl.load(DELTA + row.to(tl.int64) * L + offs_m, mask=in_m, other=0.0)
        p = _probabilities(
            q, k, q_base, k_base, W, kb_base, s_q_l, s_q_e, s_k_s, s_k_e, s_kb_s,
            offs_m, offs_n, lse, L, S, E, b, h, b0, qk_scale,
            LO, HI, KLEN, QLEN, RLEN, s_rlen_b, KKEEP, s_kkeep_b,
            KEEP, s_keep_b, s_keep_h, s_keep_l, s_keep_s,
            BIAS, s_bias_b, s_bias_h, s_bias_l, s_bias_s,
            ADDITIVE, HAS_KB, HAS_LO, HAS_HI, HAS_KLEN, HAS_QLEN, HAS_RLEN, HAS_KKEEP,
            HAS_KEEP, HAS_BIAS, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_H,
        )  # fmt: skip
        dv += mm(tl.trans(p).to(do.dtype), do, PRECISION, UPCAST)
        dp = mm(do, tl.trans(v), PRECISION, UPCAST)  # (BLOCK_M, BLOCK_N)
        if HAS_DW:
            dp += tl.load(
                dw_base + offs_m[:, None] * s_dw_l + offs_n[None, :] * s_dw_s,
                mask=in_m[:, None] & in_n[None, :],
                other=0.0,
            ).to(tl.float32)
        ds = p * (dp - delta[:, None])  # gradient of the natural-unit logits
        if HAS_KB:
            dkb += tl.sum(ds, axis=0)
        if ADDITIVE:
            g = ds * scale
            for h0 in range(0, E, BLOCK_H):
                offs_h = h0 + tl.arange(0, BLOCK_H)
                in_h = offs_h < E
                qa = tl.load(
                    q_base + offs_m[:, None] * s_q_l + offs_h[None, :] * s_q_e,
                    mask=in_m[:, None] & in_h[None, :],
                    other=0.0,
                ).to(tl.float32)  # (BLOCK_M, BLOCK_H)
                ka = tl.load(
                    k_base + offs_n[:, None] * s_k_s + offs_h[None, :] * s_k_e,
                    mask=in_n[:, None] & in_h[None, :],
                    other=0.0,
                ).to(tl.float32)  # (BLOCK_N, BLOCK_H)
                w = tl.load(W + offs_h, mask=in_h, other=0.0).to(tl.float32)
                t = tanh(qa[:, None, :] + ka[None, :, :])  # (BLOCK_M, BLOCK_N, BLOCK_H)
                gt = g[:, :, None] * t
                d_ka = tl.sum(g[:, :, None] * (1.0 - t * t), axis=0) * w[None, :]
                dk_ptr = DK + row.to(tl.int64) * S * E + offs_n[:, None] * E + offs_h[None, :]
                dk_mask = in_n[:, None] & in_h[None, :]
                tl.store(dk_ptr, tl.load(dk_ptr, mask=dk_mask, other=0.0) + d_ka, mask=dk_mask)
                dwv_ptr = DWV + (row.to(tl.int64) * tl.num_programs(0) + pid_n) * E + offs_h
                d_w = tl.sum(tl.sum(gt, axis=0), axis=0)
                tl.store(dwv_ptr, tl.load(dwv_ptr, mask=in_h, other=0.0) + d_w, mask=in_h)
                tl.debug_barrier()
        else:
            dk += mm(tl.trans((ds * scale).to(q.dtype)), q, PRECISION, UPCAST)

    dk_mask = in_n[:, None] & (offs_e[None, :] < E)
    if not ADDITIVE:
        tl.store(
            DK + row.to(tl.int64) * S * E + offs_n[:, None] * E + offs_e[None, :], dk, mask=dk_mask
        )
    dv_ptr = DV + row.to(tl.int64) * S * EV + offs_n[:, None] * EV + offs_v[None, :]
    tl.store(dv_ptr, dv, mask=in_n[:, None] & (offs_v[None, :] < EV))
    if HAS_KB:
        tl.store(DKB + row.to(tl.int64) * S + offs_n, dkb, mask=in_n)


@triton.jit
def attention_backward_dq_kernel(
    Q,
    K,
    V,
    KB,
    W,
    DO,
    LSE,
    DELTA,
    DW_OUT,
    DQ,
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
    s_do_b,
    s_do_h,
    s_do_l,
    s_do_e,
    s_dw_b,
    s_dw_h,
    s_dw_l,
    s_dw_s,
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
    ADDITIVE: tl.constexpr,
    HAS_KB: tl.constexpr,
    HAS_DW: tl.constexpr,
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
    in_m = offs_m < L
    q_base = Q + b.to(tl.int64) * s_q_b + h.to(tl.int64) * s_q_h
    k_base = K + b.to(tl.int64) * s_k_b + hk.to(tl.int64) * s_k_h
    v_base = V + b.to(tl.int64) * s_v_b + hk.to(tl.int64) * s_v_h
    kb_base = KB + b.to(tl.int64) * s_kb_b + hk.to(tl.int64) * s_kb_h
    do_base = DO + b.to(tl.int64) * s_do_b + h.to(tl.int64) * s_do_h
    dw_base = DW_OUT + b.to(tl.int64) * s_dw_b + h.to(tl.int64) * s_dw_h
    qk_scale = scale * LOG2E

    q = tl.load(
        q_base + offs_m[:, None] * s_q_l + offs_e[None, :] * s_q_e,
        mask=in_m[:, None] & (offs_e[None, :] < E),
        other=0.0,
    )  # (BLOCK_M, E_P2); unused by the Additive score
    do = tl.load(
        do_base + offs_m[:, None] * s_do_l + offs_v[None, :] * s_do_e,
        mask=in_m[:, None] & (offs_v[None, :] < EV),
        other=0.0,
    )  # (BLOCK_M, EV_P2)
    lse = tl.load(LSE + row.to(tl.int64) * L + offs_m, mask=in_m, other=float("-inf"))
    delta = tl.load(DELTA + row.to(tl.int64) * L + offs_m, mask=in_m, other=0.0)
    dq = tl.zeros((BLOCK_M, E_P2), dtype=tl.float32)
    start, end = key_bounds(
        i0, L, S, b0, LO, HI, KLEN, QLEN, RLEN, s_rlen_b,
        HAS_LO, HAS_HI, HAS_KLEN, HAS_QLEN, HAS_RLEN, BLOCK_M, BLOCK_N,
    )  # fmt: skip
    for j0 in range(start, end, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        in_n = offs_n < S
        if ADDITIVE:
            k = tl.zeros((BLOCK_N, E_P2), dtype=tl.float32)  # unused: the logits read ka
        else:
            k = tl.load(
                k_base + offs_n[:, None] * s_k_s + offs_e[None, :] * s_k_e,
                mask=in_n[:, None] & (offs_e[None, :] < E),
                other=0.0,
            )  # (BLOCK_N, E_P2)
        p = _probabilities(
            q, k, q_base, k_base, W, kb_base, s_q_l, s_q_e, s_k_s, s_k_e, s_kb_s,
            offs_m, offs_n, lse, L, S, E, b, h, b0, qk_scale,
            LO, HI, KLEN, QLEN, RLEN, s_rlen_b, KKEEP, s_kkeep_b,
            KEEP, s_keep_b, s_keep_h, s_keep_l, s_keep_s,
            BIAS, s_bias_b, s_bias_h, s_bias_l, s_bias_s,
            ADDITIVE, HAS_KB, HAS_LO, HAS_HI, HAS_KLEN, HAS_QLEN, HAS_RLEN, HAS_KKEEP,
            HAS_KEEP, HAS_BIAS, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_H,
        )  # fmt: skip
        v = tl.load(
            v_base + offs_n[:, None] * s_v_s + offs_v[None, :] * s_v_e,
            mask=in_n[:, None] & (offs_v[None, :] < EV),
            other=0.0,
        )  # (BLOCK_N, EV_P2)
        dp = mm(do, tl.trans(v), PRECISION, UPCAST)  # (BLOCK_M, BLOCK_N)
        if HAS_DW:
            dp += tl.load(
                dw_base + offs_m[:, None] * s_dw_l + offs_n[None, :] * s_dw_s,
                mask=in_m[:, None] & in_n[None, :],
                other=0.0,
            ).to(tl.float32)
        ds = p * (dp - delta[:, None])
        if ADDITIVE:
            g = ds * scale
            for h0 in range(0, E, BLOCK_H):
                offs_h = h0 + tl.arange(0, BLOCK_H)
                in_h = offs_h < E
                qa = tl.load(
                    q_base + offs_m[:, None] * s_q_l + offs_h[None, :] * s_q_e,
                    mask=in_m[:, None] & in_h[None, :],
                    other=0.0,
                ).to(tl.float32)  # (BLOCK_M, BLOCK_H)
                ka = tl.load(
                    k_base + offs_n[:, None] * s_k_s + offs_h[None, :] * s_k_e,
                    mask=in_n[:, None] & in_h[None, :],
                    other=0.0,
                ).to(tl.float32)  # (BLOCK_N, BLOCK_H)
                w = tl.load(W + offs_h, mask=in_h, other=0.0).to(tl.float32)
                t = tanh(qa[:, None, :] + ka[None, :, :])  # (BLOCK_M, BLOCK_N, BLOCK_H)
                d_qa = tl.sum(g[:, :, None] * (1.0 - t * t), axis=1) * w[None, :]
                dq_ptr = DQ + row.to(tl.int64) * L * E + offs_m[:, None] * E + offs_h[None, :]
                dq_mask = in_m[:, None] & in_h[None, :]
                tl.store(dq_ptr, tl.load(dq_ptr, mask=dq_mask, other=0.0) + d_qa, mask=dq_mask)
                tl.debug_barrier()
        else:
            dq += mm((ds * scale).to(k.dtype), k, PRECISION, UPCAST)

    if not ADDITIVE:
        dq_ptr = DQ + row.to(tl.int64) * L * E + offs_m[:, None] * E + offs_e[None, :]
        tl.store(dq_ptr, dq, mask=in_m[:, None] & (offs_e[None, :] < E))
