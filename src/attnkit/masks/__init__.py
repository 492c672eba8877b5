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
    """Boolean mask with attnkit's polarity: True = may attend. Shape (..., L, S).

    The polarity of SDPA's bool ``attn_mask`` (``attn_mask=b`` is ``mask=masks.keep(b)``)
    and the opposite of ``torch.nn.MultiheadAttention``'s (use :func:`block` for that).

    Args:
        tensor: bool, True = query ``i`` may attend to key ``j``; shape (..., L, S),
            broadcastable to the call's (*batch, L, S) without growing it: any dim
            may be 1 and leading dims may be left out, so (L, S) is one mask for every
            batch element and head, (B, 1, L, S) one per batch element, and (S,) one
            key mask for every query row. A shape that does not broadcast raises
            ValueError when the mask is used.

    Returns:
        A :class:`KeepMask`. A query row that keeps no key gives output 0, weights 0
        and lse -inf (no NaN).

    Raises:
        TypeError: ``tensor`` is not a torch.Tensor, or not bool (for 0/1 masks use
            :func:`tf`, for additive floats :func:`bias`).
        ValueError: ``tensor`` is 0-d.

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import masks
        >>> q = k = v = torch.randn(2, 4, 3, 8)                 # (B, H, L, E)
        >>> keep = torch.tensor([[True, False, False],
        ...                      [False, False, False],        # row 1 keeps no key
        ...                      [True, True, True]])
        >>> out = attnkit.attention(q, k, v, mask=masks.keep(keep))
        >>> out[..., 1, :].abs().sum()
        tensor(0.)
    """
    if isinstance(tensor, torch.Tensor) and tensor.dtype != torch.bool:
        raise TypeError(
            f"masks.keep: expected a bool tensor (True = may attend), got dtype {tensor.dtype}; "
            "for 0/1 TensorFlow masks use masks.tf, for additive floats masks.bias"
        )
    return KeepMask(tensor, source="keep")


