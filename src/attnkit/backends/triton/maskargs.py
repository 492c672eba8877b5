"""A mask as kernel arguments: the one host-side place that does it.

:func:`pack_mask` reads a :class:`MaskSpec` (OR-ed :class:`Clause` conjunctions and a
summed bias) and returns a :class:`PackedMask`: an int32 tensor of per-batch records,
the dense keep and bias in a compact layout, four band ints, the rows per batch
element and the compile-time mask bits (layout in :mod:`.bits`, read in the kernels
by :mod:`.kmask`). :func:`spec_from_plan` builds the spec from the call's block plan
(the one lowering of masks every backend reads); nothing here knows a mask class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ...blockplan import BlockPlan
from . import bits as _b
from .layout import bh_view

__all__ = [
    "Clause",
    "MaskSpec",
    "PackedMask",
    "pack_mask",
    "plan_reason",
    "spec_from_plan",
    "unsupported",
]


@dataclass
class Clause:
    """One conjunction: a pair (query i, key j) of batch element b0 is kept when every
    field present keeps it. Per-batch tensors have a first dim of B0 or 1.

    lo, hi: band ``i + lo <= j <= i + hi`` (None: unbounded). key_lo/key_hi (B0,):
    ``key_lo <= j < key_hi``. query_lo/query_hi (B0,): other rows are padding.
    row_lo/row_hi (B0, L): ``row_lo[i] <= j < row_hi[i]``. key_keep (B0, S) bool.
    docs: (q_ids (B0, L), k_ids (B0, S), equal) with ``equal``: same id and id >= 0;
    else the opposite. dense_keep: bool broadcastable to (*batch, L, S)."""

    lo: int | None = None
    hi: int | None = None
    key_lo: torch.Tensor | None = None
    key_hi: torch.Tensor | None = None
    query_lo: torch.Tensor | None = None
    query_hi: torch.Tensor | None = None
    row_lo: torch.Tensor | None = None
    row_hi: torch.Tensor | None = None
    key_keep: torch.Tensor | None = None
    docs: list[tuple[torch.Tensor, torch.Tensor, bool]] = field(default_factory=list)
    dense_keep: torch.Tensor | None = None


@dataclass
class MaskSpec:
    """What the kernels can hold: a pair is kept when some clause keeps it (``[]``:
    nothing kept; ``[Clause()]``: everything), plus ``bias`` (float, broadcastable to
    (*batch, L, S), -inf blocks) added to every logit."""

    clauses: list[Clause]
    bias: torch.Tensor | None = None


@dataclass
class PackedMask:
    """Kernel arguments of a mask: ``records`` (B0 or 1, W) int32 (W >= 1), ``keep``
    (compact uint8) or None, ``bias`` (compact) or None, ``ints`` = [R, MB, LO0, HI0,
    LO1, HI1] (rows per batch element, mask bits, bands)."""

    records: torch.Tensor
    keep: torch.Tensor | None
    bias: torch.Tensor | None
    ints: list[int]


def _min(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else torch.minimum(a, b)


def _max(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else torch.maximum(a, b)


def spec_from_plan(plan: BlockPlan) -> MaskSpec:
    """The call's block plan (:mod:`attnkit.blockplan`, the one lowering of masks) as a
    spec: each plan clause one kernel clause, the plan's biases summed."""
    clauses = []
    for c in plan.clauses:
        keep: torch.Tensor | None = None
        for t in c.dense_keep:
            keep = t if keep is None else keep & t
        clauses.append(
            Clause(
                lo=c.lo,
                hi=c.hi,
                key_lo=c.key_lo,
                key_hi=c.key_hi,
                query_lo=c.query_lo,
                query_hi=c.query_hi,
                row_lo=c.row_lo,
                row_hi=c.row_hi,
                key_keep=c.key_keep,
                docs=[(d.q_ids, d.k_ids, d.equal) for d in c.docs],
                dense_keep=keep,
            )
        )
    bias: torch.Tensor | None = None
    for t in plan.biases:
        bias = t if bias is None else bias + t
    return MaskSpec(clauses, bias)


def plan_reason(plan: BlockPlan) -> str | None:
    """Why the kernels cannot hold a plan, from its structure alone (no tensor value is
    read: ``explain`` of any size allocates nothing), or None."""
    if len(plan.clauses) > _b.MAX_CLAUSES:
        return f"a mask of {len(plan.clauses)} OR-ed clauses (the kernels take {_b.MAX_CLAUSES})"
    if sum(bool(c.dense_keep) for c in plan.clauses) > 1:
        return "dense keep tensors in more than one OR-ed clause"
    for c in plan.clauses:
        if sum(d.equal for d in c.docs) > 1 or sum(not d.equal for d in c.docs) > 1:
            return "two document-id conditions of one kind in one clause"
    return None


def unsupported(spec: MaskSpec) -> str | None:
    """Why the kernels cannot hold ``spec``, or None."""
    if len(spec.clauses) > _b.MAX_CLAUSES:
        return f"a mask of {len(spec.clauses)} OR-ed clauses (the kernels take {_b.MAX_CLAUSES})"
    if sum(c.dense_keep is not None for c in spec.clauses) > 1:
        return "dense keep tensors in more than one OR-ed clause"
    for c in spec.clauses:
        if sum(eq for *_, eq in c.docs) > 1 or sum(not eq for *_, eq in c.docs) > 1:
            return "two document-id conditions of one kind in one clause"
    return None


