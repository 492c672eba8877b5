"""Words and special tokens: a linear map over positions, applied to rows and columns.

A :class:`PositionMap` sends each token position to a page position (a *group*:
a word of several pieces) or drops it (a special token under ``--no-special``).
The reducer applies it to every row block of weights as they stream by, so the
word view and the view without special tokens cost one more pass over the
weights and work at any length (dense and long pages, statistics, rollout):

- columns (keys): attention *to* a word is the **sum** over its pieces; a
  dropped key is left out, and each row is then **renormalised** to sum to 1;
- rows (queries): attention *from* a word is the **mean** over its pieces (of
  rows that already sum to 1, so they still do); a dropped query is left out.

Written as matrices, a layer's weights ``A`` (Q, K) become ``R A C`` with ``C``
(K, K') the 0/1 membership of keys in groups and ``R`` (Q', Q) the membership of
queries divided by each group's size, and a row scaling for renormalisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .tokens import TokenText

__all__ = ["PositionMap", "WordsError", "apply_map", "map_labels", "map_position", "position_map"]


class WordsError(ValueError):
    """The tokens cannot be grouped into words; the message says why and what happens."""


@dataclass(frozen=True)
class PositionMap:
    """Token positions -> page positions.

    Attributes:
        group: (n,) int64, the page position of each token, -1 where dropped;
            increasing by runs over the kept tokens (a group is a run of tokens).
        size: the number of page positions.
        counts: (size,) float32 tokens per group.
        boundary: (n + 1,) bool, where a block of token rows may start or end
            without splitting a group.
        drops: whether some tokens are dropped (rows are renormalised).
        merges: whether some group has several tokens (a word view).
    """

    group: torch.Tensor
    size: int
    counts: torch.Tensor
    boundary: torch.Tensor
    drops: bool
    merges: bool

    @property
    def n(self) -> int:
        """Token positions the map reads."""
        return int(self.group.numel())

    @property
    def kept(self) -> torch.Tensor:
        """(size,) the first token position of each group."""
        g = self.group
        first = (g >= 0) & torch.cat([torch.ones(1, dtype=torch.bool), g[1:] != g[:-1]])
        return torch.nonzero(first).flatten()

    @classmethod
    def from_groups(cls, group: Sequence[int]) -> PositionMap:
        """A map from each token's group (-1: dropped), groups numbered 0, 1, ... as runs."""
        g = torch.as_tensor(list(group), dtype=torch.long)  # (n,)
        kept = g[g >= 0]
        size = int(kept.max()) + 1 if kept.numel() else 0
        steps = kept[1:] - kept[:-1]
        if kept.numel() and (int(kept[0]) != 0 or bool(((steps != 0) & (steps != 1)).any())):
            raise ValueError("group: expected runs numbered 0, 1, 2, ... in token order")
        counts = torch.bincount(kept, minlength=size).float()  # (size,)
        edge = torch.ones(g.numel() + 1, dtype=torch.bool)  # (n + 1,)
        edge[1:-1] = (g[1:] != g[:-1]) | (g[1:] < 0)
        return cls(g, size, counts, edge, bool((g < 0).any()), bool((counts > 1).any()))

    def cut(self, row0: int, end: int) -> int:
        """Where a block of token rows from ``row0`` ends, at most ``end`` when it can:
        the last boundary in (row0, end], else the first after it."""
        end = max(row0 + 1, min(end, self.n))
        inside = torch.nonzero(self.boundary[row0 + 1 : end + 1]).flatten()
        if inside.numel():
            return row0 + 1 + int(inside[-1])
        after = torch.nonzero(self.boundary[end:]).flatten()
        return end + int(after[0])

    def rows_in(self, row0: int, r: int) -> tuple[int, int]:
        """(first page row, page rows) of the token rows [row0, row0 + r), which must hold
        whole groups."""
        if not (bool(self.boundary[row0]) and bool(self.boundary[row0 + r])):
            raise ValueError(
                f"rows: token rows {row0}..{row0 + r} split a word; a block must hold whole words"
            )
        inside = self.group[row0 : row0 + r]
        kept = inside[inside >= 0]
        if not kept.numel():
            return 0, 0
        return int(kept[0]), int(kept[-1]) - int(kept[0]) + 1


