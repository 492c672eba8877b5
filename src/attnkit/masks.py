"""Masks: every convention enters through a named constructor, one polarity inside.

Inside attnkit a boolean mask means **True = may attend**. Every other convention
is converted by the constructor that names it, so no call is ambiguous:

==================  ===========================================================
constructor         convention
==================  ===========================================================
``keep(t)``         bool, True = may attend (attnkit's own polarity)
``block(t)``        bool, True = masked (``torch.nn.MultiheadAttention``)
``bias(t)``         float, added to the logits (``-inf`` blocks)
``tf(t)``           0/1, 1 = masked (TensorFlow tutorial's ``mask * -1e9``)
``valid_lens(l)``   d2l: key ``j`` kept when ``j < l``; (B,) or (B, L)
``key_padding(t)``  bool (B, S), True = padding key
``causal()``        query ``i`` sees keys ``j <= i`` (alignment explicit)
``window(l, r)``    query ``i`` sees keys ``i-l .. i+r`` inclusive
==================  ===========================================================

Masks combine with ``&``: a key is kept when every part keeps it, and additive
biases add up. Structured masks (causal, window, valid_lens, key_padding) stay
symbolic so kernels can skip blocks and padding; :meth:`Mask.to_dense` builds the
materialized form for the reference path and for pictures.

Alignment of causal and window masks when ``L != S``::

    top_left (SDPA, Keras)          bottom_right (FlashAttention, KV cache)
    L=3, S=5                        L=3, S=5
    q0: x . . . .                   q0: x x x . .
    q1: x x . . .                   q1: x x x x .
    q2: x x x . .                   q2: x x x x x
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ._host import readable

__all__ = [
    "AndMask",
    "BiasMask",
    "CausalMask",
    "DenseMask",
    "KeepMask",
    "KeyPaddingMask",
    "Mask",
    "ValidLensMask",
    "WindowMask",
    "bias",
    "block",
    "causal",
    "keep",
    "key_padding",
    "tf",
    "valid_lens",
    "window",
]

Align = Literal["top_left", "bottom_right"]
_ALIGNS = ("top_left", "bottom_right")


@dataclass(frozen=True)
class DenseMask:
    """A materialized mask: ``keep`` (bool, True = may attend) and/or ``bias`` (float).

    Each is ``None`` or a tensor broadcastable to ``batch_shape + (L, S)``.
    """

    keep: torch.Tensor | None
    bias: torch.Tensor | None


def _shape_str(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(d)) for d in shape) + ")"


def _check_broadcast_to(
    what: str, shape: Sequence[int], target: Sequence[int], hint: str = ""
) -> None:
    """Raise ValueError unless ``shape`` broadcasts to ``target`` without growing it."""
    ok = len(shape) <= len(target) and all(
        s in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False)
    )
    if not ok:
        raise ValueError(
            f"mask: {what} has shape {_shape_str(shape)}, which does not broadcast to the "
            f"attention shape {_shape_str(target)} (batch dims..., L, S){hint}"
        )


def _and_hint(other: object) -> str:
    what = f"a {other.dtype} tensor" if isinstance(other, torch.Tensor) else type(other).__name__
    return (
        f"mask &: both sides must be attnkit masks, got {what}; wrap a tensor first: "
        "masks.keep(t) (bool, True = may attend), masks.block(t) (bool, True = masked), "
        "masks.bias(t) (float, added to the logits) or masks.tf(t) (1 = masked)"
    )


def _check_shard(q_start: int, k_start: int, L: int, S: int, total_L: int, total_S: int) -> None:
    args = {"q_start": q_start, "k_start": k_start, "L": L, "S": S}
    args.update(total_L=total_L, total_S=total_S)
    for name, val in args.items():
        if isinstance(val, bool) or not isinstance(val, int) or val < 0:
            raise ValueError(f"mask.shard: {name} must be an int >= 0, got {val!r}")
    if q_start + L > total_L or k_start + S > total_S:
        raise ValueError(
            f"mask.shard: queries [{q_start}, {q_start + L}) and keys [{k_start}, {k_start + S}) "
            f"must lie inside the full problem of {total_L} queries and {total_S} keys"
        )


def _slice_last2(t: torch.Tensor, q0: int, k0: int, L: int, S: int) -> torch.Tensor:
    """t (..., L_total or 1, S_total or 1) or (S_total,) sliced to the shard; size-1 dims kept."""
    if t.shape[-1] != 1:
        t = t[..., k0 : k0 + S]  # (..., *, S)
    if t.ndim >= 2 and t.shape[-2] != 1:
        t = t[..., q0 : q0 + L, :]  # (..., L, S or 1)
    return t


def _tensor_signature(t: torch.Tensor) -> tuple[object, ...]:
    return (tuple(t.shape), t.dtype, t.device.type, t.requires_grad)


class Mask:
    """Base class of every mask. Combine masks with ``&``.

    Subclasses describe which (query, key) pairs may attend. ``kind`` names the
    convention so backends can declare which kinds they handle symbolically.
    """

    kind: str = "mask"

    def __and__(self, other: Mask) -> Mask:
        if not isinstance(other, Mask):
            raise TypeError(_and_hint(other))
        return AndMask.of(self, other)

    def __rand__(self, other: object) -> Mask:
        raise TypeError(_and_hint(other))

    def shard(self, q_start: int, k_start: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        """This mask of the full (total_L, total_S) problem, restricted to queries
        ``[q_start, q_start + L)`` and keys ``[k_start, k_start + S)``, in local coordinates.

        For context parallelism and any other split of a sequence: a shard of a
        longer sequence is evaluated at its true positions. Structured masks stay
        symbolic (a window gains an offset, lengths are shifted); dense tensors are
        sliced (a size-1 dim stays broadcast). Nothing is read on the host.
        """
        _check_shard(q_start, k_start, L, S, total_L, total_S)
        return self._shard(q_start, k_start, L, S, total_L, total_S)

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        raise NotImplementedError(f"{type(self).__name__} cannot be sharded")

    def parts(self) -> tuple[Mask, ...]:
        """The leaf masks this mask is made of (itself for a leaf)."""
        return (self,)

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        """Check this mask fits a call with these sizes; raise ValueError if not."""

    def signature(self, L: int, S: int) -> tuple[object, ...]:
        """The mask's structure for a call of (L, S), hashable, without tensor data: its
        kind, static parameters and its tensors' shapes, dtypes, devices and grad flags."""
        return (type(self), *(_tensor_signature(t) for t in self._tensors()))

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return ()

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        """Materialize as keep/bias tensors broadcastable to ``batch_shape + (L, S)``."""
        raise NotImplementedError

    def to_dense(
        self,
        L: int,
        S: int,
        batch_shape: Sequence[int] = (),
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """A dense tensor of shape ``batch_shape + (L, S)`` (broadcast where possible).

        Returns a bool tensor (True = may attend) for pure keep masks, else a float
        additive bias of ``dtype`` with ``-inf`` where a key is blocked.
        """
        dev = torch.device(device) if device is not None else torch.device("cpu")
        batch_shape = tuple(int(d) for d in batch_shape)
        self.validate(batch_shape, L, S)
        d = self.dense(L, S, batch_shape, dev)
        full = (*batch_shape, L, S)
        if d.bias is None:
            keep_t = d.keep if d.keep is not None else torch.ones((), dtype=torch.bool)
            return keep_t.to(dev).expand(full).clone()
        out = d.bias.to(device=dev, dtype=dtype).expand(full).clone()
        if d.keep is not None:
            out = out.masked_fill(~d.keep.to(dev).expand(full), float("-inf"))
        return out

    def symbolic_causal(self, L: int, S: int) -> bool:
        """True when this mask is exactly ``is_causal=True`` of SDPA (top-left causal)."""
        return False


def _band_keep(
    L: int, S: int, left: int | None, right: int | None, offset: int, device: torch.device
) -> torch.Tensor:
    """Bool (L, S): query i keeps key j when i' - left <= j <= i' + right, i' = i + offset."""
    i = torch.arange(L, device=device).unsqueeze(-1) + offset  # (L, 1)
    j = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    keep_t = torch.ones(L, S, dtype=torch.bool, device=device)
    if left is not None:
        keep_t &= j >= i - left
    if right is not None:
        keep_t &= j <= i + right
    return keep_t


class KeepMask(Mask):
    """Boolean mask, True = may attend, broadcastable to ``(..., L, S)``."""

    kind = "keep"

    def __init__(self, tensor: torch.Tensor, *, source: str = "keep") -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"masks.{source}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.ndim < 1:
            raise ValueError(
                f"masks.{source}: expected a tensor of shape (..., L, S) or (S,), got a 0-d tensor"
            )
        self.tensor = tensor
        self.source = source

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        _check_broadcast_to(f"masks.{self.source}(...)", self.tensor.shape, (*batch_shape, L, S))

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        return DenseMask(keep=self.tensor.to(device), bias=None)

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        return KeepMask(_slice_last2(self.tensor, q0, k0, L, S), source=self.source)

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.tensor,)


