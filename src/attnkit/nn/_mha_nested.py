"""Nested (ragged) inputs of :class:`~attnkit.nn.MultiheadAttention`.

A nested tensor (``torch.nested``, jagged layout or torch's older strided one)
of shape (N, L*, features) is a batch of sequences of different lengths, always
batch first. The layer pads each input once to its longest sequence and passes
the key lengths to :func:`attnkit.attention` as ``masks.valid_lens`` (with
``queries=True`` when the queries have the same lengths, as in self-attention),
so the backends take their ragged paths and skip the padding; with ``bias_k`` or
the zero key, whose positions follow the padding, the lengths become a
``masks.key_padding`` mask. The output is a nested tensor of the query's layout
and lengths (jagged: the query's own offsets, so ``x + layer(x, x, x)[0]``
works); the weights, when asked for, are dense (N, L_max, S'_max) or
(N, H, L_max, S'_max), 0 at padding rows and columns, as torch's fast path
returns them.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import masks
from .._host import readable
from ._common import InputShapeError, MhaLayer, shape_str
from ._mha_inputs import OWNER, build_mask, check_devices, check_inputs_dtype, check_query_dims

__all__ = ["any_nested", "nested_forward"]


def any_nested(*tensors: object) -> bool:
    """True when one of ``tensors`` is a nested tensor."""
    return any(isinstance(t, torch.Tensor) and t.is_nested for t in tensors)


class _Ragged:
    """One nested input padded: ``padded`` (N, L_max, F), ``lens`` (N,) long, ``max_len``."""

    def __init__(self, t: torch.Tensor) -> None:
        self.source = t
        self.jagged = t.layout == torch.jagged
        if self.jagged:
            jt: Any = t  # torch's jagged NestedTensor (offsets(), lengths())
            if jt.lengths() is not None:  # a jagged view with holes: pack it first
                t = jt = jt.contiguous()
            offsets = jt.offsets()
            self.offsets = offsets
            self.lens = offsets.diff()  # (N,) on the values' device
            self.host_lens: list[int] | None = None
        else:
            self.host_lens = [int(u.shape[0]) for u in t.unbind()]  # host metadata, no sync
            self.lens = torch.tensor(self.host_lens, dtype=torch.long)  # (N,) host-readable
        self.padded = torch.nested.to_padded_tensor(t, 0.0)  # (N, L_max, F)
        self.max_len = int(self.padded.shape[1])

    def valid(self) -> torch.Tensor:
        """(N, L_max) bool, True at the real positions."""
        pos = torch.arange(self.max_len, device=self.padded.device)  # (L_max,)
        return pos.view(1, -1) < self.lens.to(self.padded.device).view(-1, 1)  # (N, L_max)

    def same_lengths(self, other: _Ragged) -> bool:
        """True when both hold the same lengths (read on the host only where free)."""
        if other.source is self.source:
            return True
        if self.host_lens is not None and other.host_lens is not None:
            return self.host_lens == other.host_lens
        a, b = self.lens, other.lens
        if a.shape != b.shape or not (readable(a) and readable(b)):
            return False
        return bool(torch.equal(a.cpu(), b.cpu()))

    def unpad(self, out: torch.Tensor) -> torch.Tensor:
        """(N, L_max, E) padded output -> a nested tensor of this input's layout and lengths."""
        N, Lmax, E = out.shape
        if not self.jagged:
            assert self.host_lens is not None
            return torch.nested.as_nested_tensor([out[b, :n] for b, n in enumerate(self.host_lens)])
        total = int(self.source.values().shape[0])
        starts = torch.arange(N, device=out.device) * Lmax - self.offsets[:-1]  # (N,)
        flat = torch.arange(total, device=out.device) + starts.repeat_interleave(
            self.lens, output_size=total
        )  # (T,) index of each real position in the padded (N·L_max) rows
        values = out.reshape(N * Lmax, E).index_select(0, flat)  # (T, E)
        return torch.nested.nested_tensor_from_jagged(values, offsets=self.offsets)


