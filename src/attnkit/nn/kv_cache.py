"""A static key/value cache for incremental (token-by-token) decoding.

The cache holds preallocated key and value buffers of a maximum length and a
fill position. A decoder layer writes the keys and values of the tokens it is
given at the fill position, advances it, and attends over the filled part
``[0, length)``; with ``masks.causal("bottom_right")`` the new queries, which
are the last ``T`` positions of that part, see exactly the keys at or before
their own position.

The fill position is a Python int, not a tensor. The caller always knows on
the host how many tokens it feeds, so advancing it never reads the device (no
host-device synchronization), the writes are plain slice copies, and the
attention runs over the filled part only (its cost grows with the filled
length, not with ``max_len``), where one new query needs no mask at all and a
few take the fused bottom-right-causal path of the backends. Under
``torch.compile`` the growing key length is a dynamic shape.

Decoding under autograd (training, RL rollouts that backpropagate) works too.
With gradients enabled a step does not hand the attention a view of the
buffers, which the next step's write would change under the saved tensors of
the backward; the filled part is instead a new tensor, the previous filled
part with the new keys concatenated (``torch.cat``, differentiable), kept
beside the buffers until the next step. Gradients then flow to the keys and
values of every earlier step, exactly as in the full causal forward. The
buffers still receive every write (detached), so they always hold the cache's
contents. The concatenation costs a copy of the filled part per step, the same
order as the step's attention; under ``torch.no_grad()`` or
``torch.inference_mode()`` the in-place path runs and copies only the new
positions.
"""

from __future__ import annotations

import numbers
import os

import torch

from .._autocast import autocast_mixes
from ._common import check_factory_device, check_factory_dtype, check_positive_int, shape_str

__all__ = ["KVCache"]

_OWNER = "KVCache"


