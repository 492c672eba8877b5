"""A mask as kernel arguments: the one host-side place that does it.

:func:`pack_mask` reads a :class:`MaskSpec` (OR-ed :class:`Clause` conjunctions and a
summed bias) and returns a :class:`PackedMask`: an int32 tensor of per-batch records,
the dense keep and bias in a compact layout, four band ints, the rows per batch
element and the compile-time mask bits (layout in :mod:`.bits`, read in the kernels
by :mod:`.kmask`). :func:`spec_from_mask` builds the spec from a mask's parts; it is
the only function that knows the mask classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ... import masks as _masks
from . import bits as _b
from .layout import bh_view

__all__ = [
    "Clause",
    "MaskSpec",
    "PackedMask",
    "mask_reason",
    "pack_mask",
    "spec_from_mask",
    "unsupported",
]

_KINDS = (
    _masks.WindowMask,
    _masks.ValidLensMask,
    _masks.KeyPaddingMask,
    _masks.KeepMask,
    _masks.BiasMask,
)


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


def spec_from_mask(mask: _masks.Mask | None, L: int, S: int, device: torch.device) -> MaskSpec:
    """The mask's parts (all and-ed) as one clause, its bias parts summed."""
    clause = Clause()
    bias: torch.Tensor | None = None
    for part in mask.parts() if mask is not None else ():
        if isinstance(part, _masks.WindowMask):  # causal included
            shift = part.offset(L, S)
            if part.left is not None:
                lo = shift - part.left
                clause.lo = lo if clause.lo is None else max(clause.lo, lo)
            if part.right is not None:
                hi = shift + part.right
                clause.hi = hi if clause.hi is None else min(clause.hi, hi)
        elif isinstance(part, _masks.ValidLensMask):
            lens = part.lens.to(device)
            if lens.ndim == 2:
                clause.row_hi = _min(clause.row_hi, lens)  # (B0, L)
            else:
                clause.key_hi = _min(clause.key_hi, lens)  # (B0,)
            if part.query_lens is not None:
                clause.query_hi = _min(clause.query_hi, part.query_lens.to(device))  # (B0,)
        elif isinstance(part, _masks.KeyPaddingMask):
            kept = ~part.padding.to(device)  # (B0, S)
            clause.key_keep = kept if clause.key_keep is None else clause.key_keep & kept
        elif isinstance(part, _masks.KeepMask):
            t = part.tensor.to(device)
            clause.dense_keep = t if clause.dense_keep is None else clause.dense_keep & t
        elif isinstance(part, _masks.BiasMask):
            t = part.tensor.to(device)
            bias = t if bias is None else bias + t
        else:
            raise TypeError(f"triton backend: no kernel form for mask {type(part).__name__}")
    return MaskSpec([clause], bias)


def mask_reason(mask: _masks.Mask | None) -> str | None:
    """Why :func:`spec_from_mask` has no kernel form for ``mask``, from its parts' types
    alone (no tensor is touched: ``explain`` of any size allocates nothing)."""
    for part in mask.parts() if mask is not None else ():
        if not isinstance(part, _KINDS):
            return f"no kernel form for mask {type(part).__name__}"
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