class BiasMask(Mask):
    """Additive float mask broadcastable to ``(..., L, S)``; ``-inf`` blocks a key."""

    kind = "bias"

    def __init__(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"masks.bias: expected a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.is_floating_point():
            raise TypeError(
                f"masks.bias: expected a floating-point tensor, got dtype {tensor.dtype}; "
                "for a boolean mask use masks.keep (True = attend) or masks.block (True = masked)"
            )
        if tensor.ndim < 1:
            raise ValueError("masks.bias: expected a tensor of shape (..., L, S), got a 0-d tensor")
        if not readable(tensor):
            pass  # on an accelerator (or meta) the values are not read: that would sync
        elif torch.isnan(tensor).any() or torch.isposinf(tensor).any():
            raise ValueError(
                "masks.bias: the bias contains NaN or +inf; expected finite values or -inf "
                "(which blocks a key)"
            )
        self.tensor = tensor

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        _check_broadcast_to("masks.bias(...)", self.tensor.shape, (*batch_shape, L, S))

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        return DenseMask(keep=None, bias=self.tensor.to(device))

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        shard = BiasMask.__new__(BiasMask)  # the values were checked once, by the full mask
        shard.tensor = _slice_last2(self.tensor, q0, k0, L, S)
        return shard

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.tensor,)


