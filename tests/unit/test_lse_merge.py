"""One merge of (out, lse) partials, against one-shot attention over all the keys."""

from __future__ import annotations

import itertools

import pytest
import torch

import attnkit
from attnkit import _lse, masks

from tolerance import FLOAT64_REL, assert_close_to_scale


@pytest.mark.parametrize("cuts", [(5,), (1, 9), (3, 4, 11)])
def test_merging_key_blocks_equals_attention_over_all_keys(cuts: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(0)
    B, H, L, S, E = 2, 3, 7, 13, 5
    q, k, v = (torch.randn(B, H, n, E, generator=g, dtype=torch.float64) for n in (L, S, S))
    mask = masks.causal("bottom_right") & masks.valid_lens(torch.tensor([13, 4]))
    ref, ref_lse = attnkit.attention(q, k, v, mask=mask, return_lse=True, backend="reference")
    edges = (0, *cuts, S)
    outs, lses = [], []
    for a, b in itertools.pairwise(edges):
        part = mask.shard(0, a, L, b - a, L, S)
        o, lse = attnkit.attention(q, k[..., a:b, :], v[..., a:b, :], mask=part,
                                   return_lse=True, backend="reference")  # fmt: skip
        outs.append(o)
        lses.append(lse)
    out, lse = _lse.merge_all(outs, lses)
    assert_close_to_scale(out, ref, rel=FLOAT64_REL)
    assert_close_to_scale(lse, ref_lse, rel=FLOAT64_REL)


def test_rows_empty_in_every_part_give_zero_and_minus_inf_with_zero_gradients() -> None:
    out_a = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    lse_a = torch.tensor([[0.5, float("-inf"), 1.0], [float("-inf")] * 3], dtype=torch.float64)
    out_b = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    lse_b = torch.tensor([[float("-inf"), float("-inf"), 2.0], [float("-inf")] * 3],
                         dtype=torch.float64)  # fmt: skip
    out, lse = _lse.merge(out_a, lse_a, out_b, lse_b)
    assert torch.isneginf(lse[0, 1]) and torch.isneginf(lse[1]).all()
    assert (out[0, 1] == 0).all() and (out[1] == 0).all()
    torch.testing.assert_close(out[0, 0], out_a[0, 0], rtol=0, atol=0)
    out.sum().backward()
    assert out_a.grad is not None and out_b.grad is not None
    assert not out_a.grad.isnan().any() and (out_a.grad[1] == 0).all()
    assert torch.isfinite(lse[0, 2])


def test_a_nan_partial_propagates() -> None:
    out_a = torch.ones(1, 2, 3)
    out_b = torch.full((1, 2, 3), float("nan"))
    lse = torch.zeros(1, 2)
    out, _ = _lse.merge(out_a, lse, out_b, lse)
    assert out.isnan().all()


def test_finish_gives_zero_and_minus_inf_for_rows_without_keys() -> None:
    acc = torch.zeros(2, 3)
    out, lse = _lse.finish(acc.unsqueeze(0), torch.tensor([[0.0, 2.0]]), torch.tensor([[0.0, 1.0]]))
    assert out.shape == (1, 2, 3)
    assert torch.isneginf(lse[0, 0]) and lse[0, 1] == pytest.approx(
        1.0 + torch.log(torch.tensor(2.0)).item()
    )


def test_merge_all_rejects_mismatched_lists() -> None:
    with pytest.raises(ValueError, match="as many outputs as lses"):
        _lse.merge_all([torch.zeros(1, 1, 1)], [])
