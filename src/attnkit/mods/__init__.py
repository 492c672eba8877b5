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
from .base import Align as Align  # (the type of align=, as mods.Align)
from .base import Mod, PositionMod, as_list
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

    Args:
        slopes: one slope per query head, a (H,) float tensor (learnable if it
            requires grad) or a list of floats, H the call's query heads (dim -3) or 1
            for all; or an int H, the standard slopes :func:`alibi_slopes` ``(H)``.
        causal: keyword-only; True: ``-slope_h * (i - j)`` at absolute positions;
            False (default): ``-slope_h * |i - j|``.
        align: keyword-only, ``"top_left"`` (default) or ``"bottom_right"`` (query
            ``i`` at position ``i + S - L``, new queries at the end of a KV cache).
        q_offset: keyword-only int, global position of query row 0 (default 0).
        k_offset: keyword-only int, global position of key column 0 (default 0).

    Returns:
        An :class:`ALiBi` modifier for ``mods=``. Its causal form (or the symmetric
        form under a causal mask, with no softcap after it) runs on ``sdpa`` as a
        per-key bias; otherwise on ``chunked`` and ``reference``.

    Raises:
        TypeError, ValueError: ``slopes`` is neither an int in [1, 2**16] nor a (H,)
            float tensor or list, ``align`` is neither name, or an offset is not an
            int. A call whose query heads are not H raises ValueError.

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import masks, mods
        >>> q = k = v = torch.randn(2, 8, 16, 32)               # (B, H, L, E)
        >>> out = attnkit.attention(q, k, v, mask=masks.causal(),
        ...                         mods=mods.alibi(8, causal=True))
        >>> out.shape
        torch.Size([2, 8, 16, 32])
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
    ``bidirectional=False`` for a decoder's self-attention.

    The logit of query ``i`` and key ``j`` gets ``table[bucket(j - i), h]``, with the
    buckets of :func:`t5_buckets`.

    Args:
        table: float tensor (num_buckets, heads), the bias of each bucket and query
            head (heads = the call's query heads, dim -3, or 1); used as it is, so a
            model's parameter keeps training.
        num_buckets: the number of buckets (T5: 32), an int >= 4 (>= 2 when not
            bidirectional); must equal ``table.shape[0]``.
        max_distance: the distance from which every offset shares the last bucket
            (T5: 128), an int >= 2 larger than the exact buckets.
        bidirectional: True (default, an encoder): half the buckets for keys after
            the query; False (a decoder's self-attention): only ``j <= i`` is bucketed,
            later keys share bucket 0.
        align: keyword-only, ``"top_left"`` (default) or ``"bottom_right"``, as for
            :func:`alibi`.
        q_offset: keyword-only int, global position of query row 0 (default 0).
        k_offset: keyword-only int, global position of key column 0 (default 0).

    Returns:
        A :class:`RelativePositionBias` modifier for ``mods=``, computed per tile
        (``chunked``, ``reference``).

    Raises:
        TypeError, ValueError: ``table`` is not a 2-D float tensor, its rows are not
            ``num_buckets``, ``num_buckets`` or ``max_distance`` is out of range, or
            an offset or ``align`` is bad. A call whose query heads differ from the
            table's columns (other than 1) raises ValueError.

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import mods
        >>> table = torch.randn(32, 8, requires_grad=True)     # (num_buckets, heads)
        >>> q = k = v = torch.randn(2, 8, 16, 32)
        >>> out = attnkit.attention(q, k, v, mods=mods.relative_position_bias(table))
        >>> out.sum().backward()
        >>> table.grad.shape
        torch.Size([32, 8])
    """
    return RelativePositionBias(table, num_buckets, max_distance, bidirectional, align=align,
                                q_offset=q_offset, k_offset=k_offset)  # fmt: skip


def softcap(cap: float) -> Softcap:
    """Logit softcapping: ``s -> cap * tanh(s / cap)`` (Gemma 2 uses cap = 50).

    Applied to the scaled logits (and any position bias before it in ``mods=``),
    before the mask.

    Args:
        cap: a positive float in float32's normal range (about 1.2e-38 to 3.4e38),
            or ``inf`` (no cap: the call runs as without the modifier).

    Returns:
        A :class:`Softcap` modifier for ``mods=`` (runs on ``chunked`` and
        ``reference``).

    Raises:
        TypeError, ValueError: ``cap`` is not a positive number in that range or inf.

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import mods
        >>> q = k = v = torch.randn(2, 4, 16, 32)
        >>> attnkit.attention(q, k, v, mods=mods.softcap(50.0)).shape
        torch.Size([2, 4, 16, 32])
    """
    return Softcap(cap)


def sinks(logits: torch.Tensor) -> Sinks:
    """Attention sinks: ``logits`` (H,), one learnable logit per query head (gpt-oss).

    Each row's softmax gets one more logit, the head's sink, that has no value: the
    keys share ``exp(lse) / (exp(lse) + exp(sink))`` of the weight, so the output of
    a row shrinks when its keys score below the sink.

    Args:
        logits: float tensor (H,), one sink logit per query head (dim -3 of the call),
            or (1,) for all heads; used as it is (a parameter gets its gradient).

    Returns:
        A :class:`Sinks` modifier for ``mods=``. It joins the softmax after any
        backend's (out, lse), so every backend that returns the lse runs the call.
        The weights returned (``return_weights``) no longer sum to 1.

    Raises:
        TypeError, ValueError: ``logits`` is not a 1-D float tensor. A call whose
            query heads are not H raises ValueError.

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import mods
        >>> q = k = v = torch.randn(2, 4, 16, 32)
        >>> sink = torch.zeros(4, requires_grad=True)
        >>> out, w = attnkit.attention(q, k, v, mods=mods.sinks(sink), return_weights=True)
        >>> bool((w.sum(-1) < 1).all())
        True
    """
    return Sinks(logits)


from .._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__all__)