class KVCache:
    """Preallocated keys (B, Hkv, max_len, D) and values (B, Hkv, max_len, Dv), filled in order.

    Args:
        batch_size: B, the number of sequences decoded together.
        num_kv_heads: Hkv, the key/value heads of the layer.
        max_len: the most positions the cache can hold (prompt plus generated tokens).
        head_dim: D, the key size per head.
        value_dim: Dv, the value size per head (default ``head_dim``).
        device, dtype: of the buffers; they must match the layer's parameters.

    ``length`` is the number of positions filled so far; :meth:`reset` empties
    the cache (the buffers are kept and overwritten by the next writes). Setting
    ``length`` back to an earlier count rolls the cache back: the next write
    overwrites the positions from there on. It takes an int from 0 to the positions
    written since the last reset (a ValueError otherwise: past them the buffers hold
    no keys). ``copy.deepcopy`` copies the buffers (a branch for beam search); with
    gradients enabled the copy shares the earlier steps' differentiable keys and
    values, which no write changes, so gradients reach them from either cache.
    Inference decoding runs under ``torch.no_grad()`` or ``torch.inference_mode()``
    (writes in place, no autograd graph across steps); a cache made under
    ``torch.inference_mode()`` and written outside it copies its buffers once. With gradients enabled the
    steps stay differentiable: gradients of step-by-step decoding equal those of
    the full causal forward (see the module docstring for the cost).

    Raises:
        ValueError: a size that is not a positive int, or buffers larger than the
            device's memory (checked before any allocation, naming the bytes).
        MemoryError: the allocator could not provide the buffers (naming the bytes).
    """

    def __init__(
        self,
        batch_size: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        *,
        value_dim: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        B = check_positive_int(_OWNER, "batch_size", batch_size)
        H = check_positive_int(_OWNER, "num_kv_heads", num_kv_heads)
        n = check_positive_int(_OWNER, "max_len", max_len)
        D = check_positive_int(_OWNER, "head_dim", head_dim)
        Dv = D if value_dim is None else check_positive_int(_OWNER, "value_dim", value_dim)
        dt = check_factory_dtype(_OWNER, dtype) or torch.get_default_dtype()
        where = check_factory_device(_OWNER, device) or torch.empty(0).device
        size = B * H * n * (D + Dv) * dt.itemsize  # bytes of keys and values together
        shapes = f"keys {shape_str((B, H, n, D))} and values {shape_str((B, H, n, Dv))} {dt}"
        limit = _device_memory(where)
        if limit is not None and size > limit:
            raise ValueError(
                f"{_OWNER}: {shapes} need {size:,} bytes ({_human(size)}), more than the "
                f"{limit:,} bytes ({_human(limit)}) of memory on {where}; lower max_len="
                f"{n} or batch_size={B}"
            )
        try:
            self.keys = torch.zeros(B, H, n, D, device=where, dtype=dt)  # (B, Hkv, max_len, D)
            self.values = torch.zeros(B, H, n, Dv, device=where, dtype=dt)  # (B, Hkv, max_len, Dv)
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            raise MemoryError(
                f"{_OWNER}: could not allocate {shapes}, {size:,} bytes ({_human(size)}) on "
                f"{where}; lower max_len={n} or batch_size={B}, or free memory"
            ) from exc
        self._length = 0
        self._written = 0  # positions written since the last reset: length's largest value
        # With gradients enabled: the filled part as a differentiable tensor (see the module
        # docstring), its length, and the one a write made before advance() commits it.
        self._graph: tuple[torch.Tensor, torch.Tensor] | None = None
        self._graph_end = 0  # the positions of _graph still valid (fewer after a roll-back)
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def length(self) -> int:
        """The positions filled so far, ``[0, length)``; set it back to roll back."""
        return self._length

    @length.setter
    def length(self, value: int) -> None:
        traced = torch.compiler.is_compiling() and not isinstance(value, int)  # (a SymInt)
        if not traced and (
            isinstance(value, bool)
            or not isinstance(value, numbers.Integral)
            or not 0 <= int(value) <= self._written
        ):
            raise ValueError(
                f"{_OWNER}.length: expected an int from 0 to the {self._written} positions "
                f"written since the last reset (max_len {self.max_len}), got {value!r}"
            )
        self._length = int(value)

    def __setstate__(self, state: dict[str, object]) -> None:
        """A cache pickled before ``length`` was checked (its plain ``length`` field)
        loads with its length as the positions written."""
        if "length" in state and "_length" not in state:
            state["_length"] = state.pop("length")
            state.setdefault("_written", state["_length"])
        self.__dict__.update(state)

    def __deepcopy__(self, memo: dict[int, object]) -> KVCache:
        """A copy with its own buffers; the differentiable filled part of the steps taken
        with gradients is shared (never written in place), so gradients still reach it."""
        import copy

        shared = ("_graph", "_pending")
        other = object.__new__(type(self))
        memo[id(self)] = other
        for name, value in self.__dict__.items():
            if name in shared:
                other.__dict__[name] = value
            elif isinstance(value, torch.Tensor):
                other.__dict__[name] = value.detach().clone()
            else:
                other.__dict__[name] = copy.deepcopy(value, memo)
        return other

    @property
    def max_len(self) -> int:
        """The most positions the cache can hold."""
        return int(self.keys.shape[2])

    @property
    def batch_size(self) -> int:
        return int(self.keys.shape[0])

    def reset(self) -> None:
        """Empty the cache for a new batch of sequences."""
        self._length = self._written = 0
        self._graph = self._pending = None

    def check_write(self, owner: str, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Raise, naming ``owner``, unless ``keys``/``values`` fit at the fill position."""
        for name, t in (("keys", keys), ("values", values)):
            if not isinstance(t, torch.Tensor) or t.ndim != 4:
                got = shape_str(t) if isinstance(t, torch.Tensor) else type(t).__name__
                raise (ValueError if isinstance(t, torch.Tensor) else TypeError)(
                    f"{owner}: the new {name} must be a tensor (batch_size, num_kv_heads, T, "
                    f"head size), got {got}"
                )
        want_k = (*self.keys.shape[:2], keys.shape[2], self.keys.shape[3])
        want_v = (*self.values.shape[:2], keys.shape[2], self.values.shape[3])
        if tuple(keys.shape) != want_k or tuple(values.shape) != want_v:
            raise ValueError(
                f"{owner}: the new keys {shape_str(keys)} and values {shape_str(values)} do not "
                f"fit the cache's keys {shape_str(self.keys)} and values {shape_str(self.values)} "
                f"(batch_size, num_kv_heads, max_len, head size); build the cache for this "
                f"layer and batch"
            )
        if keys.device != self.keys.device or (
            keys.dtype != self.keys.dtype
            and not autocast_mixes(keys.device, keys.dtype, self.keys.dtype)
        ):  # (under autocast the cache keeps its dtype; attention() casts what it reads)
            raise TypeError(
                f"{owner}: the cache holds {self.keys.dtype} on {self.keys.device}, the layer "
                f"computes {keys.dtype} on {keys.device}; build the cache with the layer's "
                f"dtype and device"
            )
        if self.length + keys.shape[2] > self.max_len:
            raise ValueError(
                f"{owner}: the cache holds {self.length} of {self.max_len} positions and cannot "
                f"take {keys.shape[2]} more; allocate a longer cache (max_len) or reset() it"
            )

    def write(
        self, keys: torch.Tensor, values: torch.Tensor, *, owner: str = _OWNER
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, Hkv, T, D) keys and (B, Hkv, T, Dv) values at the fill position.

        The fill position does not move (call :meth:`advance` once the step has
        succeeded). Returns the part filled with the new positions included,
        keys (B, Hkv, length + T, D) and values (B, Hkv, length + T, Dv): views
        of the buffers under ``torch.no_grad()``, new tensors that carry the
        gradient to every step's keys and values when gradients are enabled.
        ``owner`` names the caller in error messages.
        """
        self.check_write(owner, keys, values)
        if (
            not torch.compiler.is_compiling()  # (dynamo cannot trace is_inference)
            and self.keys.is_inference()
            and not torch.is_inference_mode_enabled()
        ):
            # Made under torch.inference_mode(): only inference mode may write its
            # buffers. Outside it they become normal tensors, contents kept (one copy).
            self.keys, self.values = self.keys.clone(), self.values.clone()
        start = self.length
        end = start + int(keys.shape[2])
        if self._graph is not None and self._graph_end > start:
            # ``length`` was set back: positions from ``start`` on are written again, and
            # only the earlier steps' differentiable copy before them stays (cut when a
            # step with gradients reads it: a view taken here under no_grad or inference
            # mode would carry no gradient)
            self._graph_end = start
        grad = torch.is_grad_enabled()
        self.keys[:, :, start:end] = keys.detach() if grad else keys  # (B, Hkv, T, D)
        self.values[:, :, start:end] = values.detach() if grad else values  # (B, Hkv, T, Dv)
        if not grad:
            self._pending = None
            return self.keys[:, :, :end], self.values[:, :, :end]  # (B, Hkv, length + T, D|Dv)
        # Out of place: nothing the attention saves for its backward is written again.
        prev_k, prev_v = self._filled_before(start)  # (B, Hkv, length, D|Dv)
        filled = (
            torch.cat([prev_k, keys], dim=2),  # (B, Hkv, length + T, D)
            torch.cat([prev_v, values], dim=2),  # (B, Hkv, length + T, Dv)
        )
        self._pending = filled
        return filled

    def advance(self, count: int) -> None:
        """Count ``count`` more positions as filled (after :meth:`write`): an int from 0
        to the positions left (``max_len - length``)."""
        left = self.max_len - self.length
        if torch.compiler.is_compiling():  # (a traced length: the write checked it)
            pass
        elif (
            isinstance(count, bool)
            or not isinstance(count, numbers.Integral)
            or not 0 <= int(count) <= left
        ):
            raise ValueError(
                f"{_OWNER}.advance: count must be an int from 0 to the {left} positions left "
                f"(length {self.length} of max_len {self.max_len}), got {count!r}"
            )
        self._length += int(count)
        self._written = max(self._written, self._length)
        pending, self._pending = self._pending, None
        if pending is not None and pending[0].shape[2] == self.length:
            self._graph, self._graph_end = pending, self.length

    def _filled_before(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (B, Hkv, start, D) and values (B, Hkv, start, Dv) filled before ``start``.

        The differentiable tensor of earlier steps taken with gradients enabled, and
        after it whatever later no-grad steps wrote to the buffers (constants).
        """
        graph, have = self._graph, self._graph_end
        if graph is None or have == 0 or have > start:
            return self.keys[:, :, :start], self.values[:, :, :start]
        if have < graph[0].shape[2]:  # rolled back: its valid part
            graph = (graph[0][:, :, :have], graph[1][:, :, :have])  # (B, Hkv, have, D|Dv)
        if have == start:
            return graph
        return (
            torch.cat([graph[0], self.keys[:, :, have:start]], dim=2),  # (B, Hkv, start, D)
            torch.cat([graph[1], self.values[:, :, have:start]], dim=2),  # (B, Hkv, start, Dv)
        )

    def append(
        self, keys: torch.Tensor, values: torch.Tensor, *, owner: str = _OWNER
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`write`, then :meth:`advance` over the new positions; returns the filled part."""
        filled = self.write(keys, values, owner=owner)
        self.advance(int(keys.shape[2]))
        return filled

    def __repr__(self) -> str:
        return (
            f"KVCache(length={self.length}, keys={shape_str(self.keys)}, "
            f"values={shape_str(self.values)}, dtype={self.keys.dtype})"
        )


def _device_memory(device: torch.device) -> int | None:
    """Bytes of memory ``device`` has in all (RAM for the CPU), or None where unknown."""
    if device.type == "cpu":
        try:
            return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
        except (AttributeError, OSError, ValueError):  # no sysconf (Windows) or no such name
            return None
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return int(torch.cuda.get_device_properties(index).total_memory)
    return None


def _human(size: int) -> str:
    """``size`` bytes as ``12.3 GiB``."""
    value = float(size)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "bytes" else f"{size} bytes"
        value /= 1024
    return f"{size} bytes"  # pragma: no cover
