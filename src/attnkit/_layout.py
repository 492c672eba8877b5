"""HeadLayout: how a call's leading dims map to (batch, heads), in one place.

A call's query is (*batch, L, E) with ``batch`` the broadcast leading dims of query
and key. Its *head dim* is the last leading dim (dim -3), whatever the caller means
by it:

- (L, E): no leading dims, one head;
- (H, L, E): dim -3 is the head dim; d2l's (B, L, E) is read the same way, so a
  per-head parameter of such a call has one entry per batch element (or one in all);
- (B, ..., H, L, E): dim -3 is the head dim, the others batch.

Every per-head parameter (a tensor ``scale``, ALiBi slopes, a T5 table's columns, sink
logits) is (H,) or (1,) and is broadcast against a tensor of that layout by
:meth:`HeadLayout.per_head`; every key-side tensor (keys, values, a score's key bias,
per-key flags) is brought to the query's heads under grouped-query attention by
:meth:`HeadLayout.query_heads`; a tiled kernel that flattens the leading dims to rows
finds each row's head with :meth:`HeadLayout.row_heads`, adds a per-head tile with
:meth:`HeadLayout.add_per_row` and sums a per-row gradient back per head with
:meth:`HeadLayout.sum_per_head`. Backends call these and never reshape a per-head
tensor themselves, so a 2-D, 3-D or grouped-query call is laid out the same way on
every path.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["ONE_HEAD", "HeadLayout"]


class HeadLayout(NamedTuple):
    """The leading dims of a call and its grouped-query factor.

    A named tuple (immutable, like a frozen dataclass) so that torch's compiler builds
    one inside a compiled call on every supported torch (2.12's cannot pass a frozen
    dataclass made in the graph to another object's constructor).

    Attributes:
        batch_shape: the call's leading dims (*batch); () for 2-D inputs.
        groups: query heads per key head (1 without grouped-query attention); key head
            ``j`` serves query heads ``j*groups .. j*groups + groups - 1`` (torch's
            ``enable_gqa`` order).
    """

    batch_shape: tuple[int, ...]
    groups: int = 1

    @property
    def heads(self) -> int:
        """Query heads H: dim -3 of the call (1 without leading dims)."""
        return self.batch_shape[-1] if self.batch_shape else 1

    @property
    def kv_heads(self) -> int:
        """Key/value heads: H / groups."""
        return self.heads // self.groups

    def per_head(self, t: torch.Tensor, trailing: int) -> torch.Tensor:
        """A per-head tensor shaped to broadcast against (*batch_shape, *X), X of
        ``trailing`` dims.

        Args:
            t: (H or 1, *tail), one entry per query head (or one for all), with
                ``len(tail) <= trailing`` (tail aligned to the right of X: a scale (H,)
                against logits (..., L, S) is ``trailing=2``; a tile (H, L, S) too).

        Returns:
            (H or 1, 1.., *tail) at dim ``-(trailing + 1)`` when the call has leading
            dims; without leading dims (2-D inputs, one head) the (1, ...) entry alone,
            (1.., *tail), so the result never adds a dim to a 2-D call.
        """
        tail = tuple(t.shape[1:])
        shaped = t.reshape(t.shape[0], *([1] * (trailing - len(tail))), *tail)
        return shaped if self.batch_shape else shaped[0]

    def query_heads(self, t: torch.Tensor, trailing: int) -> torch.Tensor:
        """A key-side tensor brought to the query's heads under grouped-query attention.

        Args:
            t: (..., Hk, *tail) with ``trailing`` dims after its head dim: keys and
                values (..., Hk, S, D) ``trailing=2``, a key bias (..., Hk, 1, S)
                ``trailing=2``, per-key flags (..., Hk, S) ``trailing=1``.

        Returns:
            (..., H, *tail), key head j repeated for its ``groups`` query heads. A tensor
            that broadcasts over the heads (size 1 there, or no head dim) or that is
            already per query head is returned as it is, so the call is idempotent.
        """
        dim = -(trailing + 1)
        if self.groups == 1 or t.ndim <= trailing or t.shape[dim] != self.kv_heads:
            return t
        return t.repeat_interleave(self.groups, dim=dim)  # (..., H, *tail)

    def has_query_heads(self, t: torch.Tensor, trailing: int) -> bool:
        """True when the key-side tensor ``t`` (..., heads, *tail) is per query head under
        grouped-query attention (a key bias a per-head scale multiplied): the keys and
        values it goes with must then be brought to the query's heads too."""
        dim = -(trailing + 1)
        return self.groups > 1 and t.ndim > trailing and t.shape[dim] == self.heads

    def sum_to_key_heads(self, g: torch.Tensor, like: torch.Tensor, trailing: int) -> torch.Tensor:
        """The inverse of :meth:`query_heads` for a gradient: ``g`` (..., H, *tail), the
        gradient of ``query_heads(like)``, summed over each key head's query heads when
        ``like`` has the key's heads, else as it is."""
        dim = -(trailing + 1)
        if self.groups == 1 or like.ndim <= trailing or like.shape[dim] != self.kv_heads:
            return g
        return g.unflatten(dim, (-1, self.groups)).sum(dim)  # (..., Hk, *tail)

    def row_heads(self, start: int, stop: int, device: torch.device) -> torch.Tensor:
        """The head of each flattened row n in [start, stop) of (*batch_shape): n mod H
        (the head dim is the last leading dim), (stop - start,) long."""
        return torch.arange(start, stop, device=device) % self.heads

    def add_per_row(self, s: torch.Tensor, tile: torch.Tensor, start: int) -> torch.Tensor:
        """``s`` (R, ...) rows [start, start + R) of the flattened leading dims, plus each
        row's head's entry of ``tile`` (H or 1, ...), in place where the rows are whole
        runs of heads (a view), else through a gather of the rows' heads."""
        R, H = s.shape[0], tile.shape[0]
        if H == 1:
            return s.add_(tile)
        if start % H == 0 and R % H == 0:
            return s.view(R // H, H, *s.shape[1:]).add_(tile).view(s.shape)
        return s.add_(tile[self.row_heads(start, start + R, s.device)])

    def sum_per_head(self, g: torch.Tensor, start: int, heads: int) -> torch.Tensor:
        """Per-row values ``g`` (R, ...) of rows [start, start + R) summed per head:
        (heads, ...), ``heads`` H (or 1: every row summed). In a fixed order (no atomics),
        so the same bit for bit on every run."""
        R = g.shape[0]
        if heads == 1:
            return g.sum(0, keepdim=True)  # (1, ...)
        if start % heads == 0 and R % heads == 0:
            return g.view(R // heads, heads, *g.shape[1:]).sum(0)  # (H, ...)
        onehot = torch.zeros(heads, R, dtype=g.dtype, device=g.device)  # (H, R)
        onehot[self.row_heads(start, start + R, g.device), torch.arange(R, device=g.device)] = 1
        return (onehot @ g.reshape(R, -1)).view(heads, *g.shape[1:])  # (H, ...)


ONE_HEAD = HeadLayout(())
"""The layout of 2-D inputs (L, E): no leading dims, one head."""
