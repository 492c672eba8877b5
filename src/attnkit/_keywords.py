"""Keywords of :func:`attnkit.attention` that come from elsewhere: SDPA's (``is_causal``,
``attn_mask``, ``enable_gqa``), turned into attnkit's own arguments, and a clear error
for any keyword it does not take, naming the close ones."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

import torch

from . import masks as _masks
from ._inputs import normalize_mask

__all__ = ["FOREIGN", "refuse_unknown", "sdpa_mask"]

_CAUSAL = _masks.causal()  # SDPA's is_causal: top-left aligned (masks are immutable)

FOREIGN: dict[str, str] = {
    "causal": "is_causal=True (SDPA's top-left alignment) or "
    "mask=masks.causal('bottom_right') (FlashAttention's)",
    "softmax_scale": "scale=",
    "attention_mask": "attn_mask= (a bool tensor, True = attend, or a float bias) or mask=",
    "key_padding_mask": "mask=masks.key_padding(t) (True = padding)",
    "need_weights": "return_weights=True",
    "dropout": "dropout_p=",
    "valid_lens": "mask=masks.valid_lens(lens)",
    "window_size": "mask=masks.window(left, right)",
}
"""Keywords of other attention functions (FlashAttention, torch's and Keras' layers, d2l)
and what attnkit takes instead."""


def refuse_unknown(func: str, unexpected: Mapping[str, object], known: Iterable[str]) -> None:
    """Raise TypeError for the keywords ``func`` does not take, naming close matches.

    Args:
        func: the function's name, for the message ("attention").
        unexpected: the keywords received that the signature does not name.
        known: the keyword names the function takes.
    """
    known = sorted(known)
    hints = []
    for name in unexpected:
        if name in FOREIGN:
            hints.append(f"{name!r} (attnkit's equivalent: {FOREIGN[name]})")
            continue
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        guess = " or ".join(repr(c) for c in close)
        hints.append(f"{name!r} (did you mean {guess}?)" if close else repr(name))
    raise TypeError(
        f"{func}() got an unexpected keyword argument {', '.join(hints)}; "
        f"{func}() takes {', '.join(known)}"
    )


def sdpa_mask(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: object,
    is_causal: object,
    attn_mask: object,
    enable_gqa: object,
) -> object:
    """The ``mask=`` that SDPA's keywords mean, checked as SDPA checks them.

    Args:
        query: (..., L, E); key: (..., S, E): read for their head dim (-3) only.
        mask: attnkit's ``mask=`` as received (None, a mask or a float tensor).
        is_causal: True = ``masks.causal()`` (top-left, as SDPA), combined with ``mask``
            or ``attn_mask`` by ``&`` (SDPA takes the pair on some kernels and torch versions
            and refuses it on others: here it always means both).
        attn_mask: None, a bool tensor (..., L, S) with SDPA's polarity (True = may
            attend: ``masks.keep``) or a float tensor added to the logits
            (``masks.bias``); refused with ``mask``.
        enable_gqa: None (attnkit's rule: the query's head dim may be a multiple of the
            key's), True (the same) or False (SDPA's default: head dims must broadcast:
            equal, or either one 1).

    Returns:
        the mask to pass on (None, a mask object, or ``mask`` unchanged).

    Raises:
        TypeError, ValueError: before any compute, naming the argument.
    """
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal: expected True or False, got {is_causal!r}")
    if enable_gqa is not None and not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa: expected None, True or False, got {enable_gqa!r}")
    if enable_gqa is False and query.dim() >= 3 and key.dim() >= 3:
        hq, hk = query.shape[-3], key.shape[-3]
        if hq != hk and 1 not in (hq, hk):
            raise ValueError(
                f"enable_gqa: False (SDPA's rule) needs the head dims (-3) of query and key to "
                f"broadcast, got query {tuple(query.shape)} and key {tuple(key.shape)}; pass "
                f"enable_gqa=True (or leave it None) for grouped-query attention "
                f"({hq} query heads over {hk} key heads)"
            )
    if attn_mask is not None:
        if mask is not None:
            raise ValueError(
                "attn_mask, mask: both given; pass one (attn_mask is SDPA's name: a bool "
                "tensor, True = attend, or a float bias), or combine them with & as masks"
            )
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(
                f"attn_mask: expected a bool or float tensor (..., L, S) as SDPA takes, got "
                f"{type(attn_mask).__name__}; attnkit masks go to mask="
            )
        if attn_mask.dtype == torch.bool:
            given_mask: _masks.Mask = _masks.keep(attn_mask)  # SDPA's: True = may attend
        elif attn_mask.is_floating_point():
            given_mask = _masks.bias(attn_mask)
        else:
            raise TypeError(
                f"attn_mask: expected a bool (True = attend) or float (added) tensor as SDPA "
                f"takes, got dtype {attn_mask.dtype}"
            )
        return given_mask & _CAUSAL if is_causal else given_mask
    if not is_causal:
        return mask
    if mask is None:
        return _CAUSAL
    given = normalize_mask(mask)
    assert given is not None
    return given & _CAUSAL
