"""Every backend's backward from a given (out, lse) (``Backend.backward``): for a whole
call it equals autograd through the reference; for a call split into two key blocks,
the blocks' gradients (each given the global out and lse) add up to the whole call's,
as a context-parallel ring uses them."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import _lse
from attnkit._inputs import validate_inputs
from attnkit.backends.records import BackwardCall, OutputGrads

from cases import make_case
from tolerance import FLOAT64_REL, assert_close_to_scale

CASES = [
    ("scaled_dot", "none"),
    ("scaled_dot", "causal"),
    ("gaussian", "key_padding"),
    ("bilinear", "window"),
    ("additive", "document"),
    ("dot", "prefix_lm"),
    ("scaled_dot", "bias"),
]


def _reference(case, dl: bool):  # type: ignore[no-untyped-def]
    leaves = [t.clone().requires_grad_(True) for t in (case.q, case.k, case.v)]
    params = [p for p in case.score.parameters()]
    out, lse = attnkit.attention(*leaves, score=case.score, mask=case.mask, return_lse=True,
                                 backend="reference")  # fmt: skip
    g = torch.Generator().manual_seed(2)
    d_out = torch.randn(out.shape, generator=g, dtype=out.dtype)
    d_lse = torch.randn(lse.shape, generator=g, dtype=lse.dtype) if dl else None
    live = torch.isfinite(lse)
    outs = [out] + ([torch.where(live, lse, 0.0)] if dl else [])
    grads_in = [d_out] + ([d_lse] if dl else [])
    ref = torch.autograd.grad(outs, [*leaves, *params], grads_in, allow_unused=True)
    return out.detach(), lse.detach(), d_out, d_lse, ref, params


@pytest.mark.parametrize("with_d_lse", [False, True])
@pytest.mark.parametrize("score_name, mask_name", CASES)
@pytest.mark.parametrize("backend", ["sdpa", "chunked", "reference"])
def test_backward_from_the_calls_own_lse_matches_autograd(
    backend: str, score_name: str, mask_name: str, with_d_lse: bool
) -> None:
    case = make_case(score_name, mask_name, (2, 4, 2, 6, 6, 5, 3), seed=3, dtype=torch.float64)
    out, lse, d_out, d_lse, ref, params = _reference(case, with_d_lse)
    inputs = validate_inputs(case.q, case.k, case.v, score=case.score, mask=case.mask)
    be = attnkit.get_backend(backend)
    dq, dk, dv, dp = be.backward(BackwardCall(inputs, OutputGrads(out, lse, d_out, d_lse), params))
    for got, want in zip([dq, dk, dv, *dp], ref, strict=True):
        assert_close_to_scale(got, torch.zeros_like(got) if want is None else want, rel=FLOAT64_REL)


@pytest.mark.parametrize("score_name, mask_name", CASES)
@pytest.mark.parametrize("backend", ["sdpa", "chunked", "reference"])
def test_key_blocks_given_the_global_lse_add_up_to_the_whole(
    backend: str, score_name: str, mask_name: str
) -> None:
    case = make_case(score_name, mask_name, (2, 4, 2, 6, 6, 5, 3), seed=4, dtype=torch.float64)
    out, lse, d_out, d_lse, ref, params = _reference(case, True)
    S, cut = case.k.shape[-2], 4
    be = attnkit.get_backend(backend)
    dq = torch.zeros_like(case.q)
    dk_parts, dv_parts = [], []
    dps = [torch.zeros_like(p) for p in params]
    for k0, k1 in ((0, cut), (cut, S)):
        mask = None if case.mask is None else case.mask
        if isinstance(mask, torch.Tensor):
            mask = attnkit.masks.bias(mask)
        if mask is not None:
            mask = mask.shard(0, k0, case.q.shape[-2], k1 - k0, case.q.shape[-2], S)
        k, v = case.k[..., k0:k1, :], case.v[..., k0:k1, :]
        inputs = validate_inputs(case.q, k, v, score=case.score, mask=mask)
        gq, gk, gv, gp = be.backward(
            BackwardCall(inputs, OutputGrads(out, lse, d_out, d_lse), params)
        )
        dq += gq
        dk_parts.append(gk)
        dv_parts.append(gv)
        for acc, x in zip(dps, gp, strict=True):
            if x is not None:
                acc += x
    got = [dq, torch.cat(dk_parts, -2), torch.cat(dv_parts, -2), *dps]
    for a, want in zip(got, ref, strict=True):
        assert_close_to_scale(a, torch.zeros_like(a) if want is None else want, rel=FLOAT64_REL)
    assert _lse  # the merge identity these gradients rest on lives in attnkit._lse
