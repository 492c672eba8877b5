"""All-pairs sampling of a parametrized test's combinations.

A test marked ``@pytest.mark.pairwise`` keeps, in the default run, a set of its
parameter combinations in which every value of every parameter meets every value of
every other parameter at least once (an all-pairs, or 2-way covering, set); its other
combinations are marked ``slow`` and run under ``scripts/test.sh --full`` and in CI
(``pytest -m slow``). Most defects of a parametrized matrix show in one value or in the
meeting of two (a score under one mask kind, a mask kind on one backend); the full
product stays in the slow run for the rest.

``@pytest.mark.pairwise(unsupported=predicate)``: ``predicate(params)`` is true for a
combination the code under test refuses by design (sdpa with the additive score, say).
Such a combination covers nothing (it checks only that the call is refused), so the
covering set is chosen among the others; the refused ones stay in the default run,
where they cost a refusal each.

The choice is greedy (the combination that covers the most pairs not yet covered,
the first of equals in collection order) and deterministic, so every pytest-xdist
worker makes the same one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

import pytest

Params = Mapping[str, object]


def _pairs(params: Params) -> set[tuple[tuple[str, str], ...]]:
    """Every pair of (name, value) in one combination; a lone parameter is its own."""
    items = sorted((name, repr(value)) for name, value in params.items())
    if len(items) < 2:
        return {tuple(items)}
    return set(itertools.combinations(items, 2))


def covering_indices(combos: Sequence[Params]) -> set[int]:
    """The indices of a subset of ``combos`` that covers every pair the whole covers."""
    wanted = [_pairs(combo) for combo in combos]
    uncovered = set().union(*wanted) if wanted else set()
    keep: set[int] = set()
    while uncovered:
        best = max(range(len(combos)), key=lambda i: (len(wanted[i] & uncovered), -i))
        keep.add(best)
        uncovered -= wanted[best]
    return keep


def mark_all_but_pairs_slow(items: Sequence[pytest.Item]) -> None:
    """Mark ``slow`` every combination of a ``pairwise`` test outside its covering set."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        marker = item.get_closest_marker("pairwise")
        if marker is None or not hasattr(item, "callspec"):
            continue
        groups.setdefault(f"{item.path}::{item.originalname}", []).append(item)  # type: ignore[attr-defined]
    for group in groups.values():
        marker = group[0].get_closest_marker("pairwise")
        assert marker is not None
        unsupported: Callable[[Params], bool] = marker.kwargs.get("unsupported", lambda p: False)
        runs = [item for item in group if not unsupported(item.callspec.params)]  # type: ignore[attr-defined]
        keep = covering_indices([item.callspec.params for item in runs])  # type: ignore[attr-defined]
        for index, item in enumerate(runs):
            if index not in keep:
                item.add_marker(pytest.mark.slow)
