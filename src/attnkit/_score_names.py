"""The score names: one list for ``attention(score=...)`` and ``attnkit explain --score``.

Two kinds of name:

- :data:`NAMED`: parameter-free scores that ``attention(score="...")`` takes as a string
  (``"dot"``, ``"scaled_dot"``, ``"gaussian"``; whatever :mod:`attnkit.scores` names).
- :data:`NEEDS_WEIGHTS`: scores that hold learned weights (``"bilinear"``,
  ``"additive"``). A string cannot carry weights, so ``attention()`` refuses these names
  and says which object to pass; ``attnkit explain --score additive`` describes a call
  with that object, built by :func:`build_with_weights` at the feature dim ``E``.

:data:`ALL` is the CLI's list of choices: the same names, one meaning each.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import scores

__all__ = ["ALL", "NAMED", "NEEDS_WEIGHTS", "build_with_weights", "check_score_name"]

NAMED: tuple[str, ...] = tuple(sorted(scores._NAMED))
"""Strings ``attention(score=...)`` accepts."""

NEEDS_WEIGHTS: dict[str, tuple[type[scores.Score], str]] = scores.WITH_WEIGHTS
"""Name -> (the Score class, how to build one): scores with learned weights."""

ALL: tuple[str, ...] = NAMED + tuple(n for n in NEEDS_WEIGHTS if n not in NAMED)
"""Every score name, in the CLI's order: the strings first, then the objects."""

_BUILD: dict[str, Callable[[int, torch.device | str, torch.dtype], scores.Score]] = {
    "bilinear": lambda E, device, dtype: scores.Bilinear(E, E, device=device, dtype=dtype),
    "additive": lambda E, device, dtype: scores.Additive(E, E, E, device=device, dtype=dtype),
}


def check_score_name(score: object) -> object:
    """``score`` unchanged, or a ValueError for a name of a score with weights.

    Args:
        score: what ``attention(score=...)`` received (a string or a Score object).

    Raises:
        ValueError: ``score`` is ``"bilinear"`` or ``"additive"``: a string holds no
            weights; the message names the object to pass.
    """
    if isinstance(score, str) and score in NEEDS_WEIGHTS and score not in NAMED:
        scores.refuse_weighted_name(score)
    return score


def build_with_weights(
    name: str, E: int, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> scores.Score:
    """The object ``attnkit explain --score NAME`` describes for a score with weights:
    ``scores.Bilinear(E, E)`` or ``scores.Additive(E, E, E)`` (hidden dim E).

    Args:
        name: a key of :data:`NEEDS_WEIGHTS`.
        E: the feature dim of query and key.
        device, dtype: of the weights (``"meta"`` holds no storage).
    """
    return _BUILD[name](E, device, dtype)
