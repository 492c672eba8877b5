"""Streaming capture: each attention call of a model reduced as it runs.

:class:`StreamRecorder` is the recorder :func:`attnkit.attention` reports to
(see :mod:`attnkit._recording`). Unlike :func:`attnkit.viz.capture`, which
keeps every call's weights, it recomputes each call's exact weights a block of
query rows at a time (every head; at most
:data:`~attnkit.viz.reduce.BLOCK_CELLS` weights), hands each block to a
:class:`~attnkit.viz.reduce.SetReducer` and drops it. A block asks only for the
keys its rows may attend to (a causal mask: the keys up to its last row), so a
decoder's weights cost half. A plain dot-product call (no modifiers, finite q and k)
forms a block's weights from one product of q and k, since the block holds whole
rows: masked logits, row max, exp and row sums, then each row divided by its sum
(its rows' entropies come from the same logits); other calls go through
``attention(return_weights=True)``. Any model whose attention runs through
``attention()`` streams this way: attnkit's own layers and models, and a
transformers model whose attention implementation calls ``attention()``.

:class:`Router` names the reducer and layer of a call from the qualified name
of the module that made it, and ticks the run's :class:`~.progress.Progress`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .. import _lse, _recording, mods, scores
from ..blockplan import build_plan
from ..blockplan.plan import BlockPlan
from ..functional import attention
from ..kernels.softmax import exp_rows_, exp_rows_entropy_
from .progress import Progress
from .reduce import BLOCK_CELLS, SetReducer, torch_threads

if TYPE_CHECKING:
    from .._inputs import AttentionInputs
    from ..backends.base import AttentionResult, Backend

__all__ = [
    "Progress",
    "Router",
    "StreamRecorder",
    "ThreadChoice",
    "row_blocks",
    "score_form",
    "streaming",
]


class ThreadChoice:
    """How many CPU threads the recorder's work runs on, chosen by measuring it.

    That work (each row block's weights and their reduction, the rollout) is hundreds
    of medium-sized passes a layer. On a quiet machine a pass split across the cores
    is faster; on a busy one each split pass waits for its slowest core, and one
    thread was about ten times faster than two (2 cores, load average about 12). So
    the first row block runs on one thread (it pays the first-call costs), the next
    :data:`TRIALS` alternate between torch's own setting and one thread, and the rest
    run on whichever of the two took less time per weight.
    """

    TRIALS = 4

    def __init__(self) -> None:
        self.cost: dict[int, list[float]] = {}  # threads -> seconds and weights, summed
        self.blocks = 0

    def pick(self) -> int:
        """The thread count for the next row block."""
        self.blocks += 1
        n = torch.get_num_threads()
        if n == 1 or self.blocks == 1:
            return 1
        if self.blocks <= 1 + self.TRIALS:
            return n if self.blocks % 2 == 0 else 1
        return self.best() or n

    def measured(self, threads: int, seconds: float, cells: int) -> None:
        """A block on ``threads`` threads took ``seconds`` for ``cells`` weights."""
        if 1 < self.blocks <= 1 + self.TRIALS:
            spent = self.cost.setdefault(threads, [0.0, 0.0])
            spent[0] += seconds
            spent[1] += cells

    def best(self) -> int | None:
        """The faster thread count once both were tried (None before)."""
        if len(self.cost) < 2 or self.blocks <= 1 + self.TRIALS:
            return None
        return min(self.cost, key=lambda t: self.cost[t][0] / max(1.0, self.cost[t][1]))


class Router:
    """Which reducer, model layer and first query row a call belongs to.

    Args:
        reducers: one :class:`SetReducer` per kind (``"self"``; or ``"encoder"``,
            ``"decoder"``, ``"cross"`` for an encoder-decoder).
        kind_of: the kind of a call from its module's qualified name.
        progress: ticked once per call, when the call is reduced (:meth:`done`).
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
        self.threads = ThreadChoice()

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
        reducer = self.reducers[kind]
        return (reducer, layer) if layer < reducer.n_layers else None

    def done(self) -> None:
        """A call is reduced: the progress moves on."""
        if self.progress is not None:
            self.progress.step()

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
        terms = score.feature_terms(q, k)
    form: dict[str, Any] = {"terms": terms.kind, "scale": scale}
    if terms.weights is not None:
        form["wv"] = terms.weights.float()
    if terms.inv_two_var is not None:
        form["inv2var"] = terms.inv_two_var
    return terms.query, terms.key, form


class StreamRecorder:
    """Reduces every ``attention()`` call made inside ``model`` as it happens.

    The exact weights of a call are recomputed (without dropout) a block of rows at
    a time through :func:`attnkit.attention` with ``return_weights=True`` (the forward
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
        try:
            if routed is not None:
                self._reduce(inputs, name, *routed)
        finally:
            self.router.done()

    def _reduce(self, inputs: AttentionInputs, name: str, reducer: SetReducer, layer: int) -> None:
        """The call's weights, a block of rows at a time, and its q and k, to its reducer."""
        q, k = inputs.query, inputs.key
        while q.ndim > 4:
            q, k = q[0], k[0]  # extra leading dims: their first element
        if q.ndim < 3:
            q, k = q[None], k[None]  # (1, L, E): one head
        H, L, S = q.shape[-3], q.shape[-2], k.shape[-2]
        row0 = self.router.first_row(name, L, S)
        g = max(1, H // k.shape[-3])  # grouped-query attention: g query heads per key head
        token = _recording.ACTIVE.set(None)
        choice = self.router.threads

        def cut(t0: int, t1: int) -> int:  # the reducer's rows are the call's + row0
            return reducer.cut(row0 + t0, row0 + t1) - row0

        try:
            blocks = _blocks(inputs, q, k, cut, entropy=True)
            while True:
                threads = choice.pick()
                with torch_threads(threads):
                    start = time.perf_counter()
                    block = next(blocks, None)  # the block's weights are computed here
                    if block is None:
                        break
                    a, w, figures = block
                    ent, n_keys = figures if figures is not None else (None, None)
                    reducer.add(layer, row0 + a, w, 0, entropy=ent, keys=n_keys)
                choice.measured(threads, time.perf_counter() - start, w.numel())
                del w, figures, ent, n_keys, block
            with torch_threads(choice.best() or 1):
                q0 = q[0] if q.ndim == 4 else q  # (H, L, E)
                k0 = k[0] if k.ndim == 4 else k  # (Hk, S, E)
                qf, kf, form = score_form(inputs.score, inputs.scale, q0, k0)
                reducer.add_qk(layer, row0, qf, kf.repeat_interleave(g, 0), form, 0)
        finally:
            _recording.ACTIVE.reset(token)
        reducer.threads = choice.best() or 1


def _shifted(m: mods.Mod, q0: int, L: int, S: int) -> mods.Mod | None:
    """``m`` for the rows q0 .. of a call of (L, S) given alone with keys from 0; None when
    it cannot be (a modifier of a kind not known here)."""
    if isinstance(m, mods.PositionMod):
        pos = m.positions(L, S)
        part = copy.copy(m)
        part.align = "top_left"
        part.q_offset, part.k_offset = pos.q0 + q0, pos.k0
        return part
    if isinstance(m, (mods.Softcap, mods.Sinks)):  # the same for every row
        return m
    return None


def _shardable(inputs: AttentionInputs, L: int, S: int) -> bool:
    """Whether the call's mask can be restricted to a block of rows and keys."""
    if inputs.mask is None:
        return True
    try:
        inputs.mask.shard(0, 0, L, S, L, S)
    except NotImplementedError:
        return False
    return True


def _call_plan(inputs: AttentionInputs, q: torch.Tensor, L: int, S: int) -> BlockPlan | None:
    """The block plan of the call's mask (None: no mask)."""
    if inputs.mask is None:
        return None
    plan = build_plan(inputs.mask, L, S, tuple(q.shape[:-2]), q.device)
    if plan.per_batch:
        plan.groups()  # reads the per-batch ranges key_range uses
    return plan


def _key_limit(plan: BlockPlan | None, S: int) -> Callable[[int, int], int]:
    """keys(i0, i1): how many first keys rows i0 .. i1 - 1 of the call may attend to."""
    if plan is None:
        return lambda i0, i1: S
    b = 0 if plan.per_batch else None  # the page shows batch element 0

    def keys(i0: int, i1: int) -> int:
        return max(1, plan.key_range(b, i0, i1, 0, S)[1])

    return keys


def _rows_that_fit(a: int, L: int, H: int, keys: Callable[[int, int], int]) -> int:
    """The most rows from ``a`` whose weights (H heads, the keys those rows may attend to)
    are at most :data:`BLOCK_CELLS` (at least one row)."""
    lo, hi = 1, L - a
    while lo < hi:  # the keys grow with the rows: bisect
        mid = (lo + hi + 1) // 2
        if mid * keys(a, a + mid) * H <= BLOCK_CELLS:
            lo = mid
        else:
            hi = mid - 1
    return lo


def row_blocks(
    inputs: AttentionInputs,
    q: torch.Tensor,
    k: torch.Tensor,
    cut: Callable[[int, int], int] | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """The exact weights of a call, a block of query rows at a time: (first row, (H, r, S')).

    Args:
        inputs: the call.
        q: (B, H, L, E) or (H, L, E) queries; k: (..., Hk, S, E) keys (batch element 0
            is kept).
        cut: cut(i0, i1) -> where a block of rows from i0 that would end at i1 ends
            (a word view keeps words whole); None: at i1.

    A block holds every head and at most about :data:`BLOCK_CELLS` weights; its keys
    stop at the last key any of its rows may attend to (S' <= S; later keys are 0).
    A call whose mask or modifiers cannot be cut into rows is given whole.
    """
    for a, w, _ in _blocks(inputs, q, k, cut):
        yield a, w


def _blocks(
    inputs: AttentionInputs,
    q: torch.Tensor,
    k: torch.Tensor,
    cut: Callable[[int, int], int] | None = None,
    *,
    entropy: bool = False,
) -> Iterator[tuple[int, torch.Tensor, RowFigures | None]]:
    """:func:`row_blocks` with each block's row figures: (first row, (H, r, S') weights,
    :data:`RowFigures` or None). With ``entropy``, a block from one product of q and k
    (:func:`_softmax_block`) comes with them, read off its logits; others: None."""
    H, L, S = q.shape[-3], q.shape[-2], k.shape[-2]
    v = k.new_empty(*k.shape[:-1], 0)  # no values: only the weights are wanted
    scale = inputs.head_scale if inputs.head_scale is not None else inputs.scale  # (H,) or one
    mod_list = list(inputs.mods)
    whole = any(_shifted(m, 0, L, S) is None for m in mod_list) or not _shardable(inputs, L, S)
    plan = None if whole else _call_plan(inputs, q, L, S)
    keys = (lambda i0, i1: S) if whole else _key_limit(plan, S)
    direct = None if whole else _direct_operands(inputs, q, k, plan)
    a = 0
    while a < L:
        end = L if whole else a + _rows_that_fit(a, L, H, keys)
        if cut is not None and end < L:
            end = cut(a, end)
        hi = keys(a, end)
        if direct is not None:
            yield a, *_softmax_block(direct, plan, a, end, hi, entropy)  # (H, r, S'), figures
            a = end
            continue
        mask = inputs.mask
        shifted = mod_list
        if (a, end, hi) != (0, L, S):
            mask = mask.shard(a, 0, end - a, hi, L, S) if mask is not None else None
            shifted = [_shifted(m, a, L, S) for m in mod_list]  # type: ignore[misc]
        with torch.no_grad():
            _, w = attention(
                q[..., a:end, :], k[..., :hi, :], v[..., :hi, :], score=inputs.score, mask=mask,
                scale=scale, mods=shifted or None, return_weights=True,
            )  # fmt: skip
        yield a, (w[0] if w.ndim == 4 else w), None  # (H, r, S')
        a = end


class _Direct:
    """A dot-product call's operands for :func:`_softmax_block`: q (H, L, E) and k (H, S, E)
    of batch element 0 in float32 (k repeated to the query heads), and the scale."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
        self.q, self.k, self.scale = q, k, scale


def _direct_operands(
    inputs: AttentionInputs, q: torch.Tensor, k: torch.Tensor, plan: BlockPlan | None
) -> _Direct | None:
    """The operands when a block's weights can be formed in one pass (a plain dot-product
    score with one scale, no modifiers, finite q and k); None otherwise.

    Args:
        q: (B, H, L, E) or (H, L, E) queries; k: (..., Hk, S, E) keys, H a multiple of Hk.
        plan: the call's mask plan (None: no mask).
    """
    if type(inputs.score) not in (scores.Dot, scores.ScaledDot) or inputs.mods:
        return None
    if inputs.head_scale is not None or not isinstance(inputs.scale, (int, float)):
        return None
    if not (q.is_floating_point() and k.is_floating_point()) or q.shape[-1] != k.shape[-1]:
        return None
    q0 = q[0] if q.ndim == 4 else q  # (H, L, E)
    k0 = k[0] if k.ndim == 4 else k  # (Hk, S, E)
    if q0.shape[0] % k0.shape[0]:
        return None
    if q.ndim == 3 and plan is not None and plan.per_batch:
        return None  # a per-batch mask over (H, L, E): its batch dim is the heads
    q0 = q0.detach().to(torch.float32).contiguous()  # (H, L, E)
    k0 = k0.detach().to(torch.float32)
    g = q0.shape[0] // k0.shape[0]
    if g > 1:
        k0 = k0.repeat_interleave(g, 0)  # (H, S, E): key head j serves query heads j*g ..
    k0 = k0.contiguous()  # (H, S, E)
    if not (bool(torch.isfinite(q0).all()) and bool(torch.isfinite(k0).all())):
        return None  # the non-finite policy: attention() holds it
    return _Direct(q0, k0, float(inputs.scale))


_TINY = torch.finfo(torch.float32).tiny


def _first_rows(t: torch.Tensor, H: int) -> torch.Tensor:
    """A mask tile (rows, r, hi) or (r, hi) cut to batch element 0's H rows (rows are
    batch-major); one row or none broadcasts as it is."""
    return t[:H] if t.ndim == 3 and t.shape[0] > H else t


def _add_bias(s: torch.Tensor, bias: torch.Tensor) -> None:
    """s (H, r, hi) += a mask's bias tile (r, hi) or (1 or H, r, hi), over the keys where
    it is not 0 only (a causal band's -inf lies in a block's last r keys): a product's
    accumulator would read the whole tile for every head."""
    used = bias.ne(0).reshape(-1, bias.shape[-1]).any(0)  # (hi,): keys with a bias
    where = used.nonzero()
    if where.numel() == 0:
        return
    j0, j1 = int(where[0]), int(where[-1]) + 1
    s[..., j0:j1].add_(bias[..., j0:j1])


RowFigures = tuple[torch.Tensor, torch.Tensor]
"""A block's (H, r) row entropies in nats and (H, r) counts of weights above 0, read off
its logits by :func:`_softmax_block`."""


def _softmax_block(
    d: _Direct, plan: BlockPlan | None, i0: int, i1: int, hi: int, entropy: bool = False
) -> tuple[torch.Tensor, RowFigures | None]:
    """The exact weights (H, i1 - i0, hi) of rows i0 .. i1 - 1 over keys 0 .. hi - 1 (every
    key those rows may attend to), from one product of q and k: the masked logits, their
    row max, exp and row sums in one pass (:func:`exp_rows_`), then each row divided by
    its sum. A row that keeps no key is 0.

    With ``entropy``, also each row's entropy (H, r) in nats, from the shifted logits
    x = s - max: ``-sum w log w = log Z - sum(p x) / Z`` with p = exp(x) and Z = sum p
    (no log of every weight; 0 for a row that keeps no key), and its count of weights
    above 0, both from the same pass as the exp (:func:`exp_rows_entropy_`). Else None.
    """
    q, k = d.q[:, i0:i1], d.k[:, :hi]  # (H, r, E), (H, hi, E)
    H, r = q.shape[0], i1 - i0
    keep, bias = (None, None) if plan is None else plan.tile_mask(
        0 if plan.per_batch else None, i0, i1, 0, hi, q.device
    )  # fmt: skip
    s = torch.baddbmm(q.new_empty(H, r, hi), q, k.transpose(1, 2), beta=0.0, alpha=d.scale)
    if bias is not None:
        _add_bias(s, _first_rows(bias, H).to(torch.float32))
    if keep is not None:
        s.masked_fill_(~_first_rows(keep, H), float("-inf"))
    m = _lse.safe_max(s.amax(dim=-1))  # (H, r)
    if not entropy:
        sums = exp_rows_(s, m, want_sum=True)  # s becomes exp(s - m); (H, r)
        assert sums is not None
        return s.div_(sums.clamp_min_(_TINY).unsqueeze(-1)), None  # (H, r, hi)
    sums, px, positive = exp_rows_entropy_(s, m)  # s becomes p = exp(s - m); each (H, r)
    kept = sums > 0
    z = sums.clamp_min_(_TINY)
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    ent = torch.where(kept, z.log() - px / z, zero)  # (H, r)
    return s.div_(z.unsqueeze(-1)), (ent, positive)  # (H, r, hi), ((H, r), (H, r))


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
        if _recording.reaches(recorder):  # (not a run of the model in another thread)
            recorder.stack.append(name)

    return hook


def _leave(recorder: StreamRecorder, name: str) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if _recording.reaches(recorder) and recorder.stack and recorder.stack[-1] == name:
            recorder.stack.pop()

    return hook
