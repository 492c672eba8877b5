"""The Mask base class: polarity, composition (``&``, ``|``, ``~``), sharding, lowering.

A mask says which (query, key) pairs may attend. Every mask kind knows three things
about itself, and nothing outside ``attnkit.masks`` asks it by type:

- ``dense()``: its materialized keep/bias tensors, the readable definition used by
  the reference path and by pictures;
- ``lower()``: its terms in the vocabulary of :mod:`attnkit.blockplan.atoms`
  (bands, per-batch key and query ranges, per-query key ranges, kept keys, document
  ids, dense tensors), as a disjunction of conjunctions, from which
  :func:`attnkit.blockplan.plan_for` builds the one block plan every backend reads;
- ``_shard()``: itself restricted to a block of a longer sequence, at its true
  positions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .._args import shape_text as shape_str
from ..blockplan.atoms import DNF

__all__ = [
    "DenseMask",
    "Mask",
    "check_broadcast_to",
    "mask_kinds",
    "shape_str",
    "slice_last2",
]


@dataclass(frozen=True, init=False)
class DenseMask:
    """A materialized mask: ``keep`` (bool, True = may attend) and/or additive biases.

    Args:
        keep: None (keeps every pair) or a bool tensor broadcastable to
            ``batch_shape + (L, S)``.
        bias: None or one float tensor, broadcastable so, added to the logits.
        biases: further such tensors (a combination's parts): kept apart, so that a
            backend adds them in its compute dtype with :meth:`bias_in`, each cast
            first, as the block plan does.
    """

    keep: torch.Tensor | None
    biases: tuple[torch.Tensor, ...]

    def __init__(
        self,
        keep: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        *,
        biases: tuple[torch.Tensor, ...] = (),
    ) -> None:
        object.__setattr__(self, "keep", keep)
        object.__setattr__(self, "biases", ((bias,) if bias is not None else ()) + tuple(biases))

    @property
    def bias(self) -> torch.Tensor | None:
        """The biases' sum in their promoted dtype (None without a bias)."""
        if not self.biases:
            return None
        return self.bias_in(functools.reduce(torch.promote_types, (t.dtype for t in self.biases)))

    def bias_in(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The biases' sum in ``dtype``, each cast to it first (None without a bias)."""
        if not self.biases:
            return None
        out = self.biases[0].to(dtype)
        for t in self.biases[1:]:
            out = out + t.to(dtype)
        return out


def check_broadcast_to(
    what: str, shape: Sequence[int], target: Sequence[int], hint: str = ""
) -> None:
    """Raise ValueError unless ``shape`` broadcasts to ``target`` without growing it."""
    ok = len(shape) <= len(target) and all(
        # (==, not `in`: dynamo's `in` misses a dynamic size equal to an int)
        s == 1 or s == t
        for s, t in zip(reversed(shape), reversed(target), strict=False)
    )
    if not ok:
        raise ValueError(
            f"mask: {what} has shape {shape_str(shape)}, which does not broadcast to the "
            f"attention shape {shape_str(target)} (batch dims..., L, S){hint}"
        )


def _operand_hint(op: str, other: object) -> str:
    what = f"a {other.dtype} tensor" if isinstance(other, torch.Tensor) else type(other).__name__
    return (
        f"mask {op}: both sides must be attnkit masks, got {what}; wrap a tensor first: "
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


def slice_last2(t: torch.Tensor, q0: int, k0: int, L: int, S: int) -> torch.Tensor:
    """t (..., L_total or 1, S_total or 1) or (S_total,) sliced to the shard; size-1 dims kept."""
    if t.shape[-1] != 1:
        t = t[..., k0 : k0 + S]  # (..., *, S)
    if t.ndim >= 2 and t.shape[-2] != 1:
        t = t[..., q0 : q0 + L, :]  # (..., L, S or 1)
    return t


def _tensor_signature(t: torch.Tensor) -> tuple[object, ...]:
    return (tuple(t.shape), t.dtype, t.device.type, t.requires_grad)


_KINDS: dict[str, type[Mask]] = {}


def mask_kinds() -> frozenset[str]:
    """Every mask kind a call can carry (:meth:`Mask.kinds`), from the mask classes
    themselves: each class that sets ``kind`` and reports it (every leaf, ``|``, ``~``)."""
    return frozenset(_KINDS)


class Mask:
    """Base class of every mask. Combine masks with ``&`` (and), ``|`` (or), ``~`` (not).

    ``kind`` names the convention so backends can declare which kinds they handle.
    A fully masked row follows one policy everywhere: output 0, weights 0, lse -inf.
    """

    kind: str = "mask"
    kind_reported: bool = True
    """True when :meth:`kinds` reports this class's kind (every leaf, and ``|`` and ``~``,
    which a backend must know to compute); False for ``&``, whose parts are reported
    instead. Every class that sets ``kind`` joins :func:`mask_kinds`."""
    additive: bool = False
    """True for masks that add values to the logits (``bias``): they combine with ``&``
    only, since ``|`` and ``~`` of a value are undefined."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__ and cls.kind_reported:
            _KINDS[cls.kind] = cls

    # ------------------------------------------------------------------ composition

    def __and__(self, other: Mask) -> Mask:
        if not isinstance(other, Mask):
            raise TypeError(_operand_hint("&", other))
        from .logic import AndMask

        return AndMask.of(self, other)

    def __rand__(self, other: object) -> Mask:
        raise TypeError(_operand_hint("&", other))

    def __or__(self, other: Mask) -> Mask:
        if not isinstance(other, Mask):
            raise TypeError(_operand_hint("|", other))
        from .logic import OrMask

        return OrMask.of(self, other)

    def __ror__(self, other: object) -> Mask:
        raise TypeError(_operand_hint("|", other))

    def __invert__(self) -> Mask:
        from .logic import NotMask

        return NotMask.of(self)

    def parts(self) -> tuple[Mask, ...]:
        """The masks this one is the conjunction of (itself for anything but ``&``)."""
        return (self,)

    def children(self) -> tuple[Mask, ...]:
        """The masks this one combines (none for a leaf)."""
        return ()

    def starts_queries_at_key_zero(self) -> bool:
        """Whether this mask holds a band (anywhere under its ``&``, ``|`` or ``~``) that
        puts the first query at the first key's position: top-left, at offsets 0. Such
        a band misplaces queries that follow cached keys (they belong after them,
        bottom-right)."""
        return any(c.starts_queries_at_key_zero() for c in self.children())

    def kinds(self) -> frozenset[str]:
        """Every kind in this mask: the leaves' kinds, plus "or"/"not" where those appear."""
        out = {self.kind} if self.kind_reported else set()
        for c in self.children():
            out |= c.kinds()
        return frozenset(out)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor this mask holds (its own and its children's)."""
        own = self._tensors()
        for c in self.children():
            own += c.tensors()
        return own

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return ()

    def dense_tensors(self) -> tuple[torch.Tensor, ...]:
        """The (L, S)-sized tensors this mask holds, which must live on the inputs' device
        (small per-batch tensors such as lengths may stay on the CPU)."""
        out: tuple[torch.Tensor, ...] = ()
        for c in self.children():
            out += c.dense_tensors()
        return out

    def has_bias_beyond(self, limit: float) -> bool:
        """Whether a bias of this mask (or of its children) holds a finite value beyond
        ``±limit``; True where its values cannot be read without a sync (see
        :func:`attnkit._host.readable`)."""
        return any(c.has_bias_beyond(limit) for c in self.children())

    def map_tensors(self, fn: Callable[[torch.Tensor, str], torch.Tensor]) -> Mask:
        """A copy of this mask with every tensor ``t`` replaced by ``fn(t, role)``: role
        "dense" for tensors laid out as (..., L, S), "batch" for per-batch tensors whose
        first dim is the batch dim (lengths, padding, ids). Masks without tensors return
        themselves. E.g. slicing heads, or moving a mask to a device."""
        return self

    # ------------------------------------------------------------------ positions

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

    # ------------------------------------------------------------------ checks

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        """Check this mask fits a call with these sizes; raise ValueError if not."""
        for c in self.children():
            c.validate(batch_shape, L, S)

    def signature(self, L: int, S: int) -> tuple[object, ...]:
        """The mask's structure for a call of (L, S), hashable, without tensor data: its
        kind, static parameters and its tensors' shapes, dtypes, devices and grad flags."""
        return (type(self), *(_tensor_signature(t) for t in self._tensors()))

    def has_tensor_offsets(self) -> bool:
        """True when a position offset of this mask (or of a part of it) is a tensor: which
        band it keeps is then read from that tensor's value, which :meth:`signature`
        leaves out (dispatch then keys its cached choice on the lowered plan)."""
        return any(c.has_tensor_offsets() for c in self.children())

    def static_key(self) -> tuple[object, ...] | None:
        """A hashable key that fixes this mask whole, for a mask that holds no tensor
        (a causal or window band with integer offsets): equal keys, equal masks, for
        every call. None (the default) for a mask that holds data, whose values each
        call must read. attnkit's cache of plain-call plans keys on it."""
        return None

    @classmethod
    def from_static_key(cls, key: tuple[object, ...]) -> Mask:
        """The mask whose :meth:`static_key` is ``key`` (its first entry is the class):
        a traced call's plan is chosen from the key alone (:mod:`attnkit._plans`).
        Only classes whose masks have static keys define it."""
        raise TypeError(f"{cls.__name__} masks have no static key")

    # ------------------------------------------------------------------ lowering

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        """This mask's terms for a call of (L, S) on ``device``: a list of clauses, each
        a list of :mod:`attnkit.blockplan.atoms` (a pair is kept when every atom of some
        clause keeps it). Builds only small per-batch tensors, reads nothing on the host."""
        raise NotImplementedError(f"{type(self).__name__} has no lowering")

    # ------------------------------------------------------------------ dense form

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
        for name, n in (("L", L), ("S", S)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"to_dense: {name} must be an int >= 0 (a length), got {n!r}")
        dev = torch.device(device) if device is not None else torch.device("cpu")
        batch_shape = tuple(int(d) for d in batch_shape)
        self.validate(batch_shape, L, S)
        d = self.dense(L, S, batch_shape, dev)
        full = (*batch_shape, L, S)
        bias = d.bias_in(dtype)
        if bias is None:
            keep_t = d.keep if d.keep is not None else torch.ones((), dtype=torch.bool)
            return keep_t.to(dev).expand(full).clone()
        out = bias.to(dev).expand(full).clone()
        if d.keep is not None:
            out = out.masked_fill(~d.keep.to(dev).expand(full), float("-inf"))
        return out
