"""Per-batch masks: ``valid_lens`` (d2l), ``key_padding`` (torch), ``document`` (packed
sequences)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .._args import MAX_POSITION, as_bool, as_int_tensor
from .._host import readable
from ..blockplan.atoms import (
    DNF,
    Atom,
    Document,
    KeyKeep,
    KeyRange,
    QueryRange,
    RowRange,
    logical_not,
)
from .base import DenseMask, Mask, shape_str

__all__ = ["DocumentMask", "KeyPaddingMask", "ValidLensMask"]


def _needs_batch(where: str, batch_shape: Sequence[int]) -> int:
    if len(batch_shape) == 0:
        raise ValueError(
            f"mask: {where} needs a batch dim; the query has shape (L, E) with no leading dims, "
            "expected (B, ..., L, E)"
        )
    return int(batch_shape[0])


def _per_batch(t: torch.Tensor, batch_shape: Sequence[int]) -> torch.Tensor:
    """(B, ...) -> (B, 1, ..., 1, ...): broadcast over the other leading dims (heads)."""
    return t.view(t.shape[0], *([1] * (len(batch_shape) - 1)), *t.shape[1:])


class ValidLensMask(Mask):
    """d2l's ``valid_lens``: key ``j`` is kept for batch ``b`` when ``j < lens[b]``.

    ``lens`` has shape (B,) (one length per batch element) or (B, L) (one per
    query). B is the first leading dim of the query; the lengths broadcast over
    the other leading dims (heads). With ``queries=True`` (1-D lens only), query
    rows at or past the length are padding too and become fully masked rows.

    Attributes:
        lens: (B,) or (B, L) long, the key lengths.
        queries: True when query rows past a length are padding too.
        query_lens: (B,) long, the query lengths when ``queries`` (``lens`` unless the
            mask is a shard of a longer sequence), else None; read only.
    """

    kind = "valid_lens"

    def __init__(self, lens: torch.Tensor | Sequence[int], queries: bool = False) -> None:
        lens = as_int_tensor(
            "masks.valid_lens", "lens", lens, ndims=(1, 2), layout="(B,) or (B, L)"
        )
        as_bool("masks.valid_lens", "queries", queries)
        if readable(lens) and lens.numel() and int(lens.min()) < 0:
            raise ValueError(
                f"masks.valid_lens: lengths must be >= 0, got minimum {int(lens.min())}"
            )
        if queries and lens.ndim != 1:
            raise ValueError(
                "masks.valid_lens: queries=True needs one length per batch element, shape (B,); "
                f"got {shape_str(lens.shape)}"
            )
        self.lens = lens.to(torch.long)
        self.queries = queries
        self._shard_query_lens: torch.Tensor | None = None  # a shard's own, else ``lens``

    @property
    def query_lens(self) -> torch.Tensor | None:
        """(B,) long, the query lengths when ``queries`` (``lens``, read anew when the
        field is set anew, unless the mask is a shard of a longer sequence), else None."""
        if not self.queries:
            return None
        return self.lens if self._shard_query_lens is None else self._shard_query_lens

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        B = _needs_batch("masks.valid_lens", batch_shape)
        if self.lens.shape[0] != B:
            raise ValueError(
                f"mask: masks.valid_lens has {self.lens.shape[0]} lengths, but the batch dim "
                f"(first leading dim) is {B}; expected shape ({B},) or ({B}, {L})"
            )
        if self.lens.ndim == 2 and self.lens.shape[1] != L:
            raise ValueError(
                f"mask: masks.valid_lens per-query lengths have shape "
                f"{shape_str(self.lens.shape)}, expected ({B}, {L}) for L={L} queries"
            )
        if not readable(self.lens) or not self.lens.numel():
            return  # the value checks below read the lengths on the host: CPU, eager only
        lo, hi = (int(x) for x in torch.aminmax(self.lens))  # (again at each call: an
        if lo < 0:  # in-place edit since the mask was made is checked too)
            raise ValueError(f"masks.valid_lens: lengths must be >= 0, got minimum {lo}")
        if hi > S:
            raise ValueError(
                f"mask: masks.valid_lens has a length of {hi}, more than the "
                f"{S} keys; expected lengths in [0, {S}]"
            )
        ql = self.query_lens
        if ql is not None and int(ql.max()) > L:
            raise ValueError(
                f"mask: masks.valid_lens(queries=True) has a length of {int(ql.max())}, "
                f"more than the {L} queries; expected lengths in [0, min(L, S)]"
            )

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        lens = self.lens.to(device)
        j = torch.arange(S, device=device)
        if lens.ndim == 1:
            keep_t = j.view(1, 1, S) < lens.view(-1, 1, 1)  # (B, 1, S)
            if self.query_lens is not None:
                i = torch.arange(L, device=device)
                q_lens = self.query_lens.to(device)
                keep_t = keep_t & (i.view(1, L, 1) < q_lens.view(-1, 1, 1))  # (B, L, S)
        else:
            keep_t = j.view(1, 1, S) < lens.unsqueeze(-1)  # (B, L, S)
        return DenseMask(keep=_per_batch(keep_t, batch_shape))  # (B, 1.., L|1, S)

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        lens = self.lens.to(device)
        atoms: list[Atom] = [RowRange(None, lens) if lens.ndim == 2 else KeyRange(None, lens)]
        if self.query_lens is not None:
            atoms.append(QueryRange(None, self.query_lens.to(device)))
        return [atoms]

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        lens = self.lens
        if lens.ndim == 2:
            lens = lens[:, q0 : q0 + L]  # (B, L) rows of this shard
        shard = ValidLensMask.__new__(ValidLensMask)
        shard.lens = (lens - k0).clamp(0, S)  # (B,) or (B, L): keys left in this shard
        shard.queries = self.queries
        shard._shard_query_lens = None
        if self.query_lens is not None:
            shard._shard_query_lens = (self.query_lens - q0).clamp(0, L)  # (B,)
        return shard

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.lens,) if self.query_lens is None else (self.lens, self.query_lens)

    def map_tensors(self, fn: Callable[[torch.Tensor, str], torch.Tensor]) -> Mask:
        out = ValidLensMask.__new__(ValidLensMask)
        out.lens = fn(self.lens, "batch")
        out.queries = self.queries
        own = self._shard_query_lens
        out._shard_query_lens = None if own is None else fn(own, "batch")
        return out

    def signature(self, L: int, S: int) -> tuple[object, ...]:
        return (*super().signature(L, S), self.queries)


class KeyPaddingMask(Mask):
    """Padding keys: bool (B, S), True = padding (torch's ``key_padding_mask``)."""

    kind = "key_padding"

    def __init__(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"masks.key_padding: expected a bool tensor of shape (B, S), got "
                f"{type(tensor).__name__}"
            )
        if tensor.dtype != torch.bool:
            raise TypeError(
                f"masks.key_padding: expected a bool tensor (True = padding), got dtype "
                f"{tensor.dtype}; for an additive float mask use masks.bias"
            )
        if tensor.ndim != 2:
            raise ValueError(
                f"masks.key_padding: expected shape (B, S), got {shape_str(tensor.shape)}"
            )
        self.padding = tensor

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        B = _needs_batch("masks.key_padding", batch_shape)
        if tuple(self.padding.shape) != (B, S):
            raise ValueError(
                f"mask: masks.key_padding has shape {shape_str(self.padding.shape)}, expected "
                f"(B, S) = ({B}, {S})"
            )

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        keep_t = ~self.padding.to(device)  # (B, S)
        return DenseMask(keep=_per_batch(keep_t.unsqueeze(1), batch_shape))

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        return [[KeyKeep(logical_not(self.padding.to(device)))]]

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        return KeyPaddingMask(self.padding[:, k0 : k0 + S])  # (B, S) keys of this shard

    def map_tensors(self, fn: Callable[[torch.Tensor, str], torch.Tensor]) -> Mask:
        return KeyPaddingMask(fn(self.padding, "batch"))

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.padding,)


