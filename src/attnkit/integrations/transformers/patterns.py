"""A transformers mask pattern read back into attnkit masks, exactly or not at all.

transformers hands its mask function a ``mask_function(batch, head, q_idx, kv_idx)``
composed from factories (causal, sliding window, chunks, packed sequences, blocks,
and/or). Its structure is not public, so the integration does not read it: it
evaluates the function once on the call's (batch, query, key) positions (the grid
transformers' own ``sdpa_mask`` would build) and checks it against a few candidate
patterns, in a fixed order, whose parameters come from the call itself (the
``local_size`` it passes, the model's config) or from the grid (document and block
ids). A candidate is taken only when it keeps exactly the pairs the grid keeps; when
none does, the caller keeps the grid as a dense mask. Never wrong, at worst dense.

Positions are global: query row ``i`` sits at ``q0 + i`` and key column ``j`` at
``k0 + j``; ``q0``/``k0`` are ints or 0-d tensors (a static cache's position, kept as
data so a compiled decode step keeps its graph).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ... import masks
from ...masks.bands import Offset

__all__ = ["Call", "Hints", "band_mask", "recognise"]

Candidate = tuple[torch.Tensor, Callable[[], masks.Mask | None]]
"""(its keep grid (B or 1, 1, L, S), the attnkit mask that keeps the same pairs)."""


@dataclass(frozen=True)
class Hints:
    """Sizes to try: ``windows``/``chunks`` from the call (its ``local_size``), tried
    before the plain bands; ``config_windows``/``config_chunks`` from the model's config
    (``sliding_window``, ``attention_chunk_size``), tried after them."""

    windows: tuple[int, ...] = ()
    chunks: tuple[int, ...] = ()
    config_windows: tuple[int, ...] = ()
    config_chunks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Call:
    """The sizes and positions of one mask-interface call.

    Attributes:
        B, L, S: batch size, queries, keys.
        q0, k0: global positions of the first query and key (int or 0-d tensor).
        device: where index tensors are built.
        stable: the mask feeds a compiled graph (transformers allows no skipping): its
            structure must not depend on values (no part dropped because it keeps all).
    """

    B: int
    L: int
    S: int
    q0: Offset
    k0: Offset
    device: torch.device
    stable: bool

    def positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Global positions of the queries (L,) and keys (S,)."""
        q = torch.arange(self.L, device=self.device) + _on(self.q0, self.device)  # (L,)
        k = torch.arange(self.S, device=self.device) + _on(self.k0, self.device)  # (S,)
        return q, k


def _on(x: Offset, device: torch.device) -> Offset:
    return x.to(device) if isinstance(x, torch.Tensor) else x


def band_mask(left: int | None, right: int | None, c: Call) -> masks.Mask | None:
    """The band ``q - left <= kv <= q + right`` at the call's global positions, or None
    when it keeps every pair and the call's structure may depend on values."""
    if isinstance(c.q0, int) and isinstance(c.k0, int):
        delta = c.q0 - c.k0  # query row i sits at key column i + delta
        keeps_first = left is None or c.L - 1 + delta - left <= 0  # last row keeps key 0
        keeps_last = right is None or c.S - 1 <= delta + right  # first row keeps key S - 1
        if keeps_first and keeps_last and not c.stable:
            return None  # every query sees every key (one new token against its cache)
        if delta == c.S - c.L:
            return _window(left, right, "bottom_right")  # queries are the last positions
        if delta == 0:
            return _window(left, right, "top_left")
    return _window(left, right, "top_left", q_offset=c.q0, k_offset=c.k0)


def _window(
    left: int | None, right: int | None, align: masks.Align, **offsets: Offset
) -> masks.Mask:
    if left is None and right == 0:
        return masks.causal(align, **offsets)
    return masks.window(left, right, align, **offsets)


def _band(left: int | None, right: int | None, c: Call) -> Candidate:
    """The band ``q - left <= kv <= q + right`` as a candidate."""
    return _band_grid(left, right, c), functools.partial(band_mask, left, right, c)


def _band_grid(left: int | None, right: int | None, c: Call) -> torch.Tensor:
    """(1, 1, L, S) bool keep of the band (built outside torch.compile: the offsets are
    read, and the band is two triangles of one byte per pair)."""
    delta = int(c.q0) - int(c.k0)  # query row i sits at key column i + delta
    keep = torch.ones(c.L, c.S, dtype=torch.bool, device=c.device)
    if left is not None:
        keep = keep.triu(delta - left)  # j >= i + delta - left
    if right is not None:
        keep = keep.tril(delta + right)  # j <= i + delta + right
    return keep.view(1, 1, c.L, c.S)


