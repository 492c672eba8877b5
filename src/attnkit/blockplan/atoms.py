"""The vocabulary masks lower to: atoms, each one condition on a (query, key) pair.

A mask lowers (:meth:`attnkit.masks.Mask.lower`) to a disjunction of conjunctions of
atoms (:data:`DNF`): a pair is kept when every atom of at least one clause keeps it.
``[[]]`` keeps everything, ``[]`` keeps nothing. Every atom can be negated into a DNF
of atoms, so ``~`` and ``|`` of any keep-type masks stay symbolic.

Per-batch tensors have a first dim of B0 (the call's first batch dim) or 1
(broadcast over it). Atoms only hold tensors; :class:`attnkit.blockplan.clause.Clause`
folds the atoms of one clause into the fields kernels read (:meth:`Atom.add_to`), so
nothing downstream asks an atom for its type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .clause import Clause

__all__ = [
    "DNF",
    "MAX_CLAUSES",
    "Atom",
    "Band",
    "DenseBias",
    "DenseKeep",
    "Document",
    "KeyKeep",
    "KeyRange",
    "MaskTooComplex",
    "QueryRange",
    "RowRange",
    "conjoin",
    "logical_not",
    "negate",
]


class Atom:
    """One condition on a (query i, key j) pair of batch element b."""

    def add_to(self, clause: Clause) -> None:
        """Fold this condition into a clause (intersecting with what it holds)."""
        raise NotImplementedError

    def negate(self) -> DNF:
        """The pairs this atom does not keep, as a DNF of atoms."""
        raise NotImplementedError


DNF = list[list[Atom]]
"""A disjunction (outer list) of conjunctions (inner lists) of atoms."""


def logical_not(t: torch.Tensor) -> torch.Tensor:
    """``~t`` that keeps broadcast (zero-stride) dims broadcast: an expanded view is
    negated at its compact size, never materialized."""
    if torch.compiler.is_compiling():  # (strides may be symbols there; the graph fuses ~)
        return ~t
    compact = t
    for d in range(t.ndim):
        if t.stride(d) == 0 and t.shape[d] > 1:
            compact = compact.narrow(d, 0, 1)
    return (~compact).expand(t.shape) if compact is not t else ~t


MAX_CLAUSES = 1024
"""The most conjunctions a lowered mask may have. ``~`` of an ``|`` multiplies them out
(``~(x1 | x2 | ...)`` of clauses of k atoms has k^n clauses): three nested ``~`` over four
small masks reached millions, and lowering ran out of memory."""


class MaskTooComplex(ValueError):
    """A mask whose lowering would exceed :data:`MAX_CLAUSES` conjunctions: backends that
    keep masks symbolic decline it, and the reference backend builds it densely."""


def conjoin(a: DNF, b: DNF) -> DNF:
    """``a AND b`` distributed into one DNF; :class:`MaskTooComplex` past
    :data:`MAX_CLAUSES` conjunctions."""
    if len(a) * len(b) > MAX_CLAUSES:
        raise MaskTooComplex(
            f"mask: its & | ~ lower to {len(a) * len(b):,} conjunctions, more than "
            f"{MAX_CLAUSES:,} (a ~ of an | multiplies them out); the symbolic backends "
            "decline it and the reference backend builds it densely (or pass the mask as "
            "masks.keep(mask.to_dense(L, S, batch_shape)))"
        )
    return [x + y for x in a for y in b]


def negate(dnf: DNF) -> DNF:
    """``NOT dnf``: every clause fails, i.e. for each clause some atom fails."""
    out: DNF = [[]]
    for clause in dnf:
        failed: DNF = []
        for atom in clause:
            failed += atom.negate()
        out = conjoin(out, failed)
    return out


@dataclass(frozen=True)
class Band(Atom):
    """``i + lo <= j <= i + hi`` (None: that side unbounded). Causal and window masks,
    any alignment, are bands with the alignment folded into lo and hi."""

    lo: int | None
    hi: int | None

    def add_to(self, clause: Clause) -> None:
        clause.intersect_band(self.lo, self.hi)

    def negate(self) -> DNF:
        out: DNF = []
        if self.lo is not None:
            out.append([Band(None, self.lo - 1)])
        if self.hi is not None:
            out.append([Band(self.hi + 1, None)])
        return out


@dataclass(frozen=True, eq=False)
class KeyRange(Atom):
    """``lo[b] <= j < hi[b]``: lo, hi (B0,) long or None (unbounded)."""

    lo: torch.Tensor | None
    hi: torch.Tensor | None

    def add_to(self, clause: Clause) -> None:
        clause.intersect_keys(self.lo, self.hi)

    def negate(self) -> DNF:
        out: DNF = []
        if self.lo is not None:
            out.append([KeyRange(None, self.lo)])
        if self.hi is not None:
            out.append([KeyRange(self.hi, None)])
        return out


@dataclass(frozen=True, eq=False)
class QueryRange(Atom):
    """``lo[b] <= i < hi[b]``: rows outside are padding (fully masked)."""

    lo: torch.Tensor | None
    hi: torch.Tensor | None

    def add_to(self, clause: Clause) -> None:
        clause.intersect_queries(self.lo, self.hi)

    def negate(self) -> DNF:
        out: DNF = []
        if self.lo is not None:
            out.append([QueryRange(None, self.lo)])
        if self.hi is not None:
            out.append([QueryRange(self.hi, None)])
        return out


@dataclass(frozen=True, eq=False)
class RowRange(Atom):
    """``lo[b, i] <= j < hi[b, i]``: lo, hi (B0, L) long or None (per-query lengths)."""

    lo: torch.Tensor | None
    hi: torch.Tensor | None

    def add_to(self, clause: Clause) -> None:
        clause.intersect_rows(self.lo, self.hi)

    def negate(self) -> DNF:
        out: DNF = []
        if self.lo is not None:
            out.append([RowRange(None, self.lo)])
        if self.hi is not None:
            out.append([RowRange(self.hi, None)])
        return out


@dataclass(frozen=True, eq=False)
class KeyKeep(Atom):
    """``keep[b, j]``: (B0, S) bool, False = a padding key."""

    keep: torch.Tensor

    def add_to(self, clause: Clause) -> None:
        clause.intersect_key_keep(self.keep)

    def negate(self) -> DNF:
        return [[KeyKeep(logical_not(self.keep))]]


@dataclass(frozen=True, eq=False)
class Document(Atom):
    """Packed sequences: ``q_ids[b, i] == k_ids[b, j] and q_ids[b, i] >= 0`` (a negative
    id is padding), or with ``equal=False`` the opposite. q_ids (B0, L), k_ids (B0, S)
    long.

    Ids are any integers in any order: a document need not be one run of positions
    (see :mod:`.ragged`). Built with :meth:`numbered`, they are renumbered in order of
    value to ``0, 1, ...`` (padding to -1), so every consumer may hold them in int32.
    """

    q_ids: torch.Tensor
    k_ids: torch.Tensor
    equal: bool = True

    @classmethod
    def numbered(cls, q_ids: torch.Tensor, k_ids: torch.Tensor) -> Document:
        """The document condition of ids (B0 or 1, L) and (B0 or 1, S), renumbered per
        batch element in order of value: equal ids stay equal, order is kept (sorted ids
        stay sorted), padding becomes -1 and every id lies in [-1, L + S). Tensor
        operations only (a sort): no value is read on the host. One tensor for both
        when the queries and keys share their ids."""
        same = q_ids is k_ids
        if same:
            both = q_ids
        else:
            B = max(q_ids.shape[0], k_ids.shape[0])
            L, S = q_ids.shape[-1], k_ids.shape[-1]
            both = torch.cat([q_ids.expand(B, L), k_ids.expand(B, S)], dim=-1)  # (B, L + S)
        ordered, order = both.sort(dim=-1, stable=True)  # (B, N)
        new = ordered >= 0  # (B, N): a new document starts here (padding never does)
        new[..., 1:] &= ordered[..., 1:] != ordered[..., :-1]
        label = torch.empty_like(ordered).scatter_(-1, order, new.long().cumsum(-1) - 1)
        label = torch.where(both < 0, -1, label)  # (B, N)
        if same:
            return cls(label, label)
        return cls(label[..., : q_ids.shape[-1]], label[..., q_ids.shape[-1] :])

    def add_to(self, clause: Clause) -> None:
        clause.docs.append(self)

    def negate(self) -> DNF:
        return [[Document(self.q_ids, self.k_ids, not self.equal)]]


@dataclass(frozen=True, eq=False)
class DenseKeep(Atom):
    """``keep[..., i, j]``: a bool tensor broadcastable to (*batch, L, S)."""

    keep: torch.Tensor

    def add_to(self, clause: Clause) -> None:
        clause.dense_keep.append(self.keep)

    def negate(self) -> DNF:
        return [[DenseKeep(logical_not(self.keep))]]


@dataclass(frozen=True, eq=False)
class DenseBias(Atom):
    """An additive float tensor broadcastable to (*batch, L, S); ``-inf`` blocks. Only
    in conjunctions: the plan adds every bias, whatever clause keeps a pair."""

    bias: torch.Tensor

    def add_to(self, clause: Clause) -> None:
        clause.biases.append(self.bias)

    def negate(self) -> DNF:
        raise TypeError("mask ~: a bias mask adds values to the logits and has no negation")
