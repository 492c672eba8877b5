"""The backward kernels: probabilities recomputed from the lse, FlashAttention-2 style.

With p = exp(s - lse) and delta = rowsum(dO * O) - dlse (computed by the host), the
gradient of a logit is ``ds = p * (dO @ V^T + dW - delta)``, dW the gradient of the
returned weights when there is one (``HAS_DW``); without a gradient of the output
(``HAS_DO`` off: only the weights get one) the dO terms are absent.

- :func:`attention_backward_dkdv_kernel`, grid (cdiv(S, BLOCK_N), B * H): one key
  block per program, looping over the query blocks that can see it; writes dK, dV,
  the key bias' gradient and, for the Additive score, d(ka) and its share of d(w_v).
- :func:`attention_backward_dq_kernel`, grid (cdiv(L, BLOCK_M), B * H): one query
  block per program, looping over its key blocks; writes dQ (or d(qa)).

Gradients are written per query head in float32 (B * H, ...); the host sums query
heads that share a key/value head. For the Additive score, d(qa)/d(ka) accumulate in
float32 global memory one hidden step at a time (each program owns its rows, so no
two programs write one place).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kmask import SPARSE_FIELDS, key_range, query_range, tile_state
from .logits import (
    ADDITIVE,
    HAS_DO,
    HAS_DW,
    HAS_KB,
    LOG2E,
    load_tile,
    logits_tile,
    mm,
    mm_narrow,
    operand_tile,
    program_row,
    tanh,
)


@triton.jit
def _ds(s, lse, delta, do, v, dw_base, offs_m, offs_n, L, S, OPS: tl.constexpr):
    """(p, ds) of one tile: probabilities from the lse and the natural-unit logits'
    gradient."""
    shift = tl.where(lse == float("-inf"), 0.0, lse * LOG2E)
    p = tl.exp2(s - shift[:, None])
    if (HAS_DO & OPS) != 0:
        dp = mm(do, tl.trans(v), OPS)  # (BLOCK_M, BLOCK_N)
    else:
        dp = tl.zeros_like(p)
    if (HAS_DW & OPS) != 0:
        dp += load_tile(dw_base, offs_m, S, L, offs_n, S).to(tl.float32)
    return p, p * (dp - delta[:, None])


@triton.jit
def _additive_grads(g, q_base, k_base, W, D_base, s_d, DWV_ptr, offs_m, offs_n, L, S, E,
                    s_q_l, s_k_s, FOR_KEYS: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    """Accumulate the Additive score's d(ka) (FOR_KEYS, plus d(w_v) into DWV_ptr) or
    d(qa) in global float32 memory, from g = ds * scale (BLOCK_M, BLOCK_N)."""
    in_m = offs_m < L
    in_n = offs_n < S
    for h0 in range(0, E, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        in_h = offs_h < E
        qa = load_tile(q_base, offs_m, s_q_l, L, offs_h, E).to(tl.float32)  # (BLOCK_M, BLOCK_H)
        ka = load_tile(k_base, offs_n, s_k_s, S, offs_h, E).to(tl.float32)  # (BLOCK_N, BLOCK_H)
        w = tl.load(W + offs_h, mask=in_h, other=0.0).to(tl.float32)
        t = tanh(qa[:, None, :] + ka[None, :, :])  # (BLOCK_M, BLOCK_N, BLOCK_H)
        dt = g[:, :, None] * (1.0 - t * t)
        if FOR_KEYS:
            d = tl.sum(dt, axis=0) * w[None, :]  # (BLOCK_N, BLOCK_H)
            ptr = D_base + offs_n[:, None] * s_d + offs_h[None, :]
            dmask = in_n[:, None] & in_h[None, :]
            d_w = tl.sum(tl.sum(g[:, :, None] * t, axis=0), axis=0)
            tl.store(DWV_ptr + offs_h, tl.load(DWV_ptr + offs_h, mask=in_h, other=0.0) + d_w,
                     mask=in_h)  # fmt: skip
        else:
            d = tl.sum(dt, axis=1) * w[None, :]  # (BLOCK_M, BLOCK_H)
            ptr = D_base + offs_m[:, None] * s_d + offs_h[None, :]
            dmask = in_m[:, None] & in_h[None, :]
        tl.store(ptr, tl.load(ptr, mask=dmask, other=0.0) + d, mask=dmask)
        tl.debug_barrier()


@triton.jit
def _dkdv_step(
    dk, dv, dkb, i0, state, k, v, q_base, k_base, do_base, dw_base, W, kb_base,
    BIAS, rec, KEEP, LSE_row, DELTA_row, DK_base, DWV_ptr, b, h, H, offs_n, offs_e,
    offs_v, L, S, E, EV, s_q_l, s_k_s, scale, qk_scale, LO0, HI0, LO1, HI1,
    OPS: tl.constexpr, MB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr, E_P2: tl.constexpr, EV_P2: tl.constexpr,
):  # fmt: skip
    offs_m = i0 + tl.arange(0, BLOCK_M)
    in_m = offs_m < L
    # (BLOCK_M, E_P2); unused by the Additive score
    q = load_tile(q_base, offs_m, s_q_l, L, offs_e, E)
    if (HAS_DO & OPS) != 0:
        do = load_tile(do_base, offs_m, EV, L, offs_v, EV)  # (BLOCK_M, EV_P2)
    else:
        do = tl.zeros((BLOCK_M, EV_P2), dtype=v.dtype)
    lse = tl.load(LSE_row + offs_m, mask=in_m, other=float("-inf"))
    delta = tl.load(DELTA_row + offs_m, mask=in_m, other=0.0)
    s = logits_tile(
        q, k, q_base, k_base, W, kb_base, BIAS, rec, KEEP, b, h, H, offs_m, offs_n,
        L, S, E, s_q_l, s_k_s, qk_scale, LO0, HI0, LO1, HI1, state,
        OPS, MB, BLOCK_M, BLOCK_N, BLOCK_H,
    )  # fmt: skip
    p, ds = _ds(s, lse, delta, do, v, dw_base, offs_m, offs_n, L, S, OPS)
    if (HAS_DO & OPS) != 0:
        dv += mm_narrow(tl.trans(p), do, OPS)
    if (HAS_KB & OPS) != 0:
        dkb += tl.sum(ds, axis=0)
    if (ADDITIVE & OPS) != 0:
        _additive_grads(ds * scale, q_base, k_base, W, DK_base, E, DWV_ptr, offs_m, offs_n,
                        L, S, E, s_q_l, s_k_s, True, BLOCK_H)  # fmt: skip
    else:
        dk += mm_narrow(tl.trans(ds * scale), q, OPS)
    return dk, dv, dkb


@triton.jit
def attention_backward_dkdv_kernel(
    Q, K, V, KB, W, MASK, KEEP, BIAS, DO, LSE, DELTA, DWG, DK, DV, DKB, DWV,
    s_q_b, s_q_h, s_q_l, s_k_b, s_k_h, s_k_s, s_v_b, s_v_h, s_v_s,
    H, L, S, E, EV, GROUPS, R, scale, LO0, HI0, LO1, HI1,
    OPS: tl.constexpr, MB: tl.constexpr, E_P2: tl.constexpr, EV_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    b, h, rec, q_base, k_base, v_base, kv_rows = program_row(
        row, Q, K, V, MASK, H, GROUPS, R, L, S, s_q_b, s_q_h, s_k_b, s_k_h, s_v_b, s_v_h, MB
    )  # fmt: skip
    kb_base = KB + kv_rows
    j0 = pid_n * BLOCK_N
    offs_n = j0 + tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, E_P2)
    offs_v = tl.arange(0, EV_P2)
    in_n = offs_n < S
    do_base = DO + row.to(tl.int64) * L * EV
    dw_base = DWG + row.to(tl.int64) * L * S
    DK_base = DK + row.to(tl.int64) * S * E
    DWV_ptr = DWV + (row.to(tl.int64) * tl.num_programs(0) + pid_n) * E
    qk_scale = scale * LOG2E
    SKIP_EMPTY: tl.constexpr = (SPARSE_FIELDS & MB) != 0

    k = operand_tile(k_base, offs_n, s_k_s, S, offs_e, E, OPS, BLOCK_N, E_P2)  # (BLOCK_N, E_P2)
    v = load_tile(v_base, offs_n, s_v_s, S, offs_v, EV)  # (BLOCK_N, EV_P2)
    dk = tl.zeros((BLOCK_N, E_P2), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, EV_P2), dtype=tl.float32)
    dkb = tl.zeros((BLOCK_N,), dtype=tl.float32)
    LSE_row = LSE + row.to(tl.int64) * L
    DELTA_row = DELTA + row.to(tl.int64) * L
    start, end = query_range(rec, MB, j0, L, S, LO0, HI0, LO1, HI1, BLOCK_M, BLOCK_N)
    for i0 in range(start, end, BLOCK_M):
        state = tile_state(rec, MB, i0, j0, L, S, LO0, HI0, LO1, HI1, BLOCK_M, BLOCK_N)
        if SKIP_EMPTY:
            if state != 0:
                dk, dv, dkb = _dkdv_step(
                    dk, dv, dkb, i0, state, k, v, q_base, k_base, do_base, dw_base, W,
                    kb_base, BIAS, rec, KEEP, LSE_row, DELTA_row, DK_base, DWV_ptr, b, h,
                    H, offs_n, offs_e, offs_v, L, S, E, EV, s_q_l, s_k_s, scale, qk_scale,
                    LO0, HI0, LO1, HI1, OPS, MB, BLOCK_M, BLOCK_N, BLOCK_H, E_P2, EV_P2,
                )  # fmt: skip
        else:
            dk, dv, dkb = _dkdv_step(
                dk, dv, dkb, i0, state, k, v, q_base, k_base, do_base, dw_base, W,
                kb_base, BIAS, rec, KEEP, LSE_row, DELTA_row, DK_base, DWV_ptr, b, h,
                H, offs_n, offs_e, offs_v, L, S, E, EV, s_q_l, s_k_s, scale, qk_scale,
                LO0, HI0, LO1, HI1, OPS, MB, BLOCK_M, BLOCK_N, BLOCK_H, E_P2, EV_P2,
            )  # fmt: skip

    if (ADDITIVE & OPS) == 0:
        tl.store(DK_base + offs_n[:, None] * E + offs_e[None, :], dk,
                 mask=in_n[:, None] & (offs_e[None, :] < E))  # fmt: skip
    dv_ptr = DV + row.to(tl.int64) * S * EV + offs_n[:, None] * EV + offs_v[None, :]
    tl.store(dv_ptr, dv, mask=in_n[:, None] & (offs_v[None, :] < EV))
    if (HAS_KB & OPS) != 0:
        tl.store(DKB + row.to(tl.int64) * S + offs_n, dkb, mask=in_n)


@triton.jit
def _dq_step(
    dq, j0, state, q, do, lse, delta, q_base, k_base, v_base, dw_base, W, kb_base,
    BIAS, rec, KEEP, DQ_base, b, h, H, offs_m, offs_e, offs_v, L, S, E, EV,
    s_q_l, s_k_s, s_v_s, scale, qk_scale, LO0, HI0, LO1, HI1,
    OPS: tl.constexpr, MB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr, E_P2: tl.constexpr, EV_P2: tl.constexpr,
):  # fmt: skip
    offs_n = j0 + tl.arange(0, BLOCK_N)
    k = operand_tile(k_base, offs_n, s_k_s, S, offs_e, E, OPS, BLOCK_N, E_P2)  # (BLOCK_N, E_P2)
    if (HAS_DO & OPS) != 0:
        v = load_tile(v_base, offs_n, s_v_s, S, offs_v, EV)  # (BLOCK_N, EV_P2)
    else:
        v = tl.zeros((BLOCK_N, EV_P2), dtype=do.dtype)  # unused
    s = logits_tile(
        q, k, q_base, k_base, W, kb_base, BIAS, rec, KEEP, b, h, H, offs_m, offs_n,
        L, S, E, s_q_l, s_k_s, qk_scale, LO0, HI0, LO1, HI1, state,
        OPS, MB, BLOCK_M, BLOCK_N, BLOCK_H,
    )  # fmt: skip
    _, ds = _ds(s, lse, delta, do, v, dw_base, offs_m, offs_n, L, S, OPS)
    if (ADDITIVE & OPS) != 0:
        _additive_grads(ds * scale, q_base, k_base, W, DQ_base, E, DQ_base, offs_m, offs_n,
                        L, S, E, s_q_l, s_k_s, False, BLOCK_H)  # fmt: skip
    else:
        dq += mm_narrow(ds * scale, k, OPS)
    return dq


@triton.jit
def attention_backward_dq_kernel(
    Q, K, V, KB, W, MASK, KEEP, BIAS, DO, LSE, DELTA, DWG, DQ,
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
    i0 = pid_m * BLOCK_M
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_e = tl.arange(0, E_P2)
    offs_v = tl.arange(0, EV_P2)
    in_m = offs_m < L
    dw_base = DWG + row.to(tl.int64) * L * S
    DQ_base = DQ + row.to(tl.int64) * L * E
    qk_scale = scale * LOG2E
    SKIP_EMPTY: tl.constexpr = (SPARSE_FIELDS & MB) != 0

    # (BLOCK_M, E_P2); unused by the Additive score
    q = load_tile(q_base, offs_m, s_q_l, L, offs_e, E)
    if (HAS_DO & OPS) != 0:
        do = load_tile(
            DO + row.to(tl.int64) * L * EV, offs_m, EV, L, offs_v, EV
        )  # (BLOCK_M, EV_P2)
    else:
        do = tl.zeros((BLOCK_M, EV_P2), dtype=DO.dtype.element_ty)  # unused
    lse = tl.load(LSE + row.to(tl.int64) * L + offs_m, mask=in_m, other=float("-inf"))
    delta = tl.load(DELTA + row.to(tl.int64) * L + offs_m, mask=in_m, other=0.0)
    dq = tl.zeros((BLOCK_M, E_P2), dtype=tl.float32)
    start, end = key_range(rec, MB, i0, L, S, LO0, HI0, LO1, HI1, BLOCK_M, BLOCK_N)
    for j0 in range(start, end, BLOCK_N):
        state = tile_state(rec, MB, i0, j0, L, S, LO0, HI0, LO1, HI1, BLOCK_M, BLOCK_N)
        if SKIP_EMPTY:
            if state != 0:
                dq = _dq_step(
                    dq, j0, state, q, do, lse, delta, q_base, k_base, v_base, dw_base, W,
                    kb_base, BIAS, rec, KEEP, DQ_base, b, h, H, offs_m, offs_e, offs_v,
                    L, S, E, EV, s_q_l, s_k_s, s_v_s, scale, qk_scale, LO0, HI0, LO1, HI1,
                    OPS, MB, BLOCK_M, BLOCK_N, BLOCK_H, E_P2, EV_P2,
                )  # fmt: skip
        else:
            dq = _dq_step(
                dq, j0, state, q, do, lse, delta, q_base, k_base, v_base, dw_base, W,
                kb_base, BIAS, rec, KEEP, DQ_base, b, h, H, offs_m, offs_e, offs_v,
                L, S, E, EV, s_q_l, s_k_s, s_v_s, scale, qk_scale, LO0, HI0, LO1, HI1,
                OPS, MB, BLOCK_M, BLOCK_N, BLOCK_H, E_P2, EV_P2,
            )  # fmt: skip

    if (ADDITIVE & OPS) == 0:
        tl.store(DQ_base + offs_m[:, None] * E + offs_e[None, :], dq,
                 mask=in_m[:, None] & (offs_e[None, :] < E))  # fmt: skip
