"""Per-head statistics of attention weights and the pattern class of each head.

One set of row sums is accumulated while the weights stream by (a row block
at a time, see :mod:`attnkit.viz.reduce`); :func:`classify` turns them into a
class. The page's table and the terminal summary of ``attnkit show`` use the
same classes:

- ``previous token``: at least half of each row's weight on the key just before it;
- ``first token (sink)``: at least half on the first key (``[CLS]``, ``<s>``, a sink);
- ``self``: at least half on the query's own position;
- ``broad``: spread out (mean normalized entropy at least 0.7);
- ``local window``: at least 60% within ``LOCAL`` positions either side;
- ``mixed``: none of these.

The first query row is left out of the previous/first/self scores: in a causal
decoder it can only attend to itself, the first token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "CLASSES",
    "LOCAL",
    "StatsAccumulator",
    "classify",
    "describe",
    "head_statistics",
    "most_focused",
]

CLASSES = ("previous token", "first token (sink)", "self", "local window", "broad", "mixed")
LOCAL = 4  # keys within this many positions of the query count as its local window
_FIELDS = ("rows", "entropy", "norm_entropy", "norm_rows", "distance", "prev", "first", "self",
           "pattern_rows", "local")  # fmt: skip


_TINY = torch.finfo(torch.float32).tiny  # log(w) of a weight 0 is read as log(tiny): 0 · it = 0


def _diagonal(w: torch.Tensor, d: int) -> torch.Tensor:
    """(h, r, S) -> (h, r): ``w[:, t, t + d]`` for each row t, 0 where t + d is not a key."""
    h, r, S = w.shape
    out = w.new_zeros(h, r)
    if -r < d < S:
        diag = torch.diagonal(w, offset=d, dim1=1, dim2=2)  # (h, n): rows max(0, -d) ...
        t0 = max(0, -d)
        out[:, t0 : t0 + diag.shape[-1]] = diag
    return out


def _moments(w: torch.Tensor, row0: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, r, S) -> each row's sum of weights and sum of weights times (key - row0), (h, r)
    each: one pass each (a matrix-vector product reads the weights once and writes
    nothing). Keys are counted from row0 so the products stay small near the rows (a
    sum of j itself would cancel against the row's position, thousands for long rows)."""
    h, r, S = w.shape
    offsets = torch.arange(S, dtype=w.dtype) - row0  # (S,)
    moment = torch.mv(w.reshape(h * r, S), offsets).view(h, r)  # (h, r)
    return w.sum(-1), moment


def _distance(w: torch.Tensor, row0: int) -> torch.Tensor:
    """(h, r, S) weights of rows row0 .. row0 + r - 1 -> (h,) the sum over rows of
    ``sum_j w[t, j] |row0 + t - j|``.

    ``|i - j| = (i - j) + 2 max(j - i, 0)``: the first term is linear in j, so it comes
    from each row's sum and first moment (:func:`_moments`); the second lives on keys
    after the row: the r × r square beside the rows, then the keys past the block (after
    every row: linear again). A causal block has no keys past it."""
    r, S = w.shape[1:]
    t = torch.arange(r, dtype=w.dtype)  # (r,): each row's position less row0
    mass, moment = _moments(w, row0)
    signed = t * mass - moment  # (h, r): sum_j w (i - j)
    j0, j1 = min(row0 + 1, S), min(row0 + r, S)  # the square: keys after some row
    if j0 < j1:
        ahead = (torch.arange(j0, j1) - row0 - t.long().unsqueeze(1)).clamp_min_(0)  # (r, n)
        signed += 2 * (w[..., j0:j1] * ahead.to(w.dtype)).sum(-1)
    if j1 < S:  # keys after every row: sum w (j - i)
        far_mass, far_moment = _moments(w[..., j1:], row0 - j1)
        signed += 2 * (far_moment - t * far_mass)
    return signed.sum(-1)


