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
"""

from __future__ import annotations

import torch

from ._common import check_positive_int, shape_str

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
    the cache (the buffers are kept and overwritten by the next writes).
    Decoding is inference: run it under ``torch.no_grad()`` or
    ``torch.inference_mode()`` so no autograd graph grows across steps.
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
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"{_OWNER}: dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.keys = torch.zeros(B, H, n, D, device=device, dtype=dtype)  # (B, Hkv, max_len, D)
        self.values = torch.zeros(B, H, n, Dv, device=device, dtype=dtype)  # (B, Hkv, max_len, Dv)
        self.length = 0

    @property
    def max_len(self) -> int:
        """The most positions the cache can hold."""
        return int(self.keys.shape[2])

    @property
    def batch_size(self) -> int:
        return int(self.keys.shape[0])

    def reset(self) -> None:
        """Empty the cache for a new batch of sequences."""
        self.length = 0

    def check_write(self, owner: str, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Raise, naming ``owner``, unless ``keys``/``values`` fit at the fill position."""
        want_k = (*self.keys.shape[:2], keys.shape[2], self.keys.shape[3])
        want_v = (*self.values.shape[:2], keys.shape[2], self.values.shape[3])
        if tuple(keys.shape) != want_k or tuple(values.shape) != want_v:
            raise ValueError(
                f"{owner}: the new keys {shape_str(keys)} and values {shape_str(values)} do not "
                f"fit the cache's keys {shape_str(self.keys)} and values {shape_str(self.values)} "
                f"(batch_size, num_kv_heads, max_len, head size); build the cache for this "
                f"layer and batch"
            )
        if keys.dtype != self.keys.dtype or keys.device != self.keys.device:
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
        keys (B, Hkv, length + T, D) and values (B, Hkv, length + T, Dv).
        ``owner`` names the caller in error messages.
        """
        self.check_write(owner, keys, values)
        start = self.length
        end = start + int(keys.shape[2])
        self.keys[:, :, start:end] = keys  # (B, Hkv, T, D) into the buffer
        self.values[:, :, start:end] = values  # (B, Hkv, T, Dv) into the buffer
        return self.keys[:, :, :end], self.values[:, :, :end]  # (B, Hkv, length + T, D|Dv)

    def advance(self, count: int) -> None:
        """Count ``count`` more positions as filled (after :meth:`write`)."""
        self.length += count

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
