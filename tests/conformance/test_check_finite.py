"""``check_finite=False``: the caller guarantees finite inputs, and the non-finite
policy's checks are skipped (scipy's ``check_finite=False``). On finite inputs every
backend gives what the default gives; the plain call then costs the op alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks

from cases import CPU_BACKENDS, make_case


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("score_name", ["scaled_dot", "gaussian", "additive"])
@pytest.mark.parametrize("mask_name", ["none", "causal", "key_padding", "document"])
def test_finite_inputs_give_the_same_result_with_the_checks_off(
    backend: str, score_name: str, mask_name: str
) -> None:
    case = make_case(score_name, mask_name, (2, 3, 3, 6, 7, 5, 4), seed=2)
    kw = {"score": case.score, "mask": case.mask, "backend": backend}
    ex = attnkit.explain(case.q, case.k, case.v, **kw)
    if ex.reasons[backend]:
        pytest.skip(f"{backend} does not run this case")
    leaves = [t.clone().requires_grad_(True) for t in (case.q, case.k, case.v)]
    checked = attnkit.attention(*leaves, **kw)
    unchecked = attnkit.attention(*leaves, check_finite=False, **kw)
    torch.testing.assert_close(unchecked, checked, rtol=0, atol=0)
    g = torch.randn_like(checked)
    for a, b in zip(torch.autograd.grad(checked, leaves, g),
                    torch.autograd.grad(unchecked, leaves, g), strict=True):  # fmt: skip
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_the_default_keeps_the_policy_and_the_opt_out_hands_the_inputs_to_the_kernel() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
    v[0, 0, 4] = float("nan")  # seen only by the last query under a causal mask
    out = attnkit.attention(q, k, v, mask=masks.causal())
    assert torch.isfinite(out[0, 0, :4]).all() and torch.isnan(out[0, 0, 4]).all()
    raw = attnkit.attention(q, k, v, mask=masks.causal(), check_finite=False)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(
        raw, want, equal_nan=True, rtol=0, atol=0
    )  # exactly what the kernel gives


def test_check_finite_must_be_a_bool() -> None:
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(TypeError, match="check_finite"):
        attnkit.attention(q, q, q, check_finite="no")  # type: ignore[arg-type]
