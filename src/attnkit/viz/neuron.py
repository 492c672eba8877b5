"""q and k for the neuron view: every layer, for every query that fits, else a window.

The neuron view draws, for one query and one key, the per-dimension terms whose
sum times the scale is the logit. :class:`NeuronStore` keeps q and k in float32
while the model runs:

- when every layer's q and k of every token fit :attr:`Budget.neuron_values
  <attnkit.viz.reduce.Budget>`, all of them;
- past that, q for a *window* of query positions (by default the
  :data:`DEFAULT_WINDOW` positions ending at the last one) and k for the keys
  those queries weigh most: the window's own positions first, then each window
  query's best key in every layer and head, then the second best, and so on,
  until the budget is full.

Positions are page positions; a view without special tokens maps them to token
positions (``positions``). The word view has no neuron view: q and k belong to
tokens, not words.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["DEFAULT_WINDOW", "NeuronStore", "WindowError", "window_capacity"]

DEFAULT_WINDOW = 32  # query positions kept past the budget, ending at the last one


class WindowError(ValueError):
    """A query window that the input or the page cannot hold; the message says why."""


def window_capacity(budget: int, n_layers: int, n_heads: int, dim: int) -> int:
    """The most query positions a window may hold: half of the positions (q or k) the
    budget pays for at this model's size, so at least as many keys as queries fit."""
    return max(1, budget // max(1, n_layers * n_heads * dim) // 2)


class NeuronStore:
    """q and k of the shown layers and heads, in float32 (a model's q and k may pass
    float16's range).

    Args:
        layers: model layers shown (increasing).
        n_heads: heads shown.
        positions: (Q',) token row of each page query; None = the identity.
        key_positions: (K',) token key of each page key; None = the identity.
        Q, K: token rows and keys of the run.
        budget: at most this many values (layers × heads × (queries + keys) × dim).
        window: (start, stop) page queries to keep past the budget; None = the default.
    """

    def __init__(
        self,
        layers: Sequence[int],
        n_heads: int,
        positions: torch.Tensor | None,
        key_positions: torch.Tensor | None,
        Q: int,
        K: int,
        budget: int,
        window: tuple[int, int] | None,
    ) -> None:
        self.layers = list(layers)
        self.n_heads = n_heads
        self.Q, self.K = Q, K
        self.positions = positions if positions is not None else torch.arange(Q)
        self.key_positions = key_positions if key_positions is not None else torch.arange(K)
        self.budget = budget
        self.window = window
        self.dim: int | None = None
        self.full = False
        self.q: torch.Tensor | None = None  # (layers, heads, rows kept, d) float32
        self.k: torch.Tensor | None = None  # (layers, heads, K, d) float32, token keys
        self.rows = torch.zeros(0, dtype=torch.long)  # token rows kept, in page order
        self.forms: list[dict[str, Any] | None] = [None] * len(self.layers)

    def _start(self, d: int) -> None:
        """Decide what to keep once the width of q and k is known."""
        self.dim = d
        nL, nH = len(self.layers), self.n_heads
        Qp, Kp = int(self.positions.numel()), int(self.key_positions.numel())
        self.full = nL * nH * (Qp + Kp) * d <= self.budget
        if self.full:
            start, stop = 0, Qp
        elif self.window is not None:
            start, stop = self.window
        else:
            width = min(DEFAULT_WINDOW, window_capacity(self.budget, nL, nH, d), Qp)
            start, stop = Qp - width, Qp
        self.window = (start, stop)
        self.rows = self.positions[start:stop]
        # float32: a model's q and k may pass float16's largest value (65504)
        self.q = torch.zeros((nL, nH, stop - start, d), dtype=torch.float32)
        self.k = torch.zeros((nL, nH, self.K, d), dtype=torch.float32)

    def add(
        self,
        li: int,
        heads: slice | torch.Tensor,
        src: slice | torch.Tensor,
        row0: int,
        q: torch.Tensor,
        k: torch.Tensor,
        form: dict[str, Any],
    ) -> None:
        """Keep q (h, r, d) of token rows row0 .. row0 + r - 1 and k (h, S, d) of keys
        0 .. S - 1 for layer index ``li``: chunk heads ``src`` go to shown heads ``heads``."""
        d = q.shape[-1]
        if self.dim is None:
            self._start(d)
        if d != self.dim or k.shape[-1] != d:
            return  # layers of different widths: the first width only
        assert self.q is not None and self.k is not None
        r = q.shape[1]
        inside = (self.rows >= row0) & (self.rows < row0 + r)  # (W,)
        if bool(inside.any()):
            at = torch.nonzero(inside).flatten()
            picked = q.detach()[src][:, self.rows[at] - row0].to("cpu", torch.float32)
            self.q[li, heads, at[0] : at[-1] + 1] = picked  # (h, n, d)
        self.k[li, heads, : k.shape[1]] = k.detach()[src].to("cpu", torch.float32)
        self.forms[li] = {
            key: (val.tolist() if isinstance(val, torch.Tensor) else val)
            for key, val in form.items()
        }

    def finish(self, top_index: torch.Tensor | None) -> dict[str, Any] | None:
        """The neuron view's data, or None when nothing was kept.

        Args:
            top_index: (layers, heads, Q', k) page keys of every page query, best first
                (the long page's top-k, or the dense weights' argsort), to choose the
                keys of a window; None = the window's own keys only.

        Returns:
            ``layers`` (indices of shown layers), ``q`` (layers, heads, W, d), ``k``
            (layers, heads, K'', d) float32 arrays, ``forms``, ``query_start`` and
            ``query_stop`` (the window of page queries), ``key_index`` (the K'' page
            keys held, increasing; None = every key).
        """
        if self.q is None or self.k is None or self.window is None:
            return None
        start, stop = self.window
        out: dict[str, Any] = {
            "layers": list(range(len(self.layers))),
            "q": self.q.numpy(),
            "forms": self.forms,
            "query_start": start,
            "query_stop": stop,
            "key_index": None,
        }
        if self.full:
            out["k"] = self.k[:, :, self.key_positions].numpy()
            return out
        keys = self._window_keys(top_index, start, stop)
        out["k"] = self.k[:, :, self.key_positions[keys]].numpy()
        out["key_index"] = keys.tolist()
        return out

    def _window_keys(self, top: torch.Tensor | None, start: int, stop: int) -> torch.Tensor:
        """Page keys for a window: its own positions, then the keys its queries weigh most
        (best rank over every layer, head and window query first; then how often)."""
        assert self.q is not None and self.dim is not None
        Kp = int(self.key_positions.numel())
        nL, nH, W = self.q.shape[0], self.q.shape[1], self.q.shape[2]
        room = max(W, self.budget // max(1, nL * nH * self.dim) - W)
        chosen = torch.zeros(Kp, dtype=torch.bool)
        if Kp == int(self.positions.numel()):  # self-attention: the window's own keys
            chosen[start : min(stop, Kp)] = True
        if top is not None and top.numel():
            ranked = top[:, :, start:stop].long()  # (layers, heads, W, k): best first
            rank = torch.arange(ranked.shape[-1]).expand_as(ranked)
            ok = (ranked >= 0) & (ranked < Kp)
            keys, rank = ranked[ok], rank[ok]
            best = torch.full((Kp,), ranked.shape[-1], dtype=torch.long)
            best.scatter_reduce_(0, keys, rank, "amin")
            often = torch.bincount(keys, minlength=Kp)
            order = torch.argsort(best * (often.max() + 1) - often)  # best rank, then count
            order = order[(best[order] < ranked.shape[-1]) & ~chosen[order]]
            chosen[order[: max(0, room - int(chosen.sum()))]] = True
        if not bool(chosen.any()):
            chosen[: min(room, Kp)] = True
        return torch.nonzero(chosen).flatten()