def block(tensor: torch.Tensor) -> KeepMask:
    """Boolean mask with torch MHA's polarity: True = masked (may NOT attend).

    The polarity of ``torch.nn.MultiheadAttention``'s bool ``attn_mask`` (True = not
    allowed to attend); ``masks.block(t)`` is ``masks.keep(~t)``.

    Args:
        tensor: bool, True = query ``i`` may NOT attend to key ``j``; shape
            (..., L, S), broadcastable to the call's (*batch, L, S) as for
            :func:`keep` (e.g. (L, S), (B, 1, L, S) or (S,)).

    Returns:
        A :class:`KeepMask` holding ``~tensor``. A query row whose keys are all
        blocked gives output 0, weights 0 and lse -inf (no NaN).

    Raises:
        TypeError: ``tensor`` is not a torch.Tensor, or not bool.
        ValueError: ``tensor`` is 0-d.

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import masks
        >>> q = k = v = torch.randn(2, 4, 3, 8)
        >>> future = torch.ones(3, 3, dtype=torch.bool).triu(1)  # True = masked
        >>> a = attnkit.attention(q, k, v, mask=masks.block(future))
        >>> torch.allclose(a, attnkit.attention(q, k, v, mask=masks.causal()))
        True
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"masks.block: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != torch.bool:
        raise TypeError(
            f"masks.block: expected a bool tensor (True = masked), got dtype {tensor.dtype}"
        )
    return KeepMask(~tensor, source="block")


def bias(tensor: torch.Tensor) -> BiasMask:
    """Additive float mask, shape (..., L, S), added to the logits; ``-inf`` blocks.

    The form of SDPA's float ``attn_mask``: the bias is added to the scaled logits
    (after the score, its ``scale`` and any ``mods``) before the softmax. A float
    tensor passed as ``mask=`` is read as ``masks.bias(tensor)``.

    Args:
        tensor: floating-point, added to the logit of query ``i`` and key ``j``;
            ``-inf`` blocks the key exactly, any finite value (a large negative one
            too) only weighs it. Shape (..., L, S), broadcastable to the call's
            (*batch, L, S) as for :func:`keep`; a learnable bias that requires grad
            gets its gradient.

    Returns:
        A :class:`BiasMask`. A query row whose bias is ``-inf`` for every key gives
        output 0, weights 0 and lse -inf (no NaN); a row of ``-1e9`` instead is not
        masked (its keys still share the weights).

    Raises:
        TypeError: ``tensor`` is not a torch.Tensor or not floating-point (for bool
            masks use :func:`keep` or :func:`block`).
        ValueError: ``tensor`` is 0-d, or holds NaN or +inf (checked for a CPU
            tensor; an accelerator's values are not read, which would sync).

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import masks
        >>> q = k = v = torch.randn(2, 4, 3, 8)
        >>> b = torch.zeros(3, 3)
        >>> b[:, 2] = float("-inf")                            # no query sees key 2
        >>> _, w = attnkit.attention(q, k, v, mask=masks.bias(b), return_weights=True)
        >>> w[..., 2].abs().sum()
        tensor(0.)
    """
    return BiasMask(tensor)


def tf(tensor: torch.Tensor) -> KeepMask:
    """TensorFlow tutorial convention: 1 = masked, 0 = attend; shape (..., L, S).

    The tutorial adds ``mask * -1e9`` to the logits; attnkit blocks exactly, so a
    fully masked row gives zeros instead of a uniform average.

    Args:
        tensor: 0/1 values of any dtype (int, float or bool; True counts as 1),
            1 = masked, 0 = may attend. Shape (..., L, S), broadcastable to the call's
            (*batch, L, S) as for :func:`keep`: the tutorial's padding mask
            (B, 1, 1, S) and look-ahead mask (L, S) work as they are.

    Returns:
        A :class:`KeepMask` holding ``tensor == 0``. A fully masked row gives output
        0, weights 0 and lse -inf (no NaN).

    Raises:
        TypeError: ``tensor`` is not a torch.Tensor.
        ValueError: ``tensor`` holds a value other than 0 and 1 (checked for a CPU
            tensor; an accelerator's values are not read), or is 0-d.

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import masks
        >>> q = k = v = torch.randn(2, 4, 3, 8)
        >>> look_ahead = 1 - torch.ones(3, 3).tril()           # 1 above the diagonal
        >>> a = attnkit.attention(q, k, v, mask=masks.tf(look_ahead))
        >>> torch.allclose(a, attnkit.attention(q, k, v, mask=masks.causal()))
        True
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
        lens: int lengths in [0, S] (an integer tensor or a list of ints): (B,), one
            per batch element (first leading dim of the query; they broadcast over the
            other leading dims, e.g. heads), or (B, L), one per query row.
        queries: False (default, d2l's behaviour): only keys are masked. True (needs
            (B,) lengths): query rows ``i >= length`` are padding too and become fully
            masked rows (output 0, weights 0, lse -inf), for self-attention over padded
            sequences.

    A row that keeps no key (a length of 0) gives output 0 and weights 0, where d2l's
    ``masked_softmax`` gives a uniform row (see :func:`attnkit.masked_softmax`).

    Returns:
        A :class:`ValidLensMask`, kept symbolic: kernels skip the keys past each
        length instead of reading a dense mask.

    Raises:
        TypeError: ``lens`` does not have an integer dtype, or ``queries`` is not a bool.
        ValueError: ``lens`` is not (B,) or (B, L), holds a negative length, or is
            (B, L) with ``queries=True``. When the mask is used: the query has no batch
            dim, B or L differs from the call's, or a length exceeds S (or L with
            ``queries=True``; the lengths are read for a CPU tensor only).

    Examples:
        >>> import torch
        >>> from attnkit import masks
        >>> masks.valid_lens(torch.tensor([1, 3])).to_dense(3, 3, (2,)).int()
        tensor([[[1, 0, 0],
                 [1, 0, 0],
                 [1, 0, 0]],
        <BLANKLINE>
                [[1, 1, 1],
                 [1, 1, 1],
                 [1, 1, 1]]], dtype=torch.int32)
    """
    return ValidLensMask(lens, queries=queries)


def key_padding(tensor: torch.Tensor) -> KeyPaddingMask:
    """Key padding: bool (B, S), True = padding key (torch MHA's ``key_padding_mask``).

    Args:
        tensor: bool of shape exactly (B, S), True = key ``j`` of batch element ``b`` is
            padding and no query attends to it (torch's ``key_padding_mask`` polarity).
            B is the first leading dim of the query; the mask broadcasts over the
            other leading dims (heads) and over every query row.

    Returns:
        A :class:`KeyPaddingMask`, kept symbolic (kernels skip padding keys). A batch
        element whose keys are all padding gives output 0, weights 0 and lse -inf for
        every row (no NaN).

    Raises:
        TypeError: ``tensor`` is not a torch.Tensor, or not bool (for an additive float
            mask use :func:`bias`).
        ValueError: ``tensor`` is not 2-D; when the mask is used, its shape is not the
            call's (B, S) or the query has no batch dim.

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import masks
        >>> q = k = v = torch.randn(2, 4, 3, 8)                 # (B, H, L, E)
        >>> pad = torch.tensor([[False, False, True], [False, False, False]])
        >>> a = attnkit.attention(q, k, v, mask=masks.key_padding(pad))
        >>> torch.allclose(a, attnkit.attention(q, k, v, mask=masks.valid_lens([2, 3])))
        True
    """
    return KeyPaddingMask(tensor)


def causal(align: Align = "top_left", *, q_offset: Offset = 0, k_offset: Offset = 0) -> CausalMask:
    """Causal mask; ``align`` is ``"top_left"`` (SDPA, Keras) or ``"bottom_right"``.

    ``q_offset``/``k_offset``: global positions of the first query row and key column
    (for a block of a longer sequence); query at position p sees keys at positions <= p.
    Each is an int or a 0-d integer tensor (data: a compiled model keeps one graph while
    it changes, e.g. decoding against a static KV cache).

    Args:
        align: ``"top_left"`` (default; SDPA's ``is_causal``, Keras): query ``i`` keeps
            keys ``j <= i``. ``"bottom_right"`` (FlashAttention, a KV cache): the last
            query is aligned with the last key, query ``i`` keeps ``j <= i + S - L``.
        q_offset: global position of query row 0 (default 0).
        k_offset: global position of key column 0 (default 0).

    Returns:
        A :class:`CausalMask`, kept symbolic (kernels skip the blocks above the
        diagonal). A row that keeps no key (with ``"bottom_right"`` and L > S, the
        first L - S rows) gives output 0, weights 0 and lse -inf.

    Raises:
        ValueError: ``align`` is neither name, or an offset tensor has more than one
            element.
        TypeError: an offset is not an int or an integer tensor.

    Examples:
        >>> from attnkit import masks
        >>> masks.causal("bottom_right").to_dense(2, 4).int()   # L=2 new queries, S=4
        tensor([[1, 1, 1, 0],
                [1, 1, 1, 1]], dtype=torch.int32)
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

    Args:
        left: how many keys before the query's own position it keeps, an int >= 0, or
            None (unbounded).
        right: how many keys after it, an int >= 0 or None (unbounded); default 0, so
            ``window(left)`` is a causal sliding window of ``left + 1`` keys.
        align: ``"top_left"`` (default) or ``"bottom_right"`` (the query index is
            shifted by ``S - L``), as for :func:`causal`.
        q_offset: global position of query row 0 (default 0).
        k_offset: global position of key column 0 (default 0).

    Returns:
        A :class:`WindowMask`, kept symbolic (kernels skip the blocks outside the
        band). A row that keeps no key gives output 0, weights 0 and lse -inf.

    Raises:
        TypeError, ValueError: ``left`` or ``right`` is not None or an int >= 0,
            ``align`` is neither name, or an offset is not an int or a one-element
            integer tensor.

    Examples:
        >>> from attnkit import masks
        >>> masks.window(1).to_dense(4, 4).int()               # keys i-1 .. i
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
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

    Args:
        ids: integer document id of each position, (N,) for every batch element or
            (B, N) per batch element (B: the query's first leading dim), N = L; query
            ``i`` keeps key ``j`` when their ids are equal and not negative. A negative
            id is padding: it keeps nothing and is kept by nothing.
        lengths: keyword-only, the documents' lengths (ints >= 0), (D,) or (B, D);
            positions past a row's total are padding.
        key_ids: keyword-only, with ``ids`` only: the keys' ids, (S,) or (B, S), when
            the keys are not the queries (cross-attention between packed batches);
            default None, the keys have the queries' ids.

    Returns:
        A :class:`DocumentMask`, kept symbolic (kernels skip the blocks between
        documents). A padding row (or a document with no key) gives output 0,
        weights 0 and lse -inf.

    Raises:
        TypeError: neither or both of ``ids`` and ``lengths``, ``key_ids`` with
            ``lengths``, or ids that are not integers.
        ValueError: a shape other than those above, or a negative length; when the mask
            is used, ids that do not cover the call's L queries (or ``key_ids`` its S
            keys) or B rows that are not the call's batch.

    Examples:
        >>> from attnkit import masks
        >>> masks.document(lengths=[2, 1]).to_dense(3, 3).int()
        tensor([[1, 1, 0],
                [1, 1, 0],
                [0, 0, 1]], dtype=torch.int32)
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
    tensor of per-batch lengths; ``align`` and the offsets as for :func:`causal`.

    Args:
        prefix: the prefix length, an int >= 0 for every batch element, or a (B,)
            integer tensor (or list) of per-batch lengths, B the query's first leading
            dim.
        align: ``"top_left"`` (default) or ``"bottom_right"``: where the causal part
            sits when L != S, as for :func:`causal`.
        q_offset: keyword-only int, global position of query row 0 (default 0).
        k_offset: keyword-only int, global position of key column 0 (default 0).

    Returns:
        A :class:`PrefixLMMask` (the prefix OR the causal band), kept symbolic.

    Raises:
        TypeError, ValueError: ``prefix`` is not an int >= 0 or a (B,) integer tensor
            of lengths >= 0, ``align`` is neither name, or an offset is not an int;
            when the mask is used, B lengths for a call whose batch is not B.

    Examples:
        >>> from attnkit import masks
        >>> masks.prefix_lm(2).to_dense(4, 4).int()
        tensor([[1, 1, 0, 0],
                [1, 1, 0, 0],
                [1, 1, 1, 0],
                [1, 1, 1, 1]], dtype=torch.int32)
    """
    return PrefixLMMask(prefix, align, q_offset=q_offset, k_offset=k_offset)


from .._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__all__)
