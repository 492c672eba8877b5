"""Streaming capture for transformers models: their attention through attnkit.

A transformers model whose attention modules call the ``AttentionInterface``
switches, for the run, to ``attn_implementation="attnkit"``
(:mod:`attnkit.integrations.transformers`): each attention module then makes one
:func:`attnkit.attention` call per forward, with the model's masks, grouped-query
heads, softcapping, sinks and position biases, and the recorder of
:mod:`attnkit.viz.stream` reduces that call's exact weights as it happens (a few
heads at a time), so at most one layer's weights (of a few heads) are alive.

A model that computes its attention itself (older modeling code) cannot switch;
:mod:`attnkit.viz.sources.text_run` asks it for its collected weights instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from ..stream import Router, streaming

__all__ = ["IMPLEMENTATION", "streaming_attention", "supports_streaming"]

IMPLEMENTATION = "attnkit"


def supports_streaming(model: nn.Module) -> bool:
    """Whether ``model`` (and every transformers model inside it) can switch to attnkit."""
    if not hasattr(model, "set_attn_implementation"):
        return False
    try:
        import attnkit.integrations.transformers  # noqa: F401  (registers "attnkit")
    except ImportError:
        return False
    for m in model.modules():
        can_set = getattr(type(m), "_can_set_attn_implementation", None)
        if callable(can_set) and not can_set():
            return False
    return True


@contextmanager
def streaming_attention(model: nn.Module, router: Router) -> Iterator[None]:
    """Within the block, ``model``'s attention runs on attnkit and streams to ``router``.

    The model's attention implementation is switched to :data:`IMPLEMENTATION`
    and switched back afterwards.

    Raises:
        RuntimeError: the model cannot switch (see :func:`supports_streaming`).
    """
    if not supports_streaming(model):
        raise RuntimeError("this transformers model cannot switch its attention implementation")
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None) or "eager"
    model.set_attn_implementation(IMPLEMENTATION)  # type: ignore[operator]
    try:
        with streaming(model, router):
            yield
    finally:
        model.set_attn_implementation(before)  # type: ignore[operator]