def _left_padding(padding: torch.Tensor | None, c: Call) -> torch.Tensor:
    """(B,) leading padding positions of each row (0 without padding)."""
    if padding is None:
        return torch.zeros(c.B, dtype=torch.long, device=c.device)
    kept = padding.to(device=c.device, dtype=torch.long)
    return (kept.cumsum(dim=-1) == 0).sum(dim=-1).expand(c.B)  # (B,)


def _chunk_starts(grid: torch.Tensor, c: Call) -> torch.Tensor:
    """(B,) the key position where the last query's run of kept keys starts (its chunk's
    first position, where the keys reach back that far)."""
    _, k = c.positions()
    last = grid[:, 0, -1, :]  # (B', S)
    first = torch.where(last, k.view(1, -1), k[-1] + 1).amin(dim=-1)  # (B',)
    return first.expand(c.B)


def _chunk_candidate(size: int, shift: torch.Tensor, c: Call) -> Candidate:
    """Causal within chunks of ``size`` positions, counted from ``shift`` (B,) (the left
    padding of each row: only its remainder modulo ``size`` matters)."""
    q, k = c.positions()
    lp = shift.view(-1, 1)  # (B, 1)
    q_ids = torch.div(q.view(1, -1) - lp, size, rounding_mode="floor")  # (B, L)
    k_ids = torch.div(k.view(1, -1) - lp, size, rounding_mode="floor")  # (B, S)
    low = torch.minimum(q_ids.amin(-1, keepdim=True), k_ids.amin(-1, keepdim=True))  # (B, 1)
    q_ids, k_ids = q_ids - low, k_ids - low  # every id >= 0 (a negative id means padding)
    same = q_ids.view(c.B, 1, c.L, 1) == k_ids.view(c.B, 1, 1, c.S)  # (B, 1, L, S)
    grid = same & _band_grid(None, 0, c)

    def build() -> masks.Mask | None:
        band = band_mask(None, 0, c)
        docs = masks.document(q_ids, key_ids=k_ids)
        return docs if band is None else band & docs

    return grid, build


def _seen_band(grid: torch.Tensor, c: Call) -> tuple[int, int] | None:
    """(left, right): how far before and after its own position the grid's queries keep
    keys, when that is a window (a query keeps keys from q - left to q + right)."""
    rows = grid[:, 0].any(dim=-1)  # (B', L) queries that keep a key
    if not bool(rows.any()):
        return None
    S = grid.shape[-1]
    first = grid[:, 0].to(torch.uint8).argmax(dim=-1)  # (B', L) first kept column
    last = S - 1 - grid[:, 0].flip(-1).to(torch.uint8).argmax(dim=-1)  # (B', L) last kept
    i = torch.arange(grid.shape[-2], device=grid.device) + (int(c.q0) - int(c.k0))  # (L,)
    left = int((i - first)[rows].max())  # keys this far back are kept
    right = int((last - i)[rows].max())
    return (left, right) if left >= 0 and right >= 0 else None


def _with_keys(grid: torch.Tensor, left: int | None, right: int | None, c: Call) -> Candidate:
    """A band and per-batch kept keys read off the grid: a key is dropped when no query
    the band lets see it keeps it."""
    band = _band_grid(left, right, c)  # (1, 1, L, S)
    reached = band.any(dim=-2, keepdim=True)  # (1, 1, 1, S) keys some query may see
    keys = (grid & band).any(dim=-2, keepdim=True) | ~reached  # (B', 1, 1, S)

    def build() -> masks.Mask | None:
        dropped = masks.key_padding(~keys.reshape(-1, c.S).expand(c.B, c.S))  # (B, S)
        m = band_mask(left, right, c)
        return dropped if m is None else m & dropped

    return band & keys, build


def _document_ids(grid: torch.Tensor) -> torch.Tensor:
    """(B', L) ids of packed documents read off a self-attention grid: a position starts a
    document when its row keeps no earlier key (the check against the grid decides)."""
    L = grid.shape[-2]
    earlier = torch.ones(L, L, dtype=torch.bool, device=grid.device).tril(-1)  # (L, L) j < i
    starts = ~(grid[:, 0] & earlier).any(dim=-1)  # (B', L)
    return starts.long().cumsum(dim=-1) - 1  # (B', L)


