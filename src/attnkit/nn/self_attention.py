"""The classic self-attention block: QKV projection, attention dropout, output projection.

One layer covers the usual hand-written variants: separate ``q``/``k``/``v``
projections or one fused ``proj`` producing all three, dropout on the
attention weights, an optional output projection ``output_proj``, one or
several heads. The submodule names are those hand-written blocks commonly use,
so their weights load unchanged. The logits are scaled by 1/sqrt(head size).

The same layer is a decoder block: ``causal=True`` lets each position attend
to itself and the positions before it, ``num_kv_heads`` shares each key/value
head among a group of query heads (grouped-query attention; the key and value
heads go to :func:`attnkit.attention` as they are, never repeated), and a
:class:`~attnkit.nn.KVCache` from :meth:`SelfAttention.new_cache` turns it
into an incremental decoder: prefill with the prompt, then step one or
several tokens at a time, each call attending over the filled cache with
``masks.causal("bottom_right")``. These are options of this class rather than
a separate ``CausalSelfAttention``: a decoder block is the same block (same
projections, same submodule names, same state_dict keys), and one class keeps
one code path for encoders and decoders.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import masks
from .._torch_features import check_compiling
from ._common import (
    attend,
    check_dropout,
    check_factory_device,
    check_factory_dtype,
    check_param_dtype,
    check_positive_int,
    check_tensor,
    keep_of_zero_one,
    shape_str,
)
from .kv_cache import KVCache

__all__ = ["SelfAttention"]

_OWNER = "SelfAttention"
_SIZES = frozenset({"hidden_dim", "num_heads", "num_kv_heads", "head_dim", "kv_dim", "fused_qkv"})
"""Attributes the projections' weights are sized by: fixed once the layer is built."""


