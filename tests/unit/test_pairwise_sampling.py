"""The all-pairs sampling of parametrized tests (tests/pairwise.py) covers every pair."""

from __future__ import annotations

import itertools

from pairwise import covering_indices


def _product(**values: tuple[object, ...]) -> list[dict[str, object]]:
    names = list(values)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values.values())]


def test_every_pair_of_values_meets_in_the_kept_set_and_the_set_is_small() -> None:
    combos = _product(score=tuple("abcde"), mask=tuple(range(8)), where=("q", "k", "v"),
                      backend=("sdpa", "chunked", "reference"))  # fmt: skip
    keep = covering_indices(combos)
    kept = [combos[i] for i in sorted(keep)]
    for a, b in itertools.combinations(["score", "mask", "where", "backend"], 2):
        wanted = {(c[a], c[b]) for c in combos}
        assert {(c[a], c[b]) for c in kept} == wanted, (a, b)
    # At least the largest pair product (5 x 8), far below the whole product (360).
    assert 40 <= len(kept) <= 60, len(kept)
    assert covering_indices(combos) == keep  # the same choice every time (xdist workers)


def test_a_lone_parameter_keeps_every_value() -> None:
    combos = _product(mask=tuple(range(6)))
    assert covering_indices(combos) == set(range(6))


def test_two_parameters_keep_the_whole_product() -> None:
    combos = _product(score=tuple("abc"), mask=tuple(range(4)))
    assert covering_indices(combos) == set(range(12))
