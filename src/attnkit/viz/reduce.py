"""Streaming reduction of attention weights: a layer (or a row block) at a time.

A :class:`SetReducer` receives the weights of one kind of attention as they
are produced, ``add(layer, row0, w)`` with ``w`` of shape (heads, rows, keys),
and keeps only what the page shows, so at most one layer's weights are alive:

- **dense** pages (up to :attr:`Budget.dense_cells` weights): every weight,
  in float16 until the page quantizes it;
- **long** pages: for every head an exact overview, the max and the mean over
  b×b blocks (a single sharp weight is never averaged away), and the exact
  top-k keys of every query row;
- always: per-head statistics and pattern classes (:mod:`.stats`), the head
  mean of every layer for attention rollout and flow (:mod:`.rollout`) while
  it fits, and q and k for the neuron view while they fit.

Rows may come in any order and in any number of calls (a prompt, then one
generated token at a time); keys may grow (a KV cache): missing keys are 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .rollout import FLOW_MAX_TOKENS, attention_flow, attention_rollout
from .stats import StatsAccumulator

__all__ = ["Budget", "ReducedSet", "SetReducer"]


@dataclass(frozen=True)
class Budget:
    """What a page keeps.

    Attributes:
        dense_cells: at most this many weights (layers × heads × Q × K): store
            every weight; above it, the long-input page (overview + top-k).
        top_k: keys kept per query row on a long page.
        overview: the largest side of a head's block-pooled overview.
        mean_cells: at most this many head-mean weights (layers × Q × K) are kept
            for attention rollout.
        flow_tokens: compute attention flow up to this many tokens.
        neuron_values: at most this many q/k values (layers × heads × (Q + K) × d)
            for the neuron view; beyond it, the first layers that fit.
    """

    dense_cells: int = 1 << 25
    top_k: int = 16
    overview: int = 128
    mean_cells: int = 1 << 26
    flow_tokens: int = 24
    neuron_values: int = 1 << 20


@dataclass
class ReducedSet:
    """One kind of attention, reduced for a page (numpy arrays, see :class:`SetReducer`)."""

    name: str
    shape: tuple[int, int, int, int]  # (layers, heads, Q, K) shown
    layer_labels: list[str]
    head_labels: list[str]
    dense: np.ndarray | None = None  # (layers, heads, Q, K) float32
    block: int = 1
    pooled_max: np.ndarray | None = None  # (layers, heads, Qb, Kb)
    pooled_mean: np.ndarray | None = None  # (layers, heads, Qb, Kb)
    topk_index: np.ndarray | None = None  # (layers, heads, Q, k) int32
    topk_weight: np.ndarray | None = None  # (layers, heads, Q, k) float32
    stats: dict[str, Any] = field(default_factory=dict)
    rollout: np.ndarray | None = None  # (Q, K)
    flow: np.ndarray | None = None  # (Q, K)
    neuron: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)  # Q query tokens as text
    raw_tokens: list[str] | None = None  # the tokenizer's own spelling, when it differs
    key_tokens: list[str] | None = None  # K key tokens; None = the queries
    key_raw_tokens: list[str] | None = None
    pair_start: int | None = None
    key_pair_start: int | None = None
    generated_start: int | None = None  # first generated token (a generation page)

    @property
    def long(self) -> bool:
        return self.dense is None


class SetReducer:
    """Reduces the weights of one kind of attention as the model produces them.

    Args:
        name: the kind (``"self-attention (causal)"``).
        n_layers: layers the model has (every one is fed; rollout needs all).
        n_heads: heads per layer in the model.
        Q, K: query and key count of the finished page.
        layers: model layers to show (default all), increasing.
        heads: model heads to show (default all).
        positional: queries and keys share positions (self-attention).
        budget: what to keep.
    """

    def __init__(
        self,
        name: str,
        n_layers: int,
        n_heads: int,
        Q: int,
        K: int,
        *,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        positional: bool = True,
        budget: Budget | None = None,
    ) -> None:
        self.name = name
        self.n_layers, self.n_heads, self.Q, self.K = n_layers, n_heads, Q, K
        self.layers = list(range(n_layers)) if layers is None else sorted(layers)
        self.heads = list(range(n_heads)) if heads is None else list(heads)
        self.row_of = {layer: i for i, layer in enumerate(self.layers)}
        self.positional = positional and Q == K
        self.budget = budget or Budget()
        nL, nH = len(self.layers), len(self.heads)
        b = self.budget
        self.long = nL * nH * Q * K > b.dense_cells
        self.dense: torch.Tensor | None = None
        if not self.long:
            self.dense = torch.zeros((nL, nH, Q, K))
        else:
            self.block = max(1, -(-max(Q, K) // b.overview))
            self.Qb, self.Kb = -(-Q // self.block), -(-K // self.block)
            self.k = min(b.top_k, K)
            self.pmax = torch.zeros((nL, nH, self.Qb, self.Kb))
            self.psum = torch.zeros((nL, nH, self.Qb, self.Kb))
            self.tk_idx = torch.zeros((nL, nH, Q, self.k), dtype=torch.int32)
            self.tk_w = torch.zeros((nL, nH, Q, self.k))
        self.stats = StatsAccumulator(nL, nH, self.positional)
        self.means: torch.Tensor | None = None
        if self.positional and n_layers * Q * K <= b.mean_cells:
            self.means = torch.zeros((n_layers, Q, K))
        self.neuron: dict[str, Any] | None = None
        self.neuron_layers: list[int] = []

    # ------------------------------------------------------------------- weights

    def _chunk_heads(self, head0: int, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(positions among the shown heads, positions in the chunk) of the chunk's shown heads."""
        sel = [(i, h - head0) for i, h in enumerate(self.heads) if head0 <= h < head0 + n]
        if not sel:
            return None
        return torch.tensor([i for i, _ in sel]), torch.tensor([j for _, j in sel])

    def add(self, layer: int, row0: int, w: torch.Tensor, head0: int = 0) -> None:
        """Reduce weights (h, r, S) of model ``layer``, heads head0 .. head0 + h - 1, for
        query rows row0 .. row0 + r - 1.

        ``S`` may be less than K (keys not produced yet are 0). Every (layer, head,
        row) is to be given once. Row blocks are processed in chunks so temporaries
        stay small.
        """
        if w.ndim != 3 or head0 < 0 or head0 + w.shape[0] > self.n_heads:
            raise ValueError(
                f"weights: expected (heads, rows, keys) within {self.n_heads} heads from "
                f"head {head0}, got {tuple(w.shape)}"
            )
        h, r, S = w.shape
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer: expected 0..{self.n_layers - 1}, got {layer}")
        if row0 < 0 or row0 + r > self.Q or S > self.K:
            raise ValueError(
                f"weights: rows {row0}..{row0 + r} and {S} keys do not fit a "
                f"{self.Q} × {self.K} page"
            )
        w = w.detach().to("cpu", torch.float32)
        chunk = max(1, (1 << 24) // max(1, h * S))
        if self.long:
            chunk = max(self.block, chunk - chunk % self.block)
        for a in range(0, r, chunk):
            self._add_rows(layer, row0 + a, w[:, a : a + chunk], head0)

    def _add_rows(self, layer: int, row0: int, w: torch.Tensor, head0: int) -> None:
        h, r, S = w.shape
        rows = torch.arange(row0, row0 + r)
        if self.means is not None:
            self.means[layer, row0 : row0 + r, :S] += w.sum(0) / self.n_heads  # (r, S)
        li = self.row_of.get(layer)
        sel = self._chunk_heads(head0, h)
        if li is None or sel is None:
            return
        dst, src = sel
        kept = w.index_select(0, src)  # (h', r, S)
        if S < self.K:
            kept = torch.nn.functional.pad(kept, (0, self.K - S))  # (h', r, K)
        self.stats.add(li, kept, rows, dst.numpy())
        if self.dense is not None:
            self.dense[li, dst, row0 : row0 + r] = kept
            return
        b, Kb = self.block, self.Kb
        padded = torch.nn.functional.pad(kept, (0, Kb * b - self.K))  # (h', r, Kb * b)
        blocks = padded.view(kept.shape[0], r, Kb, b)  # (h', r, Kb, b)
        row_block = rows // b  # (r,)
        pmax = self.pmax[li, dst]  # (h', Qb, Kb)
        where = row_block.view(1, r, 1).expand(kept.shape[0], r, Kb)  # (h', r, Kb)
        pmax.scatter_reduce_(1, where, blocks.amax(-1), "amax")
        self.pmax[li, dst] = pmax
        psum = self.psum[li, dst]  # (h', Qb, Kb)
        psum.index_add_(1, row_block, blocks.sum(-1))
        self.psum[li, dst] = psum
        vals, idx = torch.topk(kept, self.k, dim=-1)  # (h', r, k)
        self.tk_idx[li, dst, row0 : row0 + r] = idx.int()
        self.tk_w[li, dst, row0 : row0 + r] = vals

    # ------------------------------------------------------------------- q and k

    def add_qk(
        self,
        layer: int,
        row0: int,
        q: torch.Tensor,
        k: torch.Tensor,
        form: dict[str, Any],
        head0: int = 0,
    ) -> None:
        """Keep the terms of the logits for the neuron view, while they fit the budget.

        Args:
            layer: the model layer.
            row0: the first query row of ``q``.
            q: (h, r, d) the query side of the score (``W_q q`` for Additive), heads
                head0 .. head0 + h - 1.
            k: (h, S, d) the key side for keys 0 .. S - 1 (a KV cache: all so far).
            form: ``{"terms": "dot" | "gaussian" | "additive", "scale": float}``, and
                ``"wv"`` (d,) for Additive.
        """
        li = self.row_of.get(layer)
        sel = self._chunk_heads(head0, q.shape[0])
        if li is None or sel is None:
            return
        dst, src = sel
        d = q.shape[-1]
        if self.neuron is None:
            per_layer = len(self.heads) * (self.Q + self.K) * d
            fit = max(0, min(len(self.layers), self.budget.neuron_values // max(1, per_layer)))
            self.neuron_layers = self.layers[:fit]
            self.neuron = {
                "q": torch.zeros((fit, len(self.heads), self.Q, d), dtype=torch.float16),
                "k": torch.zeros((fit, len(self.heads), self.K, d), dtype=torch.float16),
                "forms": [None] * fit,
            }
        if li >= len(self.neuron_layers):
            return
        n = self.neuron
        if n["q"].shape[-1] != d or k.shape[-1] != d:
            return  # layers of different widths: keep the first width only
        q = q.detach().to("cpu", torch.float32).index_select(0, src)
        k = k.detach().to("cpu", torch.float32).index_select(0, src)
        n["q"][li, dst, row0 : row0 + q.shape[1]] = q.half()
        n["k"][li, dst, : k.shape[1]] = k.half()
        n["forms"][li] = {
            key: (val.tolist() if isinstance(val, torch.Tensor) else val)
            for key, val in form.items()
        }

    # ------------------------------------------------------------------- result

    def finish(self, labels: Sequence[str] | None = None) -> ReducedSet:
        """The reduced set for :func:`attnkit.viz.to_html` (labels: layer names)."""
        nL, nH = len(self.layers), len(self.heads)
        out = ReducedSet(
            name=self.name,
            shape=(nL, nH, self.Q, self.K),
            layer_labels=list(labels) if labels else [f"layer {i}" for i in self.layers],
            head_labels=[f"head {h}" for h in self.heads],
            stats=self.stats.finish(),
        )
        if self.dense is not None:
            out.dense = self.dense.numpy()
        else:
            b = self.block
            rows = torch.full((self.Qb,), float(b))
            rows[-1] = self.Q - b * (self.Qb - 1)
            cols = torch.full((self.Kb,), float(b))
            cols[-1] = self.K - b * (self.Kb - 1)
            out.block = b
            out.pooled_max = self.pmax.numpy()
            out.pooled_mean = (self.psum / (rows[:, None] * cols[None, :])).numpy()
            out.topk_index = self.tk_idx.numpy()
            out.topk_weight = self.tk_w.numpy()
        if self.means is not None:
            out.rollout = attention_rollout(self.means.unsqueeze(1))
            if self.Q <= min(self.budget.flow_tokens, FLOW_MAX_TOKENS):
                out.flow = attention_flow(self.means.unsqueeze(1))
        elif self.positional:
            out.notes.append(
                f"Attention rollout is left out: {self.n_layers} layers of {self.Q} × {self.K} "
                "head means are more than the page keeps."
            )
        if self.neuron is not None and self.neuron_layers:
            n = self.neuron
            out.neuron = {
                "layers": [self.row_of[x] for x in self.neuron_layers],
                "q": n["q"].numpy(),
                "k": n["k"].numpy(),
                "forms": n["forms"],
            }
            if len(self.neuron_layers) < nL:
                out.notes.append(
                    f"The neuron view holds q and k of the first {len(self.neuron_layers)} of "
                    f"{nL} layers (the rest would make the page too large)."
                )
        return out
