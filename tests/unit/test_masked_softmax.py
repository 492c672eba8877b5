"""attnkit.masked_softmax against d2l's masked_softmax, written out here."""

from __future__ import annotations

import doctest

import pytest
import torch
from tests.tolerance import assert_close_to_scale

import attnkit
from attnkit import _masked_softmax


def d2l_masked_softmax(X: torch.Tensor, valid_lens: torch.Tensor | None) -> torch.Tensor:
    """d2l's formula: X (B, L, S); valid_lens None, (B,) or (B, L); masked logits -1e6."""
    if valid_lens is None:
        return torch.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    flat = X.reshape(-1, shape[-1]).clone()  # (B*L, S)
    kept = torch.arange(shape[-1])[None, :] < valid_lens[:, None]
    flat[~kept] = -1e6
    return torch.softmax(flat.reshape(shape), dim=-1)


def _logits(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


def test_no_lengths_is_a_softmax() -> None:
    X = _logits(2, 3, 5)
    assert_close_to_scale(attnkit.masked_softmax(X), d2l_masked_softmax(X, None))
    assert_close_to_scale(attnkit.masked_softmax(X, None), torch.softmax(X, -1))


@pytest.mark.parametrize(
    "lens",
    [torch.tensor([2, 3]), torch.tensor([5, 1]), torch.tensor([[1, 3, 2], [2, 4, 5]])],
    ids=["per-batch", "per-batch-full", "per-query"],
)
def test_equals_d2l_where_lengths_are_positive(lens: torch.Tensor) -> None:
    X = _logits(2, 3, 5)  # (B, L, S)
    assert_close_to_scale(attnkit.masked_softmax(X, lens), d2l_masked_softmax(X, lens))


def test_d2l_book_example() -> None:
    X = torch.rand(2, 2, 4, generator=torch.Generator().manual_seed(0))
    for lens in (torch.tensor([2, 3]), torch.tensor([[1, 3], [2, 4]])):
        got = attnkit.masked_softmax(X, lens)
        assert_close_to_scale(got, d2l_masked_softmax(X, lens))
        assert_close_to_scale(got.sum(-1), torch.ones(2, 2))


def test_zero_length_is_zeros_not_d2ls_uniform_row() -> None:
    X = _logits(3, 2, 4)
    lens = torch.tensor([0, 2, 4])
    got = attnkit.masked_softmax(X, lens)
    want = d2l_masked_softmax(X, lens)
    assert torch.equal(got[0], torch.zeros(2, 4))  # attnkit: no key, all zeros
    assert_close_to_scale(want[0], torch.full((2, 4), 0.25))  # d2l: uniform 1/S
    assert_close_to_scale(got[1:], want[1:])
    per_query = torch.tensor([[0, 3], [1, 0], [4, 4]])
    got = attnkit.masked_softmax(X, per_query)
    assert torch.equal(got[0, 0], torch.zeros(4)) and torch.equal(got[1, 1], torch.zeros(4))
    assert not torch.isnan(got).any()


def test_gradients_match_d2l_and_vanish_on_empty_rows() -> None:
    X = _logits(2, 3, 5).requires_grad_()
    lens = torch.tensor([[1, 3, 0], [5, 2, 4]])
    g = _logits(2, 3, 5)
    (attnkit.masked_softmax(X, lens) * g).sum().backward()
    got = X.grad
    assert got is not None
    X2 = X.detach().clone().requires_grad_()
    (d2l_masked_softmax(X2, lens) * g).sum().backward()
    assert X2.grad is not None
    rows = torch.tensor([[True, True, False], [True, True, True]])
    assert_close_to_scale(got[rows], X2.grad[rows])
    assert torch.equal(got[0, 2], torch.zeros(5))


def test_more_dims_and_two_dims() -> None:
    X = _logits(2, 4, 3, 6)  # (B, H, L, S): lengths broadcast over heads
    lens = torch.tensor([[1, 6, 3], [2, 2, 5]])
    want = torch.stack([d2l_masked_softmax(X[:, h], lens) for h in range(4)], dim=1)
    assert_close_to_scale(attnkit.masked_softmax(X, lens), want)
    X2 = _logits(3, 6)  # (B, S): one row per batch element
    lens1 = torch.tensor([1, 4, 6])
    assert_close_to_scale(
        attnkit.masked_softmax(X2, lens1), d2l_masked_softmax(X2[:, None], lens1)[:, 0]
    )


def test_half_precision_accumulates_in_float32() -> None:
    X = _logits(2, 3, 5)
    lens = torch.tensor([2, 5])
    got = attnkit.masked_softmax(X.to(torch.bfloat16), lens)
    assert got.dtype == torch.float32
    want = d2l_masked_softmax(X.to(torch.bfloat16).float(), lens)
    assert_close_to_scale(got, want)


def test_bad_arguments_name_the_argument() -> None:
    X = _logits(2, 3, 5)
    with pytest.raises(ValueError, match=r"valid_lens: shape \(3,\) does not fit X"):
        attnkit.masked_softmax(X, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"valid_lens: shape \(2, 2\) does not fit X"):
        attnkit.masked_softmax(X, torch.tensor([[1, 2], [3, 4]]))
    with pytest.raises(ValueError, match="more than the 5 keys"):
        attnkit.masked_softmax(X, torch.tensor([6, 1]))
    with pytest.raises(ValueError, match=">= 0"):
        attnkit.masked_softmax(X, torch.tensor([-1, 1]))
    with pytest.raises(TypeError, match="X: expected a floating-point tensor"):
        attnkit.masked_softmax(torch.ones(2, 3, 5, dtype=torch.long), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"X: expected logits \(B, L, S\)"):
        attnkit.masked_softmax(torch.ones(5), torch.tensor([1]))


def test_exported_with_a_working_example() -> None:
    assert "masked_softmax" in attnkit.__all__
    assert attnkit.masked_softmax is attnkit.functional.masked_softmax
    result = doctest.testmod(_masked_softmax, verbose=False)
    assert result.attempted >= 1 and result.failed == 0
