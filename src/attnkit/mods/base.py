"""The Mod base class and the positions a position-aware modifier sees.

A score modifier changes the logits of a call after the score and its scale, and
before the mask: ``logits = mod(scale * score(q, k))``. Each mod knows

- ``logits(s, pos)``: its materialized definition on (*batch, L, S) logits, the
  readable form the reference backend runs;
- ``offset_bias(heads, offsets)`` (position biases only): its additive bias for each
  head and each relative position ``offset = key position - query position``, an
  (H, n) table (n <= L + S - 1) from which a tiled kernel gathers each tile's bias,
  never holding an (H, L, S) tensor. The table is differentiable in the mod's
  parameters: a backward sums the logits' gradient along each diagonal of every tile
  (a fixed order, no atomics) and pulls it through the table once.

Positions are global: query row ``i`` sits at ``q_offset + i`` (plus ``S - L`` with
``align="bottom_right"``, where new queries are the last positions of a KV cache), key
column ``j`` at ``k_offset + j``, so a block of a longer sequence (context
parallelism) sees its true positions.

Far positions: a bias that grows with distance (ALiBi) is, for queries and keys far
apart, a large part shared by every pair of the call plus a part bounded by L and S.
:meth:`PositionMod.bias_table` forms both from exact integer offsets, and
:meth:`PositionMod.without_common` gives the mod that leaves the shared part out:
softmax ignores it, so :func:`attnkit.attention` runs that mod and adds the shared part
(:meth:`PositionMod.common_bias`, differentiable) to the lse alone. Neither the logits
nor the gradients then hold a number that grows with the distance, so float32 keeps
its precision at a query offset of 10**6 and the slopes' gradient has no large terms
that cancel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .._args import as_int
from .._layout import HeadLayout

__all__ = [
    "Align",
    "Mod",
    "PositionMod",
    "Positions",
    "as_list",
    "backend_mod_kinds",
    "check_align",
    "check_offset",
]

Align = Literal["top_left", "bottom_right"]


def check_align(where: str, align: object) -> None:
    if align not in ("top_left", "bottom_right"):
        raise ValueError(f"{where}: align must be 'top_left' or 'bottom_right', got {align!r}")


def check_offset(where: str, name: str, val: object) -> int:
    return as_int(where, name, val)


@dataclass(frozen=True)
class Positions:
    """Absolute positions of a call's rows and columns: query row i at ``q0 + i``, key
    column j at ``k0 + j``.

    Biases are formed from :meth:`relative`, never from the absolute positions: a
    decoding step at position 10**6 sees the same numbers as one at position 0, so a
    bias computed in float32 does not lose precision as the positions grow."""

    q0: int
    k0: int

    def nearest_offset(self, L: int, S: int) -> int:
        """The relative position ``p_j - p_i`` of smallest magnitude among the call's
        (L, S) pairs: 0 when a query and a key share a position, else the offset of the
        closest pair (every offset of the call lies within L + S of it)."""
        gap = self.k0 - self.q0
        return min(max(0, gap - (L - 1)), gap + S - 1)

    def relative(self, L: int, S: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column positions, (L,) and (S,) long, bounded by L and S: row i at
        ``i - m`` (``m = (L - 1) // 2``), column j at ``k0 + j - (q0 + m) - n`` with n the
        :meth:`nearest_offset`, so that ``cols[j] - rows[i] + n = p_j - p_i``, the pair's
        true relative position. Neither grows with the global offset nor with the gap
        ``k0 - q0``: that is all in n."""
        mid = (L - 1) // 2
        rows = torch.arange(L, device=device) - mid  # (L,)
        shift = self.k0 - self.q0 - mid - self.nearest_offset(L, S)
        cols = torch.arange(S, device=device) + shift  # (S,)
        return rows, cols


_BACKEND_KINDS: dict[str, type[Mod]] = {}


def backend_mod_kinds() -> frozenset[str]:
    """Every score modifier kind a backend may compute, from the modifier classes
    themselves (each that sets ``kind`` and is computed in backends)."""
    return frozenset(_BACKEND_KINDS)


