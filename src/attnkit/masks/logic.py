"""Combinations: ``a & b`` (and), ``a | b`` (or), ``~a`` (not).

``&`` keeps a pair every part keeps, and additive biases add up. ``|`` keeps a pair
some part keeps, ``~`` the pairs a mask does not keep; both take keep-type masks only
(a bias has no "or" or "not"). A row that ends up keeping no key follows the
fully-masked-row policy (output 0, weights 0, lse -inf), whatever the combination.
Everything stays symbolic: a combination lowers to a disjunction of conjunctions
of its parts' atoms (:mod:`attnkit.blockplan.atoms`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..blockplan.atoms import DNF, conjoin, negate
from .base import DenseMask, Mask

__all__ = ["AndMask", "NotMask", "OrMask"]


def _no_bias(op: str, masks: Sequence[Mask]) -> None:
    for m in masks:
        if m.additive or any(p.additive for p in _leaves(m)):
            raise TypeError(
                f"mask {op}: a bias mask adds values to the logits, so it has no "
                f"{'or' if op == '|' else 'not'}; combine biases with & only (or turn a "
                "boolean into masks.keep / masks.block first)"
            )


def _leaves(m: Mask) -> list[Mask]:
    kids = m.children()
    if not kids:
        return [m]
    out: list[Mask] = []
    for c in kids:
        out += _leaves(c)
    return out


class _Combination(Mask):
    """What ``&`` and ``|`` share: a tuple of parts (its :meth:`children`), sharded,
    signed and mapped part by part into a combination of the same class."""

    kind_reported = False  # not a kind: its subclasses name theirs

    def __init__(self, parts: Sequence[Mask]) -> None:
        where = f"masks.{type(self).__name__}"
        try:
            parts = tuple(parts)
        except TypeError:
            raise TypeError(f"{where}: expected a list of masks, got {parts!r:.60}") from None
        if not parts:
            raise ValueError(f"{where}: expected at least one mask, got none")
        for p in parts:
            if not isinstance(p, Mask):
                raise TypeError(f"{where}: every part must be an attnkit mask, got {p!r:.60}")
        self._parts = parts

    def children(self) -> tuple[Mask, ...]:
        return self._parts

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        return type(self)([p._shard(q0, k0, L, S, total_L, total_S) for p in self._parts])

    def signature(self, L: int, S: int) -> tuple[object, ...]:
        return (type(self), *(p.signature(L, S) for p in self._parts))

    def map_tensors(self, fn: Callable[[torch.Tensor, str], torch.Tensor]) -> Mask:
        return type(self)([p.map_tensors(fn) for p in self._parts])


class AndMask(_Combination):
    """Conjunction of masks: kept where every part keeps; biases add up."""

    kind = "and"
    kind_reported = False  # its parts' kinds are reported

    @classmethod
    def of(cls, a: Mask, b: Mask) -> AndMask:
        return cls((*a.parts(), *b.parts()))

    def parts(self) -> tuple[Mask, ...]:
        return self._parts

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        keep_t: torch.Tensor | None = None
        biases: tuple[torch.Tensor, ...] = ()
        for p in self._parts:
            d = p.dense(L, S, batch_shape, device)
            if d.keep is not None:
                keep_t = d.keep if keep_t is None else keep_t & d.keep
            biases += d.biases  # added by the reader, in its compute dtype
        return DenseMask(keep=keep_t, biases=biases)

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        out: DNF = [[]]
        for p in self._parts:
            out = conjoin(out, p.lower(L, S, device))
        return out


class OrMask(_Combination):
    """Disjunction of keep-type masks: kept where any part keeps."""

    kind = "or"
    kind_reported = True

    def __init__(self, parts: Sequence[Mask]) -> None:
        super().__init__(parts)
        _no_bias("|", self._parts)

    @classmethod
    def of(cls, a: Mask, b: Mask) -> OrMask:
        flat: list[Mask] = []
        for m in (a, b):
            flat += list(m.children()) if isinstance(m, OrMask) else [m]
        return cls(flat)

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        keep_t: torch.Tensor | None = torch.zeros((), dtype=torch.bool, device=device)
        for p in self._parts:
            d = p.dense(L, S, batch_shape, device)
            if d.keep is None:  # this part keeps everything
                return DenseMask(keep=None)
            keep_t = d.keep if keep_t is None else keep_t | d.keep
        return DenseMask(keep=keep_t)

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        out: DNF = []
        for p in self._parts:
            out += p.lower(L, S, device)
        return out


class NotMask(Mask):
    """Complement of a keep-type mask: kept where the mask does not keep."""

    kind = "not"

    def __init__(self, inner: Mask) -> None:
        if not isinstance(inner, Mask):
            raise TypeError(f"masks.NotMask: expected an attnkit mask, got {inner!r:.60}")
        _no_bias("~", [inner])
        self.inner = inner

    @classmethod
    def of(cls, m: Mask) -> Mask:
        return m.inner if isinstance(m, NotMask) else cls(m)

    def children(self) -> tuple[Mask, ...]:
        return (self.inner,)

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        d = self.inner.dense(L, S, batch_shape, device)
        if d.keep is None:
            return DenseMask(keep=torch.zeros((), dtype=torch.bool, device=device))
        return DenseMask(keep=~d.keep)

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        return negate(self.inner.lower(L, S, device))

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        return NotMask(self.inner._shard(q0, k0, L, S, total_L, total_S))

    def signature(self, L: int, S: int) -> tuple[object, ...]:
        return (NotMask, self.inner.signature(L, S))

    def map_tensors(self, fn: Callable[[torch.Tensor, str], torch.Tensor]) -> Mask:
        return NotMask(self.inner.map_tensors(fn))