class SelfAttention(nn.Module):
    """Self-attention over a sequence, softmax(q kᵀ / sqrt(d)) v.

    Args:
        hidden_dim: the feature size of the input and of the output.
        num_heads: H, query heads; must divide ``hidden_dim`` (head size
            d = hidden_dim / num_heads).
        fused_qkv: one ``proj`` Linear (hidden, hidden + 2·Hkv·d) instead of
            ``q`` (hidden, hidden), ``k`` and ``v`` (hidden, Hkv·d).
        dropout: dropout on the attention weights while training, in [0, 1).
        out_proj: apply ``output_proj`` Linear (hidden, hidden) to the result.
        bias: biases in the projections.
        causal: position i attends only to positions j <= i (a decoder).
        num_kv_heads: Hkv, key/value heads (default H); must divide H. Query
            heads g·j .. g·j + g - 1 (g = H / Hkv) share key/value head j.
        device, dtype: where and in which floating-point dtype the parameters live.
    """

    def __init__(
        self,
        hidden_dim: int,
        num_heads: int = 1,
        fused_qkv: bool = True,
        dropout: float = 0.0,
        out_proj: bool = True,
        bias: bool = True,
        *,
        causal: bool = False,
        num_kv_heads: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.hidden_dim = check_positive_int(_OWNER, "hidden_dim", hidden_dim)
        self.num_heads = check_positive_int(_OWNER, "num_heads", num_heads)
        if hidden_dim % num_heads != 0:
            raise ValueError(f"{_OWNER}: num_heads={num_heads} must divide hidden_dim={hidden_dim}")
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.num_kv_heads = check_positive_int(_OWNER, "num_kv_heads", kv_heads)
        if num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"{_OWNER}: num_kv_heads={self.num_kv_heads} must divide num_heads={num_heads} "
                f"(each key/value head serves num_heads / num_kv_heads query heads)"
            )
        if not isinstance(causal, bool):
            raise TypeError(f"{_OWNER}: causal must be True or False, got {causal!r}")
        self.causal = causal
        check_factory_dtype(_OWNER, dtype)
        check_factory_device(_OWNER, device)
        self.head_dim = hidden_dim // num_heads
        self.kv_dim = self.num_kv_heads * self.head_dim
        self.dropout = check_dropout(_OWNER, dropout)
        self.fused_qkv = bool(fused_qkv)
        factory: dict[str, Any] = {"device": device, "dtype": dtype, "bias": bias}
        self.proj: nn.Linear | None = None
        self.q: nn.Linear | None = None
        self.k: nn.Linear | None = None
        self.v: nn.Linear | None = None
        if self.fused_qkv:
            self.proj = nn.Linear(hidden_dim, hidden_dim + 2 * self.kv_dim, **factory)
        else:
            self.q = nn.Linear(hidden_dim, hidden_dim, **factory)
            self.k = nn.Linear(hidden_dim, self.kv_dim, **factory)
            self.v = nn.Linear(hidden_dim, self.kv_dim, **factory)
        self.output_proj = nn.Linear(hidden_dim, hidden_dim, **factory) if out_proj else None

    def __setattr__(self, name: str, value: object) -> None:
        """As :class:`torch.nn.Module`'s, but the sizes the projections were built for
        (``hidden_dim``, ``num_heads``, ``num_kv_heads``, ``head_dim``, ``kv_dim``,
        ``fused_qkv``) cannot be set again: the weights would not match them.

        Raises:
            AttributeError: one of those sizes, once the layer is built.
        """
        if name in _SIZES and name in self.__dict__:
            raise AttributeError(
                f"{_OWNER}: {name} is fixed when the layer is built (its projections are "
                f"sized for {name}={self.__dict__[name]!r}); build a new layer for "
                f"{name}={value!r}"
            )
        super().__setattr__(name, value)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        extra = f", num_kv_heads={self.num_kv_heads}" if self.num_kv_heads != self.num_heads else ""
        return f"num_heads={self.num_heads}{extra}, causal={self.causal}, dropout={self.dropout}"

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty :class:`KVCache` for this layer: B sequences of up to ``max_len`` positions.

        The buffers take the dtype and device of the layer's parameters.
        """
        weight = self.proj.weight if self.proj is not None else self.k.weight  # type: ignore[union-attr]
        return KVCache(
            batch_size,
            self.num_kv_heads,
            max_len,
            self.head_dim,
            device=weight.device,
            dtype=weight.dtype,
        )

    def forward(
        self,
        x: torch.Tensor,
        mask: masks.Mask | torch.Tensor | None = None,
        return_weights: bool = False,
        *,
        cache: KVCache | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from every position of ``x`` to every position of ``x`` (or the cache).

        Args:
            x: (B, S, hidden) or (S, hidden).
            mask: an :mod:`attnkit.masks` object over (B, H, S, S), or a keep
                tensor (B, S) or (B, S, S): bool or 0/1 numbers, nonzero = may
                attend (the ``masked_fill(mask == 0, -inf)`` convention). A query
                with no key left gives 0, not NaN. Combined with the causal mask
                when the layer is ``causal``. With a ``cache``, an attnkit mask
                over (B, H, S, length) only; a causal or window band in it must be
                placed after the cached positions (``align="bottom_right"`` or a
                ``q_offset``): a top-left band at offset 0 is refused after the prefill.
            return_weights: also return the weights (B, H, S, S) (before dropout);
                (B, H, S, length) with a cache.
            cache: a :class:`KVCache` from :meth:`new_cache` (causal layers
                only). The S positions of ``x`` follow the ``cache.length``
                positions already in it: their keys and values are written
                there, ``cache.length`` grows by S, and the queries attend over
                the filled part with ``masks.causal("bottom_right")``. Prefill
                with the prompt, then step one or several tokens at a time.
                Steps taken with gradients enabled stay differentiable (the
                gradients equal the full causal forward's).

        Returns:
            (B, S, hidden) (or (S, hidden)); with ``return_weights`` the tuple
            ``(output, weights)``.
        """
        check_compiling()
        check_tensor(_OWNER, "x", x, f"(B, S, {self.hidden_dim})")
        if x.ndim not in (2, 3) or x.shape[-1] != self.hidden_dim:
            raise ValueError(
                f"{_OWNER}: x must have shape (B, S, {self.hidden_dim}) or (S, "
                f"{self.hidden_dim}), got {shape_str(x)}"
            )
        check_param_dtype(_OWNER, self, x=x)
        batched = x.ndim == 3
        xb = x if batched else x.unsqueeze(0)  # (B, S, hidden)
        B, S = xb.shape[0], xb.shape[1]
        if cache is not None:
            m = self._check_cache(cache, mask, B)
        else:
            m = self._mask(mask, B, S, batched)
        if self.causal:
            # With a cache the S queries are the last S of the filled part.
            causal = masks.causal("bottom_right" if cache is not None else "top_left")
            m = causal if m is None else m & causal

        if self.proj is not None:
            q, k, v = self.proj(xb).split(
                [self.hidden_dim, self.kv_dim, self.kv_dim], dim=-1
            )  # (B, S, hidden), 2 x (B, S, Hkv·d)
        else:
            assert self.q is not None and self.k is not None and self.v is not None
            q, k, v = self.q(xb), self.k(xb), self.v(xb)  # (B, S, hidden), 2 x (B, S, Hkv·d)
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q = q.view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
        k = k.view(B, S, Hkv, D).transpose(1, 2)  # (B, Hkv, S, D)
        v = v.view(B, S, Hkv, D).transpose(1, 2)  # (B, Hkv, S, D)
        if cache is not None:
            # Written first, counted as filled only once the attention succeeded.
            k, v = cache.write(k, v, owner=_OWNER)  # (B, Hkv, length + S, D) each
        dropout_p = self.dropout if self.training else 0.0
        out, weights = attend(q, k, v, mask=m, dropout_p=dropout_p, need_weights=return_weights)
        if cache is not None:
            cache.advance(S)
        out = out.transpose(1, 2).reshape(B, S, self.hidden_dim)  # (B, S, hidden)
        if self.output_proj is not None:
            out = self.output_proj(out)  # (B, S, hidden)
        if not batched:
            out = out.squeeze(0)  # (S, hidden)
        if weights is None:
            return out
        return out, (weights if batched else weights.squeeze(0))  # (B, H, S, S) or (H, S, S)

    def _check_cache(self, cache: object, mask: object, B: int) -> masks.Mask | None:
        """Raise unless ``cache`` is a :class:`KVCache` this causal layer can use for B
        sequences; returns the mask (an attnkit mask or None)."""
        if not isinstance(cache, KVCache):
            raise TypeError(
                f"{_OWNER}: cache must be a KVCache (layer.new_cache(batch_size, max_len)), got "
                f"{type(cache).__name__}"
            )
        if not self.causal:
            raise ValueError(
                f"{_OWNER}: cache is for incremental decoding, which needs causal=True; this "
                f"layer was built with causal=False"
            )
        if cache.batch_size != B:
            raise ValueError(
                f"{_OWNER}: the cache holds {cache.batch_size} sequences, x has batch size {B}"
            )
        m = self._mask(mask, B, 0, True, cached=True)
        if m is not None and cache.length > 0 and m.starts_queries_at_key_zero():
            raise ValueError(
                f"{_OWNER}: mask holds a top-left band, which places the new queries at "
                f"positions 0.. of the {cache.length} cached ones, not after them; give it "
                "align='bottom_right' (or q_offset=cache.length)"
            )
        return m

    def _mask(
        self, mask: object, B: int, S: int, batched: bool, *, cached: bool = False
    ) -> masks.Mask | None:
        """The ``mask`` argument as an attnkit mask over (B, H, S, S), or None; with a
        cache only an attnkit mask (over (B, H, S, cache length)) or None."""
        if mask is None or isinstance(mask, masks.Mask):
            return mask
        if cached:
            raise TypeError(
                f"{_OWNER}: with a cache, mask must be None or an attnkit mask over (B, H, S, "
                f"cache length), got {type(mask).__name__}"
            )
        if not isinstance(mask, torch.Tensor):
            raise TypeError(
                f"{_OWNER}: mask must be an attnkit mask or a keep tensor (B, S) / (B, S, S), "
                f"got {type(mask).__name__}"
            )
        keep = keep_of_zero_one(_OWNER, "mask", mask, "for an additive bias pass masks.bias(t)")
        if not batched:
            keep = keep.unsqueeze(0)  # (1, S) or (1, S, S)
        if keep.shape == (B, S):
            return masks.keep(keep.view(B, 1, 1, S))  # (B, 1, 1, S)
        if keep.shape == (B, S, S):
            return masks.keep(keep.view(B, 1, S, S))  # (B, 1, S, S)
        want = f"({B}, {S}) or ({B}, {S}, {S})" if batched else f"({S},) or ({S}, {S})"
        raise ValueError(f"{_OWNER}: mask must have shape {want}, got {shape_str(mask)}")
