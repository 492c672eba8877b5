"""The long page's store: exact block overviews and exact top-k keys, a row block at a time.

For each head, a long page keeps the max and the mean of its weights over b×b
blocks of (query, key) positions, and the exact top-k keys of every query row.
:class:`LongStore` fills them from weights (h, r, S) of a few heads and a row
block, vectorised over heads and rows:

1. per row, the max of every :data:`SUB` keys (one pass), and from them of every
   b keys (b a multiple of :data:`SUB`), then over the rows of each row block;
2. the sums: first over the rows of each row block (a pass along the keys), then
   over each block of b keys (an array b times smaller);
3. the top-k, pruned by those maxima (where the compiled kernel runs, the three steps
   are one pass instead, :func:`attnkit.kernels.rows.row_top_k`, whose sums are per row
   and then over each row block): the k keys of largest weight lie in the k
   groups of :data:`SUB` keys of largest max (a key outside them is beaten by the
   max of each of those k groups), and those groups in the k larger groups of
   largest max, so each row searches three short lists (of at most about 128
   values, where ``torch.topk`` is fastest) instead of every key.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels.rows import row_top_k

__all__ = ["SUB", "LongStore", "block_max", "overview_block", "top_keys"]

Heads = slice | torch.Tensor  # shown heads as a slice (contiguous) or an index tensor
SUB = 8  # keys per sub-block: the unit of the top-k search and of the overview's blocks
_LIST = 128  # values per row in each search step


def overview_block(Q: int, K: int, side: int) -> int:
    """The side b of an overview block: at most ``side`` blocks along Q and K, and a
    multiple of :data:`SUB` past it (so blocks are made of sub-blocks)."""
    b = max(1, -(-max(Q, K) // side))
    return b if b <= SUB else -(-b // SUB) * SUB


def _pool_max(w: torch.Tensor, b: int) -> torch.Tensor:
    """(h, r, S) -> per row the max of every b keys, (h, r, ceil(S / b))."""
    h, r, S = w.shape
    if S < b:
        return w.amax(-1, keepdim=True)  # (h, r, 1)
    return F.max_pool1d(w.reshape(h * r, 1, S), b, b, ceil_mode=True).view(h, r, -1)


def _sum_keys(x: torch.Tensor, b: int, n_blocks: int) -> torch.Tensor:
    """(h, n, S) -> the sum of every b keys, (h, n, n_blocks) (blocks past S are 0)."""
    h, n, S = x.shape
    full = S // b
    out = x.new_zeros(h, n, n_blocks)
    out[..., :full] = x[..., : full * b].reshape(h, n, full, b).sum(-1)
    if S % b:
        out[..., full] = x[..., full * b :].sum(-1)
    return out


def _regroup(x: torch.Tensor, m: int, fill: float) -> torch.Tensor:
    """(h, r, n) -> (h, r, ceil(n / m)): the max of every m values."""
    h, r, n = x.shape
    if m == 1:
        return x
    groups = -(-n // m)
    if groups * m != n:
        x = F.pad(x, (0, groups * m - n), value=fill)
    return x.view(h, r, groups, m).amax(-1)  # (h, r, groups)


def block_max(w: torch.Tensor, b: int, n_blocks: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per row, the max of each block of ``b`` keys, and of each :data:`SUB` keys (None when
    ``b`` is not a multiple of it).

    Args:
        w: (h, r, S) weights (>= 0); keys beyond S count as 0.
        b: keys per block.
        n_blocks: blocks in the result (>= ceil(S / b)); blocks past S are 0.

    Returns:
        (h, r, n_blocks) maxima, and (h, r, ceil(S / SUB)) maxima or None.
    """
    sub_max: torch.Tensor | None = None
    if b % SUB == 0:
        sub_max = _pool_max(w, SUB)  # (h, r, ceil(S / SUB))
        bmax = _regroup(sub_max, b // SUB, 0.0)
    else:
        bmax = _pool_max(w, b)
    short = n_blocks - bmax.shape[-1]
    if short > 0:
        bmax = F.pad(bmax, (0, short))  # (h, r, n_blocks)
    return bmax, sub_max


def _best(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (h, r, k) of the k largest of each row of (h, r, n), in no order."""
    return torch.topk(values, k, dim=-1, sorted=False).indices


def top_keys(
    w: torch.Tensor, k: int, sub_max: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact top-k weights of each row and their keys.

    Args:
        w: (h, r, S) weights (>= 0).
        k: keys kept per row (keys S .. k - 1 count as weight 0 when S < k).
        sub_max: (h, r, ceil(S / SUB)) the max of every :data:`SUB` keys, when known.

    Returns:
        (h, r, k) weights, largest first, and (h, r, k) int64 key indices.
    """
    h, r, S = w.shape
    if S <= k:
        return torch.topk(F.pad(w, (0, k - S)), k, dim=-1)  # keys past S: weight 0
    if S <= 2 * _LIST or S <= 2 * k * SUB:  # short rows: search them whole
        return torch.topk(w, k, dim=-1)
    if sub_max is None:
        sub_max = _pool_max(w, SUB)
    n = sub_max.shape[-1]
    if n <= _LIST:  # the k sub-blocks of largest max
        sub = _best(sub_max, k)  # (h, r, k)
    else:  # the k groups of m sub-blocks of largest max, then their k best sub-blocks
        m = -(-n // _LIST)
        groups = _regroup(sub_max, m, -1.0)  # (h, r, ceil(n / m))
        sub = (_best(groups, k).unsqueeze(-1) * m + torch.arange(m)).view(h, r, k * m)
        values = torch.gather(sub_max, 2, sub.clamp_max(n - 1)).masked_fill_(sub >= n, -1.0)
        sub = torch.gather(sub, 2, _best(values, k))  # (h, r, k)
    index = (sub.unsqueeze(-1) * SUB + torch.arange(SUB)).view(h, r, k * SUB)  # (h, r, k·SUB)
    cand = torch.gather(w, 2, index.clamp_max(S - 1))
    if S % SUB:
        cand.masked_fill_(index >= S, -1.0)  # past the last key: never chosen
    vals, pick = torch.topk(cand, k, dim=-1)  # (h, r, k), largest first
    return vals, torch.gather(index, 2, pick)


class LongStore:
    """Block overviews (max, sum) and top-k rows of (layers, heads, Q, K) weights.

    Args:
        n_layers, n_heads: the shown layers and heads.
        Q, K: page rows and keys.
        block: b, the side of an overview block.
        k: keys kept per row.
    """

    def __init__(self, n_layers: int, n_heads: int, Q: int, K: int, block: int, k: int) -> None:
        self.Q, self.K, self.block, self.k = Q, K, block, k
        self.Qb, self.Kb = -(-Q // block), -(-K // block)
        shape = (n_layers, n_heads, self.Qb, self.Kb)
        self.pmax = torch.zeros(shape)  # (layers, heads, Qb, Kb)
        self.psum = torch.zeros(shape)  # (layers, heads, Qb, Kb)
        self.tk_idx = torch.zeros((n_layers, n_heads, Q, k), dtype=torch.int32)
        self.tk_w = torch.zeros((n_layers, n_heads, Q, k))

    def add(self, li: int, heads: Heads, row0: int, w: torch.Tensor) -> None:
        """Reduce weights (h, r, S) of layer ``li``, shown heads ``heads``, rows row0 .. row0 + r - 1."""
        h, r, S = w.shape
        b = self.block
        qb0, qb1 = row0 // b, (row0 + r - 1) // b + 1
        aligned = row0 % b == 0 and r % b == 0  # whole row blocks: views
        where = (torch.arange(row0, row0 + r) // b - qb0).view(1, r, 1)  # (1, r, 1)
        fused = row_top_k(w, self.k, b)  # one pass: the top-k, block maxima and sums
        if fused is not None:
            vals, idx, bmax, bsum = fused  # (h, r, k) twice, (h, r, ceil(S / b)) twice
            if bmax.shape[-1] < self.Kb:
                bmax = F.pad(bmax, (0, self.Kb - bmax.shape[-1]))  # (h, r, Kb)
                bsum = F.pad(bsum, (0, self.Kb - bsum.shape[-1]))  # (h, r, Kb)
            if aligned:  # then over the rows of each row block
                rsum = bsum.view(h, r // b, b, self.Kb).sum(2)  # (h, qb1 - qb0, Kb)
            else:
                rsum = bsum.new_zeros(h, qb1 - qb0, self.Kb).index_add_(1, where.view(r), bsum)
        else:
            bmax, sub_max = block_max(w, b, self.Kb)  # (h, r, Kb)
            vals, idx = top_keys(w, self.k, sub_max)  # (h, r, k)
            if aligned:  # rows first (a pass along the keys), then the keys
                rows = w.view(h, r // b, b, S).sum(2)  # (h, qb1 - qb0, S)
            else:
                rows = w.new_zeros(h, qb1 - qb0, S).index_add_(1, where.view(r), w)  # (h, ., S)
            rsum = _sum_keys(rows, b, self.Kb)  # (h, qb1 - qb0, Kb)
        if aligned:
            rmax = bmax.view(h, r // b, b, self.Kb).amax(2)  # (h, qb1 - qb0, Kb)
        else:
            rmax = bmax.new_zeros(h, qb1 - qb0, self.Kb)
            rmax.scatter_reduce_(1, where.expand(h, r, self.Kb), bmax, "amax")
        rows_at = slice(row0, row0 + r)
        blocks = slice(qb0, qb1)
        if isinstance(heads, slice):
            at = self.pmax[li, heads, blocks]
            torch.maximum(at, rmax, out=at)
            self.psum[li, heads, blocks] += rsum
            self.tk_idx[li, heads, rows_at] = idx.int()
            self.tk_w[li, heads, rows_at] = vals
            return
        self.pmax[li, heads, blocks] = torch.maximum(self.pmax[li, heads, blocks], rmax)
        self.psum[li, heads, blocks] += rsum
        self.tk_idx[li, heads, rows_at] = idx.int()
        self.tk_w[li, heads, rows_at] = vals

    def finish(self) -> dict[str, torch.Tensor]:
        """pooled_max, pooled_mean (sum over each block / its cells), topk_index, topk_weight."""
        b = self.block
        rows = torch.full((self.Qb,), float(b))
        rows[-1] = self.Q - b * (self.Qb - 1)
        cols = torch.full((self.Kb,), float(b))
        cols[-1] = self.K - b * (self.Kb - 1)
        return {
            "pooled_max": self.pmax,
            "pooled_mean": self.psum / (rows[:, None] * cols[None, :]),
            "topk_index": self.tk_idx,
            "topk_weight": self.tk_w,
        }