def _block_ids(extra: torch.Tensor) -> torch.Tensor:
    """(B', L) block ids of a self-attention grid's pairs past the causal band (a query
    seeing a later key of its own block): the first position of each block, -1 alone."""
    L = extra.shape[-1]
    pairs = extra[:, 0]  # (B', L, L)
    first = pairs.to(torch.uint8).argmax(dim=-2)  # (B', L) first query seeing each key
    seen = pairs.any(dim=-2)  # (B', L) a key some earlier query of its block sees
    starts = pairs.any(dim=-1)  # (B', L) a query that sees a later key starts its block
    own = torch.arange(L, device=extra.device).expand_as(first)  # (B', L)
    return torch.where(seen, first, torch.where(starts, own, -1))  # (B', L)


def _same_ids(ids: torch.Tensor) -> torch.Tensor:
    return (ids.unsqueeze(-1) == ids.unsqueeze(-2)).unsqueeze(1) & (ids >= 0).view(
        ids.shape[0], 1, -1, 1
    )  # (B', 1, L, L)


def _sized(
    grid: torch.Tensor,
    c: Call,
    windows: tuple[int, ...],
    chunks: tuple[int, ...],
    padding: torch.Tensor | None,
) -> Iterator[Candidate]:
    for w in windows:  # sliding windows: causal (kv > q - w), two-sided (|q - kv| <= w)
        for left, right in ((w - 1, 0), (w, w), (w - 1, w - 1)):
            yield _band(left, right, c)
    for n in chunks:  # chunks counted after the left padding, as transformers counts them
        yield _chunk_candidate(n, _left_padding(padding, c), c)
        yield _chunk_candidate(n, _chunk_starts(grid, c), c)  # or as the grid shows them


def _candidates(
    grid: torch.Tensor, c: Call, hints: Hints, padding: torch.Tensor | None
) -> Iterator[Candidate]:
    """Candidate patterns: the sizes the call passes first, then plain bands (causal,
    everything), then the config's sizes, then document and block ids read off the
    grid. The order keeps a decode step's answer the same from one step to the next."""
    yield from _sized(grid, c, hints.windows, hints.chunks, padding)
    yield _band(None, 0, c)
    yield _band(None, None, c)
    yield from _sized(grid, c, hints.config_windows, hints.config_chunks, padding)
    windows = (*hints.windows, *hints.config_windows)
    bands = [*((w - 1, 0) for w in windows), (None, 0), (None, None)]
    seen = _seen_band(grid, c)  # the band the grid's kept pairs span, when no size was given
    if seen is not None and seen not in bands:
        yield _band(*seen, c)
        bands.append(seen)
    for left, right in bands:  # a band with some keys dropped (padding inside the pattern)
        yield _with_keys(grid, left, right, c)
    self_attention = c.L == c.S and int(c.q0) == int(c.k0)  # (read: outside compile)
    if not self_attention:
        return
    ids = _document_ids(grid)  # packed sequences: a band inside each document
    for left, right in bands:

        def packed(a: int | None = left, b: int | None = right) -> masks.Mask | None:
            band = band_mask(a, b, c)
            docs = masks.document(ids)
            return docs if band is None else band & docs

        yield _band_grid(left, right, c) & _same_ids(ids), packed
    causal = _band_grid(None, 0, c)
    blocks = _block_ids(grid & ~causal)  # block ids: a block sees itself both ways

    def blockwise() -> masks.Mask | None:
        band = band_mask(None, 0, c)  # None: the band alone keeps every pair already
        return None if band is None else band | masks.document(blocks)

    yield causal | _same_ids(blocks), blockwise


def recognise(
    grid: torch.Tensor, c: Call, hints: Hints, padding: torch.Tensor | None = None
) -> tuple[bool, masks.Mask | None]:
    """The attnkit mask keeping exactly the pairs of ``grid``, if one of the candidates does.

    Reads the grid on the host (one comparison per candidate tried): callers outside
    ``torch.compile`` only.

    Args:
        grid: (B or 1, 1, L, S) bool, the pattern evaluated at the call's positions
            without the padding mask.
        c: the call.
        hints: window and chunk sizes to try.
        padding: the call's 2-D padding mask (True = attend), for chunk boundaries.

    Returns:
        (True, mask or None for "keeps every pair") when recognised, else (False, None).
    """
    for want, build in _candidates(grid, c, hints, padding):
        shape = torch.broadcast_shapes(grid.shape, want.shape)
        if torch.equal(grid.expand(shape), want.expand(shape)):
            return True, build()
    return False, None
