"""Words and special tokens as a linear map over positions, inside the streaming reduction.

The oracle is the map written as matrices in float64, ``R A C`` (with each row
renormalised when keys are dropped), applied to whole layers; the reducer applies
it a row block at a time, on dense and long pages alike.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnkit.viz.positions import PositionMap, apply_map, map_labels, map_position
from attnkit.viz.reduce import Budget, SetReducer

from tolerance import (
    FLOAT32_CHAIN_REL,
    FLOAT32_ULPS_REL,
    WEIGHTS_SCALE,
    assert_close_elementwise,
    assert_close_to_scale,
)

GROUPS = [-1, 0, 1, 1, 1, 2, 3, 3, -1, 4, 5, 5, -1]  # -1: a special token, dropped


def _matrices(group: list[int], n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """R (n_out, n): the mean over each group's rows; C (n, n_out): the sum over its keys."""
    n = len(group)
    C = np.zeros((n, n_out))
    for i, g in enumerate(group):
        if g >= 0:
            C[i, g] = 1.0
    R = (C / np.maximum(C.sum(0), 1)).T
    return R, C


def _oracle(w: np.ndarray, group: list[int]) -> np.ndarray:
    """(..., Q, K) weights on page positions, in float64."""
    pmap = PositionMap.from_groups(group)
    R, C = _matrices(group, pmap.size)
    cols = w.astype(np.float64) @ C  # (..., Q, K')
    sums = cols.sum(-1, keepdims=True)
    cols = np.where(sums > 0, cols / np.where(sums > 0, sums, 1), 0.0)
    return R @ cols  # (..., Q', K')


def _weights(heads: int, n: int, seed: int, causal: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(heads, n, n, generator=g) * 3
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1)  # (heads, n, n)


def test_the_map_is_r_a_c_and_rows_still_sum_to_one() -> None:
    pmap = PositionMap.from_groups(GROUPS)
    assert (pmap.size, pmap.drops, pmap.merges) == (6, True, True)
    w = _weights(3, len(GROUPS), 0)
    got, first = apply_map(w, 0, pmap, pmap)
    assert first == 0 and got.shape == (3, 6, 6)
    assert_close_elementwise(got, _oracle(w.numpy(), GROUPS), rel=FLOAT32_ULPS_REL)
    rows = got.sum(-1)
    assert_close_elementwise(rows, torch.ones_like(rows), rel=FLOAT32_ULPS_REL)


def test_words_alone_keep_rows_summing_to_one_without_renormalising() -> None:
    words = [0, 1, 1, 2, 3, 3, 3]
    pmap = PositionMap.from_groups(words)
    assert not pmap.drops and pmap.merges
    w = _weights(2, len(words), 1)
    got, _ = apply_map(w, 0, pmap, pmap)
    R, C = _matrices(words, pmap.size)
    assert_close_elementwise(got, R @ w.double().numpy() @ C, rel=FLOAT32_ULPS_REL)
    rows = got.sum(-1)
    assert_close_elementwise(rows, torch.ones_like(rows), rel=FLOAT32_ULPS_REL)


def test_blocks_are_cut_between_words_and_a_split_word_is_refused() -> None:
    pmap = PositionMap.from_groups(GROUPS)
    for row0 in range(len(GROUPS)):
        for end in range(row0 + 1, len(GROUPS) + 1):
            cut = pmap.cut(row0, end)
            assert bool(pmap.boundary[cut]) and cut > row0
    assert pmap.cut(1, 3) == 2 and pmap.cut(2, 3) == 5  # word 1 holds tokens 2..4
    with pytest.raises(ValueError, match="split a word"):
        apply_map(_weights(1, len(GROUPS), 2)[:, 2:4], 2, pmap, None)


def test_labels_and_positions_follow_the_map() -> None:
    pmap = PositionMap.from_groups([-1, 0, 1, 1, -1])
    shown, raw = map_labels(["[CLS]", "The", " un", "bel", "[SEP]"],
                            ["[CLS]", "the", "un", "##bel", "[SEP]"], pmap)  # fmt: skip
    assert shown == ["The", " unbel"] and raw == ["the", "un ##bel"]
    assert map_position(pmap, 2) == 1 and map_position(pmap, 4) is None


@pytest.mark.parametrize("long", [False, True], ids=["dense", "long"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_the_reducer_applies_the_map_per_row_block(long: bool, causal: bool) -> None:
    n_layers, heads = 2, 3
    group = [-1, *[g for g in range(40) for _ in range(1 + g % 3)], -1]  # words of 1 to 3 pieces
    n = len(group)
    pmap = PositionMap.from_groups(group)
    budget = Budget(dense_cells=10 if long else 1 << 20, overview=8, top_k=4)
    mapped = SetReducer("m", n_layers, heads, n, n, budget=budget, rows=pmap, cols=pmap)
    oracle = SetReducer("o", n_layers, heads, pmap.size, pmap.size, budget=budget)
    for layer in range(n_layers):
        w = _weights(heads, n, 10 + layer, causal)
        a = 0
        while a < n:  # row blocks of about 7 rows, cut between words, keys up to the last row
            end = mapped.cut(a, a + 7)
            keys = end if causal else n
            mapped.add(layer, a, w[:, a:end, :keys].contiguous())
            a = end
        oracle.add(layer, 0, torch.from_numpy(_oracle(w.numpy(), group)).float())
    got, want = mapped.finish(), oracle.finish()
    assert got.shape == want.shape == (n_layers, heads, pmap.size, pmap.size)
    if long:
        for name in ("pooled_max", "pooled_mean", "topk_weight"):
            assert_close_to_scale(getattr(got, name), getattr(want, name), rel=FLOAT32_ULPS_REL)
    else:
        assert_close_to_scale(got.dense, want.dense, rel=FLOAT32_ULPS_REL)
    for name in ("entropy", "distance", "first", "prev", "self", "local"):
        assert_close_to_scale(got.stats[name], want.stats[name], scale=WEIGHTS_SCALE)
    assert_close_to_scale(got.rollout, want.rollout, rel=FLOAT32_CHAIN_REL)
    assert got.neuron is None and any("word view" in note for note in got.notes)
