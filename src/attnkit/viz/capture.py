"""capture(): record the exact attention weights of a module's attention layers.

Inside ``with capture(model) as cap:`` every :func:`attnkit.attention` call
made while ``model`` (or one of its submodules) runs is reported to a recorder.
The forward itself is untouched: it runs on whichever backend it would have
used (SDPA, chunked, ...) and its output is bit-for-bit the same. For each
selected layer the recorder then asks a backend that returns exact weights for
the weights and log-sum-exp of the same call, without dropout, through
:func:`attnkit.attention` itself: on the backend that ran the forward when it
can return weights (kernels that recompute them from their saved
log-sum-exp), else on the next available one. Only selected layers pay
for this; outside a capture, ``attention()`` does one ContextVar lookup.

A *layer* is a module that calls ``attention()`` itself, named by its
qualified name in ``model`` (``"encoder.layer.0.attention.self"``) and numbered
in the order the modules first call it during the capture.
"""

from __future__ import annotations

import fnmatch
import numbers
import operator
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .. import _recording
from ..functional import attention

if TYPE_CHECKING:
    from .._inputs import AttentionInputs
    from ..backends.base import AttentionResult, Backend

__all__ = ["AttentionRecord", "Capture", "capture"]

LayerSelection = Sequence[int | str] | int | str | None
HeadSelection = Sequence[int] | int | None


@dataclass(frozen=True)
class AttentionRecord:
    """One recorded ``attention()`` call.

    Attributes:
        layer: qualified name of the module that made the call ("" = the model).
        index: the layer's number (order of first call during the capture).
        heads: the head indices kept (dim -3 of the call's weights), or () when
            the call had no head dim.
        weights: (*batch, h, L, S) exact attention weights of the kept heads
            (float32 for half inputs), detached; rows of fully masked queries are 0.
        lse: (*batch, h, L) log-sum-exp of the logits of those heads.
        backend: name of the backend that ran the forward.
    """

    layer: str
    index: int
    heads: tuple[int, ...]
    weights: torch.Tensor
    lse: torch.Tensor | None
    backend: str


class Capture:
    """The records of a :func:`capture` block, in call order.

    ``len(cap)``, ``cap[i]`` and iteration give :class:`AttentionRecord` objects;
    :attr:`layers` names the recorded layers; :meth:`stack` gives one array.
    """

    def __init__(self) -> None:
        self.records: list[AttentionRecord] = []
        self.unmatched: str | None = None
        """Why asked-for layers were not recorded (numbers beyond the layers that ran),
        set when the block ends; None when every asked-for number matched a layer."""

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[AttentionRecord]:
        return iter(self.records)

    def __getitem__(self, i: int) -> AttentionRecord:
        return self.records[i]

    @property
    def layers(self) -> list[str]:
        """Names of the recorded layers, in order of their first record."""
        seen: dict[str, None] = {}
        for r in self.records:
            seen.setdefault(r.layer, None)
        return list(seen)

    def weights(self, layer: int | str) -> torch.Tensor:
        """The last recorded weights (*batch, h, L, S) of a layer, by number or name."""
        for r in reversed(self.records):
            if r.layer == layer or r.index == layer:
                return r.weights
        why = f" ({self.unmatched})" if self.unmatched is not None else ""
        raise KeyError(f"layer {layer!r} was not recorded; recorded: {self.layers}{why}")

    def stack(self, batch_index: int | None = None) -> torch.Tensor:
        """All records as one tensor (n_records, *batch, h, L, S).

        Args:
            batch_index: keep only this element of the first batch dim, giving
                (n_records, h, L, S) for weights of shape (B, h, L, S).
        """
        if not self.records:
            if self.unmatched is not None:
                raise ValueError(f"stack: nothing was recorded; {self.unmatched}")
            raise ValueError("stack: nothing was recorded; was the model called inside capture()?")
        if batch_index is not None:
            sizes = {int(r.weights.shape[0]) for r in self.records if r.weights.ndim > 3}
            n = min(sizes) if sizes else 0
            if (
                isinstance(batch_index, bool)
                or not isinstance(batch_index, numbers.Integral)
                or not -n <= int(batch_index) < n
            ):
                raise IndexError(
                    f"batch_index: expected an int in [-{n}, {n}) (the records' batch of "
                    f"{n}), got {batch_index!r}"
                )
        pick = None if batch_index is None else int(batch_index)
        ws = [r.weights if pick is None else r.weights[pick] for r in self.records]
        shapes = {tuple(w.shape) for w in ws}
        if len(shapes) != 1:
            raise ValueError(f"stack: records have different shapes {sorted(shapes)}")
        return torch.stack(ws)  # (n_records, *batch, h, L, S)


