"""``attention_backward`` on each CPU backend for a score whose parameters are plain numbers.

A context-parallel ring differentiates each block with ``attention_backward``. With the
Gaussian formed from the differences q − k (narrow bandwidths, inputs far from 0) the
chunked tiles return a gradient for ``1/2σ²`` too; when σ is a plain number nothing
requires it, and that gradient must be dropped, not handed to autograd (regression:
``RuntimeError: element 2 of tensors does not require grad``, found by the
context-parallel fuzz on a Gaussian ring).
"""

from __future__ import annotations

import pytest
import torch

import attnkit

from tolerance import FLOAT64_REL, assert_close_to_scale


@pytest.mark.parametrize("backend", ["reference", "chunked"])
@pytest.mark.parametrize("learnable", [False, True], ids=["sigma_number", "sigma_learnable"])
def test_gaussian_in_the_differences_form_from_a_given_out_and_lse(
    backend: str, learnable: bool
) -> None:
    gen = torch.Generator().manual_seed(118)
    B, H, L, S, E, Ev = 2, 2, 7, 9, 4, 3
    # keys spread far beyond σ, each query near one key: the dot form would cancel
    k = 10 * torch.randn(B, H, S, E, generator=gen, dtype=torch.float64)
    q = k[..., :L, :] + 0.3 * torch.randn(B, H, L, E, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, S, Ev, generator=gen, dtype=torch.float64)
    score = attnkit.scores.Gaussian(0.7, learnable=learnable).double()
    params = [score.sigma] if learnable else []
    d_out = torch.randn(B, H, L, Ev, generator=gen, dtype=torch.float64)
    d_lse = torch.randn(B, H, L, generator=gen, dtype=torch.float64)

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = attnkit.attention(*leaves, score=score, return_lse=True, backend="reference")
    want = torch.autograd.grad((out * d_out).sum() + (lse * d_lse).sum(), [*leaves, *params])

    reasons = attnkit.explain(q, k, v, score=score, return_lse=True).reasons
    assert any("would cancel" in r for r in reasons["sdpa"]), (
        reasons
    )  # (so the tiles run the differences form)
    dq, dk, dv, dps = attnkit.attention_backward(
        q, k, v, out.detach(), lse.detach(), d_out, d_lse,
        score=score, backend=backend, params=params,
    )  # fmt: skip
    names = ("d_q", "d_k", "d_v", "d_sigma")[: len(want)]
    assert len(dps) == len(params)
    for name, got, ref in zip(names, [dq, dk, dv, *dps], want, strict=True):
        assert got is not None, name
        assert_close_to_scale(got, ref, rel=FLOAT64_REL, what=name)