class DocumentMask(Mask):
    """Packed sequences: query ``i`` keeps key ``j`` when both belong to the same document.

    ``ids``: (N,) or (B, N) integer document ids of the positions (queries and keys
    of a self-attention); a negative id marks padding, which keeps nothing and is kept
    by nothing. ``key_ids``: (S,) or (B, S) ids of the keys when they differ from the
    queries' (e.g. cross attention between two packed batches). Combine with
    ``masks.causal()`` for causal packed training, like FlashAttention's varlen
    kernels and FlexAttention's document masks.
    """

    kind = "document"
    #: how the caller gave the ids, for messages: "ids", or "lengths" (from_lengths)
    _given_as = "ids"

    def __init__(
        self,
        ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int]],
        key_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int]] | None = None,
    ) -> None:
        layout = "(N,) or (B, N)"
        q = as_int_tensor("masks.document", "ids", ids, ndims=(1, 2), layout=layout)
        self.q_ids = q
        self.k_ids = q
        if key_ids is not None:
            layout = "(S,) or (B, S)"
            self.k_ids = as_int_tensor("masks.document", "key_ids", key_ids, ndims=(1, 2),
                                       layout=layout)  # fmt: skip

    @classmethod
    def from_lengths(
        cls, lengths: torch.Tensor | Sequence[int] | Sequence[Sequence[int]]
    ) -> DocumentMask:
        """Documents of given lengths packed one after another: (D,) for one sequence, or
        (B, D) per batch element (zero lengths allowed); positions past a row's total are
        padding (id -1)."""
        if torch.compiler.is_compiling():
            raise ValueError(
                "masks.document: lengths= sizes the ids from the lengths' values, which "
                "torch.compile cannot trace; build the mask outside the compiled function and "
                "pass it in, or give the ids: masks.document(ids)"
            )
        lens = as_int_tensor("masks.document", "lengths", lengths, ndims=(1, 2),
                             layout="(D,) or (B, D)")  # fmt: skip
        if lens.numel() and int(lens.min()) < 0:
            raise ValueError(f"masks.document: lengths must be >= 0, got {int(lens.min())}")
        rows = lens.unsqueeze(0) if lens.ndim == 1 else lens  # (B, D)
        total = float(rows.double().sum(dim=1).max()) if rows.numel() else 0.0  # no overflow
        if total > MAX_POSITION:
            raise ValueError(
                f"masks.document: lengths must add up to at most {MAX_POSITION} positions per "
                f"row, got {total:.4g}"
            )
        n = int(rows.sum(dim=1).max()) if rows.numel() else 0
        pos = torch.arange(n)  # (N,)
        ends = rows.cumsum(dim=1)  # (B, D)
        ids = torch.searchsorted(ends, pos.expand(rows.shape[0], n).contiguous(), right=True)
        ids = torch.where(pos < ends[:, -1:], ids, -1) if rows.shape[1] else -torch.ones_like(ids)
        mask = cls(ids if lens.ndim == 2 else ids[0])
        mask._given_as = "lengths"
        return mask

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        for name, t, n in (("ids", self.q_ids, L), ("key_ids", self.k_ids, S)):
            if t.shape[-1] != n:
                what = "queries" if name == "ids" else "keys"
                if self._given_as == "lengths":
                    raise ValueError(
                        f"mask: masks.document lengths add up to {t.shape[-1]} positions (the "
                        f"longest row), but the call has {n} {what}; expected lengths whose "
                        f"longest row adds up to {n}; to pad the rest, give ids with -1 there: "
                        f"masks.document(ids)"
                    )
                given = (
                    name
                    if name == "ids" or self.k_ids is not self.q_ids
                    else ("ids (the keys' ids too: key_ids not given)")
                )
                raise ValueError(
                    f"mask: masks.document {given} cover {t.shape[-1]} positions, but the call "
                    f"has {n} {what}; expected shape (N,) or (B, N) with N = {n}"
                    + (" (give key_ids when queries and keys differ)" if L != S else "")
                )
            if t.ndim == 2:
                B = _needs_batch("masks.document with (B, N) ids", batch_shape)
                if t.shape[0] != 1 and t.shape[0] != B:  # (not `in`, as in check_broadcast_to)
                    raise ValueError(
                        f"mask: masks.document {name} have {t.shape[0]} rows, but the batch dim "
                        f"(first leading dim) is {B}"
                    )

    def _ids(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(B or 1, L) and (B or 1, S) ids on ``device``; one tensor object for both when the
        queries and keys share their ids (self-attention), which the plan relies on."""
        q = self.q_ids.to(device)
        q = q if q.ndim == 2 else q.unsqueeze(0)  # (B or 1, L)
        if self.k_ids is self.q_ids:
            return q, q
        k = self.k_ids.to(device)
        return q, (k if k.ndim == 2 else k.unsqueeze(0))  # (B or 1, S)

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        q, k = self._ids(device)  # (B or 1, L), (B or 1, S)
        keep = (q.unsqueeze(-1) == k.unsqueeze(-2)) & (q.unsqueeze(-1) >= 0)  # (B or 1, L, S)
        if keep.shape[0] == 1 and self.q_ids.ndim == 1 and self.k_ids.ndim == 1:
            return DenseMask(keep=keep[0])  # (L, S)
        return DenseMask(keep=_per_batch(keep, batch_shape))  # (B, 1.., L, S)

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        return [[Document.numbered(*self._ids(device))]]

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        shard = DocumentMask.__new__(DocumentMask)
        shard.q_ids = self.q_ids[..., q0 : q0 + L]  # (..., L)
        shard.k_ids = self.k_ids[..., k0 : k0 + S]  # (..., S)
        return shard

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.q_ids,) if self.k_ids is self.q_ids else (self.q_ids, self.k_ids)

    def map_tensors(self, fn: Callable[[torch.Tensor, str], torch.Tensor]) -> Mask:
        out = DocumentMask.__new__(DocumentMask)
        for name, t in (("q_ids", self.q_ids), ("k_ids", self.k_ids)):
            setattr(out, name, fn(t, "batch") if t.ndim == 2 else t)  # (N,) has no batch dim
        if self.k_ids is self.q_ids:
            out.k_ids = out.q_ids
        return out


# ------------------------------------------------------------------ constructors


def valid_lens(lens: torch.Tensor | Sequence[int], queries: bool = False) -> ValidLensMask:
    """d2l's ``valid_lens``: key ``j`` is kept when ``j < length``.

    Args:
        lens: int lengths in [0, S] (an integer tensor or a list of ints): (B,), one
            per batch element (first leading dim of the query; they broadcast over the
            other leading dims, e.g. heads), or (B, L), one per query row.
        queries: False (default, d2l's behaviour): only keys are masked. True (needs
            (B,) lengths): query rows ``i >= length`` are padding too and become fully
            masked rows (output 0, weights 0, lse -inf), for self-attention over padded
            sequences.

    A row that keeps no key (a length of 0) gives output 0 and weights 0, where d2l's
    ``masked_softmax`` gives a uniform row (see :func:`attnkit.masked_softmax`).

    Returns:
        A :class:`ValidLensMask`, kept symbolic: kernels skip the keys past each
        length instead of reading a dense mask.

    Raises:
        TypeError: ``lens`` does not have an integer dtype, or ``queries`` is not a bool.
        ValueError: ``lens`` is not (B,) or (B, L), holds a negative length, or is
            (B, L) with ``queries=True``. When the mask is used: the query has no batch
            dim, B or L differs from the call's, or a length exceeds S (or L with
            ``queries=True``; the lengths are read for a CPU tensor only).

    Examples:
        >>> import torch
        >>> from attnkit import masks
        >>> masks.valid_lens(torch.tensor([1, 3])).to_dense(3, 3, (2,)).int()
        tensor([[[1, 0, 0],
                 [1, 0, 0],
                 [1, 0, 0]],
        <BLANKLINE>
                [[1, 1, 1],
                 [1, 1, 1],
                 [1, 1, 1]]], dtype=torch.int32)
    """
    return ValidLensMask(lens, queries=queries)


def key_padding(tensor: torch.Tensor) -> KeyPaddingMask:
    """Key padding: bool (B, S), True = padding key (torch MHA's ``key_padding_mask``).

    Args:
        tensor: bool of shape exactly (B, S), True = key ``j`` of batch element ``b`` is
            padding and no query attends to it (torch's ``key_padding_mask`` polarity).
            B is the first leading dim of the query; the mask broadcasts over the
            other leading dims (heads) and over every query row.

    Returns:
        A :class:`KeyPaddingMask`, kept symbolic (kernels skip padding keys). A batch
        element whose keys are all padding gives output 0, weights 0 and lse -inf for
        every row (no NaN).

    Raises:
        TypeError: ``tensor`` is not a torch.Tensor, or not bool (for an additive float
            mask use :func:`bias`).
        ValueError: ``tensor`` is not 2-D; when the mask is used, its shape is not the
            call's (B, S) or the query has no batch dim.

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import masks
        >>> q = k = v = torch.randn(2, 4, 3, 8)                 # (B, H, L, E)
        >>> pad = torch.tensor([[False, False, True], [False, False, False]])
        >>> a = attnkit.attention(q, k, v, mask=masks.key_padding(pad))
        >>> torch.allclose(a, attnkit.attention(q, k, v, mask=masks.valid_lens([2, 3])))
        True
    """
    return KeyPaddingMask(tensor)


def document(
    ids: torch.Tensor | Sequence[int] | None = None,
    *,
    lengths: torch.Tensor | Sequence[int] | Sequence[Sequence[int]] | None = None,
    key_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int]] | None = None,
) -> DocumentMask:
    """Packed sequences: a query keeps the keys of its own document.

    Give either ``ids``, the document id of every position, (N,) or (B, N) (a
    negative id marks padding), or ``lengths``, the documents' lengths packed one
    after another, (D,) or (B, D). ``key_ids`` (S,) or (B, S): ids of the keys when
    they differ from the queries'. ``masks.document(ids) & masks.causal()`` is causal
    packed training.

    Args:
        ids: integer document id of each position, (N,) for every batch element or
            (B, N) per batch element (B: the query's first leading dim), N = L; query
            ``i`` keeps key ``j`` when their ids are equal and not negative. A negative
            id is padding: it keeps nothing and is kept by nothing.
        lengths: keyword-only, the documents' lengths (ints >= 0), (D,) or (B, D).
            The longest row's total is the call's L; in a (B, D) row that adds up to
            less, the positions past its total are padding. (Padding at the end of
            every row: ``ids`` with -1 there.)
        key_ids: keyword-only, with ``ids`` only: the keys' ids, (S,) or (B, S), when
            the keys are not the queries (cross-attention between packed batches);
            default None, the keys have the queries' ids.

    Returns:
        A :class:`DocumentMask`, kept symbolic (kernels skip the blocks between
        documents). A padding row (or a document with no key) gives output 0,
        weights 0 and lse -inf.

    Raises:
        TypeError: neither or both of ``ids`` and ``lengths``, ``key_ids`` with
            ``lengths``, or ids that are not integers.
        ValueError: a shape other than those above, or a negative length; when the mask
            is used, ids that do not cover the call's L queries (or ``key_ids`` its S
            keys), lengths whose longest row does not add up to L, or B rows that are
            not the call's batch.

    Examples:
        >>> from attnkit import masks
        >>> masks.document(lengths=[2, 1]).to_dense(3, 3).int()
        tensor([[1, 1, 0],
                [1, 1, 0],
                [0, 0, 1]], dtype=torch.int32)
    """
    if (ids is None) == (lengths is None):
        raise TypeError("masks.document: give exactly one of ids or lengths")
    if lengths is not None:
        if key_ids is not None:
            raise TypeError("masks.document: key_ids goes with ids, not with lengths")
        return DocumentMask.from_lengths(lengths)
    assert ids is not None
    return DocumentMask(ids, key_ids)
