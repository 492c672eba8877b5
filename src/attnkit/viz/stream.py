"""Streaming capture: each attention call of a model reduced as it runs.

:class:`StreamRecorder` is the recorder :func:`attnkit.attention` reports to
(see :mod:`attnkit._recording`). Unlike :func:`attnkit.viz.capture`, which
keeps every call's weights, it hands each call's exact weights, a few heads at
a time, to a :class:`~attnkit.viz.reduce.SetReducer` and drops them, so at most
one layer's weights (of a few heads) are alive. Any model whose attention runs
through ``attention()`` streams this way: attnkit's own layers and models, and
a transformers model whose attention implementation calls ``attention()``.

:class:`Router` names the reducer and layer of a call from the qualified name
of the module that made it; :class:`Progress` prints attnkit's own progress on
a terminal when a run takes more than a moment.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .. import _recording, mods, scores
from ..functional import attention
from .reduce import SetReducer

if TYPE_CHECKING:
    from .._inputs import AttentionInputs
    from ..backends.base import AttentionResult, Backend

__all__ = ["HEAD_CHUNK_CELLS", "Progress", "Router", "StreamRecorder", "score_form", "streaming"]

# Weights computed at once: heads × rows × keys at most this many (256 MiB of float32).
HEAD_CHUNK_CELLS = 1 << 26


class Progress:
    """``layer 5/12`` on stderr, only on a terminal and only once a run takes over a second."""

    def __init__(self, total: int, what: str = "attention", delay: float = 1.0) -> None:
        self.total, self.what, self.delay = max(1, total), what, delay
        self.start = time.perf_counter()
        self.done = 0
        self.shown = False
        self.live = bool(getattr(sys.stderr, "isatty", lambda: False)())

    def step(self, n: int = 1) -> None:
        self.done += n
        if not self.live or time.perf_counter() - self.start < self.delay:
            return
        pct = min(100, 100 * self.done // self.total)
        sys.stderr.write(
            f"\rattnkit: {self.what} {min(self.done, self.total)}/{self.total} ({pct}%)"
        )
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


class Router:
    """Which reducer, model layer and first query row a call belongs to.

    Args:
        reducers: one :class:`SetReducer` per kind (``"self"``; or ``"encoder"``,
            ``"decoder"``, ``"cross"`` for an encoder-decoder).
        kind_of: the kind of a call from its module's qualified name.
        progress: ticked once per call.
    """

    def __init__(
        self,
        reducers: dict[str, SetReducer],
        kind_of: Callable[[str], str] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.reducers = reducers
        self.kind_of = kind_of or (lambda name: "self")
        self.progress = progress
        self.layer_of: dict[str, tuple[str, int]] = {}
        self.counts: dict[str, int] = {}
        self.row_offset: dict[str, int] = {}  # cross-attention: the decoder's first row
        self.calls = 0

    def route(self, name: str) -> tuple[SetReducer, int] | None:
        """(reducer, model layer) of a call made by module ``name``; None if not shown."""
        if name not in self.layer_of:
            kind = self.kind_of(name)
            if kind not in self.reducers:
                return None
            self.layer_of[name] = (kind, self.counts.get(kind, 0))
            self.counts[kind] = self.counts.get(kind, 0) + 1
        kind, layer = self.layer_of[name]
        self.calls += 1
        if self.progress is not None:
            self.progress.step()
        reducer = self.reducers[kind]
        return (reducer, layer) if layer < reducer.n_layers else None

    def first_row(self, name: str, rows: int, keys: int) -> int:
        """The call's first query row: keys - rows for self-attention with a cache."""
        kind = self.layer_of[name][0]
        if kind == "cross":
            return self.row_offset.get("cross", 0)
        return keys - rows


def score_form(score: scores.Score, scale: float, q: torch.Tensor, k: torch.Tensor) -> tuple[
    torch.Tensor, torch.Tensor, dict[str, Any]
]:  # fmt: skip
    """The query side, key side and terms of a score for the neuron view.

    Returns (q', k', form): for dot-like scores q' · k' times ``scale`` is the
    logit; Gaussian sums ``-(q'_d - k'_d)² / 2σ²``; Additive sums
    ``tanh(q'_d + k'_d) · w_v[d]`` with q' = W_q q and k' = W_k k.
    """
    with torch.no_grad():
        if isinstance(score, scores.Additive):
            qh, kh = score.project(q, k)
            wv = score.w_v.weight.reshape(-1).float()
            return qh, kh, {"terms": "additive", "scale": scale, "wv": wv}
        if isinstance(score, scores.Gaussian):
            inv = float(score._inv_two_var(q.float()))
            return q, k, {"terms": "gaussian", "scale": scale, "inv2var": inv}
        if isinstance(score, scores.Bilinear):
            return q @ score.weight, k, {"terms": "dot", "scale": scale}
    return q, k, {"terms": "dot", "scale": scale}


