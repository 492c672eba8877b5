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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .._args import as_int
from .._layout import HeadLayout

__all__ = ["Align", "Mod", "PositionMod", "Positions", "as_list", "check_align", "check_offset"]

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

    def relative(self, L: int, S: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column positions relative to the middle query row's, (L,) and (S,)
        long: row i at ``i - m``, column j at ``k0 + j - (q0 + m)``, ``m = (L - 1) // 2``.

        A difference of the two is the pair's true relative position ``p_j - p_i``;
        their magnitudes are bounded by L, S and the gap ``k0 - q0`` (a decoding step's
        keys end at its query: the columns are then exactly ``p_j - p_i``), never by the
        global offset."""
        mid = (L - 1) // 2
        rows = torch.arange(L, device=device) - mid  # (L,)
        cols = torch.arange(S, device=device) + (self.k0 - self.q0 - mid)  # (S,)
        return rows, cols


class Mod(nn.Module):
    """Base class of score modifiers (an ``nn.Module``: learnable ones hold parameters)."""

    kind: str = "mod"
    additive: bool = False
    """True for a position bias added to the logits (ALiBi, relative position bias)."""

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
    """An additive bias from positions and heads (see the module docstring)."""

    additive = True

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

    def offsets(self, L: int, S: int, device: torch.device) -> tuple[torch.Tensor, int]:
        """Every offset a call of (L, S) can see, (L + S - 1,) ascending, and the first:
        query row i and key column j see offset ``(j - i) + k0 - q0``."""
        pos = self.positions(L, S)
        first = pos.k0 - pos.q0 - (L - 1)
        return torch.arange(first, first + L + S - 1, device=device), first

    def logits(self, s: torch.Tensor, L: int, S: int) -> torch.Tensor:
        layout = HeadLayout(tuple(s.shape[:-2]))  # the logits' own leading dims
        offs, _ = self.offsets(L, S, s.device)
        table = self.offset_bias(torch.arange(layout.heads, device=s.device), offs)  # (H, n)
        idx = torch.arange(S, device=s.device).view(1, S) - torch.arange(L, device=s.device).view(
            L, 1
        )
        bias = table[:, idx + (L - 1)]  # (H, L, S)
        return s + layout.per_head(bias.to(s.dtype), 2)  # (*batch, L, S)

    def signature(self) -> tuple[object, ...]:
        return (*super().signature(), self.align, self.q_offset, self.k_offset)

    def heads_of(self, n: int) -> int:
        """How many heads a per-head parameter of first dim ``n`` describes."""
        return n


def as_list(mods: object) -> list[Mod]:
    """``mods=`` of :func:`attnkit.attention` as a list (None, one mod, or a sequence)."""
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
