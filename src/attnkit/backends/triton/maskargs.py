"""A mask as kernel arguments: the one host-side place that does it.

:func:`pack_mask` reads a :class:`MaskSpec` (the block plan's OR-ed
:class:`~attnkit.blockplan.Clause` conjunctions and a summed bias) and returns a :class:`PackedMask`: an int32 tensor of per-batch records,
the dense keep and bias in a compact layout, four band ints, the rows per batch
element and the compile-time mask bits (layout in :mod:`.bits`, read in the kernels
by :mod:`.kmask`). :func:`spec_from_plan` builds the spec from the call's block plan
(the one lowering of masks every backend reads); nothing here knows a mask class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...blockplan import BlockPlan, Clause
from . import bits as _b
from .layout import bh_view

__all__ = [
    "MaskSpec",
    "PackedMask",
    "pack_mask",
    "plan_reason",
    "spec_from_plan",
    "unsupported",
]


@dataclass
class MaskSpec:
    """What the kernels can hold: a pair is kept when some clause keeps it (``[]``:
    nothing kept; ``[Clause()]``: everything), plus ``bias`` (float, broadcastable to
    (*batch, L, S), -inf blocks) added to every logit. The clauses are the block
    plan's own (:class:`attnkit.blockplan.Clause`); their ``biases`` are not read."""

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


def spec_from_plan(plan: BlockPlan) -> MaskSpec:
    """The call's block plan (:mod:`attnkit.blockplan`, the one lowering of masks) as a
    spec: the plan's clauses as they are, its biases summed."""
    bias: torch.Tensor | None = None
    for t in plan.biases:
        bias = t if bias is None else bias + t
    return MaskSpec(list(plan.clauses), bias)


def plan_reason(plan: BlockPlan) -> str | None:
    """Why the kernels cannot hold a plan, from its structure alone (no tensor value is
    read: ``explain`` of any size allocates nothing), or None."""
    return _reason(plan.clauses)


def unsupported(spec: MaskSpec) -> str | None:
    """Why the kernels cannot hold ``spec``, or None."""
    return _reason(spec.clauses)


def _reason(clauses: list[Clause]) -> str | None:
    if len(clauses) > _b.MAX_CLAUSES:
        return f"a mask of {len(clauses)} OR-ed clauses (the kernels take {_b.MAX_CLAUSES})"
    if sum(bool(c.dense_keep) for c in clauses) > 1:
        return "dense keep tensors in more than one OR-ed clause"
    for c in clauses:
        if sum(d.equal for d in c.docs) > 1 or sum(not d.equal for d in c.docs) > 1:
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
        for doc in c.docs:
            if doc.equal == want_equal:
                bits |= bit
                pieces.append(doc.q_ids.reshape(-1, L).clamp(-(2**31), 2**31 - 1).to(i32))
                pieces.append(doc.k_ids.reshape(-1, S).clamp(-(2**31), 2**31 - 1).to(i32))
    if c.dense_keep:
        bits |= _b.DENSE
    return bits, pieces


def _within(bound: int, L: int, S: int) -> int:
    """A band bound (key minus query index) held to [-L, S]: the same band over L rows
    and S keys."""
    return max(-L, min(S, bound))


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
        # a band bound past -L or S keeps what -L or S keeps (rows + bound < 0 or >= S
        # for every row), and held there its sums with row indices never leave int32,
        # as Triton types an argument that fits it (a bound near 2**31 wrapped: rows of 0)
        bands[2 * n] = _within(c.lo, L, S) if c.lo is not None else 0
        bands[2 * n + 1] = _within(c.hi, L, S) if c.hi is not None else 0
        pieces += parts
        if c.dense_keep:
            dense = c.dense_keep[0]
            for t in c.dense_keep[1:]:
                dense = dense & t
            keep, dims = _compact(dense, batch_shape, L, S)
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
