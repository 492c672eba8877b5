"""The long page's store: exact block overviews and exact top-k keys, a row block at a time.

For each head, a long page keeps the max and the mean of its weights over b×b
blocks of (query, key) positions, and the exact top-k keys of every query row.
:class:`LongStore` fills them from weights (h, r, S) of a few heads and a row
block, vectorised over heads and rows:

1. per row, the max and the sum over each block of b keys (one pass each);
2. the overview: those per-row block values reduced over the rows of each row
   block (arrays b times smaller than the weights);
3. the top-k: the k keys of largest weight lie in the k key blocks of largest
   max (a key outside them is beaten by the max of each of those k blocks), so
   only those k·b candidates are searched instead of every key.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["LongStore", "block_max_sum", "top_keys"]

Heads = slice | torch.Tensor  # shown heads as a slice (contiguous) or an index tensor


def block_max_sum(w: torch.Tensor, b: int, n_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the max and the sum of each block of ``b`` keys.

    Args:
        w: (h, r, S) weights (>= 0); keys beyond S count as 0.
        b: keys per block.
        n_blocks: blocks in the result (>= ceil(S / b)); blocks past S are 0.

    Returns:
        (h, r, n_blocks) maxima and (h, r, n_blocks) sums, float32.
    """
    h, r, S = w.shape
    full = S // b
    if S >= b:
        bmax = F.max_pool1d(w.reshape(h * r, 1, S), b, b, ceil_mode=True).view(h, r, -1)
    else:
        bmax = w.amax(-1, keepdim=True)  # (h, r, 1)
    bsum = w[..., : full * b].view(h, r, full, b).sum(-1)  # (h, r, full)
    if S % b:
        bsum = torch.cat([bsum, w[..., full * b :].sum(-1, keepdim=True)], -1)  # (h, r, ceil)
    short = n_blocks - bmax.shape[-1]
    if short > 0:
        bmax, bsum = F.pad(bmax, (0, short)), F.pad(bsum, (0, short))  # (h, r, n_blocks)
    return bmax, bsum


def top_keys(
    w: torch.Tensor, bmax: torch.Tensor, b: int, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact top-k weights of each row and their keys, searched in the k key blocks
    of largest max only.

    Args:
        w: (h, r, S) weights (>= 0).
        bmax: (h, r, n) per-row block maxima of ``w`` (:func:`block_max_sum`), n >= ceil(S / b).
        b: keys per block.
        k: keys kept per row (keys S .. k - 1 count as weight 0 when S < k).

    Returns:
        (h, r, k) weights, largest first, and (h, r, k) int64 key indices.
    """
    h, r, S = w.shape
    if S <= k:
        return torch.topk(F.pad(w, (0, k - S)), k, dim=-1)  # keys past S: weight 0
    blocks = -(-S // b)
    if blocks <= 2 * k:  # pruning would keep most keys: search them all
        return torch.topk(w, k, dim=-1)
    _, chosen = torch.topk(bmax[..., :blocks], k, dim=-1, sorted=False)  # (h, r, k)
    index = (chosen.unsqueeze(-1) * b + torch.arange(b)).view(h, r, k * b)  # (h, r, k·b)
    cand = torch.gather(w, 2, index.clamp_max(S - 1))  # (h, r, k·b)
    if S % b:
        cand = cand.masked_fill(index >= S, -1.0)  # past the last key: never chosen
    vals, pick = torch.topk(cand, k, dim=-1)  # (h, r, k)
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
        h, r, _ = w.shape
        b = self.block
        bmax, bsum = block_max_sum(w, b, self.Kb)  # (h, r, Kb) each
        qb0, qb1 = row0 // b, (row0 + r - 1) // b + 1
        if row0 % b == 0 and r % b == 0:  # whole row blocks: a view
            rmax = bmax.view(h, r // b, b, self.Kb).amax(2)  # (h, qb1 - qb0, Kb)
            rsum = bsum.view(h, r // b, b, self.Kb).sum(2)
        else:
            where = (torch.arange(row0, row0 + r) // b - qb0).view(1, r, 1).expand(h, r, self.Kb)
            rmax = bmax.new_zeros(h, qb1 - qb0, self.Kb).scatter_reduce_(1, where, bmax, "amax")
            rsum = bsum.new_zeros(h, qb1 - qb0, self.Kb).index_add_(1, where[0, :, 0], bsum)
        vals, idx = top_keys(w, bmax, b, self.k)  # (h, r, k)
        rows = slice(row0, row0 + r)
        blocks = slice(qb0, qb1)
        if isinstance(heads, slice):
            at = self.pmax[li, heads, blocks]
            torch.maximum(at, rmax, out=at)
            self.psum[li, heads, blocks] += rsum
            self.tk_idx[li, heads, rows] = idx.int()
            self.tk_w[li, heads, rows] = vals
            return
        self.pmax[li, heads, blocks] = torch.maximum(self.pmax[li, heads, blocks], rmax)
        self.psum[li, heads, blocks] += rsum
        self.tk_idx[li, heads, rows] = idx.int()
        self.tk_w[li, heads, rows] = vals

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
