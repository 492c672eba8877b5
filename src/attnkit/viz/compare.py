"""Comparisons: two sides (two texts on one model, or one text on two models) and A − B.

A comparison is two reduced sets per kind of attention and their difference,
made here from the exact weights, never in the page. :func:`compare` takes
each side as an :class:`~attnkit.viz.AttentionSet` (or a reduced set, or a list
of either, one per kind of attention) and returns a :class:`Comparison`, which
:func:`attnkit.viz.to_html` and :func:`attnkit.viz.show` draw as one page: both
sides in sync (same layer, heads, selected token and search), and A − B on a
diverging colour map where the two token sequences are equal. Where they are
not, the page shows the sides next to each other and says why.

The difference travels as one signed byte per value, against each head's
largest ``|A − B|`` (error at most 1/254 of it): every weight on a dense page,
the exact block means on a long one, and the rollout when both sides have one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .payload import blob
from .reduce import Budget, ReducedSet
from .tokens import mark

__all__ = ["Comparison", "Difference", "compare", "compare_payload"]


@dataclass
class Difference:
    """A − B of one kind of attention whose two sides hold the same tokens.

    Attributes:
        weights: (layers, heads, R, C) float32: A − B of every weight (``block``
            is 1, R × C = queries × keys), or of the exact block means of a long
            page (R × C query × key blocks of ``block`` tokens).
        block: tokens per block side (1: every weight).
        rollout: (Q, K) A − B of the attention rollout, when both sides have one.
    """

    weights: np.ndarray
    block: int = 1
    rollout: np.ndarray | None = None


@dataclass
class Comparison:
    """Two sides of one comparison, reduced for a page, and their differences.

    Attributes:
        a, b: the reduced sets of each side, one per kind of attention, in the
            same order (an encoder-decoder: encoder, decoder, cross).
        names: what the page calls the sides (a model's name, or the text).
        differences: per kind, its :class:`Difference`, or None where the
            tokens (or the layers and heads) differ.
        why: why there is no difference, for the page (None when every kind has one).
    """

    a: list[ReducedSet]
    b: list[ReducedSet]
    names: tuple[str, str]
    differences: list[Difference | None]
    why: str | None = None


def _side(name: str, side: Any, budget: Budget) -> list[ReducedSet]:
    from .attention_set import AttentionSet, reduce_set

    items = [side] if isinstance(side, (AttentionSet, ReducedSet)) else side
    if not isinstance(items, (list, tuple)) or not items:
        raise TypeError(
            f"{name}: expected an AttentionSet, a reduced set or a list of them (one per kind of "
            f"attention), got {type(side).__name__}"
        )
    out = []
    for item in items:
        if isinstance(item, AttentionSet):
            out.append(reduce_set(item, budget))
        elif isinstance(item, ReducedSet):
            out.append(item)
        else:
            raise TypeError(
                f"{name}: expected AttentionSet or reduced set items, got {type(item).__name__}"
            )
    return out


def _first_difference(a: Sequence[str], b: Sequence[str], what: str) -> str | None:
    """Why two token sequences differ, in words; None when they are equal."""
    if list(a) == list(b):
        return None
    if len(a) != len(b):
        return f"the {what} sequences differ: A has {len(a)} tokens and B has {len(b)}."
    i = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    return (
        f"the {what} sequences differ from token {i} on ({mark(a[i])!r} in A, {mark(b[i])!r} in B)."
    )


def _spelling(s: ReducedSet) -> list[str]:
    """The query tokens as the tokenizer spells them (the shown text keeps the input's
    casing, which an uncased model's tokens do not)."""
    return s.raw_tokens if s.raw_tokens is not None else s.tokens


def _key_spelling(s: ReducedSet) -> list[str]:
    """The key tokens as the tokenizer spells them (the queries' when the keys are them)."""
    if s.key_tokens is None:
        return _spelling(s)
    return s.key_raw_tokens if s.key_raw_tokens is not None else s.key_tokens


def _why_not(a: ReducedSet, b: ReducedSet) -> str | None:
    """Why A − B cannot be drawn for this kind (None: it can). Two sides pair up when
    the tokenizer made the same tokens of them, whatever the input's spelling."""
    why = _first_difference(_spelling(a), _spelling(b), "token")
    if why is None and (a.key_tokens is not None or b.key_tokens is not None):
        why = _first_difference(_key_spelling(a), _key_spelling(b), "key token")
    if why is not None:
        return why
    if a.shape[:2] != b.shape[:2]:
        return (
            f"A shows {a.shape[0]} layers × {a.shape[1]} heads and B {b.shape[0]} × "
            f"{b.shape[1]}; each layer and head is shown side by side where both have it."
        )
    for mine, theirs in ((a.layer_labels, b.layer_labels), (a.head_labels, b.head_labels)):
        if mine != theirs:
            return (
                f"A shows {', '.join(mine)} and B {', '.join(theirs)}; each is shown side by "
                "side, and a difference only between the same layers and heads."
            )
    if a.long != b.long or a.block != b.block:
        return "one side holds every weight and the other a long input's overview."
    return None


def _difference(a: ReducedSet, b: ReducedSet) -> Difference:
    if a.dense is not None and b.dense is not None:
        weights = a.dense.astype(np.float32) - b.dense.astype(np.float32)  # (layers, heads, Q, K)
        block = 1
    else:
        assert a.pooled_mean is not None and b.pooled_mean is not None
        weights = a.pooled_mean.astype(np.float32) - b.pooled_mean.astype(np.float32)
        block = a.block  # (layers, heads, Qb, Kb)
    rollout = None
    if a.rollout is not None and b.rollout is not None and a.rollout.shape == b.rollout.shape:
        rollout = (a.rollout - b.rollout).astype(np.float32)  # (Q, K)
    return Difference(weights, block, rollout)


def compare(
    a: Any,
    b: Any,
    *,
    names: tuple[str, str] = ("A", "B"),
    top_k: int = 16,
    budget: Budget | None = None,
) -> Comparison:
    """Two sides of a comparison and their difference, ready for :func:`~attnkit.viz.to_html`.

    Args:
        a, b: each side: an :class:`~attnkit.viz.AttentionSet` (weights of shape
            (layers, heads, Q, K) and their tokens), a reduced set (what
            ``attnkit show`` runs produce), or a list of them, one per kind of
            attention, the same kinds in the same order on both sides.
        names: what the page calls the two sides (e.g. two model names).
        top_k: keys kept per query row when a side is a long input.
        budget: what the page keeps (default ``Budget(top_k=top_k)``).

    Returns:
        a :class:`Comparison`; A − B wherever both sides hold the same tokens and
        the same layers × heads.

    Raises:
        TypeError / ValueError: a side is not attention sets, the sides hold
        different numbers of kinds, or ``names`` is not two strings.
    """
    if (
        not isinstance(names, (tuple, list))
        or len(names) != 2
        or not all(isinstance(n, str) and n.strip() for n in names)
    ):
        raise ValueError(f"names: expected two non-empty strings, got {names!r}")
    budget = budget or Budget(top_k=top_k)
    side_a, side_b = _side("a", a, budget), _side("b", b, budget)
    if len(side_a) != len(side_b):
        raise ValueError(
            f"b: expected as many kinds of attention as a ({len(side_a)}), got {len(side_b)}"
        )
    differences: list[Difference | None] = []
    reasons: list[str] = []
    for sa, sb in zip(side_a, side_b, strict=True):
        why = _why_not(sa, sb)
        differences.append(None if why else _difference(sa, sb))
        if why and why not in reasons:
            reasons.append(why)
    why_text = " ".join(r[0].upper() + r[1:] for r in reasons) or None
    return Comparison(side_a, side_b, (str(names[0]), str(names[1])), differences, why_text)


def _signed_part(values: np.ndarray) -> dict[str, Any]:
    """(layers, heads, R, C) signed values: one signed byte each against each head's largest |v|."""
    lead = values.shape[:2]
    flat = values.reshape(*lead, -1).astype(np.float32)  # (layers, heads, R * C)
    scales = np.abs(flat).max(axis=2) if flat.shape[2] else np.zeros(lead, np.float32)
    scales = np.where(scales > 0, scales, 1.0).astype(np.float32)  # (layers, heads)
    codes = np.rint(flat / scales[:, :, None] * 127.0).astype(np.int8)  # (layers, heads, R * C)
    return {**blob(codes.tobytes()), "scales": [float(s) for s in scales.reshape(-1)]}


def _difference_payload(d: Difference) -> dict[str, Any]:
    out: dict[str, Any] = {
        "mode": "dense" if d.block == 1 else "blocks",
        "block": d.block,
        "shape": list(d.weights.shape),
        **_signed_part(d.weights),
        "rollout": None,
    }
    if d.rollout is not None:
        r = d.rollout[None, None]  # (1, 1, Q, K)
        out["rollout"] = {"mode": "dense", "block": 1, "shape": list(r.shape), **_signed_part(r)}
    return out


def compare_payload(c: Comparison) -> dict[str, Any]:
    """The page's ``compare`` record (the sets themselves travel as A's kinds, then B's)."""
    return {
        "names": list(c.names),
        "kinds": len(c.a),
        "why": c.why,
        "diffs": [None if d is None else _difference_payload(d) for d in c.differences],
    }