def nested_forward(
    layer: MhaLayer,
    query: object,
    key: object,
    value: object,
    key_padding_mask: object,
    need_weights: bool,
    attn_mask: object,
    average_attn_weights: bool,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The layer's forward for nested query, key and value; see the module docstring."""
    q, k, v = _check(layer, query, key, value, key_padding_mask, attn_mask)
    rq = _Ragged(q)
    rk = rq if k is q else _Ragged(k)
    rv = rk if v is k else _Ragged(v)
    if rk is not rv and not rk.same_lengths(rv):
        raise InputShapeError(
            f"{OWNER}: key and value must hold sequences of the same lengths, got key lengths "
            f"{rk.lens.tolist()} and value lengths {rv.lens.tolist()}"
        )
    N, Lmax, Smax = int(rq.padded.shape[0]), rq.max_len, rk.max_len
    if int(rk.padded.shape[0]) != N or int(rv.padded.shape[0]) != N:
        raise InputShapeError(
            f"{OWNER}: query, key and value must hold the same number of sequences, got "
            f"{N}, {int(rk.padded.shape[0])} and {int(rv.padded.shape[0])}"
        )
    extra = int(layer.bias_k is not None) + int(layer.add_zero_attn)
    if extra:
        # The extra keys follow the padding: mark the padding itself.
        padding = ~rk.valid()  # (N, S_max), True = padding
        mask = build_mask(layer, padding, attn_mask, is_causal, True, N, Lmax, Smax, extra)
    else:
        ragged = masks.valid_lens(rk.lens, queries=rq.same_lengths(rk))
        user = build_mask(layer, None, attn_mask, is_causal, True, N, Lmax, Smax, 0)
        mask = ragged if user is None else ragged & user
    self_attn = q is k and k is v
    out, weights = layer._attend(
        rq.padded, rk.padded, rv.padded, mask, self_attn, need_weights, average_attn_weights
    )  # (N, L_max, E), weights (N, [H,] L_max, S'_max) or None
    if weights is not None:
        rows = rq.valid()  # (N, L_max)
        rows = rows.view(N, *([1] * (weights.ndim - 3)), Lmax, 1)  # (N, [1,] L_max, 1)
        weights = weights.masked_fill(~rows, 0.0)
    return rq.unpad(out), weights


def _check(
    layer: MhaLayer,
    query: object,
    key: object,
    value: object,
    key_padding_mask: object,
    attn_mask: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raise unless query, key and value are nested (N, L*, features) inputs the layer takes."""
    named = (("query", query), ("key", key), ("value", value))
    for name, t in named:
        if not isinstance(t, torch.Tensor) or not t.is_nested:
            got = "a dense tensor" if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(
                f"{OWNER}: query, key and value must be all nested tensors or all dense; {name} "
                f"is {got} while another is nested"
            )
    assert isinstance(query, torch.Tensor)
    assert isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor)
    check_devices(query, key, value)
    check_query_dims(layer, query)
    for name, t in named:
        assert isinstance(t, torch.Tensor)
        if t.layout not in (torch.jagged, torch.strided):
            raise TypeError(
                f"{OWNER}: {name} is a nested tensor of layout {t.layout}; expected "
                f"torch.jagged (or torch.strided)"
            )
        if t.dim() != 3 or (t.layout == torch.jagged and getattr(t, "_ragged_idx", 1) != 1):
            raise InputShapeError(
                f"{OWNER}: a nested {name} must be (N, L*, features): 3-D with its ragged "
                f"dim 1, got {t.dim()}-D" + (" ragged in another dim" if t.dim() == 3 else "")
            )
        if not t.is_floating_point():
            raise TypeError(f"{OWNER}: {name} must be a floating-point tensor, got dtype {t.dtype}")
    for name, t, want, what in (
        ("query", query, layer.embed_dim, "embed_dim"),
        ("key", key, layer.kdim, "kdim"),
        ("value", value, layer.vdim, "vdim"),
    ):
        if t.size(-1) != want:
            raise InputShapeError(
                f"{OWNER}: {name} has {t.size(-1)} features (last dim of the nested "
                f"(N, L*, features) {name}), expected {what}={want}"
            )
    check_inputs_dtype(layer, query, key, value)
    if key_padding_mask is not None:
        raise ValueError(
            f"{OWNER}: key_padding_mask is not taken with nested inputs: the nested key already "
            f"gives each sequence's length (got a mask of shape "
            f"{shape_str(key_padding_mask) if isinstance(key_padding_mask, torch.Tensor) else '?'})"
        )
    if attn_mask is not None and not isinstance(attn_mask, masks.Mask):
        raise TypeError(
            f"{OWNER}: with nested inputs, attn_mask must be an attnkit mask over (N, H, L_max, "
            f"S_max) (or pass is_causal=True), got {type(attn_mask).__name__}"
        )
    return query, key, value
