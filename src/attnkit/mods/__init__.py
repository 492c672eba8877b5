"""Score modifiers: position-aware changes of the logits that today's models use.

Pass one or a list to :func:`attnkit.attention` (``mods=``) or to the layers; they
apply in the order given, after the score and its ``scale`` and before the mask, and
compose with every score and every mask, and with each other (two softcaps apply one
after the other, position biases add, each sink joins the softmax). Per-head
parameters have one entry per query head, dim -3 of the call (or one for all):

==========================================  ===========================================
modifier                                    models
==========================================  ===========================================
``alibi(slopes)``                           BLOOM, MPT: ``-slope_h * |i - j|`` (or the
                                            causal form ``-slope_h * (i - j)``)
``relative_position_bias(table, ...)``      T5: a learnable bias per bucket of ``j - i``
``softcap(cap)``                            Gemma 2: ``cap * tanh(s / cap)``
``sinks(logits)``                           gpt-oss: a learnable logit per head that
                                            joins the softmax with no value
==========================================  ===========================================

A per-head scale is ``attention(..., scale=tensor_of_H)``. Modifiers stay symbolic: a
position bias is computed per tile from positions, never as an (H, L, S) tensor unless
weights are asked for. Causal ALiBi reduces exactly to a dot product with a key bias
and runs on SDPA's fused kernel; softcap and relative position biases run on tiled
kernels. ``attnkit.explain`` says which backend takes a call and why the others don't.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._args import as_int
from .base import Align, Mod, PositionMod, as_list
from .logits import Sinks, Softcap
from .position import MAX_HEADS, ALiBi, RelativePositionBias, alibi_slopes, t5_buckets

__all__ = [
    "ALiBi",
    "Mod",
    "PositionMod",
    "RelativePositionBias",
    "Sinks",
    "Softcap",
    "alibi",
    "alibi_slopes",
    "as_list",
    "relative_position_bias",
    "sinks",
    "softcap",
    "t5_buckets",
]


def alibi(
    slopes: torch.Tensor | Sequence[float] | int,
    *,
    causal: bool = False,
    align: Align = "top_left",
    q_offset: int = 0,
    k_offset: int = 0,
) -> ALiBi:
    """ALiBi with per-head ``slopes`` (H,) (an int H: the standard slopes for H heads).

    ``causal=True``: BLOOM's form ``-slope_h * (i - j)``, meant for use under a causal
    mask; else the symmetric ``-slope_h * |i - j|``. ``align``/offsets place the
    positions as for :func:`attnkit.masks.causal`.
    """
    t: torch.Tensor | Sequence[float]
    if isinstance(slopes, torch.Tensor) or (
        isinstance(slopes, Sequence) and not isinstance(slopes, (str, bytes))
    ):
        t = slopes
    else:  # a number of heads (a bool, a float or a string is named as a mistake)
        what = "a number of heads (an int >= 1) or a (H,) float tensor"
        t = alibi_slopes(as_int("mods.alibi", "slopes", slopes, low=1, high=MAX_HEADS, what=what))
    return ALiBi(t, causal=causal, align=align, q_offset=q_offset, k_offset=k_offset)


def relative_position_bias(
    table: torch.Tensor,
    num_buckets: int = 32,
    max_distance: int = 128,
    bidirectional: bool = True,
    *,
    align: Align = "top_left",
    q_offset: int = 0,
    k_offset: int = 0,
) -> RelativePositionBias:
    """T5's bucketed relative position bias from ``table`` (num_buckets, heads), e.g.
    ``model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight``;
    ``bidirectional=False`` for a decoder's self-attention."""
    return RelativePositionBias(table, num_buckets, max_distance, bidirectional, align=align,
                                q_offset=q_offset, k_offset=k_offset)  # fmt: skip


def softcap(cap: float) -> Softcap:
    """Logit softcapping: ``s -> cap * tanh(s / cap)`` (Gemma 2 uses cap = 50)."""
    return Softcap(cap)


def sinks(logits: torch.Tensor) -> Sinks:
    """Attention sinks: ``logits`` (H,), one learnable logit per query head (gpt-oss)."""
    return Sinks(logits)


from .._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__all__)