def position_map(tokens: TokenText, *, words: bool, drop_special: bool) -> PositionMap | None:
    """The map of the word view and/or the view without special tokens (None: neither).

    Raises:
        WordsError: ``words`` and the tokenizer marks no words and gives no offsets.
    """
    if not words and not drop_special:
        return None
    n = len(tokens)
    if words and tokens.words is None:
        raise WordsError(
            "the tokenizer gives neither word ids nor character offsets (a slow tokenizer?), "
            "so its pieces cannot be grouped into words; leave --words out to see tokens"
        )
    word = tokens.words if words and tokens.words is not None else list(range(n))
    group: list[int] = []
    number = -1
    for i in range(n):
        if drop_special and tokens.special[i]:
            group.append(-1)
            continue
        if number < 0 or word[i] != word[i - 1] or group[-1] < 0:
            number += 1
        group.append(number)
    if number < 0:
        raise WordsError("the input has only special tokens; nothing is left without them")
    return PositionMap.from_groups(group)


def apply_map(
    w: torch.Tensor, row0: int, rows: PositionMap | None, cols: PositionMap | None
) -> tuple[torch.Tensor, int]:
    """Weights (h, r, S) of token rows row0 .. row0 + r - 1 and keys 0 .. S - 1 on page
    positions: (h, r', S') and the first page row.

    Columns are summed per group (dropped keys left out, each row renormalised when some
    are); rows are averaged per group (dropped rows left out). The token rows must hold
    whole row groups (see :meth:`PositionMap.cut`).
    """
    h, r, S = w.shape
    if cols is not None:
        g = cols.group[:S]  # (S,)
        width = int(g.max()) + 1 if S and int(g.max()) >= 0 else 0
        out = w.new_zeros(h, r, width)  # (h, r, S')
        keep = g >= 0
        if bool(keep.all()):
            out.index_add_(2, g, w)
        else:
            out.index_add_(2, g[keep], w[..., keep])
            total = out.sum(-1, keepdim=True)  # (h, r, 1)
            out.div_(torch.where(total > 0, total, torch.ones((), dtype=w.dtype)))
        w = out
    if rows is None:
        return w, row0
    g0, n_groups = rows.rows_in(row0, r)
    g = rows.group[row0 : row0 + r]  # (r,)
    keep = g >= 0
    if not n_groups:
        return w[:, :0], g0
    out = w.new_zeros(h, n_groups, w.shape[-1])  # (h, r', S')
    src = w if bool(keep.all()) else w[:, keep]
    out.index_add_(1, g[keep] - g0, src)
    out.div_(rows.counts[g0 : g0 + n_groups].view(1, -1, 1))
    return out, g0


def map_labels(
    shown: Sequence[str],
    raw: Sequence[str],
    pmap: PositionMap | None,
    partial: Sequence[bool] | None = None,
) -> tuple[list[str], list[str]]:
    """The page's tokens: each group's pieces joined as written, and their raw spellings
    joined by spaces (``un ##bel ##ie``).

    ``partial`` marks the tokens shown as the bytes of a character a later token
    completes (:attr:`attnkit.viz.tokens.TokenText.partial`): within a group that holds
    the completing token, only their leading space is kept, so a word reads as written
    (``café``, not ``caf\\xc3é``)."""
    if pmap is None:
        return list(shown), list(raw)
    texts: list[list[str]] = [[] for _ in range(pmap.size)]
    raws: list[list[str]] = [[] for _ in range(pmap.size)]
    held: list[list[str]] = [[] for _ in range(pmap.size)]  # pieces not yet completed
    for i, g in enumerate(pmap.group.tolist()):
        if g < 0:
            continue
        raws[g].append(raw[i])
        if partial is not None and partial[i]:
            held[g].append(shown[i])
            continue
        if held[g]:  # this token completes the character: its pieces leave their spaces
            texts[g].append("".join(p[: len(p) - len(p.lstrip())] for p in held[g]))
            held[g] = []
        texts[g].append(shown[i])
    return ["".join(t + h) for t, h in zip(texts, held, strict=True)], [" ".join(r) for r in raws]


def map_position(pmap: PositionMap | None, position: int | None) -> int | None:
    """The page position of the first kept token at or after token ``position`` (a pair's
    second text, the first generated token); None when none is."""
    if position is None or pmap is None:
        return position
    after = pmap.group[position:]
    kept = after[after >= 0]
    return int(kept[0]) if kept.numel() else None
