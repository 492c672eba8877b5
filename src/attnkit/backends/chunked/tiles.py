"""The chunked backend's tiles: forward (online softmax), exact weights, and backward.

Rows are flattened to N = B0 * R (see :class:`attnkit.blockplan.BlockPlan`); every
function walks the plan's groups, query blocks and the key blocks the plan keeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ... import _lse
from ..._host import readable
from ..._layout import ONE_HEAD, HeadLayout
from ...blockplan import BlockPlan
from ...kernels import additive as _additive
from ...kernels.softmax import exp_rows_
from ..records import OutputGrads
from .sizes import TILE_ELEMENTS

__all__ = ["Operands", "backward_tiles", "forward_tiles", "weights_tiles"]


@dataclass(frozen=True)
class Operands:
    """The tensors a tile is computed from (all rows N = B0 * R flattened).

    kind "dot": s = scale * qa @ ka^T + kb (kb pre-scaled key bias or None);
    kind "additive": s = scale * sum_h w[h] tanh(qa[:, i, h] + ka[:, j, h]);
    kind "distance": s = -scale * w[n] * ‖qa[n, i] - ka[n, j]‖² (the Gaussian formed from
    its differences, w (N, 1, 1) its 1/2σ² per row).

    Score modifiers: ``pos`` (H, L + S - 1) adds ``pos[h, j - i + L - 1]`` to the rows
    of head h (``layout`` says which head a row holds) after the scale, then each cap
    of ``softcaps`` in turn maps s to ``cap * tanh(s / cap)``; all before the mask.

    Non-finite inputs (looked for on the host where reading is free, else assumed):
    ``bad_v`` (N, S) marks value rows holding NaN/inf, which ``v`` holds as zeros so
    that a masked-out key contributes nothing, and a row that uses such a key becomes
    NaN; ``nonfinite_qk`` (a query or key may hold NaN/inf) makes every ``-inf`` of the
    mask's bias a hard mask, so a NaN logit cannot turn a blocked pair into NaN. The
    backward then keeps every pair that is not used out of every gradient
    (:func:`_backward_guard`).
    """

    kind: str
    qa: torch.Tensor  # (N, L, Eq)
    ka: torch.Tensor  # (N, S, Eq)
    w: torch.Tensor | None  # (hidden,) for additive, (N, 1, 1) for distance
    v: torch.Tensor  # (N, S, Ev)
    kb: torch.Tensor | None  # (N, 1, S)
    scale: float
    bad_v: torch.Tensor | None = None  # (N, S) 1.0 where the value row is not finite
    nonfinite_qk: bool = False
    pos: torch.Tensor | None = None  # (H, L + S - 1) position bias by offset j - i + L - 1
    layout: HeadLayout = ONE_HEAD  # the rows' heads (the last batch dim)
    softcaps: tuple[float, ...] = ()

    @property
    def clean(self) -> bool:
        """True when every key and value is finite (the fast paths apply)."""
        return self.bad_v is None and not self.nonfinite_qk

    @property
    def plain(self) -> bool:
        """True without score modifiers (no position bias, no softcap)."""
        return self.pos is None and not self.softcaps


def _nan_rows(ops: Operands, rows: slice, s: torch.Tensor, j0: int, j1: int) -> torch.Tensor | None:
    """(R, bi) True where a row of the tile s (R, bi, bj) (logits, -inf = blocked) uses a
    key whose value is not finite; None when every value is finite."""
    if ops.bad_v is None:
        return None
    used = (s > float("-inf")).to(s.dtype)  # (R, bi, bj)
    return torch.bmm(used, ops.bad_v[rows, j0:j1].unsqueeze(-1)).squeeze(-1) > 0  # (R, bi)


def _tile_logits(
    ops: Operands,
    plan: BlockPlan,
    rows: slice,
    b: int | None,
    i0: int,
    i1: int,
    j0: int,
    j1: int,
    softcap_tanh: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Masked logits of one tile: (rows, i1-i0, j1-j0), -inf where blocked.

    ``softcap_tanh``: a list that receives ``tanh(s / cap)`` of the tile for each cap
    (each softcap's derivative is ``1 - tanh²``), for the backward."""
    qt = ops.qa[rows, i0:i1]  # (R, bi, Eq)
    kt = ops.ka[rows, j0:j1]  # (R, bj, Eq)
    keep, mask_bias = plan.tile_mask(b, i0, i1, j0, j1, qt.device)
    bias = mask_bias if ops.plain else None  # with modifiers the mask comes after them
    if ops.kind == "dot":
        if ops.kb is not None:
            kb = ops.kb[rows, :, j0:j1]  # (R, 1, bj)
            bias = kb if bias is None else bias + kb
        if bias is not None:  # the bias rides in the matrix product's accumulator
            bias = bias.expand(qt.shape[0], i1 - i0, j1 - j0)  # (R, bi, bj)
            s = torch.baddbmm(bias, qt, kt.transpose(1, 2), alpha=ops.scale)
        else:
            # (scaled inside the product, as with a bias: not bmm's output scaled in
            # place, which selective activation checkpointing, keeping the matrix
            # products for the recomputation, refuses as mutated)
            zero = qt.new_zeros(()).expand(qt.shape[0], i1 - i0, j1 - j0)  # (R, bi, bj)
            s = torch.baddbmm(zero, qt, kt.transpose(1, 2), beta=0, alpha=ops.scale)
    elif ops.kind == "distance":
        assert ops.w is not None
        s = squared_distances(qt, kt).mul_(ops.w[rows] * -ops.scale)  # (R, bi, bj)
        if bias is not None:
            s = s.add_(bias)
    else:
        assert ops.w is not None
        s = _additive.logits(qt, kt, ops.w).mul_(ops.scale)  # (R, bi, bj)
        if bias is not None:
            s = s.add_(bias)
    if not ops.plain:
        s = _modified(ops, s, rows.start, i0, i1, j0, j1, plan.L, softcap_tanh)
        if mask_bias is not None:
            s = s.add_(mask_bias)
    if ops.nonfinite_qk and mask_bias is not None:  # NaN + -inf stays blocked
        s = s.masked_fill_(mask_bias == float("-inf"), float("-inf"))
    if ops.nonfinite_qk and ops.kb is not None:  # an infinitely far key, whatever the query
        s = s.masked_fill_(torch.isneginf(ops.kb[rows, :, j0:j1]), float("-inf"))
    if keep is not None:
        s = s.masked_fill_(~keep, float("-inf"))
    return s