class ValidLensMask(Mask):
    """d2l's ``valid_lens``: key ``j`` is kept for batch ``b`` when ``j < lens[b]``.

    ``lens`` has shape (B,) (one length per batch element) or (B, L) (one per
    query). B is the first leading dim of the query; the lengths broadcast over
    the other leading dims (heads). With ``queries=True`` (1-D lens only), query
    rows at or past the length are padding too and become fully masked rows.

    Attributes:
        lens: (B,) or (B, L) long, the key lengths.
        queries: True when query rows past a length are padding too.
        query_lens: (B,) long, the query lengths when ``queries`` (equal to ``lens``
            unless the mask is a shard of a longer sequence), else None.
    """

    kind = "valid_lens"

    def __init__(self, lens: torch.Tensor | Sequence[int], queries: bool = False) -> None:
        if not isinstance(lens, torch.Tensor):
            try:
                lens = torch.as_tensor(lens)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise TypeError(
                    f"masks.valid_lens: lens must be an integer tensor or a list of ints, "
                    f"got {type(lens).__name__}"
                ) from exc
        if lens.dtype == torch.bool or lens.is_floating_point() or lens.is_complex():
            raise TypeError(f"masks.valid_lens: lens must have an integer dtype, got {lens.dtype}")
        if lens.ndim not in (1, 2):
            raise ValueError(
                f"masks.valid_lens: lens must have shape (B,) or (B, L), got "
                f"{_shape_str(lens.shape)}"
            )
        if not isinstance(queries, bool):
            raise TypeError(f"masks.valid_lens: queries must be a bool, got {queries!r}")
        if readable(lens) and lens.numel() and int(lens.min()) < 0:
            raise ValueError(
                f"masks.valid_lens: lengths must be >= 0, got minimum {int(lens.min())}"
            )
        if queries and lens.ndim != 1:
            raise ValueError(
                "masks.valid_lens: queries=True needs one length per batch element, shape (B,); "
                f"got {_shape_str(lens.shape)}"
            )
        self.lens = lens.to(torch.long)
        self.queries = queries
        self.query_lens: torch.Tensor | None = self.lens if queries else None

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        if len(batch_shape) == 0:
            raise ValueError(
                "mask: masks.valid_lens needs a batch dim; the query has shape (L, E) with no "
                "leading dims, expected (B, ..., L, E)"
            )
        B = batch_shape[0]
        if self.lens.shape[0] != B:
            raise ValueError(
                f"mask: masks.valid_lens has {self.lens.shape[0]} lengths, but the batch dim "
                f"(first leading dim) is {B}; expected shape ({B},) or ({B}, {L})"
            )
        if self.lens.ndim == 2 and self.lens.shape[1] != L:
            raise ValueError(
                f"mask: masks.valid_lens per-query lengths have shape "
                f"{_shape_str(self.lens.shape)}, expected ({B}, {L}) for L={L} queries"
            )
        if not readable(self.lens) or not self.lens.numel():
            return  # the value checks below read the lengths on the host: CPU, eager only
        if int(self.lens.max()) > S:
            raise ValueError(
                f"mask: masks.valid_lens has a length of {int(self.lens.max())}, more than the "
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
        # (B, 1, ..., 1, L or 1, S): broadcast over the other leading dims (heads)
        keep_t = keep_t.view(keep_t.shape[0], *([1] * (len(batch_shape) - 1)), *keep_t.shape[1:])
        return DenseMask(keep=keep_t, bias=None)

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        lens = self.lens
        if lens.ndim == 2:
            lens = lens[:, q0 : q0 + L]  # (B, L) rows of this shard
        shard = ValidLensMask.__new__(ValidLensMask)
        shard.lens = (lens - k0).clamp(0, S)  # (B,) or (B, L): keys left in this shard
        shard.queries = self.queries
        shard.query_lens = None
        if self.query_lens is not None:
            shard.query_lens = (self.query_lens - q0).clamp(0, L)  # (B,)
        return shard

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.lens,) if self.query_lens is None else (self.lens, self.query_lens)

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
                f"masks.key_padding: expected shape (B, S), got {_shape_str(tensor.shape)}"
            )
        self.padding = tensor

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        if len(batch_shape) == 0:
            raise ValueError(
                "mask: masks.key_padding needs a batch dim; the query has shape (L, E), "
                "expected (B, ..., L, E)"
            )
        B = batch_shape[0]
        if tuple(self.padding.shape) != (B, S):
            raise ValueError(
                f"mask: masks.key_padding has shape {_shape_str(self.padding.shape)}, expected "
                f"(B, S) = ({B}, {S})"
            )

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        keep_t = ~self.padding.to(device)  # (B, S)
        # (B, 1, ..., 1, 1, S)
        keep_t = keep_t.view(keep_t.shape[0], *([1] * len(batch_shape)), S)
        return DenseMask(keep=keep_t, bias=None)

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        return KeyPaddingMask(self.padding[:, k0 : k0 + S])  # (B, S) keys of this shard

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.padding,)