def _compact(
    t: torch.Tensor, batch_shape: tuple[int, ...], L: int, S: int
) -> tuple[torch.Tensor, int]:
    """A dense tensor broadcastable to (*batch, L, S) as a contiguous (B|1, H|1, L|1, S|1)
    tensor and its real dims as bits (B, H, L, S = 1, 2, 4, 8): nothing is copied for a
    broadcast dim."""
    if t.ndim == 1:
        t = t.unsqueeze(0)  # (1, S)
    t4 = bh_view(t, batch_shape)  # (B, H, L or 1, S or 1), stride 0 where broadcast
    dims = 0
    for d, bit in enumerate((_b.DIM_B, _b.DIM_H, _b.DIM_L, _b.DIM_S)):
        if t4.shape[d] > 1 and t4.stride(d) != 0:
            dims |= bit
        else:
            t4 = t4.narrow(d, 0, 1)
    if t4.dtype == torch.bool:
        t4 = t4.contiguous().view(torch.uint8)  # same bytes, a loadable element type
    return t4.contiguous(), dims


def _clause_record(c: Clause, L: int, S: int) -> tuple[int, list[torch.Tensor]]:
    """A clause's field bits and its record pieces, each (B0 or 1, width) int32, in the
    record order of :mod:`.bits` (the order of the field bits)."""
    i32 = torch.int32
    bits = 0
    pieces: list[torch.Tensor] = []

    def col(t: torch.Tensor | None, default: int, like: torch.Tensor) -> torch.Tensor:
        if t is None:
            return torch.full((1, 1), default, dtype=i32, device=like.device)
        return t.reshape(-1, 1).clamp(-(2**31), 2**31 - 1).to(i32)  # (B0 or 1, 1)

    if c.lo is not None:
        bits |= _b.LO
    if c.hi is not None:
        bits |= _b.HI
    if c.key_lo is not None or c.key_hi is not None:
        like = c.key_lo if c.key_lo is not None else c.key_hi
        assert like is not None
        bits |= _b.KRANGE
        pieces += [col(c.key_lo, 0, like), col(c.key_hi, S, like)]
    if c.query_lo is not None or c.query_hi is not None:
        like = c.query_lo if c.query_lo is not None else c.query_hi
        assert like is not None
        bits |= _b.QRANGE
        pieces += [col(c.query_lo, 0, like), col(c.query_hi, L, like)]
    if c.row_lo is not None or c.row_hi is not None:
        like = c.row_lo if c.row_lo is not None else c.row_hi
        assert like is not None
        bits |= _b.RRANGE
        for t, default in ((c.row_lo, 0), (c.row_hi, S)):
            if t is None:
                pieces.append(torch.full((1, L), default, dtype=i32, device=like.device))
            else:
                pieces.append(t.reshape(-1, L).clamp(-(2**31), 2**31 - 1).to(i32))  # (B0, L)
    if c.key_keep is not None:
        bits |= _b.KKEEP
        pieces.append(c.key_keep.reshape(-1, S).to(i32))  # (B0, S)
    for want_equal, bit in ((True, _b.DOC), (False, _b.DOC_NE)):
        for q_ids, k_ids, equal in c.docs:
            if equal == want_equal:
                bits |= bit
                pieces.append(q_ids.reshape(-1, L).clamp(-(2**31), 2**31 - 1).to(i32))
                pieces.append(k_ids.reshape(-1, S).clamp(-(2**31), 2**31 - 1).to(i32))
    if c.dense_keep is not None:
        bits |= _b.DENSE
    return bits, pieces


def pack_mask(
    spec: MaskSpec, L: int, S: int, batch_shape: tuple[int, ...], device: torch.device
) -> PackedMask:
    """The kernel arguments of ``spec`` for a call with (*batch, L, S) logits.

    Records hold, per batch element b0 (the first batch dim), every clause's fields in
    the order of :mod:`.bits`; they are built with tensor operations only (no host read
    of mask values, so no device synchronization)."""
    reason = unsupported(spec)
    if reason is not None:
        raise TypeError(f"triton backend: {reason}")
    B0 = batch_shape[0] if batch_shape else 1
    clauses = spec.clauses or [Clause(lo=1, hi=0)]  # nothing kept: an empty band
    mb = len(clauses) << _b.NC_SHIFT
    bands = [0, 0, 0, 0]
    pieces: list[torch.Tensor] = []
    keep: torch.Tensor | None = None
    for n, c in enumerate(clauses):
        bits, parts = _clause_record(c, L, S)
        mb |= bits << (_b.CLAUSE_WIDTH * n)
        bands[2 * n] = c.lo if c.lo is not None else 0
        bands[2 * n + 1] = c.hi if c.hi is not None else 0
        pieces += parts
        if c.dense_keep is not None:
            keep, dims = _compact(c.dense_keep, batch_shape, L, S)
            if dims == 0:  # one value for every pair: the kernels read a keep by its dims
                keep = keep.reshape(1, 1, 1, 1).expand(1, 1, 1, S).contiguous()  # (1, 1, 1, S)
                dims = _b.DIM_S
            mb |= dims << _b.KEEP_SHIFT
    bias: torch.Tensor | None = None
    if spec.bias is not None:
        bias, dims = _compact(spec.bias, batch_shape, L, S)
        mb |= (1 | (dims << 1)) << _b.BIAS_SHIFT
    if pieces:
        rows = max(p.shape[0] for p in pieces)
        if rows == 1:
            mb |= _b.RECORD_B1
        records = torch.cat([p.expand(rows, p.shape[1]) for p in pieces], dim=1)  # (B0|1, W)
    else:
        records = torch.zeros(1, 1, dtype=torch.int32, device=device)
        mb |= _b.RECORD_B1
    rows_per_b0 = max(math.prod(batch_shape) // max(B0, 1), 1)
    return PackedMask(records.contiguous(), keep, bias, [rows_per_b0, mb, *bands])
