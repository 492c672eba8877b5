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

from collections.abc import Sequence

import torch

from .._host import readable
from .bands import Align, CausalMask, Offset, PrefixLMMask, WindowMask
from .base import DenseMask, Mask
from .dense import BiasMask, KeepMask
from .lengths import DocumentMask, KeyPaddingMask, ValidLensMask
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

# --------------------------------------------------------------------------- constructors


def keep(tensor: torch.Tensor) -> KeepMask:
    """Boolean mask with attnkit's polarity: True = may attend. Shape (..., L, S)."""
    if isinstance(tensor, torch.Tensor) and tensor.dtype != torch.bool:
        raise TypeError(
            f"masks.keep: expected a bool tensor (True = may attend), got dtype {tensor.dtype}; "
            "for 0/1 TensorFlow masks use masks.tf, for additive floats masks.bias"
        )
    return KeepMask(tensor, source="keep")


def block(tensor: torch.Tensor) -> KeepMask:
    """Boolean mask with torch MHA's polarity: True = masked (may NOT attend)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"masks.block: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != torch.bool:
        raise TypeError(
            f"masks.block: expected a bool tensor (True = masked), got dtype {tensor.dtype}"
        )
    return KeepMask(~tensor, source="block")


def bias(tensor: torch.Tensor) -> BiasMask:
    """Additive float mask, shape (..., L, S), added to the logits; ``-inf`` blocks."""
    return BiasMask(tensor)


def tf(tensor: torch.Tensor) -> KeepMask:
    """TensorFlow tutorial convention: 1 = masked, 0 = attend; shape (..., L, S).

    The tutorial adds ``mask * -1e9`` to the logits; attnkit blocks exactly, so a
    fully masked row gives zeros instead of a uniform average.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"masks.tf: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != torch.bool and readable(tensor):  # (a device tensor is not read: sync)
        bad = (tensor != 0) & (tensor != 1)
        if bool(bad.any()):
            raise ValueError(
                "masks.tf: expected values 0 (attend) and 1 (masked) only, got "
                f"{tensor[bad].flatten()[:3].tolist()}"
            )
    return KeepMask(tensor == 0, source="tf")


def valid_lens(lens: torch.Tensor | Sequence[int], queries: bool = False) -> ValidLensMask:
    """d2l's ``valid_lens``: key ``j`` is kept when ``j < length``.

    Args:
        lens: int lengths in [0, S]: (B,), one per batch element (first leading dim of
            the query; they broadcast over the other leading dims, e.g. heads), or
            (B, L), one per query row.
        queries: False (default, d2l's behaviour): only keys are masked. True (needs
            (B,) lengths): query rows ``i >= length`` are padding too and become fully
            masked rows (output 0, weights 0, lse -inf), for self-attention over padded
            sequences.

    A row that keeps no key (a length of 0) gives output 0 and weights 0, where d2l's
    ``masked_softmax`` gives a uniform row (see :func:`attnkit.masked_softmax`).
    """
    return ValidLensMask(lens, queries=queries)


def key_padding(tensor: torch.Tensor) -> KeyPaddingMask:
    """Key padding: bool (B, S), True = padding key (torch MHA's ``key_padding_mask``)."""
    return KeyPaddingMask(tensor)


def causal(align: Align = "top_left", *, q_offset: Offset = 0, k_offset: Offset = 0) -> CausalMask:
    """Causal mask; ``align`` is ``"top_left"`` (SDPA, Keras) or ``"bottom_right"``.

    ``q_offset``/``k_offset``: global positions of the first query row and key column
    (for a block of a longer sequence); query at position p sees keys at positions <= p.
    Each is an int or a 0-d integer tensor (data: a compiled model keeps one graph while
    it changes, e.g. decoding against a static KV cache).
    """
    return CausalMask(align, q_offset=q_offset, k_offset=k_offset)


def window(
    left: int | None,
    right: int | None = 0,
    align: Align = "top_left",
    *,
    q_offset: Offset = 0,
    k_offset: Offset = 0,
) -> WindowMask:
    """Sliding window: query i keeps keys i-left .. i+right inclusive (None = unbounded).

    ``q_offset``/``k_offset``: global positions of the first query row and key column,
    ints or 0-d integer tensors (as for :func:`causal`).
    """
    return WindowMask(left, right, align, q_offset=q_offset, k_offset=k_offset)


def document(
    ids: torch.Tensor | Sequence[int] | None = None,
    *,
    lengths: torch.Tensor | Sequence[int] | Sequence[Sequence[int]] | None = None,
    key_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int]] | None = None,
) -> DocumentMask:
    """Packed sequences: a query keeps the keys of its own document.

    Give either ``ids``, the document id of every position, (N,) or (B, N) (a
    negative id marks padding), or ``lengths``, the documents' lengths packed one
    after another, (D,) or (B, D). ``key_ids`` (S,) or (B, S): ids of the keys when
    they differ from the queries'. ``masks.document(ids) & masks.causal()`` is causal
    packed training.
    """
    if (ids is None) == (lengths is None):
        raise TypeError("masks.document: give exactly one of ids or lengths")
    if lengths is not None:
        if key_ids is not None:
            raise TypeError("masks.document: key_ids goes with ids, not with lengths")
        return DocumentMask.from_lengths(lengths)
    assert ids is not None
    return DocumentMask(ids, key_ids)


def prefix_lm(
    prefix: int | torch.Tensor | Sequence[int],
    align: Align = "top_left",
    *,
    q_offset: int = 0,
    k_offset: int = 0,
) -> PrefixLMMask:
    """Prefix LM: keys ``j < prefix`` are seen by every query (a bidirectional prefix),
    and key ``j`` by query ``i`` when ``j <= i`` (causal). ``prefix``: an int or a (B,)
    tensor of per-batch lengths; ``align`` and the offsets as for :func:`causal`."""
    return PrefixLMMask(prefix, align, q_offset=q_offset, k_offset=k_offset)


from .._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__all__)