class StatsAccumulator:
    """Row sums per (layer, head), filled a row block at a time, vectorised over heads and
    rows (a few passes over each block, no Python per row or head).

    Args:
        n_layers, n_heads: the grid of heads.
        positional: the queries and keys share positions (self-attention), so
            distances, previous-token, self and local scores mean something.
    """

    def __init__(self, n_layers: int, n_heads: int, positional: bool) -> None:
        self.positional = positional
        self.sums = {f: np.zeros((n_layers, n_heads), np.float64) for f in _FIELDS}

    def add(
        self,
        layer: int,
        w: torch.Tensor,
        rows: torch.Tensor,
        heads: np.ndarray | slice | None = None,
        *,
        entropy: torch.Tensor | None = None,
        keys: torch.Tensor | None = None,
    ) -> None:
        """Add a block of rows.

        Args:
            layer: index into the accumulator's layers.
            w: (h, r, S) weights of h heads for r query rows; keys past S count as 0.
            rows: (r,) the rows' query positions (int64), increasing by one.
            heads: which of the accumulator's heads ``w`` holds (indices or a slice);
                None = all.
            entropy: (h, r) each row's entropy in nats when known (0 for a row with no
                weight); None = computed here from ``w``.
            keys: (h, r) each row's count of weights above 0 when known; None = counted
                here from ``w`` (a pass over it).
        """
        at = (layer, slice(None) if heads is None else heads)
        h, r = w.shape[:2]
        found: dict[str, torch.Tensor] = {}
        # one work buffer for the passes below, when they are made here
        buf = torch.empty_like(w) if keys is None or entropy is None else None  # (h, r, S)
        if keys is None:
            assert buf is not None
            n_keys = torch.sign(w, out=buf).sum(-1)  # (h, r): keys with a weight > 0
        else:
            n_keys = keys.to(w.dtype)  # (h, r)
        used = n_keys > 0  # (h, r): fully masked rows are left out
        found["rows"] = used.sum(-1)
        if entropy is None:
            assert buf is not None
            torch.clamp_min(w, _TINY, out=buf)
            # numpy's vectorised log: several times faster than torch.log on the CPU
            np.log(buf.numpy(), out=buf.numpy())
            buf.mul_(w)
            ent = -buf.sum(-1)  # (h, r) in nats
        else:
            ent = entropy.to(w.dtype)  # (h, r)
        found["entropy"] = (ent * used).sum(-1)
        spread = n_keys > 1
        norm = ent / torch.log(n_keys.clamp_min(2))  # (h, r)
        found["norm_entropy"] = (norm * spread).sum(-1)
        found["norm_rows"] = spread.sum(-1)
        pattern = (rows > 0).unsqueeze(0) & used  # (h, r): rows after the first
        found["pattern_rows"] = pattern.sum(-1)
        found["first"] = (w[..., 0] * pattern).sum(-1)
        if self.positional:
            row0 = int(rows[0])
            found["distance"] = _distance(w, row0)
            band = {off: _diagonal(w, row0 + off) for off in range(-LOCAL, LOCAL + 1)}
            local = sum(band.values(), w.new_zeros(h, r))  # (h, r): |i - j| <= LOCAL
            found["local"] = (local * used).sum(-1)
            found["self"] = (band[0] * pattern).sum(-1)
            found["prev"] = (band[-1] * pattern).sum(-1)
        for name, value in found.items():
            self.sums[name][at] += value.double().numpy()

    def finish(self) -> dict[str, Any]:
        """Means per head and the class of each: a dict of (layers, heads) lists."""
        s = self.sums
        rows = np.maximum(s["rows"], 1)
        pat = np.maximum(s["pattern_rows"], 1)
        out: dict[str, Any] = {
            "entropy": s["entropy"] / rows,
            "normEntropy": s["norm_entropy"] / np.maximum(s["norm_rows"], 1),
            "first": s["first"] / pat,
        }
        if self.positional:
            out |= {
                "distance": s["distance"] / rows,
                "prev": s["prev"] / pat,
                "self": s["self"] / pat,
                "local": s["local"] / rows,
            }
        classes, scores = classify(out)
        result = {k: np.round(v, 4).tolist() for k, v in out.items()}
        result["class"] = classes
        result["score"] = np.round(scores, 4).tolist()
        return result


