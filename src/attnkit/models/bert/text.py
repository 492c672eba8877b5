"""Tokenization for the encoder: encodings truncated to the model's positions, padded batches."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["count_tokens", "encode_tokens", "pad_batch"]


def count_tokens(tokenizer: Any, text: str, pair: str | None = None) -> int:
    """How many tokens ``text`` (and ``pair``) make, special tokens included, untruncated."""
    return len(tokenizer.encode(text, pair).ids)


def encode_tokens(
    tokenizer: Any,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    *,
    max_length: int,
    limit: int,
    warn: bool = True,
) -> list[Any]:
    """The tokenizer's encodings (``.ids``, ``.tokens``, ``.type_ids``), truncated.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        texts: N strings.
        pairs: None, or N second segments (token type 1).
        max_length: tokens per input, special tokens included (longest first).
        limit: the model's positions; ``max_length`` may not exceed it.
        warn: warn (UserWarning) for every input that was truncated.
    """
    if isinstance(texts, str):
        raise TypeError("texts: expected a list of strings, got a single str")
    texts = list(texts)
    if pairs is not None:
        pairs = list(pairs)
        if len(pairs) != len(texts):
            raise ValueError(
                f"pairs: expected {len(texts)} second segments like texts, got {len(pairs)}"
            )
    if max_length > limit:
        raise ValueError(f"max_length: {max_length} is more than the model's {limit} positions")
    minimum = 3 if pairs is not None else 2
    if max_length < minimum:
        raise ValueError(
            f"max_length: expected at least {minimum} (the special tokens), got {max_length}"
        )
    inputs: list[Any] = texts if pairs is None else list(zip(texts, pairs, strict=True))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    full = tokenizer.encode_batch(inputs)
    too_long = [i for i, e in enumerate(full) if len(e.ids) > max_length]
    if not too_long:
        return list(full)
    tokenizer.enable_truncation(max_length=max_length, strategy="longest_first")
    try:
        cut = tokenizer.encode_batch([inputs[i] for i in too_long])
    finally:
        tokenizer.no_truncation()
    for i, e in zip(too_long, cut, strict=True):
        if warn:
            warnings.warn(
                f"input {i} has {len(full[i].ids)} tokens, more than {max_length}; "
                f"truncated to {max_length}",
                UserWarning,
                stacklevel=4,
            )
        full[i] = e
    return list(full)


def pad_batch(encodings: Sequence[Any], pad_id: int) -> dict[str, torch.Tensor]:
    """Encodings padded to the longest: ``input_ids``, ``attention_mask``, ``token_type_ids`` (N, L)."""
    L = max((len(e.ids) for e in encodings), default=0)
    ids = torch.full((len(encodings), L), pad_id, dtype=torch.long)  # (N, L)
    keep = torch.zeros((len(encodings), L), dtype=torch.long)  # (N, L)
    types = torch.zeros((len(encodings), L), dtype=torch.long)  # (N, L)
    for i, e in enumerate(encodings):
        n = len(e.ids)
        ids[i, :n] = torch.tensor(e.ids, dtype=torch.long)
        keep[i, :n] = 1
        types[i, :n] = torch.tensor(e.type_ids, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": keep, "token_type_ids": types}
