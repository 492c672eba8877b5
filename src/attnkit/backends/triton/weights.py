"""The weights kernel: exact weights exp(s - lse) written tile by tile.

Grid: (cdiv(S, BLOCK_N), cdiv(L, BLOCK_M), B * H) for per-head weights, or
(cdiv(S, BLOCK_N), cdiv(L, BLOCK_M), B) with ``MEAN`` (the key tiles on the first axis,
which CUDA allows 2**31 - 1 blocks, the others 65,535): the program loops over the H
heads of its tile and writes their average once, so per-head weights are never
held. Every tile is written (zeros where the mask leaves nothing), so the output
needs no separate clearing pass.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kmask import record, tile_state
from .logits import LOG2E, MEAN, logits_tile, operand_tile


@triton.jit
def attention_weights_kernel(
    Q, K, KB, W, MASK, KEEP, BIAS, LSE, OUT,
    s_q_b, s_q_h, s_q_l, s_k_b, s_k_h, s_k_s,
    H, L, S, E, GROUPS, R, scale, LO0, HI0, LO1, HI1,
    OPS: tl.constexpr, MB: tl.constexpr, E_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_z = tl.program_id(2)
    i0 = pid_m * BLOCK_M
    j0 = pid_n * BLOCK_N
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_n = j0 + tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, E_P2)
    if (MEAN & OPS) != 0:
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
        rec = record(MASK, MB, row // R, L, S)
        state = tile_state(rec, MB, i0, j0, L, S, LO0, HI0, LO1, HI1, BLOCK_M, BLOCK_N)
        if state != 0:  # else the tile is empty for this head
            q_base = Q + b.to(tl.int64) * s_q_b + h.to(tl.int64) * s_q_h
            k_base = K + b.to(tl.int64) * s_k_b + hk.to(tl.int64) * s_k_h
            kb_base = KB + (b * (H // GROUPS) + hk).to(tl.int64) * S
            q = operand_tile(q_base, offs_m, s_q_l, L, offs_e, E, OPS, BLOCK_M, E_P2)
            k = operand_tile(k_base, offs_n, s_k_s, S, offs_e, E, OPS, BLOCK_N, E_P2)
            s = logits_tile(
                q, k, q_base, k_base, W, kb_base, BIAS, rec, KEEP, b, h, H, offs_m,
                offs_n, L, S, E, s_q_l, s_k_s, qk_scale, LO0, HI0, LO1, HI1, state,
                OPS, MB, BLOCK_M, BLOCK_N, BLOCK_H,
            )  # fmt: skip
            lse = tl.load(LSE + row.to(tl.int64) * L + offs_m, mask=offs_m < L, other=0.0)
            shift = tl.where(lse == float("-inf"), 0.0, lse * LOG2E)
            total += tl.exp2(s - shift[:, None])
    if (MEAN & OPS) != 0:
        total = total / H
    out_base = OUT + pid_z.to(tl.int64) * L * S
    tl.store(
        out_base + offs_m[:, None] * S + offs_n[None, :],
        total.to(OUT.dtype.element_ty),
        mask=(offs_m[:, None] < L) & (offs_n[None, :] < S),
    )