def classify(stats: dict[str, Any]) -> tuple[list[list[str]], np.ndarray]:
    """The pattern class of every head and the score that decided it.

    Args:
        stats: (layers, heads) arrays ``first``, ``normEntropy`` and, for
            self-attention, ``prev``, ``self``, ``local``.

    Returns:
        (classes as nested lists (layers, heads), scores (layers, heads)).
    """
    first = np.asarray(stats["first"], np.float64)
    zeros = np.zeros_like(first)
    prev = np.asarray(stats.get("prev", zeros), np.float64)
    own = np.asarray(stats.get("self", zeros), np.float64)
    local = np.asarray(stats.get("local", zeros), np.float64)
    broad = np.asarray(stats["normEntropy"], np.float64)
    classes: list[list[str]] = []
    scores = np.zeros_like(first)
    for li in range(first.shape[0]):
        row = []
        for h in range(first.shape[1]):
            named = {"previous token": prev[li, h], "first token (sink)": first[li, h],
                     "self": own[li, h]}  # fmt: skip
            best = max(named, key=lambda k: named[k])
            if named[best] >= 0.5:
                row.append(best)
                scores[li, h] = named[best]
            elif broad[li, h] >= 0.7:
                row.append("broad")
                scores[li, h] = broad[li, h]
            elif local[li, h] >= 0.6:
                row.append("local window")
                scores[li, h] = local[li, h]
            else:
                row.append("mixed")
                scores[li, h] = named[best]
        classes.append(row)
    return classes, scores


def head_statistics(weights: Any, *, positional: bool | None = None) -> dict[str, Any]:
    """Statistics and pattern class of every head of a (layers, heads, Q, K) grid.

    Args:
        weights: (layers, heads, Q, K) weights (tensor, array, or a list of
            per-layer (heads, Q, K) weights such as ``outputs.attentions``).
        positional: queries and keys share positions; None = ``Q == K``.

    Returns:
        a dict of (layers, heads) nested lists: ``entropy`` (nats, mean over
        rows), ``normEntropy`` (entropy / log of the keys a row sees),
        ``first``; for self-attention ``distance`` (mean attended distance),
        ``prev``, ``self``, ``local``; and ``class`` and ``score``.

    Raises:
        ValueError: ``weights`` of no (layers, heads, Q, K) shape, or holding NaN or
            infinity.
    """
    from .grid import as_grid, check_finite

    arr = as_grid(weights, name="weights", dims="layers, heads")  # (layers, heads, Q, K)
    grid = torch.from_numpy(check_finite(arr, "weights"))
    n_layers, n_heads, Q, K = grid.shape
    acc = StatsAccumulator(n_layers, n_heads, Q == K if positional is None else positional)
    rows = torch.arange(Q)
    for li in range(n_layers):
        acc.add(li, grid[li], rows)
    return acc.finish()


def describe(stats: dict[str, Any], layer: int, head: int) -> str:
    """One phrase for a head: ``previous token (0.83 of each row on average)``."""
    cls = stats["class"][layer][head]
    score = stats["score"][layer][head]
    if cls == "broad":
        return f"broad (normalized entropy {score:.2f})"
    if cls == "mixed":
        return "mixed (no single pattern)"
    return f"{cls} ({score:.2f} of each row on average)"


def most_focused(stats: dict[str, Any], layers: Sequence[int]) -> list[int]:
    """For each layer row, the head with the lowest mean entropy."""
    ent = np.asarray(stats["entropy"])
    return [int(np.argmin(ent[i])) for i in range(len(layers))]