def _normalize_layers(layers: LayerSelection) -> tuple[int | str, ...] | None:
    if layers is None:
        return None
    items: list[Any] = list(layers) if isinstance(layers, (list, tuple, range)) else [layers]
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, (numbers.Integral, str)):
            raise TypeError(f"layers: expected None, layer numbers or module names, got {item!r}")
        if not isinstance(item, str):
            items[i] = operator.index(item)  # (a NumPy int: a Python int)
    return tuple(items)


def _normalize_heads(heads: HeadSelection) -> tuple[int, ...] | None:
    if heads is None:
        return None
    single = isinstance(heads, numbers.Integral) or (
        isinstance(heads, torch.Tensor) and heads.ndim == 0
    )
    if not single and not isinstance(heads, Iterable):
        raise TypeError(f"heads: expected None, a head number or a list of them, got {heads!r}")
    given: list[object] = [heads] if single else list(heads)  # type: ignore[arg-type]
    items: list[int] = []
    for item in given:
        if isinstance(item, torch.Tensor) and item.ndim == 0 and not item.is_floating_point():
            item = int(item)
        if isinstance(item, bool) or not isinstance(item, numbers.Integral):
            raise TypeError(f"heads: expected None or head numbers, got {item!r}")
        items.append(operator.index(item))
    if not items:
        raise ValueError("heads: expected at least one head number, got none")
    return tuple(items)