def _check_offset(where: str, name: str, val: object) -> int:
    if isinstance(val, bool) or not isinstance(val, int):
        raise TypeError(f"{where}: {name} must be an int, got {val!r}")
    return val


class WindowMask(Mask):
    """Sliding window: query ``i`` keeps keys ``i-left .. i+right`` inclusive.

    ``None`` for ``left`` or ``right`` means unbounded on that side. With
    ``align="bottom_right"`` the query index is shifted by ``S - L``.

    Global positions: query row ``i`` sits at position ``q_offset + i`` and key
    column ``j`` at ``k_offset + j`` (both default 0), so a block of a longer
    sequence is masked at its true positions; the window compares positions.
    """

    kind = "window"

    def __init__(
        self,
        left: int | None,
        right: int | None,
        align: Align = "top_left",
        *,
        q_offset: int = 0,
        k_offset: int = 0,
    ) -> None:
        for name, val in (("left", left), ("right", right)):
            if val is None:
                continue
            if isinstance(val, bool) or not isinstance(val, int):
                raise TypeError(f"masks.window: {name} must be an int >= 0 or None, got {val!r}")
            if val < 0:
                raise ValueError(f"masks.window: {name} must be >= 0, got {val}")
        if align not in _ALIGNS:
            raise ValueError(
                f"masks.window: align must be 'top_left' or 'bottom_right', got {align!r}"
            )
        self.left = left
        self.right = right
        self.align: Align = align
        self.q_offset = _check_offset("masks.window", "q_offset", q_offset)
        self.k_offset = _check_offset("masks.window", "k_offset", k_offset)

    def offset(self, L: int, S: int) -> int:
        """Shift from a query's row to its own key column: query ``i`` keeps key ``j``
        when ``i + offset - left <= j <= i + offset + right``. ``S - L`` for
        bottom_right, plus ``q_offset - k_offset``."""
        base = S - L if self.align == "bottom_right" else 0
        return base + self.q_offset - self.k_offset

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        return DenseMask(
            keep=_band_keep(L, S, self.left, self.right, self.offset(L, S), device), bias=None
        )

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        shift = self.offset(total_L, total_S) + q0 - k0  # global shift, seen from the shard
        return WindowMask(self.left, self.right, "top_left", q_offset=shift)

    def signature(self, L: int, S: int) -> tuple[object, ...]:
        return (type(self), self.left, self.right, self.align, self.offset(L, S))


