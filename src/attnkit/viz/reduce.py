"""Streaming reduction of attention weights: a layer (or a row block) at a time.

A :class:`SetReducer` receives the weights of one kind of attention as they
are produced, ``add(layer, row0, w)`` with ``w`` of shape (heads, rows, keys),
and keeps only what the page shows, so at most one layer's weights are alive:

- **dense** pages (up to :attr:`Budget.dense_cells` weights): every weight
  (float32 until the page quantizes it);
- **long** pages: for every head an exact overview, the max and the mean over
  b×b blocks (a single sharp weight is never averaged away), and the exact
  top-k keys of every query row;
- always: per-head statistics and pattern classes (:mod:`.stats`), the head
  mean of every layer for attention rollout and flow (:mod:`.rollout`) while
  it fits, and q and k for the neuron view (:mod:`.neuron`: every layer; every
  query while they fit, else a window of queries).

Every reduction is vectorised over a block of heads and rows (:mod:`.blocks`,
:mod:`.stats`): a few passes over each block, in float32, and no Python per row
or head. A word view or a view without special tokens (:mod:`.positions`) maps
each block to page positions before it is reduced.

Rows may come in any order and in any number of calls (a prompt, then one
generated token at a time); keys may grow (a KV cache): missing keys are 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .blocks import LongStore, overview_block
from .neuron import NeuronStore
from .positions import PositionMap, apply_map
from .rollout import FLOW_MAX_TOKENS, attention_flow, rollout_of_means
from .stats import StatsAccumulator

__all__ = [
    "BLOCK_CELLS",
    "Budget",
    "NonFiniteAttention",
    "ReducedSet",
    "SetReducer",
    "neuron_budget",
    "torch_threads",
]


class NonFiniteAttention(ValueError):
    """The model's attention weights hold NaN or infinity: there is nothing to draw (its
    parameters or its input embeddings are not finite)."""


# Weights reduced at once: heads × rows × keys at most this many (16 MiB of float32),
# small enough to stay in the allocator's reused memory (no fresh pages per block).
BLOCK_CELLS = 1 << 22


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Within the block, torch runs on ``n`` CPU threads (None: as it is); restored after."""
    threads = torch.get_num_threads()
    change = n is not None and n != threads
    if change:
        torch.set_num_threads(n)  # type: ignore[arg-type]
    try:
        yield
    finally:
        if change:
            torch.set_num_threads(threads)


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
            for the neuron view (a byte each on the page); beyond it, q of a window of
            queries and k of their most weighted keys, in every layer. None: what
            fits in ``page_bytes`` beside the weights (:func:`neuron_budget`).
        page_bytes: the page size the neuron view may fill up to, as estimated before
            the page is written (the page budget, 20 MiB, less a margin).
    """

    dense_cells: int = 1 << 25
    top_k: int = 16
    overview: int = 128
    mean_cells: int = 1 << 26
    flow_tokens: int = 24
    neuron_values: int | None = None
    page_bytes: int = 17 << 20


# Bytes per weight on the page after deflate, measured on long pages of 2,000 tokens:
# one-byte overview cells compress to about half, a top-k entry (a 2-byte index gap
# and a 1-byte weight) to about 0.8 of its 3 bytes. Dense pages compress as overviews.
_DEFLATED_CELL = 0.5
_DEFLATED_TOPK_ENTRY = 3 * 0.8
_NEURON_VALUES = (1 << 20, 8 << 20)  # the neuron view's least and most q/k values


def neuron_budget(budget: Budget, cells: int, topk_entries: int) -> int:
    """q/k values the neuron view may hold: the budget's own, or what is left of
    ``page_bytes`` once the weights (``cells`` one-byte cells, ``topk_entries`` top-k
    entries) are on the page, one byte a value (:func:`.payload.quantize_signed`; deflate
    keeps about 0.96 of it), within :data:`_NEURON_VALUES`."""
    if budget.neuron_values is not None:
        return budget.neuron_values
    rest = cells * _DEFLATED_CELL + topk_entries * _DEFLATED_TOPK_ENTRY
    least, most = _NEURON_VALUES
    return int(min(most, max(least, budget.page_bytes - rest)))


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
    view_kind: str = "tokens"  # "words": subword pieces merged (the word view)
    renormalised: bool = False  # special tokens dropped and each row renormalised

    @property
    def long(self) -> bool:
        return self.dense is None

    def arrays(self) -> dict[str, np.ndarray]:
        """What was captured, as named arrays (what ``--save-weights`` writes).

        A dense set: ``weights`` (layers, heads, Q, K), every weight. A long set:
        ``pooled_max`` and ``pooled_mean`` (layers, heads, Qb, Kb), the max and mean
        over ``block``×``block`` blocks, and ``topk_index`` (int32) and ``topk_weight``
        (layers, heads, Q, k), the exact top-k keys of every row, best first. Both:
        ``rollout`` (Q, K) when computed, and the neuron view's ``neuron_q`` (layers,
        heads, W, d) and ``neuron_k`` (layers, heads, K'', d) when kept (float16, or
        float32 when a value is beyond float16's range).
        """
        out: dict[str, np.ndarray] = {}
        if self.dense is not None:
            out["weights"] = np.ascontiguousarray(self.dense, np.float32)
        else:
            for name in ("pooled_max", "pooled_mean", "topk_weight"):
                out[name] = np.ascontiguousarray(getattr(self, name), np.float32)
            out["topk_index"] = np.ascontiguousarray(self.topk_index, np.int32)
        if self.rollout is not None:
            out["rollout"] = np.ascontiguousarray(self.rollout, np.float32)
        if self.neuron is not None:
            out["neuron_q"] = _half_if_it_fits(self.neuron["q"])
            out["neuron_k"] = _half_if_it_fits(self.neuron["k"])
        return out


def _half_if_it_fits(values: np.ndarray) -> np.ndarray:
    """float16 when every value is within its range (half the file), else float32."""
    finite = float(np.abs(values).max(initial=0.0)) <= float(np.finfo(np.float16).max)
    return np.ascontiguousarray(values, np.float16 if finite else np.float32)


class SetReducer:
    """Reduces the weights of one kind of attention as the model produces them.

    Args:
        name: the kind (``"self-attention (causal)"``).
        n_layers: layers the model has (every one is fed; rollout needs all).
        n_heads: heads per layer in the model.
        Q, K: query rows and keys the model produces (token positions).
        layers: model layers to show (default all), increasing.
        heads: model heads to show (default all).
        positional: queries and keys share positions (self-attention).
        budget: what to keep.
        rows, cols: maps of token positions to page positions (the word view, the view
            without special tokens; :mod:`.positions`), for queries and keys; None = as is.
        neuron_window: (start, stop) page queries whose q the neuron view keeps when not
            every query fits; None = the default window (:mod:`.neuron`).
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
        rows: PositionMap | None = None,
        cols: PositionMap | None = None,
        neuron_window: tuple[int, int] | None = None,
    ) -> None:
        for label, pmap, n in (("rows", rows, Q), ("cols", cols, K)):
            if pmap is not None and pmap.n != n:
                raise ValueError(f"{label}: the map reads {pmap.n} positions, the page has {n}")
        self.name = name
        self.n_layers, self.n_heads, self.Q, self.K = n_layers, n_heads, Q, K
        self.rows_map, self.cols_map = rows, cols
        self.Qp = rows.size if rows is not None else Q  # page rows
        self.Kp = cols.size if cols is not None else K  # page keys
        self.layers = list(range(n_layers)) if layers is None else sorted(layers)
        self.heads = list(range(n_heads)) if heads is None else list(heads)
        self.row_of = {layer: i for i, layer in enumerate(self.layers)}
        self.positional = positional and Q == K
        self.budget = budget or Budget()
        nL, nH = len(self.layers), len(self.heads)
        b = self.budget
        self.long = nL * nH * self.Qp * self.Kp > b.dense_cells
        self.dense: torch.Tensor | None = None
        self.store: LongStore | None = None
        self.block = 1
        if not self.long:
            self.dense = torch.zeros((nL, nH, self.Qp, self.Kp))
        else:
            self.block = overview_block(self.Qp, self.Kp, b.overview)
            self.store = LongStore(nL, nH, self.Qp, self.Kp, self.block, min(b.top_k, self.Kp))
        self.stats = StatsAccumulator(nL, nH, self.positional)
        self.means: torch.Tensor | None = None
        if self.positional and n_layers * self.Qp * self.Kp <= b.mean_cells:
            self.means = torch.zeros((n_layers, self.Qp, self.Kp))
        self.neuron: NeuronStore | None = None
        words = (rows is not None and rows.merges) or (cols is not None and cols.merges)
        if not words:
            if self.store is not None:
                cells = 2 * nL * nH * self.store.Qb * self.store.Kb  # max and mean
                entries = nL * nH * self.Qp * self.store.k
            else:
                cells, entries = nL * nH * self.Qp * self.Kp, 0
            self.neuron = NeuronStore(
                self.layers, nH, rows.kept if rows is not None else None,
                cols.kept if cols is not None else None, Q, K,
                neuron_budget(b, cells, entries), neuron_window,
            )  # fmt: skip
        self.threads: int | None = None  # CPU threads for the rollout (None: torch's)

    # ------------------------------------------------------------------- blocks

    def cut(self, row0: int, end: int) -> int:
        """Where a block of token rows starting at ``row0`` may end, at ``end`` or before it
        when it can: never inside a word of the word view."""
        if self.rows_map is None:
            return max(row0 + 1, min(end, self.Q))
        return self.rows_map.cut(row0, end)

    def _chunk_heads(
        self, head0: int, n: int
    ) -> tuple[slice | torch.Tensor, slice | torch.Tensor] | None:
        """(positions among the shown heads, positions in the chunk) of the chunk's shown
        heads; slices when both are runs."""
        sel = [(i, h - head0) for i, h in enumerate(self.heads) if head0 <= h < head0 + n]
        if not sel:
            return None
        dst = [i for i, _ in sel]
        src = [j for _, j in sel]
        if dst == list(range(dst[0], dst[-1] + 1)) and src == list(range(src[0], src[-1] + 1)):
            return slice(dst[0], dst[-1] + 1), slice(src[0], src[-1] + 1)
        return torch.tensor(dst), torch.tensor(src)

    # ------------------------------------------------------------------- weights

    def add(
        self,
        layer: int,
        row0: int,
        w: torch.Tensor,
        head0: int = 0,
        *,
        entropy: torch.Tensor | None = None,
        keys: torch.Tensor | None = None,
    ) -> None:
        """Reduce weights (h, r, S) of model ``layer``, heads head0 .. head0 + h - 1, for
        token rows row0 .. row0 + r - 1 and keys 0 .. S - 1.

        ``S`` may be less than K (keys not produced yet are 0). Every (layer, head,
        row) is to be given once; under a word view a block holds whole words (see
        :meth:`cut`). Large blocks are reduced in parts so temporaries stay small.
        ``entropy``: (h, r) each row's entropy in nats when the caller has it (read off
        the logits), so the statistics take no log of every weight; used only when the
        page positions are the tokens (no position map), else recomputed. ``keys``: (h, r)
        each row's count of weights above 0, when the caller has it (with ``entropy``).
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
        if self.rows_map is not None or self.cols_map is not None:
            entropy = keys = None  # page rows are not the token rows: recomputed
        elif entropy is not None:
            entropy = entropy.detach().to("cpu", torch.float32)  # (h, r)
            keys = keys.detach().to("cpu", torch.float32) if keys is not None else None
        part = max(1, BLOCK_CELLS // max(1, h * S))
        a = 0
        while a < r:
            end = self.cut(row0 + a, row0 + min(r, a + part)) - row0
            block = w[:, a:end]
            if not block.is_contiguous():
                block = block.contiguous()
            page, prow = apply_map(block, row0 + a, self.rows_map, self.cols_map)
            if page.shape[1]:
                ent = entropy[:, a:end] if entropy is not None else None  # (h, r')
                n_keys = keys[:, a:end] if keys is not None else None  # (h, r')
                self._add_rows(layer, prow, page, head0, ent, n_keys)
            a = end

    def _add_rows(
        self,
        layer: int,
        row0: int,
        w: torch.Tensor,
        head0: int,
        entropy: torch.Tensor | None,
        keys: torch.Tensor | None = None,
    ) -> None:
        """Page weights (h, r, S) of page rows row0 .. row0 + r - 1: every reduction
        (``entropy``, ``keys``: (h, r) the rows' entropies and counts of weights above 0,
        or None)."""
        h, r, S = w.shape
        if self.means is not None:
            self.means[layer, row0 : row0 + r, :S] += w.sum(0).div_(self.n_heads)  # (r, S)
        li = self.row_of.get(layer)
        sel = self._chunk_heads(head0, h)
        if li is None or sel is None:
            return
        dst, src = sel
        kept = w[src] if isinstance(src, slice) else w.index_select(0, src)  # (h', r, S)
        if entropy is not None:
            entropy = entropy[src] if isinstance(src, slice) else entropy.index_select(0, src)
        if keys is not None:
            keys = keys[src] if isinstance(src, slice) else keys.index_select(0, src)
        rows = torch.arange(row0, row0 + r)
        heads = dst if isinstance(dst, slice) else dst.numpy()
        self.stats.add(li, kept, rows, heads, entropy=entropy, keys=keys)
        if self.dense is not None:
            self.dense[li, dst, row0 : row0 + r, :S] = kept
        else:
            assert self.store is not None
            self.store.add(li, dst, row0, kept)

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
        """Keep the terms of the logits for the neuron view (see :mod:`.neuron`).

        Args:
            layer: the model layer.
            row0: the first token row of ``q``.
            q: (h, r, d) the query side of the score (``W_q q`` for Additive), heads
                head0 .. head0 + h - 1.
            k: (h, S, d) the key side for keys 0 .. S - 1 (a KV cache: all so far).
            form: ``{"terms": "dot" | "gaussian" | "additive", "scale": float}``, and
                ``"wv"`` (d,) for Additive.
        """
        li = self.row_of.get(layer)
        sel = self._chunk_heads(head0, q.shape[0])
        if li is None or sel is None or self.neuron is None:
            return
        dst, src = sel
        self.neuron.add(li, dst, src, row0, q, k, form)

    # ------------------------------------------------------------------- result

    def finish(self, labels: Sequence[str] | None = None) -> ReducedSet:
        """The reduced set for :func:`attnkit.viz.to_html` (labels: layer names)."""
        nL, nH = len(self.layers), len(self.heads)
        out = ReducedSet(
            name=self.name,
            shape=(nL, nH, self.Qp, self.Kp),
            layer_labels=list(labels) if labels else [f"layer {i}" for i in self.layers],
            head_labels=[f"head {h}" for h in self.heads],
            stats=self.stats.finish(),
        )
        top: torch.Tensor | None = None
        if self.dense is not None:
            out.dense = self.dense.numpy()
        else:
            assert self.store is not None
            parts = self.store.finish()
            out.block = self.block
            out.pooled_max = parts["pooled_max"].numpy()
            out.pooled_mean = parts["pooled_mean"].numpy()
            out.topk_index = parts["topk_index"].numpy()
            out.topk_weight = parts["topk_weight"].numpy()
            top = parts["topk_index"]
        # the block sums (pooled_mean) hold every weight: a NaN that the maxima and the
        # top-k pass over (neither chooses a NaN) still reaches them
        held = [out.dense] if out.dense is not None else [out.pooled_mean, out.pooled_max]
        if not all(grid is None or np.isfinite(grid).all() for grid in held):
            raise NonFiniteAttention(
                f"the model's {self.name} weights hold NaN or infinity (its "
                "parameters or its input are not finite); there is nothing to draw"
            )
        if self.means is not None:
            if self.Qp <= min(self.budget.flow_tokens, FLOW_MAX_TOKENS):
                out.flow = attention_flow(self.means.unsqueeze(1))
            with torch_threads(self.threads):
                out.rollout = rollout_of_means(self.means)  # overwrites the means
            self.means = None
        elif self.positional:
            out.notes.append(
                f"Attention rollout is left out: {self.n_layers} layers of {self.Qp} × "
                f"{self.Kp} head means are more than the page keeps."
            )
        self._finish_neuron(out, top)
        return out

    def _finish_neuron(self, out: ReducedSet, top: torch.Tensor | None) -> None:
        if self.neuron is None:
            out.notes.append("The word view has no neuron view: q and k belong to tokens.")
            return
        if top is None and self.dense is not None and self.neuron.window is not None:
            start, stop = self.neuron.window
            rows = self.dense[:, :, start:stop]  # (layers, heads, W, K')
            k = min(self.budget.top_k, self.Kp)
            top = torch.full((*self.dense.shape[:2], self.Qp, k), -1, dtype=torch.long)
            top[:, :, start:stop] = torch.topk(rows, k, dim=-1).indices
        out.neuron = self.neuron.finish(top)
        n = out.neuron
        if n is not None and n["key_index"] is not None:
            out.notes.append(
                f"The neuron view holds q for queries {n['query_start']} to "
                f"{n['query_stop'] - 1} and k for {len(n['key_index'])} of {self.Kp} keys "
                "(those queries' own and most weighted keys), in every layer: all of them "
                "would make the page too large."
            )