def _key_chunk(qt: torch.Tensor, kt: torch.Tensor) -> int:
    """Keys per step of a tile's (R, bi, keys, E) differences within TILE_ELEMENTS."""
    R, bi, E = qt.shape
    return max(1, min(kt.shape[1], TILE_ELEMENTS // max(1, R * bi * E)))


def squared_distances(qt: torch.Tensor, kt: torch.Tensor) -> torch.Tensor:
    """‖q_i - k_j‖² (R, bi, bj) of qt (R, bi, E) and kt (R, bj, E), each difference formed
    first (its rounding is relative to itself, not to |q| or |k|), a chunk of keys at a
    time so the (R, bi, keys, E) differences stay within TILE_ELEMENTS."""
    R, bi, bj = qt.shape[0], qt.shape[1], kt.shape[1]
    out = qt.new_empty(R, bi, bj)
    step = _key_chunk(qt, kt)
    for j in range(0, bj, step):
        d = qt.unsqueeze(2) - kt[:, j : j + step].unsqueeze(1)  # (R, bi, c, E)
        out[:, :, j : j + step] = torch.linalg.vecdot(d, d)
    return out


def _distance_grads(
    qt: torch.Tensor, kt: torch.Tensor, w: torch.Tensor, h: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of a tile's ``w * D``, D = ‖q_i - k_j‖², given h (R, bi, bj) its gradient
    and w (R, 1, 1): (dq (R, bi, E), dk (R, bj, E), dw (R, 1, 1)) with g = w h,
    dq_i = 2 sum_j g_ij (q_i - k_j), dk_j = -2 sum_i g_ij (q_i - k_j), dw = sum h D, all
    from the differences themselves (``q_i·sum g - g @ k`` would round at the size of
    |q| and |k|, not of q - k)."""
    dq = torch.zeros_like(qt)
    dk = torch.zeros_like(kt)
    dw = torch.zeros_like(w)
    step = _key_chunk(qt, kt)
    for j in range(0, kt.shape[1], step):
        d = qt.unsqueeze(2) - kt[:, j : j + step].unsqueeze(1)  # (R, bi, c, E)
        hj = h[:, :, j : j + step]  # (R, bi, c)
        dw += (hj * torch.linalg.vecdot(d, d)).sum(dim=(1, 2)).view(-1, 1, 1)
        t = d.mul_((hj * w).unsqueeze(-1))  # (R, bi, c, E): g_ij (q_i - k_j)
        dq += t.sum(dim=2)
        dk[:, j : j + step] -= t.sum(dim=1)
    return dq.mul_(2), dk.mul_(2), dw


def position_tile(pos: torch.Tensor, i0: int, i1: int, j0: int, j1: int, L: int) -> torch.Tensor:
    """The tile (H, bi, bj) of a position table pos (H, L + S - 1) indexed by
    ``j - i + L - 1``, for queries [i0, i1) and keys [j0, j1).

    Entry (a, b) is ``pos[:, base - a + b]`` with ``base = j0 - i0 + L - 1``: with the
    rows reversed that is a Hankel view of the table (strides (1, 1)), so the tile is
    one contiguous flip of a strided view, not a gather through an index tensor (17x
    faster at 256 x 256).
    """
    H, bi, bj = pos.shape[0], i1 - i0, j1 - j0
    start = j0 - i0 + L - 1 - (bi - 1)  # the table index of the tile's last row, first key
    hankel = pos.as_strided(
        (H, bi, bj), (pos.stride(0), pos.stride(1), pos.stride(1)), pos.storage_offset() + start
    )  # (H, bi, bj): [h, a', b] = pos[h, start + a' + b], a' = bi - 1 - a
    return hankel.flip(-2)  # (H, bi, bj)


def _modified(
    ops: Operands,
    s: torch.Tensor,
    row0: int,
    i0: int,
    i1: int,
    j0: int,
    j1: int,
    L: int,
    softcap_tanh: list[torch.Tensor] | None,
) -> torch.Tensor:
    """A tile's scaled logits s (R, bi, bj) of rows row0 .. row0 + R with the position
    bias added and each softcap applied in turn."""
    if ops.pos is not None:
        tile = position_tile(ops.pos, i0, i1, j0, j1, L).to(s.dtype)  # (H, bi, bj)
        s = ops.layout.add_per_row(s, tile, row0)  # (R, bi, bj)
    for cap in ops.softcaps:
        t = torch.tanh(s / cap)  # (R, bi, bj)
        if softcap_tanh is not None:
            softcap_tanh.append(t)
        s = t * cap
    return s


def diagonal_sums(ds: torch.Tensor) -> torch.Tensor:
    """Sums of ds (R, bi, bj) along each diagonal j - i, (R, bi + bj - 1), index
    ``j - i + bi - 1``: one strided view and one sum, in a fixed order (no atomics)."""
    R, bi, bj = ds.shape
    width = 2 * bi + bj
    x = torch.nn.functional.pad(ds, (bi, bi)).contiguous()  # (R, bi, 2bi + bj)
    y = x.as_strided((R, bi, bi + bj - 1), (x.stride(0), width + 1, 1), x.storage_offset() + 1)
    return y.sum(dim=1)  # (R, bi + bj - 1)


def _blocks(start: int, end: int, size: int) -> Iterator[tuple[int, int]]:
    """Half-open ranges [a, b) of at most ``size`` covering [start, end)."""
    for a in range(start, end, size):
        yield a, min(a + size, end)


def lse_low(lse: torch.Tensor, m: torch.Tensor, denom: torch.Tensor) -> torch.Tensor:
    """What ``lse = fl(m + log(denom))`` (...) rounded off: ``(m - lse) + log(denom)``
    (``m - lse`` is exact where the two are close), 0 where lse or the result is not
    finite. ``exp((s - lse) - low)`` then keeps the precision of ``exp(s - m) / denom``
    at any |lse|, where ``exp(s - lse)`` loses ``eps * |lse|``."""
    low = (m - lse) + torch.log(denom)
    return torch.where(torch.isfinite(lse) & torch.isfinite(low), low, torch.zeros_like(low))


def exp_from_lse_(s: torch.Tensor, lse: torch.Tensor, low: torch.Tensor | None) -> None:
    """s (R, bi, bj) becomes ``exp(s - lse)``, the lse (R, bi) finite, ``low`` (R, bi)
    its rounding (:func:`lse_low`) or None."""
    if low is None:
        exp_rows_(s, lse, want_sum=False)
        return
    exp_rows_(s.sub_(lse.unsqueeze(-1)), low, want_sum=False)


def forward_tiles(
    ops: Operands, plan: BlockPlan, want_weights: bool, low: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Online-softmax forward over all tiles: out (N, L, Ev), lse (N, L), weights or None;
    ``low`` (N, L), when given, receives the lse's rounding (:func:`lse_low`)."""
    N, L, Ev = ops.qa.shape[0], plan.L, ops.v.shape[-1]
    dt, dev = ops.qa.dtype, ops.qa.device
    out = torch.zeros(N, L, Ev, dtype=dt, device=dev)
    lse = torch.full((N, L), float("-inf"), dtype=dt, device=dev)
    if low is None:
        low = torch.zeros(N, L, dtype=dt, device=dev)
    band = plan.band_offsets() if ops.kind == "dot" and ops.clean and ops.plain else None
    for rows, b, q_start, q_end, k_start, k_end in plan.groups():
        done: set[int] = set()
        if band is not None:
            done = _forward_band_runs(ops, plan, rows, q_end, k_start, k_end, band, out, lse, low)
        for i0, i1 in _blocks(q_start, q_end, plan.block_q):
            if i0 in done:
                continue
            lo, hi = plan.key_range(b, i0, i1, k_start, k_end)
            if lo >= hi:
                continue  # every row of this block is fully masked
            m: torch.Tensor | None = None
            acc: torch.Tensor | None = None
            denom: torch.Tensor | None = None
            nan_rows: torch.Tensor | None = None
            for j0, j1 in _blocks(lo, hi, plan.block_k):
                s = _tile_logits(ops, plan, rows, b, i0, i1, j0, j1)  # (R, bi, bj)
                hit = _nan_rows(ops, rows, s, j0, j1)
                if hit is not None:
                    nan_rows = hit if nan_rows is None else nan_rows | hit
                tile_max = s.amax(dim=-1)  # (R, bi)
                m_new = tile_max if m is None else torch.maximum(m, tile_max)
                m_safe = _lse.safe_max(m_new)  # (R, bi)
                tile_sum = exp_rows_(s, m_safe, want_sum=True)  # s becomes p = exp(s - m)
                assert tile_sum is not None
                pv = torch.bmm(s, ops.v[rows, j0:j1])  # (R, bi, Ev)
                if acc is None or denom is None or m is None:
                    acc, denom = pv.clone(), tile_sum  # (pv, a product's output: kept)
                else:
                    alpha = torch.exp(m - m_safe)  # (R, bi); exp(-inf) = 0
                    denom = denom.mul_(alpha).add_(tile_sum)
                    acc = acc.mul_(alpha.unsqueeze(-1)).add_(pv)
                m = m_new
            assert acc is not None and denom is not None and m is not None
            m_safe = _lse.safe_max(m)
            o, lse_t = _lse.finish(acc, denom, m_safe)  # (R, bi, Ev), (R, bi)
            lse[rows, i0:i1] = lse_t
            low[rows, i0:i1] = lse_low(lse_t, m_safe, denom)
            if nan_rows is not None:  # a used value that is not finite propagates
                o = o.masked_fill(nan_rows.unsqueeze(-1), float("nan"))
            out[rows, i0:i1] = o
    weights = None
    if want_weights:
        # exp(s - lse) sums to 1 only within |lse| * eps (the rounding of lse): divided
        # by its own row sums, so the backward's rowsum(dW * W) cancels its p * dW
        weights = _lse.normalize_rows_(weights_tiles(ops, plan, lse, low=low))  # (N, L, S)
    return out, lse, weights


def _forward_band_runs(
    ops: Operands,
    plan: BlockPlan,
    rows: slice,
    q_end: int,
    k_start: int,
    k_end: int,
    band: tuple[int, int],
    out: torch.Tensor,
    lse: torch.Tensor,
    low: torch.Tensor,
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
        # the band's bias rides in the product's accumulator, scaled inside it (bmm's
        # own output is never edited in place: see _tile_logits)
        s = torch.baddbmm(
            bias.expand(R * g, bq, span),
            qb.reshape(R * g, bq, E),  # (R·g, bq, E')
            kw.reshape(R * g, span, E).transpose(1, 2),  # (R·g, E', span)
            alpha=ops.scale,
        ).view(R, g, bq, span)  # (R, g, bq, span)
        if kb is not None:
            s.add_(
                kb.as_strided(
                    (R, g, 1, span), (kb.stride(0), bq, span, 1), kb.storage_offset() + j0
                )
            )
        m = s.amax(dim=-1)  # (R, g, bq)
        m = _lse.safe_max(m)
        denom = exp_rows_(s, m, want_sum=True)  # s becomes p = exp(s - m)
        assert denom is not None
        o = torch.matmul(s, vw)  # (R, g, bq, Ev)
        o, lse_b = _lse.finish(o, denom, m)  # (R, g, bq, Ev), (R, g, bq)
        out[rows, i0 : i0 + g * bq] = o.reshape(R, g * bq, Ev)
        lse[rows, i0 : i0 + g * bq] = lse_b.reshape(R, g * bq)
        low[rows, i0 : i0 + g * bq] = lse_low(lse_b, m, denom).reshape(R, g * bq)
    return {n * bq for n in range(first, last)}


def weights_tiles(
    ops: Operands,
    plan: BlockPlan,
    lse: torch.Tensor,
    *,
    heads: int = 1,
    low: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact weights exp(s - lse), tile by tile; skipped tiles stay 0. ``low`` (N, L): the
    lse's rounding (:func:`lse_low`), or None.

    Returns (N, L, S), or with ``heads`` > 1 the mean over each run of ``heads``
    consecutive rows (the head dim, last of the batch dims): (N // heads, L, S),
    never holding more than one tile of per-head weights.
    """
    N, L, S = ops.qa.shape[0], plan.L, plan.S
    dt, dev = ops.qa.dtype, ops.qa.device
    weights = torch.zeros(N // heads, L, S, dtype=dt, device=dev)
    lse_safe = _lse.safe_max(lse)
    for rows, b, q_start, q_end, k_start, k_end in plan.groups():
        out_rows = slice(rows.start // heads, rows.stop // heads)
        for i0, i1 in _blocks(q_start, q_end, plan.block_q):
            lo, hi = plan.key_range(b, i0, i1, k_start, k_end)
            shift = lse_safe[rows, i0:i1]  # (R, bi)
            low_t = low[rows, i0:i1] if low is not None else None  # (R, bi)
            for j0, j1 in _blocks(lo, hi, plan.block_k):
                s = _tile_logits(ops, plan, rows, b, i0, i1, j0, j1)  # (R, bi, bj)
                exp_from_lse_(s, shift, low_t)
                if heads > 1:
                    s = s.view(-1, heads, i1 - i0, j1 - j0).mean(dim=1)  # (R // heads, bi, bj)
                weights[out_rows, i0:i1, j0:j1] = s
    return weights


def _backward_guard(
    ops: Operands,
    out: torch.Tensor,
    lse: torch.Tensor,
    d_out: torch.Tensor,
    row_term: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The non-finite policy of the backward, or None when there is nothing to guard.

    A pair that is not used (its logit is -inf) must add nothing to any gradient, so a
    NaN or inf held by its query, key or output gradient cannot reach the others through
    ``0 * NaN``. When the operands, the output or its gradient are not all finite this
    returns ``(reached, qa, ka)``: the rows (N, L) whose output, lse or output gradient
    is not finite (rows that use a non-finite input: their gradients may be NaN, the
    others are exact; their output gradient is dropped), and the operands with their
    non-finite rows zeroed for the gradient products (a used pair of such a row has a
    NaN logit, so its gradient is NaN anyway).
    """
    reached = ~(torch.isfinite(row_term) & ~torch.isposinf(lse) & ~torch.isnan(lse))  # (N, L)
    reached |= ~torch.isfinite(out).all(dim=-1) | ~torch.isfinite(d_out).all(dim=-1)
    if ops.clean and readable(reached) and not bool(reached.any()):
        return None
    zero = torch.zeros((), dtype=ops.qa.dtype, device=ops.qa.device)
    qa = torch.where(torch.isfinite(ops.qa).all(dim=-1, keepdim=True), ops.qa, zero)
    ka = torch.where(torch.isfinite(ops.ka).all(dim=-1, keepdim=True), ops.ka, zero)
    return reached, qa, ka


def _weighted_dp(
    ops: Operands,
    plan: BlockPlan,
    lse_safe: torch.Tensor,
    low: torch.Tensor | None,
    d_out: torch.Tensor,
    d_weights: torch.Tensor | None,
    guarded: bool,
    base: torch.Tensor,
) -> torch.Tensor:
    """``sum_j p_ij (dO_i · v_j + dW_ij - base_i)`` (N, L), tile by tile, for ``base``
    (N, L) an estimate of the row term ``sum_j p_ij (dO_i · v_j + dW_ij)`` (what
    ``rowsum(dO * O) + rowsum(dW * W)`` gives): the row term is then ``base`` plus this
    remainder, held as the two parts (see :func:`backward_tiles`).

    ``rowsum(dO * O) + rowsum(dW * W)`` equals the row term in exact arithmetic but rounds
    at the size of ``|dO| |v|``, so a row held by one key (p = 1) gets a logit gradient of
    that rounding instead of 0, which the Gaussian's far keys (a derivative of the logits
    of ``|q - k|/σ²``) magnify. Summed as ``p * dp`` the row term still rounds at that size
    (one rounding of the sum, and one of each ``p`` near 1): the logits' gradients of a row
    held by a few keys, ``p_j (dp_j - row term)``, then do not sum to 0 to within their own
    size, and a gradient that every key of the row shares (a query projection, the
    additive score's ``w``) sums that rounding over the keys where the true sum cancels.
    The remainder sums ``p * (dp - base)``, whose terms vanish on the keys that hold the
    row, so it keeps the precision of the logits' gradients themselves."""
    out = torch.zeros_like(lse_safe)  # (N, L)
    for rows, b, q_start, q_end, k_start, k_end in plan.groups():
        for i0, i1 in _blocks(q_start, q_end, plan.block_q):
            lo, hi = plan.key_range(b, i0, i1, k_start, k_end)
            low_t = low[rows, i0:i1] if low is not None else None  # (R, bi)
            base_t = base[rows, i0:i1].unsqueeze(-1)  # (R, bi, 1)
            for j0, j1 in _blocks(lo, hi, plan.block_k):
                p = _tile_logits(ops, plan, rows, b, i0, i1, j0, j1)  # (R, bi, bj)
                blocked = torch.isneginf(p) if guarded else None
                exp_from_lse_(p, lse_safe[rows, i0:i1], low_t)
                if blocked is not None:
                    p.masked_fill_(blocked, 0.0)
                dp = torch.bmm(d_out[rows, i0:i1], ops.v[rows, j0:j1].transpose(1, 2))
                if d_weights is not None:
                    dp += d_weights[rows, i0:i1, j0:j1]
                out[rows, i0:i1] += (p * dp.sub_(base_t)).sum(dim=-1)  # (R, bi)
    return out


def backward_tiles(
    ops: Operands,
    plan: BlockPlan,
    given: OutputGrads,
    d_rows: torch.Tensor | None = None,
    d_pos: torch.Tensor | None = None,
    low: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """Gradients (dqa, dka, dw, dv, dkb) by recomputing each tile's probabilities.

    With p = exp(s - lse), the gradient of the logits of a tile is
    ``p * (dO @ V^T - rowsum(dO * O) + dlse)`` plus, when the weights were returned,
    ``p * (dW - rowsum(dW * W))``, times ``1 - tanh²`` under each softcap. ``d_rows``
    (N, L), when given, accumulates each row's sum of the logits' gradient (what a
    per-row constant of the logits receives); ``d_pos`` (H, L + S - 1) the position
    table's gradient, summed along each tile's diagonals per head. ``low`` (N, L): the
    lse's rounding (:func:`lse_low`) where the forward gave it, or None. ``given``: out
    (N, L, Ev), lse (N, L), weights (N, L, S) or None, and their gradients.
    """
    out, lse, d_out, d_lse = given.out, given.lse, given.grad_out, given.grad_lse
    weights, d_weights = given.weights, given.grad_weights
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
    guard = _backward_guard(ops, out, lse, d_out, row_term)
    qa, ka = ops.qa, ops.ka
    if guard is not None:  # see _backward_guard
        reached, qa, ka = guard
        d_out = d_out.masked_fill(reached.unsqueeze(-1), 0.0)
        row_term = row_term.masked_fill(reached, 0.0)
    lse_safe = _lse.safe_max(lse)
    # The Gaussian (see _weighted_dp), and any score when the weights were returned
    # (large logits: a row held by one key, its query and key gradients multiplied by the
    # scale; the weights already cost a pass over (L, S)), when this call's keys are the
    # whole row (its own forward's lse); a backward from a given lse may see a block of
    # the keys only.
    # The row term is then held as two parts, ds = p * ((dp - row_term) - row_low): the
    # estimate from (out, weights), and the remainder (with the lse's gradient), small
    # where the row is held by a few keys.
    exact_rows = ops.kind == "distance" or ops.kb is not None or weights is not None
    row_low: torch.Tensor | None = None
    if low is not None and (exact_rows or d_weights is not None):
        base = row_term if d_lse is None else row_term + d_lse  # (N, L): the estimate
        if guard is not None:
            base = base.masked_fill(guard[0], 0.0)
        rest = _weighted_dp(ops, plan, lse_safe, low, d_out, d_weights, guard is not None, base)
        row_term, row_low = base, rest if d_lse is None else rest - d_lse  # (N, L), (N, L)
        if guard is not None:
            row_low = row_low.masked_fill(guard[0], 0.0)
    for rows, b, q_start, q_end, k_start, k_end in plan.groups():
        for i0, i1 in _blocks(q_start, q_end, plan.block_q):
            lo, hi = plan.key_range(b, i0, i1, k_start, k_end)
            if lo >= hi:
                continue
            do_t = d_out[rows, i0:i1]  # (R, bi, Ev)
            shift = lse_safe[rows, i0:i1]  # (R, bi)
            low_t = low[rows, i0:i1] if low is not None else None  # (R, bi)
            rt = row_term[rows, i0:i1].unsqueeze(-1)  # (R, bi, 1)
            rt_low = row_low[rows, i0:i1].unsqueeze(-1) if row_low is not None else None
            qt = qa[rows, i0:i1]  # (R, bi, Eq)
            for j0, j1 in _blocks(lo, hi, plan.block_k):
                tanh: list[torch.Tensor] = []
                p = _tile_logits(ops, plan, rows, b, i0, i1, j0, j1, tanh)  # (R, bi, bj)
                blocked = torch.isneginf(p) if guard is not None else None
                exp_from_lse_(p, shift, low_t)  # p = exp(s - lse)
                if blocked is not None:  # exactly 0, even in a row whose lse is NaN
                    p.masked_fill_(blocked, 0.0)
                vt = ops.v[rows, j0:j1]  # (R, bj, Ev)
                dv[rows, j0:j1] += torch.bmm(p.transpose(1, 2), do_t)  # (R, bj, Ev)
                dp = torch.bmm(do_t, vt.transpose(1, 2))  # (R, bi, bj)
                if d_weights is not None:
                    dp += d_weights[rows, i0:i1, j0:j1]
                ds = dp.sub_(rt)  # (R, bi, bj)
                if rt_low is not None:
                    ds.sub_(rt_low)
                ds.mul_(p)  # (R, bi, bj): gradient of the logits s
                for t in tanh:  # through each softcap
                    ds.mul_(1 - t * t)
                if blocked is not None:
                    ds.masked_fill_(blocked, 0.0)
                if d_rows is not None:
                    d_rows[rows, i0:i1] += ds.sum(dim=-1)  # (R, bi)
                if d_pos is not None:
                    diag = diagonal_sums(ds)  # (R, bi + bj - 1)
                    t0 = j0 - (i1 - 1) + (plan.L - 1)
                    heads = ops.layout.sum_per_head(diag, rows.start, d_pos.shape[0])
                    d_pos[:, t0 : t0 + diag.shape[-1]] += heads.to(d_pos.dtype)  # (H, ...)
                if dkb is not None:
                    dkb[rows, :, j0:j1] += ds.sum(dim=1, keepdim=True)  # (R, 1, bj)
                kt = ka[rows, j0:j1]  # (R, bj, Eq)
                if ops.kind == "dot":
                    ds.mul_(ops.scale)
                    dqa[rows, i0:i1] += torch.bmm(ds, kt)  # (R, bi, Eq)
                    dka[rows, j0:j1] += torch.bmm(ds.transpose(1, 2), qt)  # (R, bj, Eq)
                elif ops.kind == "distance":  # s = -scale * w * D
                    assert ops.w is not None and dw is not None
                    ds.mul_(-ops.scale)  # (R, bi, bj): the gradient of w * D
                    gq, gk, gw = _distance_grads(qt, kt, ops.w[rows], ds)
                    dqa[rows, i0:i1] += gq
                    dka[rows, j0:j1] += gk
                    dw[rows] += gw
                else:
                    assert ops.w is not None and dw is not None
                    gq, gk, gw = _additive.grads(qt, kt, ops.w, ds.mul_(ops.scale))
                    dqa[rows, i0:i1] += gq
                    dka[rows, j0:j1] += gk
                    dw += gw
    return dqa, dka, dw, dv, dkb