class _Recorder:
    """Tracks which module is running and records the calls of selected layers."""

    def __init__(
        self,
        layers: tuple[int | str, ...] | None,
        heads: tuple[int, ...] | None,
        parent: _recording.Recorder | None,
    ) -> None:
        self.layers = layers
        self.heads = heads
        self.parent = parent
        self.capture = Capture()
        self.stack: list[str] = []
        self.index: dict[str, int] = {}
        # Negative layer numbers are only known once every layer ran: record all.
        self.deferred = layers is not None and any(isinstance(x, int) and x < 0 for x in layers)

    # forward hooks: keep a stack of running module names
    def enter(self, name: str, module: nn.Module, args: Any) -> None:
        self.stack.append(name)

    def leave(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        if self.stack and self.stack[-1] == name:
            self.stack.pop()

    def _selected(self, name: str, index: int) -> bool:
        if self.layers is None or self.deferred:
            return True
        for item in self.layers:
            if isinstance(item, int) and item == index:
                return True
            if isinstance(item, str) and (item == name or fnmatch.fnmatchcase(name, item)):
                return True
        return False

    def record(self, inputs: AttentionInputs, result: AttentionResult, backend: Backend) -> None:
        if self.parent is not None:
            self.parent.record(inputs, result, backend)
        if not self.stack:
            return  # a call made outside the captured model
        name = self.stack[-1]
        index = self.index.setdefault(name, len(self.index))
        if not self._selected(name, index):
            return
        weights, lse = _exact_weights(inputs, result, backend)  # (*batch, L, S), (*batch, L)
        kept: tuple[int, ...] = ()
        if weights.ndim >= 3:
            H = weights.shape[-3]
            kept = tuple(range(H))
            if self.heads is not None:
                bad = [h for h in self.heads if not -H <= h < H]
                if bad:
                    raise ValueError(f"heads: {bad} out of range for layer {name!r} with {H} heads")
                kept = tuple(h % H for h in self.heads)
                pick = torch.tensor(kept, device=weights.device)
                weights = weights.index_select(-3, pick)  # (*batch, h, L, S)
                lse = lse.index_select(-2, pick) if lse is not None else None  # (*batch, h, L)
        elif self.heads is not None:
            raise ValueError(
                f"heads: layer {name!r} has no head dim (weights of shape "
                f"{tuple(weights.shape)}); pass heads=None"
            )
        self.capture.records.append(
            AttentionRecord(
                layer=name,
                index=index,
                heads=kept,
                weights=weights,
                lse=lse,
                backend=backend.name,
            )
        )

    def finish(self) -> None:
        """Resolve negative layer numbers now that every layer is known, and say which
        asked-for numbers matched no layer (:attr:`Capture.unmatched`)."""
        if self.layers is None:
            return
        n = len(self.index)
        beyond = [x for x in self.layers if isinstance(x, int) and not -n <= x < n]
        missed = [
            p
            for p in self.layers
            if isinstance(p, str)
            and not any(m == p or fnmatch.fnmatchcase(m, p) for m in self.index)
        ]
        said = []
        if beyond and n:
            said.append(
                f"layers: {beyond} matched none of the {n} attention layers the model ran "
                f"(0 to {n - 1}, or -{n} to -1)"
            )
        if missed and n:
            shown = list(self.index)[:6]
            said.append(
                f"layers: {missed} matched none of the names of the {n} attention layers the "
                f"model ran ({', '.join(shown)}{', ...' if n > len(shown) else ''})"
            )
        if said:
            self.capture.unmatched = "; ".join(said)
        if not self.deferred:
            return
        wanted_idx = {x % n for x in self.layers if isinstance(x, int) and n and -n <= x < n}
        names = [x for x in self.layers if isinstance(x, str)]
        self.capture.records = [
            r
            for r in self.capture.records
            if r.index in wanted_idx
            or any(r.layer == p or fnmatch.fnmatchcase(r.layer, p) for p in names)
        ]


def _exact_weights(
    inputs: AttentionInputs, result: AttentionResult, backend: Backend
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weights (*batch, L, S) and lse (*batch, L) of the call, without dropout, detached.

    When the call did not return per-head weights itself, the same call is made again
    through :func:`attnkit.attention` with ``return_weights=True`` and no dropout (the
    same score, mask, scale and modifiers), on the backend that ran it when that backend
    can return weights, else on the next one that can. Recording is off meanwhile, so
    the call is not recorded twice.
    """
    if result.weights is not None and not inputs.weights_mean and inputs.dropout_p == 0.0:
        lse = result.lse.detach() if result.lse is not None else None
        return result.weights.detach(), lse
    from .. import available_backends  # the package's public name, bound after viz is imported

    order = [backend.name, *(n for n in available_backends() if n != backend.name)]
    token = _recording.ACTIVE.set(None)
    try:
        with torch.no_grad():
            _, weights, lse = attention(
                inputs.query,
                inputs.key,
                inputs.value,
                score=inputs.score,
                mask=inputs.mask,
                scale=inputs.head_scale if inputs.head_scale is not None else inputs.scale,
                mods=list(inputs.mods) or None,  # (a softcap, sinks, ALiBi: the same weights)
                check_finite=inputs.check_finite,
                return_weights=True,
                return_lse=True,
                backend=order,
            )
    finally:
        _recording.ACTIVE.reset(token)
    return weights.detach(), lse.detach()


@contextmanager
def capture(
    model: nn.Module, layers: LayerSelection = None, heads: HeadSelection = None
) -> Iterator[Capture]:
    """Record the exact attention weights of ``model``'s attention layers.

    Args:
        model: any ``nn.Module`` whose attention runs through
            :func:`attnkit.attention` (attnkit layers, :mod:`attnkit.models`).
        layers: None = every layer; else layer numbers (negative count from the
            last), qualified module names, or ``fnmatch`` patterns of names.
        heads: None = every head; else head numbers (dim -3 of the weights,
            negative count from the last).

    Yields:
        a :class:`Capture`, filled as the model runs. Forward outputs are
        unchanged; the hooks are removed when the block ends, even on error.

    Example::

        with capture(model, layers=[0, -1], heads=[0]) as cap:
            model(**batch)
        cap.stack(batch_index=0)       # (2, 1, L, L)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    recorder = _Recorder(
        _normalize_layers(layers), _normalize_heads(heads), _recording.ACTIVE.get()
    )
    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(_bind_enter(recorder, name)))
        handles.append(module.register_forward_hook(_bind_leave(recorder, name), always_call=True))
    token = _recording.ACTIVE.set(recorder)
    try:
        yield recorder.capture
    finally:
        _recording.ACTIVE.reset(token)
        for h in handles:
            h.remove()
        recorder.finish()


def _bind_enter(recorder: _Recorder, name: str) -> Any:
    def hook(module: nn.Module, args: Any) -> None:
        if _recording.reaches(recorder):  # (not a run of the model in another thread)
            recorder.enter(name, module, args)

    return hook


def _bind_leave(recorder: _Recorder, name: str) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if _recording.reaches(recorder):
            recorder.leave(name, module, args, output)

    return hook
