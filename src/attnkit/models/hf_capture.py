"""Streaming capture for transformers models: one attention function, a few heads at a time.

transformers' models call their attention through an interface
(``ALL_ATTENTION_FUNCTIONS``) chosen by ``config._attn_implementation``.
:func:`streaming_attention` registers :data:`IMPLEMENTATION` there: for each
attention module it runs the model's own eager attention (so masks, position
biases, soft-capping and grouped-query attention stay the model's) on a few
heads at a time, gives the weights to the run's :class:`~attnkit.viz.stream.Router`
and returns the output without them. The model never collects every layer's
weights, so at most one layer's weights (of a few heads) are alive.

A model whose attention already runs on :func:`attnkit.attention` (an
``attn_implementation`` that calls it) needs none of this: the recorder of
:mod:`attnkit.viz.stream` sees its calls.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..viz.stream import HEAD_CHUNK_CELLS, Router

__all__ = ["IMPLEMENTATION", "streaming_attention", "supports_streaming"]

IMPLEMENTATION = "attnkit_stream"

_ACTIVE: list[tuple[dict[int, str], Router]] = []


def _generic_eager(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · scaling + mask) v for modules without their own eager function."""
    g = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(g, 1)  # (B, H, S, d)
    value = value.repeat_interleave(g, 1)  # (B, H, S, dv)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    logits = query @ key.transpose(-1, -2) * scale  # (B, H, L, S)
    if attention_mask is not None:
        logits = logits + attention_mask[..., : key.shape[-2]]
    weights = torch.softmax(logits.float(), dim=-1).to(query.dtype)
    return (weights @ value).transpose(1, 2), weights  # (B, L, H, dv), (B, H, L, S)


def _eager_of(module: nn.Module) -> Any:
    found = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    return found if callable(found) else _generic_eager


def _stream_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The registered attention function: the model's eager attention, streamed to a reducer."""
    eager = _eager_of(module)
    routed = None
    if _ACTIVE:
        names, router = _ACTIVE[-1]
        name = names.get(id(module))
        routed = router.route(name) if name is not None else None
    if routed is None:
        out, _ = eager(module, query, key, value, attention_mask, scaling=scaling,
                       dropout=dropout, **kwargs)  # fmt: skip
        return out, None
    reducer, layer = routed
    _B, H, r, d = query.shape
    S = key.shape[-2]
    row0 = router.first_row(name or "", r, S)
    g = max(1, H // key.shape[1])
    step = H if hasattr(module, "sinks") else max(g, HEAD_CHUNK_CELLS // max(1, r * S) // g * g)
    outs = []
    scale = scaling if scaling is not None else d**-0.5
    for h0 in range(0, H, step):
        h1 = min(H, h0 + step)
        ks = slice(h0 // g, -(-h1 // g))
        mask = attention_mask
        if mask is not None and mask.ndim == 4 and mask.shape[1] == H and step < H:
            mask = mask[:, h0:h1]  # a per-head bias (T5's position bias)
        out, w = eager(module, query[:, h0:h1], key[:, ks], value[:, ks], mask,
                       scaling=scaling, dropout=dropout, **kwargs)  # fmt: skip
        reducer.add(layer, row0, w[0, :, :, :S].float(), h0)
        del w
        k0 = key[0, ks].repeat_interleave(g, 0)  # (h, S, d)
        reducer.add_qk(layer, row0, query[0, h0:h1], k0, {"terms": "dot", "scale": scale}, h0)
        outs.append(out)  # (B, r, h, dv)
    return torch.cat(outs, dim=2), None


def _register() -> bool:
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask
    except ImportError:
        return False
    AttentionInterface.register(IMPLEMENTATION, _stream_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, eager_mask)
    return True


def supports_streaming(model: nn.Module) -> bool:
    """Whether ``model`` can switch to the streaming attention function."""
    return hasattr(model, "set_attn_implementation") and _register()


@contextmanager
def streaming_attention(model: nn.Module, router: Router) -> Iterator[None]:
    """Within the block, ``model``'s attention modules stream their weights to ``router``.

    The model's attention implementation is switched to :data:`IMPLEMENTATION`
    and switched back afterwards.

    Raises:
        RuntimeError: the model cannot switch (see :func:`supports_streaming`).
    """
    if not supports_streaming(model):
        raise RuntimeError("this transformers model cannot switch its attention implementation")
    before = getattr(model.config, "_attn_implementation", None) or "eager"
    names = {id(m): n for n, m in model.named_modules()}
    model.set_attn_implementation(IMPLEMENTATION)  # type: ignore[operator]
    _ACTIVE.append((names, router))
    try:
        yield
    finally:
        _ACTIVE.pop()
        model.set_attn_implementation(before)  # type: ignore[operator]