class CausalMask(WindowMask):
    """Causal: query ``i`` keeps keys ``j <= i`` (``j <= i + S - L`` when bottom_right).

    ``q_offset``/``k_offset`` place the rows and columns at global positions, as
    for :class:`WindowMask`.
    """

    kind = "causal"

    def __init__(self, align: Align = "top_left", *, q_offset: int = 0, k_offset: int = 0) -> None:
        if align not in _ALIGNS:
            raise ValueError(
                f"masks.causal: align must be 'top_left' or 'bottom_right', got {align!r}"
            )
        super().__init__(None, 0, align, q_offset=q_offset, k_offset=k_offset)

    def symbolic_causal(self, L: int, S: int) -> bool:
        """True when this is exactly SDPA's ``is_causal=True`` for (L, S): no shift."""
        return self.offset(L, S) == 0

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        shift = self.offset(total_L, total_S) + q0 - k0
        return CausalMask("top_left", q_offset=shift)


class AndMask(Mask):
    """Conjunction of masks: kept where every part keeps; biases add up."""

    kind = "and"

    def __init__(self, parts: Sequence[Mask]) -> None:
        self._parts = tuple(parts)

    @classmethod
    def of(cls, a: Mask, b: Mask) -> AndMask:
        return cls((*a.parts(), *b.parts()))

    def parts(self) -> tuple[Mask, ...]:
        return self._parts

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        for p in self._parts:
            p.validate(batch_shape, L, S)

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        keep_t: torch.Tensor | None = None
        bias_t: torch.Tensor | None = None
        for p in self._parts:
            d = p.dense(L, S, batch_shape, device)
            if d.keep is not None:
                keep_t = d.keep if keep_t is None else keep_t & d.keep
            if d.bias is not None:
                bias_t = d.bias if bias_t is None else bias_t + d.bias
        return DenseMask(keep=keep_t, bias=bias_t)

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        return AndMask([p._shard(q0, k0, L, S, total_L, total_S) for p in self._parts])

    def signature(self, L: int, S: int) -> tuple[object, ...]:
        return (AndMask, *(p.signature(L, S) for p in self._parts))