class Mod(nn.Module):
    """Base class of score modifiers (an ``nn.Module``: learnable ones hold parameters).

    A modifier changes a call's logits after the score and its scale and before the
    mask (``logits = mod(scale * score(q, k))``). A subclass sets ``kind`` (the name a
    backend's ``mod_kinds`` lists when it computes it) and implements :meth:`logits`,
    the materialized definition the reference backend runs; :meth:`check` refuses a
    call it does not fit. Pass instances to ``attention(mods=...)``.

    Attributes:
        kind: the modifier's kind (``"alibi"``, ``"softcap"``, ...).
        additive: True for a position bias added to the logits.
    """

    kind: str = "mod"
    in_backends: bool = True
    """True when backends compute this kind (their ``mod_kinds``); False for a modifier
    joined outside them (attention sinks). Every class that sets ``kind`` and is
    computed in backends joins :func:`backend_mod_kinds`."""
    additive: bool = False
    """True for a position bias added to the logits (ALiBi, relative position bias)."""

    def __init__(self) -> None:
        """A modifier with no parameters of its own (subclasses add theirs)."""
        super().__init__()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__ and cls.in_backends:
            _BACKEND_KINDS[cls.kind] = cls

    @property
    def identity(self) -> bool:
        """True when this modifier changes nothing (``softcap(inf)``): a call drops it."""
        return False

    def check(self, heads: int, where: str = "mods") -> None:
        """Raise ValueError unless this mod fits a call with ``heads`` query heads."""

    def logits(self, s: torch.Tensor, L: int, S: int) -> torch.Tensor:
        """The modified logits, materialized: s (*batch, L, S) scaled logits."""
        raise NotImplementedError

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors this mod holds (learnable or not)."""
        return ()

    def signature(self) -> tuple[object, ...]:
        """Structure without tensor values, for caches."""
        return (type(self), *((tuple(t.shape), t.dtype, t.requires_grad) for t in self.tensors()))


class PositionMod(Mod):
    """An additive bias from positions and heads (see the module docstring).

    The base of :class:`~attnkit.mods.ALiBi` and
    :class:`~attnkit.mods.RelativePositionBias`. A subclass implements
    :meth:`offset_bias`, its bias for each head and each relative position (key
    position - query position); tiled kernels gather each tile's bias from that table
    (:meth:`bias_table`), never holding an (H, L, S) tensor.

    Args:
        align: ``"top_left"`` or ``"bottom_right"``: with ``"bottom_right"`` query row
            ``i`` sits at position ``S - L + q_offset + i``.
        q_offset: int, global position of query row 0.
        k_offset: int, global position of key column 0.
        where: the constructor's name, for error messages (``"mods.alibi"``).

    Raises:
        ValueError: ``align`` is neither name.
        TypeError, ValueError: an offset is not an int in range.
    """

    additive = True
    grows_with_distance: bool = False
    """True when the bias is unbounded in the distance (ALiBi), so that far positions
    give it a large part shared by every pair (:meth:`common_bias`)."""
    common_dropped: bool = False
    """True on the copy :meth:`without_common` makes: its bias leaves the shared part
    out (softmax ignores it; :func:`attnkit.attention` adds it to the lse)."""

    def __init__(self, align: Align, q_offset: int, k_offset: int, where: str) -> None:
        super().__init__()
        check_align(where, align)
        self.align: Align = align
        self.q_offset = check_offset(where, "q_offset", q_offset)
        self.k_offset = check_offset(where, "k_offset", k_offset)

    def positions(self, L: int, S: int) -> Positions:
        base = S - L if self.align == "bottom_right" else 0
        return Positions(base + self.q_offset, self.k_offset)

    def offset_bias(self, heads: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The bias of each head for each relative position: heads (H,) long, offsets (n,)
        long (key position - query position); returns (H, n) in float32 or the
        parameters' own wider dtype, differentiable in the mod's parameters."""
        raise NotImplementedError

    def relative_offset_bias(self, heads: torch.Tensor, offsets: torch.Tensor, ref: int
                             ) -> torch.Tensor:  # fmt: skip
        """:meth:`offset_bias` less the bias at offset ``ref``, (H, n): the part that
        varies across the call's pairs. Mods whose bias grows with distance override
        this to form it from exact integer differences."""
        at_ref = torch.full((1,), ref, dtype=torch.long, device=offsets.device)
        return self.offset_bias(heads, offsets) - self.offset_bias(heads, at_ref)

    def common_bias(self, heads: torch.Tensor, L: int, S: int) -> torch.Tensor:
        """The part of the bias shared by every pair of an (L, S) call: its bias at the
        call's :meth:`Positions.nearest_offset`, (H,) in float32 or the parameters'
        wider dtype, differentiable in the mod's parameters."""
        ref = self.positions(L, S).nearest_offset(L, S)
        at_ref = torch.full((1,), ref, dtype=torch.long, device=heads.device)
        return self.offset_bias(heads, at_ref)[:, 0]  # (H,)

    def without_common(self) -> PositionMod:
        """This mod with :meth:`common_bias` left out of its bias (a shallow copy sharing
        its parameters); itself when its bias is bounded (nothing large to leave out)."""
        if not self.grows_with_distance or self.common_dropped:
            return self
        # (a new __dict__ sharing the parameter dict; not copy.copy(), which dynamo
        # cannot trace through a module's __setstate__)
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.__dict__["common_dropped"] = True
        return clone

    def offsets(self, L: int, S: int, device: torch.device) -> tuple[torch.Tensor, int]:
        """Every offset a call of (L, S) can see, (L + S - 1,) ascending, and the first:
        query row i and key column j see offset ``(j - i) + k0 - q0``."""
        pos = self.positions(L, S)
        first = pos.k0 - pos.q0 - (L - 1)
        return torch.arange(first, first + L + S - 1, device=device), first

    def bias_table(self, heads: torch.Tensor, L: int, S: int, device: torch.device
                   ) -> torch.Tensor:  # fmt: skip
        """The bias of each head by relative position for an (L, S) call, (H, L + S - 1):
        entry ``j - i + L - 1`` is the bias of query row i and key column j; without the
        :meth:`common_bias` when :attr:`common_dropped`. The one place a position bias
        is formed (the reference's logits, the tiles' table; ALiBi's folded form agrees
        with it)."""
        offs, _ = self.offsets(L, S, device)
        if not self.common_dropped:
            return self.offset_bias(heads, offs)
        return self.relative_offset_bias(heads, offs, self.positions(L, S).nearest_offset(L, S))

    def logits(self, s: torch.Tensor, L: int, S: int) -> torch.Tensor:
        layout = HeadLayout(tuple(s.shape[:-2]))  # the logits' own leading dims
        heads = torch.arange(layout.heads, device=s.device)
        table = self.bias_table(heads, L, S, s.device)  # (H, L + S - 1)
        idx = torch.arange(S, device=s.device).view(1, S) - torch.arange(L, device=s.device).view(
            L, 1
        )
        bias = table[:, idx + (L - 1)]  # (H, L, S)
        return s + layout.per_head(bias.to(s.dtype), 2)  # (*batch, L, S)

    def signature(self) -> tuple[object, ...]:
        return (*super().signature(), self.align, self.q_offset, self.k_offset,
                self.common_dropped)  # fmt: skip

    def heads_of(self, n: int) -> int:
        """How many heads a per-head parameter of first dim ``n`` describes."""
        return n


def as_list(mods: object) -> list[Mod]:
    """``mods=`` of :func:`attnkit.attention` as a list (None, one mod, or a sequence).

    Args:
        mods: None, one :class:`Mod`, or a sequence (list, tuple) of them.

    Returns:
        A new list of the mods in the order given: ``[]`` for None, ``[mods]`` for one.

    Raises:
        TypeError: ``mods`` is a string, another type, or a sequence holding something
            that is not a :class:`Mod`.

    Examples:
        >>> from attnkit import mods
        >>> mods.as_list(None), mods.as_list(mods.softcap(50.0))
        ([], [Softcap()])
    """
    if mods is None:
        return []
    if isinstance(mods, Mod):
        return [mods]
    if isinstance(mods, Sequence) and not isinstance(mods, (str, bytes)):
        out = list(mods)
        for m in out:
            if not isinstance(m, Mod):
                raise TypeError(
                    f"mods: expected attnkit.mods objects (mods.alibi, mods.softcap, ...), got "
                    f"{type(m).__name__}"
                )
        return out
    raise TypeError(
        f"mods: expected None, an attnkit.mods object or a list of them, got {type(mods).__name__}"
    )
