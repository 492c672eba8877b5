"""The ``"attnkit"`` attention function of transformers' ``AttentionInterface``.

Every attention module of a transformers 5.x model that follows the interface
calls ``fn(module, query, key, value, attention_mask, **kwargs)`` with

- query (B, H, L, E), key and value (B, Hk, S, E) after the KV cache update
  (Hk < H: grouped-query heads, which attnkit takes as they are);
- the mask the model built (a :class:`~.masks.SymbolicMask` from the ``"attnkit"``
  mask function, a 4-D tensor the caller prepared, or None);
- ``scaling``, ``dropout`` (0 unless training), and per family ``softcap``
  (Gemma 2), ``s_aux`` (gpt-oss's sinks), ``position_bias`` (T5),
  ``sliding_window``, ``is_causal``;

and expects ``(output (B, L, H, Ev), weights (B, H, L, S) or None)``.
:func:`attnkit_attention` makes one :func:`attnkit.attention` call of it, with the
model's extras as score modifiers (:mod:`attnkit.mods`), and returns exact
weights, from the same call, when the model passes ``output_attentions=True`` down
to it (most families do; GPT-2 does not, so it gets none, as from sdpa).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ... import masks, mods
from ...functional import attention
from ...masks.bands import Offset
from .masks import SymbolicMask
from .position_bias import position_bias_mod

__all__ = ["attnkit_attention"]

# Keywords some families pass that change the attention's numbers and that this function
# does not run: refused by name rather than dropped with the other keywords.
_NOT_RUN = {
    "sinks": "a sink logit per query (Inkling2's per-token sinks)",
    "indices": "a selection of keys per query (sparse attention)",
    "block_indices": "a selection of key blocks per query (block-sparse attention)",
}


def _wants_weights(module: nn.Module, kwargs: dict[str, Any]) -> bool:
    """Whether the caller asked for this call's weights: ``output_attentions`` as the
    model passed it down, else the module's config (transformers' public flag)."""
    if "output_attentions" in kwargs:
        return bool(kwargs["output_attentions"])
    return bool(getattr(getattr(module, "config", None), "output_attentions", False))


def _mask_of(
    attention_mask: object,
    module: nn.Module,
    L: int,
    S: int,
    is_causal: bool | None,
    sliding_window: int | None,
) -> tuple[masks.Mask | None, Offset, Offset]:
    """(mask, q0, k0): the call's attnkit mask and the global positions of its first
    query and key."""
    if isinstance(attention_mask, SymbolicMask):
        return attention_mask.for_call(L, S), attention_mask.q_offset, attention_mask.kv_offset
    if isinstance(attention_mask, torch.Tensor):
        if attention_mask.ndim < 2:
            raise ValueError(
                "attention_mask: expected a 4-D mask (B, 1 or H, L, S) or an attnkit mask, "
                f"got shape {tuple(attention_mask.shape)}"
            )
        if attention_mask.shape[-1] != S:  # (which keys it would cover is not known:
            # a sliding-window cache keeps the last ones, a static cache the first)
            raise ValueError(
                f"attention_mask: its last dim covers {attention_mask.shape[-1]} keys, but "
                f"the call has {S} (the keys the cache holds; a sliding-window layer keeps "
                f"only the last ones): expected a mask (B, 1 or H, {L}, {S}), as eager "
                "attention requires"
            )
        m = attention_mask
        if m.dtype == torch.bool:
            return masks.keep(m), S - L, 0  # transformers' bool masks: True = attend
        return masks.bias(m), S - L, 0
    if attention_mask is not None:
        raise TypeError(
            "attention_mask: expected None, a tensor or an attnkit mask, got "
            f"{type(attention_mask).__name__}"
        )
    causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", False))
    if not causal:
        return None, 0, 0
    # No mask built for a causal module: the queries are the last positions.
    if sliding_window:
        return masks.window(int(sliding_window) - 1, 0, "bottom_right"), S - L, 0
    return masks.causal("bottom_right"), S - L, 0


def attnkit_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | SymbolicMask | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    position_bias: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' attention through :func:`attnkit.attention`.

    Args:
        module: the calling attention module (``is_causal``, T5's table are read from it).
        query: (B, H, L, E).
        key, value: (B, Hk, S, E) and (B, Hk, S, Ev), H a multiple of Hk.
        attention_mask: a :class:`~.masks.SymbolicMask`, a (B, 1 or H, L, S) bool
            (True = attend) or float (additive) tensor, or None (then causal, at the
            bottom right, when ``is_causal`` or ``module.is_causal`` says so).
        dropout: dropout on the weights (transformers passes 0 outside training).
        scaling: multiplier of q·k; None = 1/sqrt(E).
        is_causal: overrides ``module.is_causal`` when no mask is given.
        sliding_window: with no mask and a causal module, each query sees its last
            ``sliding_window`` keys (a mask from the mask function already holds it).
        softcap: logit softcapping ``c * tanh(s / c)`` (Gemma 2).
        s_aux: (H,) sink logits (gpt-oss).
        position_bias: (1 or B, H, L, >= S) T5's bias, read back as its table.
        kwargs: ``output_attentions``; the others transformers passes (positions,
            varlen lengths) are not needed: the mask holds them. ``sinks``, ``indices``
            and ``block_indices``, which would change the numbers, are refused.

    Returns:
        (output (B, L, H, Ev) contiguous, weights (B, H, L, S) in the query's dtype
        when the model collects attentions, else None). The weights are the exact
        softmax the output used, taken before dropout.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            raise ValueError(
                f"{name}: expected a 4-D tensor (B, heads, length, head_dim), got "
                f"{getattr(t, 'shape', type(t).__name__)}"
            )
    for name, what in _NOT_RUN.items():
        if kwargs.get(name) is not None:
            raise ValueError(
                f"{name}: {type(module).__name__} passes its attention {what}, which attnkit's "
                'attention does not take; use attn_implementation="sdpa" or "eager" for it'
            )
    if kwargs.get("cache") is not None:
        raise ValueError(
            "cache: attnkit's attention does not run a paged cache (continuous batching); "
            'use attn_implementation="sdpa" there'
        )
    L, S = query.shape[-2], key.shape[-2]
    mask, q0, k0 = _mask_of(attention_mask, module, L, S, is_causal, sliding_window)
    mod_list: list[mods.Mod] = []
    if position_bias is not None:
        pb_mod, pb_mask = position_bias_mod(module, position_bias, S, q0, k0)
        if pb_mod is not None:
            mod_list.append(pb_mod)
        if pb_mask is not None:
            mask = pb_mask if mask is None else pb_mask & mask
    if softcap is not None and softcap:
        mod_list.append(mods.softcap(float(softcap)))
    if s_aux is not None:
        mod_list.append(mods.sinks(s_aux))
    p, listed = float(dropout), mod_list or None
    if _wants_weights(module, kwargs):
        out, w = attention(
            query, key, value, mask=mask, scale=scaling, dropout_p=p, mods=listed,
            return_weights=True,
        )  # fmt: skip
        return out.transpose(1, 2).contiguous(), w.to(query.dtype)  # (B, L, H, Ev), (B, H, L, S)
    out = attention(query, key, value, mask=mask, scale=scaling, dropout_p=p, mods=listed)
    return out.transpose(1, 2).contiguous(), None  # (B, L, H, Ev)