class StreamRecorder:
    """Reduces every ``attention()`` call made inside ``model`` as it happens.

    The exact weights of a call are recomputed (without dropout) a few heads at a
    time through :func:`attnkit.attention` with ``return_weights=True`` (the forward
    itself is untouched), given to the call's reducer and dropped.
    """

    def __init__(self, router: Router, parent: _recording.Recorder | None = None) -> None:
        self.router = router
        self.parent = parent
        self.stack: list[str] = []

    def record(self, inputs: AttentionInputs, result: AttentionResult, backend: Backend) -> None:
        if self.parent is not None:
            self.parent.record(inputs, result, backend)
        if not self.stack:
            return
        name = self.stack[-1]
        routed = self.router.route(name)
        if routed is None:
            return
        reducer, layer = routed
        q, k, v = inputs.query, inputs.key, inputs.value
        while q.ndim > 4:
            q, k, v = q[0], k[0], v[0]  # extra leading dims: their first element
        if q.ndim < 3:
            q, k, v = q[None], k[None], v[None]  # (1, L, E): one head
        H, r, S = q.shape[-3], q.shape[-2], k.shape[-2]
        row0 = self.router.first_row(name, r, S)
        g = max(1, H // k.shape[-3])  # grouped-query attention: g query heads per key head
        step = max(g, (HEAD_CHUNK_CELLS // max(1, r * S)) // g * g)
        if head_terms(inputs, slice(0, H)) is None or _per_head_mask(inputs, H):
            step = H  # a modifier or a mask whose heads cannot be taken apart: all at once
        token = _recording.ACTIVE.set(None)
        try:
            for h0 in range(0, H, step):
                hs = slice(h0, min(H, h0 + step))
                ks = slice(h0 // g, -(-hs.stop // g))
                w = self._weights(inputs, hs, q[..., hs, :, :], k[..., ks, :, :], v[..., ks, :, :])
                reducer.add(layer, row0, w, h0)
                del w
                q0 = q[0] if q.ndim == 4 else q  # (H, L, E)
                k0 = k[0] if k.ndim == 4 else k  # (Hk, S, E)
                qf, kf, form = score_form(inputs.score, inputs.scale, q0[hs], k0[ks])
                reducer.add_qk(layer, row0, qf, kf.repeat_interleave(g, 0), form, h0)
        finally:
            _recording.ACTIVE.reset(token)

    @staticmethod
    def _weights(
        inputs: AttentionInputs, hs: slice, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Exact weights (h, L, S) of batch element 0 for the heads ``hs``, without dropout."""
        terms = head_terms(inputs, hs)
        scale, mod_list = terms if terms is not None else (inputs.scale, list(inputs.mods))
        with torch.no_grad():
            _, w = attention(
                q, k, v, score=inputs.score, mask=inputs.mask, scale=scale,
                mods=mod_list or None, return_weights=True,
            )  # fmt: skip
        return w[0] if w.ndim == 4 else w  # (h, L, S)


def _per_head_mask(inputs: AttentionInputs, H: int) -> bool:
    """Whether the call's mask holds a dense tensor with one slice per head."""
    if inputs.mask is None or H == 1:
        return False
    return any(t.ndim >= 3 and t.shape[-3] == H for t in inputs.mask.dense_tensors())


def head_terms(
    inputs: AttentionInputs, hs: slice
) -> tuple[float | torch.Tensor, list[mods.Mod]] | None:
    """The scale and score modifiers of a call restricted to its query heads ``hs``;
    None when a modifier holds per-head tensors of a kind not known here."""
    scale: float | torch.Tensor = inputs.scale
    if inputs.head_scale is not None:
        hscale = inputs.head_scale
        scale = hscale if hscale.shape[0] == 1 else hscale[hs]
    out: list[mods.Mod] = []
    for m in inputs.mods:
        part = _mod_heads(m, hs)
        if part is None:
            return None
        out.append(part)
    return scale, out


def _mod_heads(m: mods.Mod, hs: slice) -> mods.Mod | None:
    """``m`` for the query heads ``hs`` (itself when it is the same for every head)."""
    head_dim = 1 if isinstance(m, mods.RelativePositionBias) else 0  # its table: (buckets, H)
    if all(t.shape[head_dim] == 1 for t in m.tensors()):
        return m
    if isinstance(m, mods.Sinks):
        return mods.sinks(m.sink[hs])
    if isinstance(m, mods.ALiBi):
        return mods.ALiBi(m.slopes[hs], causal=m.causal, align=m.align, q_offset=m.q_offset,
                          k_offset=m.k_offset)  # fmt: skip
    if isinstance(m, mods.RelativePositionBias):
        return mods.RelativePositionBias(
            m.table[:, hs], m.num_buckets, m.max_distance, m.bidirectional, align=m.align,
            q_offset=m.q_offset, k_offset=m.k_offset,
        )  # fmt: skip
    return None


@contextmanager
def streaming(model: nn.Module, router: Router) -> Iterator[StreamRecorder]:
    """Within the block, every ``attention()`` call inside ``model`` streams to ``router``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    recorder = StreamRecorder(router, _recording.ACTIVE.get())
    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(_enter(recorder, name)))
        handles.append(module.register_forward_hook(_leave(recorder, name), always_call=True))
    token = _recording.ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _recording.ACTIVE.reset(token)
        for h in handles:
            h.remove()


def _enter(recorder: StreamRecorder, name: str) -> Any:
    def hook(module: nn.Module, args: Any) -> None:
        recorder.stack.append(name)

    return hook


def _leave(recorder: StreamRecorder, name: str) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if recorder.stack and recorder.stack[-1] == name:
            recorder.stack.pop()

    return hook
