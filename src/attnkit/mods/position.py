"""Position biases: ALiBi (BLOOM, MPT) and T5's bucketed relative position bias."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .._args import as_bool, as_float_tensor, as_int
from .base import Align, PositionMod

__all__ = ["MAX_HEADS", "ALiBi", "RelativePositionBias", "alibi_slopes", "t5_buckets"]

MAX_HEADS = 2**16
"""The most heads :func:`alibi_slopes` makes slopes for (a guard against a stray huge
int, which would build a list of that many floats)."""


def _at_least_float32(t: torch.Tensor) -> torch.dtype:
    """float32 for half tensors, else their own dtype (float64 stays float64)."""
    return torch.promote_types(t.dtype, torch.float32)


def alibi_slopes(heads: int) -> torch.Tensor:
    """The standard ALiBi slopes for ``heads`` heads, (heads,) float32: a geometric
    sequence starting at 2^(-8/n) for the largest power of two n <= heads, the rest
    taken from the sequence for 2n at odd indices (as in the ALiBi paper's code).

    Args:
        heads: the number of heads, an int in [1, 2**16].

    Returns:
        float32 tensor (heads,): slope ``k`` (0-based) is ``2^(-8(k + 1)/n)`` for
        ``k < n``.

    Raises:
        TypeError, ValueError: ``heads`` is not an int in [1, 2**16].

    Examples:
        >>> from attnkit import mods
        >>> mods.alibi_slopes(4)
        tensor([0.2500, 0.0625, 0.0156, 0.0039])
    """
    heads = as_int("mods.alibi_slopes", "heads", heads, low=1, high=MAX_HEADS)
    n = 2 ** math.floor(math.log2(heads))

    def geometric(m: int) -> list[float]:
        start = 2.0 ** (-8.0 / m)
        return [start ** (k + 1) for k in range(m)]

    slopes = geometric(n)
    if n < heads:
        slopes += geometric(2 * n)[0::2][: heads - n]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(PositionMod):
    """ALiBi: bias ``-slope_h * |i - j|`` (symmetric), or ``-slope_h * (i - j)``
    (``causal=True``, BLOOM's form under a causal mask), at absolute positions.

    The causal form is a per-query constant plus ``slope_h * j``, a per-key bias, so it
    reduces exactly to the dot form and runs on fused dot-product kernels; under a
    causal mask the symmetric form equals it wherever a pair is kept, and is reduced
    the same way. ``slopes``: (H,) per query head (:func:`alibi_slopes`), a tensor
    (learnable if it requires grad) or a list.

    Built by :func:`attnkit.mods.alibi`, which also takes a number of heads. Backends:
    ``sdpa`` when the bias folds into a per-key bias (the causal form, or the
    symmetric one under a causal mask; no softcap after it; no grouped-query heads),
    ``chunked`` and ``reference`` always.

    Args:
        slopes: (H,) float tensor or list of floats, one per query head (or one for
            all); a tensor is kept as it is (a parameter is learned).
        causal: keyword-only; True: ``-slope_h * (i - j)``; False (default):
            ``-slope_h * |i - j|``.
        align: keyword-only, ``"top_left"`` (default) or ``"bottom_right"``.
        q_offset: keyword-only int, global position of query row 0 (default 0).
        k_offset: keyword-only int, global position of key column 0 (default 0).

    Attributes:
        slopes: the (H,) slopes.
        causal: which form.

    Raises:
        TypeError, ValueError: ``slopes`` is not a 1-D float tensor or list, or
            ``causal``, ``align`` or an offset is bad.
    """

    kind = "alibi"
    grows_with_distance = True

    def __init__(
        self,
        slopes: torch.Tensor | Sequence[float],
        *,
        causal: bool = False,
        align: Align = "top_left",
        q_offset: int = 0,
        k_offset: int = 0,
    ) -> None:
        super().__init__(align, q_offset, k_offset, "mods.alibi")
        t = as_float_tensor("mods.alibi", "slopes", slopes, ndim=1, layout="(H,)")
        self.causal = as_bool("mods.alibi", "causal", causal)
        self.slopes = t  # an nn.Parameter registers with this module

    def check(self, heads: int, where: str = "mods") -> None:
        n = self.slopes.shape[0]
        if n != 1 and n != heads:  # (not `in`: dynamo's `in` misses a dynamic size equal to it)
            raise ValueError(
                f"{where}: mods.alibi has {self.slopes.shape[0]} slopes, but the call has "
                f"{heads} query heads (dim -3); expected one slope per head"
            )

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.slopes,)

    def slope_of(self, heads: torch.Tensor) -> torch.Tensor:
        s = self.slopes.to(device=heads.device, dtype=_at_least_float32(self.slopes))
        return s[heads] if s.shape[0] != 1 else s.expand(heads.shape[0])  # (H,)

    def _unit(self, offsets: torch.Tensor) -> torch.Tensor:
        """The bias of a slope of 1 at ``offsets`` (long, key position - query position),
        in exact integers: ``-(i - j) = j - i``, or the symmetric ``-|i - j|``."""
        return offsets if self.causal else -offsets.abs()

    def _unit_at(self, offset: int) -> int:
        """:meth:`_unit` of one offset (a Python int: exact at any size)."""
        return offset if self.causal else -abs(offset)

    def offset_bias(self, heads: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        d = self._unit(offsets).to(_at_least_float32(self.slopes))  # (n,)
        return self.slope_of(heads).view(-1, 1) * d.view(1, -1)  # (H, n)

    def relative_offset_bias(self, heads: torch.Tensor, offsets: torch.Tensor, ref: int
                             ) -> torch.Tensor:  # fmt: skip
        d = self._unit(offsets) - self._unit_at(ref)  # (n,) exact, at most L + S - 2 in size
        return self.slope_of(heads).view(-1, 1) * d.to(_at_least_float32(self.slopes))  # (H, n)

    def folded(
        self, heads: torch.Tensor, L: int, S: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The causal form as a per-key bias plus a per-query constant, for kernels with
        no position table: ``-slope (p_i - p_j) = slope c_j - slope r_i + slope n``, with
        (r, c, n) of :meth:`Positions.relative` and :meth:`Positions.nearest_offset`, so
        neither term grows with the positions: the large ``slope n`` goes to the row
        term, which only the lse sees, or, with :attr:`common_dropped`, is left out as
        :meth:`bias_table` leaves it. Returns (key (H, S), row (H, L)) in ``dtype`` (at
        least the slopes' own precision), differentiable in the slopes."""
        pos = self.positions(L, S)
        rows, cols = pos.relative(L, S, heads.device)  # (L,), (S,)
        ref = pos.nearest_offset(L, S)
        # slope n less the common part bias_table leaves out, slope * unit(n): 0 for the
        # causal form; n + |n| for the symmetric one, 0 wherever a pair is kept (this fold
        # keeps keys at or before their queries only, so a kept pair means n <= 0)
        n = ref - (self._unit_at(ref) if self.common_dropped else 0)
        dt = torch.promote_types(_at_least_float32(self.slopes), dtype)
        slope = self.slope_of(heads).to(dt).view(-1, 1)  # (H, 1)
        row = -(slope * (rows - n).to(dt).view(1, L))
        return slope * cols.to(dt).view(1, S), row

    def signature(self) -> tuple[object, ...]:
        return (*super().signature(), self.causal)


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _bucketing(
    where: str, num_buckets: object, max_distance: object, bidirectional: object
) -> tuple[int, int, bool]:
    """T5's bucketing arguments, checked: each direction needs an exact bucket (the
    logarithmic ones divide by their count), and ``max_distance`` must exceed the exact
    buckets (it divides by the log of their ratio)."""
    bidirectional = as_bool(where, "bidirectional", bidirectional)
    least = 4 if bidirectional else 2
    why = f"an int >= {least}" + (" (half the buckets per direction)" if bidirectional else "")
    n = as_int(where, "num_buckets", num_buckets, low=least, what=why)
    far = as_int(where, "max_distance", max_distance, low=2, what="an int >= 2")
    if (n // (2 if bidirectional else 1)) // 2 >= far:
        raise ValueError(
            f"{where}: max_distance must exceed the exact buckets "
            f"(num_buckets={n}, max_distance={far})"
        )
    return n, far, bidirectional


def t5_buckets(
    relative: torch.Tensor, num_buckets: int, max_distance: int, bidirectional: bool
) -> torch.Tensor:
    """T5's bucket of each relative position ``j - i`` (long tensor of the same shape):
    exact buckets for small distances, logarithmic ones up to ``max_distance``; with
    ``bidirectional`` half the buckets for keys after the query.

    The same bucketing as transformers' ``T5Attention._relative_position_bucket``.

    Args:
        relative: long tensor of any shape, key position minus query position.
        num_buckets: the number of buckets (T5: 32).
        max_distance: distances from this on share the last bucket of their side
            (T5: 128).
        bidirectional: True: buckets ``n/2 ..`` for keys after the query (``j > i``),
            ``0 .. n/2 - 1`` for the others; False: only ``j <= i`` is bucketed by
            distance, keys after the query fall in bucket 0.

    Returns:
        long tensor of the shape of ``relative``, values in [0, num_buckets).

    Examples:
        >>> import torch
        >>> from attnkit import mods
        >>> mods.t5_buckets(torch.arange(-4, 5), num_buckets=8, max_distance=16,
        ...                 bidirectional=True)
        tensor([2, 2, 2, 1, 0, 5, 6, 6, 6])
    """
    where = "mods.t5_buckets"
    if not isinstance(relative, torch.Tensor) or relative.dtype not in _INT_DTYPES:
        got = relative.dtype if isinstance(relative, torch.Tensor) else type(relative).__name__
        raise TypeError(f"{where}: relative must be an integer tensor (j - i), got {got}")
    num_buckets, max_distance, bidirectional = _bucketing(
        where, num_buckets, max_distance, bidirectional
    )
    # in int64, and within ±2**62: |dtype's minimum| overflowed abs() to a negative bucket
    # (every distance past max_distance has the last bucket anyway)
    relative = relative.to(torch.long).clamp(-(2**62), 2**62)
    out = torch.zeros_like(relative)
    n = num_buckets
    if bidirectional:
        n //= 2
        out = out + (relative > 0).to(torch.long) * n
        rel = relative.abs()
    else:
        rel = -torch.clamp(relative, max=0)
    exact = n // 2
    small = rel < exact
    big = exact + (
        torch.log(rel.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (n - exact)
    ).to(torch.long)
    big = torch.clamp(big, max=n - 1)
    return out + torch.where(small, rel, big)


class RelativePositionBias(PositionMod):
    """T5's relative position bias: ``table[bucket(j - i), h]`` with a learnable
    ``table`` of shape (num_buckets, heads), the layout of T5's
    ``relative_attention_bias.weight`` (pass that weight as it is).

    Computed per tile from positions, never as an (H, L, S) tensor unless weights are
    asked for. The table's gradient is reduced per bucket in a fixed order, so it is
    the same bit for bit on every run.

    Built by :func:`attnkit.mods.relative_position_bias`; runs on ``chunked`` and
    ``reference``.

    Args:
        table: float tensor (num_buckets, heads), kept as it is (a parameter learns).
        num_buckets: rows of ``table``, an int >= 4 (>= 2 when not bidirectional).
        max_distance: an int >= 2, larger than the exact buckets (see :func:`t5_buckets`).
        bidirectional: True (default): buckets for both directions; False: causal.
        align: keyword-only, ``"top_left"`` (default) or ``"bottom_right"``.
        q_offset: keyword-only int, global position of query row 0 (default 0).
        k_offset: keyword-only int, global position of key column 0 (default 0).

    Raises:
        TypeError, ValueError: as for :func:`attnkit.mods.relative_position_bias`.
    """

    kind = "relative_position_bias"

    def __init__(
        self,
        table: torch.Tensor,
        num_buckets: int,
        max_distance: int,
        bidirectional: bool = True,
        *,
        align: Align = "top_left",
        q_offset: int = 0,
        k_offset: int = 0,
    ) -> None:
        where = "mods.relative_position_bias"
        super().__init__(align, q_offset, k_offset, where)
        table = as_float_tensor(where, "table", table, ndim=2, layout="(num_buckets, heads)",
                                convert=False)  # fmt: skip
        num_buckets, max_distance, bidirectional = _bucketing(
            where, num_buckets, max_distance, bidirectional
        )
        if table.shape[0] != num_buckets:
            raise ValueError(
                f"mods.relative_position_bias: table has {table.shape[0]} rows, expected "
                f"num_buckets={num_buckets}"
            )
        self.table = table
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional

    def check(self, heads: int, where: str = "mods") -> None:
        n = self.table.shape[1]
        if n != 1 and n != heads:  # (not `in`, as in ALiBi.check)
            raise ValueError(
                f"{where}: mods.relative_position_bias has a table for {self.table.shape[1]} "
                f"heads, but the call has {heads} query heads (dim -3)"
            )

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.table,)

    def offset_bias(self, heads: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        table = self.table.to(device=heads.device, dtype=_at_least_float32(self.table))  # (nb, H)
        cols = table[:, heads] if table.shape[1] != 1 else table.expand(-1, heads.shape[0])
        buckets = t5_buckets(offsets, self.num_buckets, self.max_distance, self.bidirectional)
        return cols.t()[:, buckets]  # (H, n)

    def signature(self) -> tuple[object, ...]:
        return (*super().signature(), self.num_buckets, self.max_distance, self.bidirectional)
