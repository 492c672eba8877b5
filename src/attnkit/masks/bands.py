"""Band masks: ``causal`` and ``window`` (any alignment, at global positions), and
``prefix_lm`` (a bidirectional prefix, causal after it).

The global positions of a band (``q_offset``/``k_offset``) are ints or 0-d integer
tensors. A tensor offset is data, not structure: a model compiled once keeps one graph
while the offset moves (a decode step against a static KV cache). Where the offset can
be read for free (a CPU tensor outside ``torch.compile``) the band lowers to the same
:class:`~attnkit.blockplan.atoms.Band` as an int offset; elsewhere it lowers to
per-query key ranges (:class:`~attnkit.blockplan.atoms.RowRange`) computed on the
device, with no host read.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

import torch

from .._args import MAX_POSITION, as_int, as_int_tensor
from .._host import readable
from ..blockplan.atoms import DNF, Band, KeyRange, RowRange
from .base import DenseMask, Mask, shape_str

__all__ = ["Align", "CausalMask", "PrefixLMMask", "WindowMask"]

Align = Literal["top_left", "bottom_right"]
_ALIGNS = ("top_left", "bottom_right")


Offset = int | torch.Tensor
"""A global position: an int, or a 0-d integer tensor (data a compiled graph reads)."""


def _check_offset(where: str, name: str, val: object) -> Offset:
    if isinstance(val, torch.Tensor):
        if val.dtype == torch.bool or val.is_floating_point() or val.is_complex():
            raise TypeError(f"{where}: {name} must have an integer dtype, got {val.dtype}")
        if val.numel() != 1:
            raise ValueError(
                f"{where}: {name} must be an int or a tensor of one element, got shape "
                f"{shape_str(val.shape)}"
            )
        return val.reshape(())  # (), a view
    return as_int(where, name, val, what="an int or a 0-d integer tensor")


def _wide(off: Offset) -> Offset:
    """A tensor offset in int64 (the arithmetic of an int32 one overflowed near 2**31);
    an int as it is."""
    return off.long() if isinstance(off, torch.Tensor) else off


def _read(off: Offset | torch.SymInt) -> int | None:
    """The offset as an int where that costs no host read of a device (else None; a
    symbolic size of torch.export or torch.compile, too: it stays a tensor)."""
    if isinstance(off, int):
        return off
    if isinstance(off, torch.Tensor) and readable(off):
        return int(off)
    return None


def _check_align(where: str, align: object) -> None:
    if align not in _ALIGNS:
        raise ValueError(f"{where}: align must be 'top_left' or 'bottom_right', got {align!r}")


def _band_keep(
    L: int, S: int, lo: Offset | None, hi: Offset | None, device: torch.device
) -> torch.Tensor:
    """Bool (L, S): query i keeps key j when i + lo <= j <= i + hi."""
    i = torch.arange(L, device=device).unsqueeze(-1)  # (L, 1)
    j = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    keep_t = torch.ones(L, S, dtype=torch.bool, device=device)
    if lo is not None:
        keep_t &= j >= i + _on(lo, device)
    if hi is not None:
        keep_t &= j <= i + _on(hi, device)
    return keep_t


def _on(x: Offset, device: torch.device) -> Offset:
    return x.to(device) if isinstance(x, torch.Tensor) else x


class WindowMask(Mask):
    """Sliding window: query ``i`` keeps keys ``i-left .. i+right`` inclusive.

    ``None`` for ``left`` or ``right`` means unbounded on that side. With
    ``align="bottom_right"`` the query index is shifted by ``S - L``.

    Global positions: query row ``i`` sits at position ``q_offset + i`` and key
    column ``j`` at ``k_offset + j`` (both default 0), so a block of a longer
    sequence is masked at its true positions; the window compares positions. An
    offset may be a 0-d integer tensor (see the module docstring).
    """

    kind = "window"
    _where = "masks.window"  # the constructor named in errors

    def __init__(
        self,
        left: int | None,
        right: int | None,
        align: Align = "top_left",
        *,
        q_offset: Offset = 0,
        k_offset: Offset = 0,
    ) -> None:
        where = self._where
        sides = []
        for name, val in (("left", left), ("right", right)):
            what = "an int >= 0 or None (unbounded)"
            sides.append(None if val is None else as_int(where, name, val, low=0, what=what))
        _check_align(where, align)
        self.left, self.right = sides
        self.align: Align = align
        self.q_offset = _check_offset(where, "q_offset", q_offset)
        self.k_offset = _check_offset(where, "k_offset", k_offset)

    def has_tensor_offsets(self) -> bool:
        return not (isinstance(self.q_offset, int) and isinstance(self.k_offset, int))

    def starts_queries_at_key_zero(self) -> bool:
        """Top-left at offsets 0 (tensor offsets are data, not read here)."""
        if self.align != "top_left" or self.has_tensor_offsets():
            return False
        return bool(self.q_offset == 0 and self.k_offset == 0)

    def static_key(self) -> tuple[object, ...] | None:
        """(class, left, right, align, offsets) while both offsets are ints; None for a
        tensor offset, which is data."""
        # (isinstance and __class__, not type(): a compiled call then guards on fewer names)
        if not (isinstance(self.q_offset, int) and isinstance(self.k_offset, int)):
            return None
        left, right = self._static_band()
        return (self.__class__, left, right, self.align, self.q_offset, self.k_offset)

    def _static_band(self) -> tuple[int | None, int | None]:
        """(left, right) for :meth:`static_key`."""
        return self.left, self.right

    @classmethod
    def from_static_key(cls, key: tuple[object, ...]) -> Mask:
        """The window whose :meth:`static_key` is ``key``: (class, left, right, align,
        q_offset, k_offset)."""
        _, left, right, align, q_offset, k_offset = key
        return WindowMask(left, right, align, q_offset=q_offset, k_offset=k_offset)  # type: ignore[arg-type]

    def offset(self, L: int, S: int) -> Offset:
        """Shift from a query's row to its own key column: query ``i`` keeps key ``j``
        when ``i + offset - left <= j <= i + offset + right``. ``S - L`` for
        bottom_right, plus ``q_offset - k_offset`` (a 0-d tensor when an offset is one)."""
        base = S - L if self.align == "bottom_right" else 0
        return base + _wide(self.q_offset) - _wide(self.k_offset)

    def bounds(self, L: int, S: int) -> tuple[Offset | None, Offset | None]:
        """(lo, hi): query i keeps key j when i + lo <= j <= i + hi (None: unbounded)."""
        off = self.offset(L, S)
        lo = None if self.left is None else off - self.left
        hi = None if self.right is None else off + self.right
        return lo, hi

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        return DenseMask(keep=_band_keep(L, S, *self.bounds(L, S), device))

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        off = self.offset(L, S)
        shift = _read(off)
        if shift is not None:
            lo = None if self.left is None else shift - self.left
            hi = None if self.right is None else shift + self.right
            return [[Band(lo, hi)]]
        # An offset that cannot be read for free: each query's key range, on the device.
        if not isinstance(off, torch.Tensor):  # a symbolic size (S - L under torch.export)
            off = torch.scalar_tensor(off, dtype=torch.long, device=device)  # ()
        rows = torch.arange(L, device=device) + off.to(device)  # (L,) key column of row i
        row_lo = None if self.left is None else (rows - self.left).view(1, L)  # (1, L)
        row_hi = None if self.right is None else (rows + self.right + 1).view(1, L)  # (1, L)
        if row_lo is None and row_hi is None:
            return [[]]
        return [[RowRange(row_lo, row_hi)]]

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        shift = self.offset(total_L, total_S) + q0 - k0  # global shift, seen from the shard
        return WindowMask(self.left, self.right, "top_left", q_offset=shift)

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(t for t in (self.q_offset, self.k_offset) if isinstance(t, torch.Tensor))

    def signature(self, L: int, S: int) -> tuple[object, ...]:
        offsets = (self.q_offset, self.k_offset)
        if any(isinstance(o, torch.Tensor) for o in offsets):
            # a tensor offset is data: its metadata only (and no tensor made to say so)
            ints = tuple(None if isinstance(o, torch.Tensor) else o for o in offsets)
            return (*super().signature(L, S), self.left, self.right, self.align, ints)
        return (type(self), self.left, self.right, self.align, self.offset(L, S))


_W = TypeVar("_W", bound=WindowMask)


def plain_band(
    cls: type[_W], left: object, right: object, align: object, q_offset: object, k_offset: object
) -> _W | None:
    """The band ``cls(...)`` makes of these arguments, built without its constructor's
    checks, when every argument already is what they would make of it: each side None or
    an int in [0, MAX_POSITION], an align name, each offset an int within
    ±MAX_POSITION. None otherwise, and the caller runs the constructor, which checks
    them (a NumPy int, say, is converted there) or raises.

    :func:`causal` and :func:`window` take this path first: a compiled call that builds
    its mask in its graph (``masks.causal()`` in a model's forward) traces no helper of
    the checks, each a guard on every call. The mask holds what the constructor sets, as
    ``tests/unit/test_masks.py`` checks."""
    if not (
        (left is None or (type(left) is int and 0 <= left <= MAX_POSITION))
        and (right is None or (type(right) is int and 0 <= right <= MAX_POSITION))
        and (align == "top_left" or align == "bottom_right")
        and type(q_offset) is int
        and -MAX_POSITION <= q_offset <= MAX_POSITION
        and type(k_offset) is int
        and -MAX_POSITION <= k_offset <= MAX_POSITION
    ):
        return None
    band = object.__new__(cls)
    band.left, band.right, band.align = left, right, align
    band.q_offset, band.k_offset = q_offset, k_offset
    return band


class CausalMask(WindowMask):
    """Causal: query ``i`` keeps keys ``j <= i`` (``j <= i + S - L`` when bottom_right).

    ``q_offset``/``k_offset`` place the rows and columns at global positions, as
    for :class:`WindowMask`.
    """

    kind = "causal"
    _where = "masks.causal"

    def __init__(
        self, align: Align = "top_left", *, q_offset: Offset = 0, k_offset: Offset = 0
    ) -> None:
        _check_align("masks.causal", align)
        super().__init__(None, 0, align, q_offset=q_offset, k_offset=k_offset)

    def _static_band(self) -> tuple[int | None, int | None]:
        """(None, 0), fixed by the class: read from no attribute, a compiled call that
        gets the mask from outside its graph guards on two attributes fewer."""
        return None, 0

    @classmethod
    def from_static_key(cls, key: tuple[object, ...]) -> Mask:
        """The causal mask whose :meth:`static_key` is ``key``: (class, None, 0, align,
        q_offset, k_offset)."""
        _, _, _, align, q_offset, k_offset = key
        return CausalMask(align, q_offset=q_offset, k_offset=k_offset)  # type: ignore[arg-type]

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        shift = self.offset(total_L, total_S) + q0 - k0
        return CausalMask("top_left", q_offset=shift)


class PrefixLMMask(Mask):
    """Prefix LM: key ``j`` is kept for query ``i`` when ``j < prefix`` (the prefix is
    seen by every query, in both directions) or ``j <= i`` (causal after it).

    ``prefix`` is one int or a (B,) tensor of per-batch prefix lengths, counted in
    global key positions: with ``k_offset`` the prefix covers the keys at positions
    ``k_offset + j < prefix``. ``align`` and the offsets place the causal part as for
    :func:`attnkit.masks.causal`.
    """

    kind = "prefix_lm"

    def __init__(
        self,
        prefix: int | torch.Tensor | Sequence[int],
        align: Align = "top_left",
        *,
        q_offset: Offset = 0,
        k_offset: Offset = 0,
    ) -> None:
        what = "an int >= 0 or a (B,) integer tensor"
        if isinstance(prefix, (bool, numbers.Number, str, bytes)):
            lens = torch.tensor([as_int("masks.prefix_lm", "prefix", prefix, low=0, what=what)])
        else:
            lens = as_int_tensor("masks.prefix_lm", "prefix", prefix, ndims=(1,), layout="(B,)")
        for name, val in (("q_offset", q_offset), ("k_offset", k_offset)):
            _check_offset("masks.prefix_lm", name, val)
        from .._host import readable

        if readable(lens) and lens.numel() and int(lens.min()) < 0:
            raise ValueError(f"masks.prefix_lm: prefix lengths must be >= 0, got {int(lens.min())}")
        _check_align("masks.prefix_lm", align)
        self.prefix = lens.to(torch.long)  # (B,) or (1,)
        self.causal = CausalMask(align, q_offset=q_offset, k_offset=k_offset)
        # the global position of this mask's key column 0, which the prefix counts from:
        # k_offset, plus a shard's first key
        self._k_first: Offset = self.causal.k_offset

    def starts_queries_at_key_zero(self) -> bool:
        """Whether its causal part is top-left at offsets 0."""
        return self.causal.starts_queries_at_key_zero()

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        n = self.prefix.shape[0]
        if n != 1 and (not batch_shape or batch_shape[0] != n):
            raise ValueError(
                f"mask: masks.prefix_lm has {n} prefix lengths, expected one or one per batch "
                f"element (first leading dim {batch_shape[0] if batch_shape else 'absent'})"
            )
        from .._host import readable

        if readable(self.prefix) and self.prefix.numel() and int(self.prefix.min()) < 0:
            raise ValueError(
                f"masks.prefix_lm: prefix lengths must be >= 0, got {int(self.prefix.min())}"
            )

    def _prefix_local(self, device: torch.device) -> torch.Tensor:
        """The prefix in this mask's own key columns: the keys at global positions below
        ``prefix``, column 0 sitting at ``_k_first`` (``k_offset``, plus a shard's first
        key)."""
        first = _wide(self._k_first)
        first = first.to(device) if isinstance(first, torch.Tensor) else first
        return (self.prefix.to(device) - first).clamp(min=0)  # (B or 1,)

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        causal = self.causal.dense(L, S, batch_shape, device).keep  # (L, S)
        assert causal is not None
        j = torch.arange(S, device=device)  # (S,)
        prefix = j.view(1, 1, S) < self._prefix_local(device).view(-1, 1, 1)  # (B or 1, 1, S)
        keep = causal | prefix  # (B or 1, L, S)
        if self.prefix.shape[0] == 1:
            return DenseMask(keep=keep[0])  # (L, S)
        keep = keep.view(keep.shape[0], *([1] * (len(batch_shape) - 1)), L, S)  # (B, 1.., L, S)
        return DenseMask(keep=keep)

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        return [*self.causal.lower(L, S, device), [KeyRange(None, self._prefix_local(device))]]

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        shard = PrefixLMMask.__new__(PrefixLMMask)
        shard.prefix = self.prefix
        shard._k_first = self._k_first + k0
        shard.causal = self.causal._shard(q0, k0, L, S, total_L, total_S)  # type: ignore[assignment]
        return shard

    def has_tensor_offsets(self) -> bool:
        return self.causal.has_tensor_offsets()

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        # with the causal part's tensor offsets, and a shard's own first key
        own = self.causal._tensors()
        first = self._k_first
        if isinstance(first, torch.Tensor) and not any(first is t for t in own):
            own = (*own, first)
        return (self.prefix, *own)

    def map_tensors(self, fn: Callable[[torch.Tensor, str], torch.Tensor]) -> Mask:
        out = PrefixLMMask.__new__(PrefixLMMask)
        out.prefix = fn(self.prefix, "batch") if self.prefix.shape[0] != 1 else self.prefix
        out.causal, out._k_first = self.causal, self._k_first
        return out

    def signature(self, L: int, S: int) -> tuple[object, ...]:
        first = None if isinstance(self._k_first, torch.Tensor) else self._k_first  # (data)
        return (*super().signature(L, S), self.causal.signature(L, S), first)


# ------------------------------------------------------------------ constructors


def causal(align: Align = "top_left", *, q_offset: Offset = 0, k_offset: Offset = 0) -> CausalMask:
    """Causal mask; ``align`` is ``"top_left"`` (SDPA, Keras) or ``"bottom_right"``.

    ``q_offset``/``k_offset``: global positions of the first query row and key column
    (for a block of a longer sequence); query at position p sees keys at positions <= p.
    Each is an int or a 0-d integer tensor (data: a compiled model keeps one graph while
    it changes, e.g. decoding against a static KV cache).

    Args:
        align: ``"top_left"`` (default; SDPA's ``is_causal``, Keras): query ``i`` keeps
            keys ``j <= i``. ``"bottom_right"`` (FlashAttention, a KV cache): the last
            query is aligned with the last key, query ``i`` keeps ``j <= i + S - L``.
        q_offset: global position of query row 0 (default 0).
        k_offset: global position of key column 0 (default 0).

    Returns:
        A :class:`CausalMask`, kept symbolic (kernels skip the blocks above the
        diagonal). A row that keeps no key (with ``"bottom_right"`` and L > S, the
        first L - S rows) gives output 0, weights 0 and lse -inf.

    Raises:
        ValueError: ``align`` is neither name, or an offset tensor has more than one
            element.
        TypeError: an offset is not an int or an integer tensor.

    Examples:
        >>> from attnkit import masks
        >>> masks.causal("bottom_right").to_dense(2, 4).int()   # L=2 new queries, S=4
        tensor([[1, 1, 1, 0],
                [1, 1, 1, 1]], dtype=torch.int32)
    """
    plain = plain_band(CausalMask, None, 0, align, q_offset, k_offset)
    if plain is not None:
        return plain
    return CausalMask(align, q_offset=q_offset, k_offset=k_offset)


def window(
    left: int | None,
    right: int | None = 0,
    align: Align = "top_left",
    *,
    q_offset: Offset = 0,
    k_offset: Offset = 0,
) -> WindowMask:
    """Sliding window: query i keeps keys i-left .. i+right inclusive (None = unbounded).

    ``q_offset``/``k_offset``: global positions of the first query row and key column,
    ints or 0-d integer tensors (as for :func:`causal`).

    Args:
        left: how many keys before the query's own position it keeps, an int >= 0, or
            None (unbounded).
        right: how many keys after it, an int >= 0 or None (unbounded); default 0, so
            ``window(left)`` is a causal sliding window of ``left + 1`` keys.
        align: ``"top_left"`` (default) or ``"bottom_right"`` (the query index is
            shifted by ``S - L``), as for :func:`causal`.
        q_offset: global position of query row 0 (default 0).
        k_offset: global position of key column 0 (default 0).

    Returns:
        A :class:`WindowMask`, kept symbolic (kernels skip the blocks outside the
        band). A row that keeps no key gives output 0, weights 0 and lse -inf.

    Raises:
        TypeError, ValueError: ``left`` or ``right`` is not None or an int >= 0,
            ``align`` is neither name, or an offset is not an int or a one-element
            integer tensor.

    Examples:
        >>> from attnkit import masks
        >>> masks.window(1).to_dense(4, 4).int()               # keys i-1 .. i
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    plain = plain_band(WindowMask, left, right, align, q_offset, k_offset)
    if plain is not None:
        return plain
    return WindowMask(left, right, align, q_offset=q_offset, k_offset=k_offset)


def prefix_lm(
    prefix: int | torch.Tensor | Sequence[int],
    align: Align = "top_left",
    *,
    q_offset: Offset = 0,
    k_offset: Offset = 0,
) -> PrefixLMMask:
    """Prefix LM: keys ``j < prefix`` are seen by every query (a bidirectional prefix),
    and key ``j`` by query ``i`` when ``j <= i`` (causal). ``prefix``: an int or a (B,)
    tensor of per-batch lengths; ``align`` and the offsets as for :func:`causal`. Both
    count global positions: with ``k_offset``, key column ``c`` is position
    ``k_offset + c``, in the prefix when that is below ``prefix``.

    Args:
        prefix: the prefix length, an int >= 0 for every batch element, or a (B,)
            integer tensor (or list) of per-batch lengths, B the query's first leading
            dim.
        align: ``"top_left"`` (default) or ``"bottom_right"``: where the causal part
            sits when L != S, as for :func:`causal`.
        q_offset: keyword-only, global position of query row 0 (default 0): an int or
            a 0-d integer tensor, as for :func:`causal`.
        k_offset: keyword-only, global position of key column 0 (default 0), likewise;
            the prefix is compared with these global positions.

    Returns:
        A :class:`PrefixLMMask` (the prefix OR the causal band), kept symbolic.

    Raises:
        TypeError, ValueError: ``prefix`` is not an int >= 0 or a (B,) integer tensor
            of lengths >= 0, ``align`` is neither name, or an offset is not an int or a
            one-element integer tensor; when the mask is used, B lengths for a call whose
            batch is not B.

    Examples:
        >>> from attnkit import masks
        >>> masks.prefix_lm(2).to_dense(4, 4).int()
        tensor([[1, 1, 0, 0],
                [1, 1, 0, 0],
                [1, 1, 1, 0],
                [1, 1, 1, 1]], dtype=torch.int32)
    """
    return PrefixLMMask(prefix, align, q_offset=q_offset, k_offset=k_offset)
