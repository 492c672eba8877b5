"""Masks: every convention enters through a named constructor, one polarity inside.

Inside attnkit a boolean mask means **True = may attend**. Every other convention
is converted by the constructor that names it, so no call is ambiguous:

==================  ===========================================================
constructor         convention
==================  ===========================================================
``keep(t)``         bool, True = may attend (attnkit's own polarity)
``block(t)``        bool, True = masked (``torch.nn.MultiheadAttention``)
``bias(t)``         float, added to the logits (``-inf`` blocks)
``tf(t)``           0/1, 1 = masked (TensorFlow tutorial's ``mask * -1e9``)
``valid_lens(l)``   d2l: key ``j`` kept when ``j < l``; (B,) or (B, L)
``key_padding(t)``  bool (B, S), True = padding key
``causal()``        query ``i`` sees keys ``j <= i`` (alignment explicit)
``window(l, r)``    query ``i`` sees keys ``i-l .. i+r`` inclusive
``document(ids)``   packed sequences: a query sees the keys of its own document
``prefix_lm(p)``    keys ``j < p`` seen by every query, causal after them
==================  ===========================================================

Masks combine with ``&`` (a key is kept when every part keeps it, and additive
biases add up), ``|`` (kept when any part keeps it) and ``~`` (kept where the mask
does not keep); ``|`` and ``~`` take keep-type masks (not ``bias``). Structured masks (causal, window, valid_lens, key_padding) stay
symbolic so kernels can skip blocks and padding; :meth:`Mask.to_dense` builds the
materialized form for the reference path and for pictures.

Alignment of causal and window masks when ``L != S``::

    top_left (SDPA, Keras)          bottom_right (FlashAttention, KV cache)
    L=3, S=5                        L=3, S=5
    q0: x . . . .                   q0: x x x . .
    q1: x x . . .                   q1: x x x x .
    q2: x x x . .                   q2: x x x x x
"""

from __future__ import annotations

# Each constructor lives in its family's module, beside its class: a compiled call that
# builds its mask in its graph (``masks.causal()`` in a forward) then reads nothing of
# this module, which the caller holds too (dynamo would guard the two routes to one
# module with a check run in Python on every call).
# (Align and Offset: the type names of the constructors' arguments, as masks.Align, ...)
from .bands import Align as Align
from .bands import CausalMask, PrefixLMMask, WindowMask, causal, prefix_lm, window
from .bands import Offset as Offset
from .base import DenseMask, Mask
from .dense import BiasMask, KeepMask, bias, block, keep, tf
from .lengths import DocumentMask, KeyPaddingMask, ValidLensMask, document, key_padding, valid_lens
from .logic import AndMask, NotMask, OrMask

__all__ = [
    "AndMask",
    "BiasMask",
    "CausalMask",
    "DenseMask",
    "DocumentMask",
    "KeepMask",
    "KeyPaddingMask",
    "Mask",
    "NotMask",
    "OrMask",
    "PrefixLMMask",
    "ValidLensMask",
    "WindowMask",
    "bias",
    "block",
    "causal",
    "document",
    "keep",
    "key_padding",
    "prefix_lm",
    "tf",
    "valid_lens",
    "window",
]

from .._namespace import public_dir as _public_dir

__dir__ = _public_dir(__all__)