# --------------------------------------------------------------------------- constructors


def keep(tensor: torch.Tensor) -> KeepMask:
    """Boolean mask with attnkit's polarity: True = may attend. Shape (..., L, S)."""
    if isinstance(tensor, torch.Tensor) and tensor.dtype != torch.bool:
        raise TypeError(
            f"masks.keep: expected a bool tensor (True = may attend), got dtype {tensor.dtype}; "
            "for 0/1 TensorFlow masks use masks.tf, for additive floats masks.bias"
        )
    return KeepMask(tensor, source="keep")


def block(tensor: torch.Tensor) -> KeepMask:
    """Boolean mask with torch MHA's polarity: True = masked (may NOT attend)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"masks.block: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != torch.bool:
        raise TypeError(
            f"masks.block: expected a bool tensor (True = masked), got dtype {tensor.dtype}"
        )
    return KeepMask(~tensor, source="block")


def bias(tensor: torch.Tensor) -> BiasMask:
    """Additive float mask, shape (..., L, S), added to the logits; ``-inf`` blocks."""
    return BiasMask(tensor)


def tf(tensor: torch.Tensor) -> KeepMask:
    """TensorFlow tutorial convention: 1 = masked, 0 = attend; shape (..., L, S).

    The tutorial adds ``mask * -1e9`` to the logits; attnkit blocks exactly, so a
    fully masked row gives zeros instead of a uniform average.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"masks.tf: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != torch.bool and readable(tensor):  # (a device tensor is not read: sync)
        bad = (tensor != 0) & (tensor != 1)
        if bool(bad.any()):
            raise ValueError(
                "masks.tf: expected values 0 (attend) and 1 (masked) only, got "
                f"{tensor[bad].flatten()[:3].tolist()}"
            )
    return KeepMask(tensor == 0, source="tf")


def valid_lens(lens: torch.Tensor | Sequence[int], queries: bool = False) -> ValidLensMask:
    """d2l ``valid_lens``: (B,) per batch or (B, L) per query; key j kept when j < length."""
    return ValidLensMask(lens, queries=queries)


def key_padding(tensor: torch.Tensor) -> KeyPaddingMask:
    """Key padding: bool (B, S), True = padding key (torch MHA's ``key_padding_mask``)."""
    return KeyPaddingMask(tensor)


def causal(align: Align = "top_left", *, q_offset: int = 0, k_offset: int = 0) -> CausalMask:
    """Causal mask; ``align`` is ``"top_left"`` (SDPA, Keras) or ``"bottom_right"``.

    ``q_offset``/``k_offset``: global positions of the first query row and key column
    (for a block of a longer sequence); query at position p sees keys at positions <= p.
    """
    return CausalMask(align, q_offset=q_offset, k_offset=k_offset)


def window(
    left: int | None,
    right: int | None = 0,
    align: Align = "top_left",
    *,
    q_offset: int = 0,
    k_offset: int = 0,
) -> WindowMask:
    """Sliding window: query i keeps keys i-left .. i+right inclusive (None = unbounded).

    ``q_offset``/``k_offset``: global positions of the first query row and key column.
    """
    return WindowMask(left, right, align, q_offset=q_offset, k_offset=k_offset)
