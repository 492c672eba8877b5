"""The weights of one kind of attention on a page (:class:`AttentionSet`), checked and
reduced to what the page holds.

A set given as full weights is reduced the way a streamed capture is
(:class:`attnkit.viz.reduce.SetReducer`: every weight on a short page, block-pooled
overviews and top-k keys past the budget); its labels and tokens are checked against
the weights' shape, each problem named by its argument.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .grid import as_grid, check_finite
from .payload import set_payload
from .reduce import Budget, ReducedSet, SetReducer

__all__ = ["AttentionSet", "as_sets", "layer_numbers", "page_payload", "reduce_set", "shown_layers"]


@dataclass(frozen=True)
class AttentionSet:
    """One kind of attention shown on a page, e.g. an encoder-decoder's cross-attention.

    Attributes:
        name: what the page's selector calls it (``"cross-attention"``).
        weights: (layers, heads, Q, K) weights (tensor or array), or a list of
            per-layer (heads, Q, K) / (1, heads, Q, K) weights.
        tokens: Q query tokens.
        key_tokens: K key tokens; None when the keys are the queries.
        layer_labels: names of the layers (default ``"layer i"``).
        head_labels: names of the heads (default ``"head i"``).
        pair_start: index of the first query token of the second sentence of a
            pair (a divider is drawn there and the A/B filter appears), or None.
        key_pair_start: the same among the keys; None = ``pair_start`` when the
            keys are the queries.
        generated_start: the first generated token (rows from it on were
            produced one step at a time); the page gets a step slider.
        raw_tokens: the tokenizer's own spelling of each query token, shown on hover.
        layers: the layers shown, by number (negative numbers count from the end), in
            increasing order on the page; None = every layer. Every layer still feeds
            attention rollout and flow, which are the whole stack's.
    """

    name: str
    weights: Any
    tokens: Sequence[str]
    key_tokens: Sequence[str] | None = None
    layer_labels: Sequence[str] | None = None
    head_labels: Sequence[str] | None = None
    pair_start: int | None = None
    key_pair_start: int | None = None
    generated_start: int | None = None
    raw_tokens: Sequence[str] | None = None
    layers: Sequence[int] | None = None


def _texts(name: str, values: Sequence[Any]) -> list[str]:
    """``values`` as strings, or a ValueError naming ``name`` for one that is not text a
    page can hold (a lone surrogate: half of a character, which UTF-8 cannot write)."""
    out = [str(t) for t in values]
    for i, t in enumerate(out):
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"{name}: entry {i} ({t!r}) holds a lone surrogate "
                f"(U+{ord(t[exc.start]):04X}, half of a character), which a page cannot "
                "hold; decode the tokens with the tokenizer, or replace it"
            ) from None
    return out


def _labels(name: str, labels: Sequence[Any] | None, n: int, default: str) -> list[str]:
    if labels is None:
        return [f"{default} {i}" for i in range(n)]
    if isinstance(labels, str):
        raise TypeError(f"{name}: expected a list of {n} strings, got a single str")
    out = _texts(name, labels)
    if len(out) != n:
        raise ValueError(f"{name}: expected {n} labels, got {len(out)}")
    return out


def _tokens(name: str, tokens: Sequence[Any] | None, n: int, what: str) -> list[str]:
    if tokens is None:
        raise ValueError(f"{name}: expected {n} {what} tokens, got None")
    if isinstance(tokens, str):
        raise TypeError(f"{name}: expected a list of strings, got a single str")
    out = _texts(name, tokens)
    if len(out) != n:
        raise ValueError(
            f"{name}: expected {n} {what} tokens (the weights have {n}), got {len(out)}"
        )
    return out


def _split(name: str, start: int | None, n: int) -> int | None:
    if start is None:
        return None
    if isinstance(start, bool) or not isinstance(start, int) or not 0 < start < n:
        raise ValueError(
            f"{name}: expected the index of the second sentence's first token, in 1..{n - 1}, "
            f"got {start!r}"
        )
    return start


def reduce_set(s: AttentionSet, budget: Budget) -> ReducedSet:
    """A set given as full weights, reduced like a streamed one (dense or long page)."""
    arr = as_grid(
        s.weights, name="attentions", dims="layers, heads", batch_of_one=True
    )  # (layers, heads, Q, K)
    n_layers, n_heads, Q, K = arr.shape
    q_tokens = _tokens("tokens", s.tokens, Q, "query")
    if s.key_tokens is None:
        if K != Q:
            raise ValueError(
                f"key_tokens: the weights have {K} keys and {Q} queries; pass key_tokens"
            )
        k_tokens = None
    else:
        k_tokens = _tokens("key_tokens", s.key_tokens, K, "key")
    check_finite(arr, "attentions")
    pair_start = _split("pair_start", s.pair_start, Q)
    key_pair = s.key_pair_start
    if key_pair is None and s.key_tokens is None:
        key_pair = pair_start
    key_pair = _split("key_pair_start", key_pair, K)
    if (pair_start is None) != (key_pair is None):
        raise ValueError(
            "pair_start, key_pair_start: give both (queries and keys differ) or neither; got "
            f"{pair_start!r} and {key_pair!r}"
        )
    gen = s.generated_start
    if gen is not None and (isinstance(gen, bool) or not isinstance(gen, int) or not 0 < gen <= Q):
        raise ValueError(f"generated_start: expected 1..{Q}, got {gen!r}")
    shown = None if s.layers is None else shown_layers(s.layers, n_layers)
    reducer = SetReducer(str(s.name), n_layers, n_heads, Q, K, layers=shown,
                         positional=s.key_tokens is None, budget=budget)  # fmt: skip
    for li in range(n_layers):
        reducer.add(li, 0, torch.from_numpy(arr[li]))
    out = reducer.finish()
    if s.layer_labels is None:
        out.layer_labels = [f"layer {i}" for i in reducer.layers]
    else:
        out.layer_labels = _labels("layer_labels", s.layer_labels, len(reducer.layers), "layer")
    out.head_labels = _labels("head_labels", s.head_labels, n_heads, "head")
    out.tokens, out.key_tokens = q_tokens, k_tokens
    if s.raw_tokens is not None:
        out.raw_tokens = _tokens("raw_tokens", s.raw_tokens, Q, "query")
    out.pair_start, out.key_pair_start, out.generated_start = pair_start, key_pair, gen
    return out


def layer_numbers(layers: Any, n: int, holder: str) -> list[int]:
    """bertviz's ``include_layers`` checked against ``n`` layers, as ``attnkit show --layers``
    reads them: negative numbers count from the end; each layer once, in the order given.

    Args:
        layers: the layer numbers (a sequence of ints).
        n: how many layers there are.
        holder: who has them, for the message: ``"the model has"``, ``"the weights have"``.

    Raises:
        ValueError: ``layers`` empty, not integers, or a number outside ``-n .. n - 1``.
    """
    given = [layers] if isinstance(layers, (str, bytes)) else list(layers)
    if not given or not all(
        isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in given
    ):
        raise ValueError(f"include_layers: expected a list of layer numbers, got {layers!r}")
    picked = [int(i) for i in given]
    bad = [str(i) for i in picked if not -n <= i < n]
    if bad:
        layer_word = "layer" if n == 1 else "layers"
        raise ValueError(
            f"include_layers: {', '.join(bad)} out of range; {holder} {n} {layer_word} "
            f"(0 to {n - 1})"
        )
    out: list[int] = []
    for i in picked:
        if i % n not in out:
            out.append(i % n)
    return out


def shown_layers(layers: Sequence[int], n_layers: int) -> list[int]:
    """bertviz's ``include_layers`` checked against ``n_layers`` (:func:`layer_numbers`),
    in increasing order: the order the page shows them."""
    return sorted(layer_numbers(layers, n_layers, "the weights have"))


def page_payload(s: ReducedSet) -> dict[str, Any]:
    """The page's data for one reduced set: weights, tokens, pair and step marks."""
    out = set_payload(s)
    Q, K = s.shape[2], s.shape[3]
    tokens = _tokens("tokens", s.tokens, Q, "query")
    keys = tokens if s.key_tokens is None else _tokens("key_tokens", s.key_tokens, K, "key")
    out |= {
        "tokens": tokens,
        "keyTokens": keys,
        "rawTokens": list(s.raw_tokens) if s.raw_tokens is not None else None,
        "rawKeyTokens": (
            list(s.key_raw_tokens)
            if s.key_raw_tokens is not None
            else (list(s.raw_tokens) if s.raw_tokens is not None and s.key_tokens is None else None)
        ),
        "pairStart": s.pair_start,
        "pairKeyStart": s.key_pair_start,
        "genStart": s.generated_start,
        "viewKind": s.view_kind,
        "renormalised": s.renormalised,
    }
    return out


def as_sets(
    attentions: Any,
    tokens: Sequence[str] | None,
    key_tokens: Sequence[str] | None,
    layer_labels: Sequence[str] | None,
    head_labels: Sequence[str] | None,
    pair_start: int | None,
) -> list[AttentionSet | ReducedSet]:
    """The sets a page shows: ``attentions`` as given (sets), or one set of its weights."""
    if isinstance(attentions, (AttentionSet, ReducedSet)):
        return [attentions]
    if (
        isinstance(attentions, (list, tuple))
        and attentions
        and all(isinstance(a, (AttentionSet, ReducedSet)) for a in attentions)
    ):
        if tokens is not None or key_tokens is not None or pair_start is not None:
            raise ValueError(
                "tokens: AttentionSet objects carry their own tokens; pass tokens=None"
            )
        return list(attentions)
    if isinstance(tokens, str):
        raise TypeError("tokens: expected a list of strings, got a single str")
    return [
        AttentionSet(
            name="attention",
            weights=attentions,
            tokens=tokens if tokens is not None else [],
            key_tokens=key_tokens,
            layer_labels=layer_labels,
            head_labels=head_labels,
            pair_start=pair_start,
        )
    ]
