"""``Score.cast``: a score's parameters in another dtype for one call, never the module."""

from __future__ import annotations

import copy

import torch

import attnkit

from tolerance import FLOAT32_ULPS_REL, assert_close_to_scale


def test_cast_is_a_shallow_copy_whose_gradients_reach_the_module() -> None:
    score = attnkit.scores.Additive(4, 3, 5)
    assert score.cast(torch.float32) is score  # nothing to cast
    wide = score.cast(torch.float64)
    assert wide is not score
    assert {p.dtype for p in wide.parameters()} == {torch.float64}
    assert {p.dtype for p in score.parameters()} == {torch.float32}  # the module unchanged
    q, k = torch.randn(2, 6, 4, dtype=torch.float64), torch.randn(2, 7, 3, dtype=torch.float64)
    wide.logits(q, k).sum().backward()
    grad = score.W_q.weight.grad
    assert grad is not None and grad.dtype == torch.float32
    twin = copy.deepcopy(score).double()  # the same logits on a float64 copy of the module
    (want,) = torch.autograd.grad(twin.logits(q, k).sum(), twin.W_q.weight)
    assert_close_to_scale(grad, want.float(), rel=FLOAT32_ULPS_REL)


def test_cast_keeps_buffers() -> None:
    """A fixed Gaussian bandwidth is a float64 buffer; the score casts it where used."""
    score = attnkit.scores.Gaussian(0.5)
    assert score.cast(torch.float16) is score
    assert score.sigma.dtype == torch.float64


def test_feature_terms_sum_to_the_logits() -> None:
    """Each score's per-feature terms (the neuron view's) sum to its own logits."""
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 5, 4, generator=g), torch.randn(2, 6, 4, generator=g)
    for score in (
        attnkit.scores.Dot(),
        attnkit.scores.ScaledDot(),
        attnkit.scores.Bilinear(4, 4),
        attnkit.scores.Additive(4, 4, 7),
        attnkit.scores.Gaussian(1.3),
    ):
        t = score.feature_terms(q, k)
        a, b = t.query.unsqueeze(-2), t.key.unsqueeze(-3)  # (2, 5, 1, D), (2, 1, 6, D)
        if t.kind == "dot":
            per = a * b
        elif t.kind == "gaussian":
            assert t.inv_two_var is not None
            per = -((a - b) ** 2) * t.inv_two_var
        else:
            assert t.kind == "additive" and t.weights is not None
            per = torch.tanh(a + b) * t.weights
        assert_close_to_scale(
            per.sum(-1), score.logits(q, k), rel=FLOAT32_ULPS_REL, what=score.name
        )
