"""Half precision: logits up to 1e4 and -inf biases give no NaN and no inf;
softmax accumulates in float32, weights and lse come back in float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnkit
from attnkit import masks

from cases import np_of
from reference import oracle


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("score", ["dot", "gaussian"])
def test_huge_logits_and_neg_inf_bias(backend: str, dtype: torch.dtype, score: str) -> None:
    gen = torch.Generator().manual_seed(31)
    B, H, L, S, E = 2, 2, 9, 13, 4
    # dot: |q·k| reaches ~1e4; gaussian: distances of ~1e2 give logits of ~-1e4.
    q = (torch.randn(B, H, L, E, generator=gen) * 50).to(dtype)
    k = (torch.randn(B, H, S, E, generator=gen) * 50).to(dtype)
    v = torch.randn(B, H, S, 3, generator=gen).to(dtype)
    bias = torch.zeros(B, 1, L, S)
    bias[:, :, :, ::3] = float("-inf")
    bias[0, :, 2] = float("-inf")  # a fully masked row
    mask = masks.bias(bias.to(dtype))
    ex = attnkit.explain(q, k, v, score=score, mask=mask, return_weights=True, return_lse=True)
    want = not ex.reasons[backend]
    res = attnkit.attention(
        q, k, v, score=score, mask=mask, return_weights=want, return_lse=want, backend=backend
    )
    res = res if isinstance(res, tuple) else (res,)
    out = res[0]
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert not out[0, :, 2].any()
    logits_max = float((q.float() @ k.float().transpose(-1, -2)).abs().max())
    if score == "dot":
        assert logits_max > 5e3
    ref_out, ref_w, ref_lse = oracle(
        np_of(q),
        np_of(k),
        np_of(v),
        score=(score, 1.0) if score == "gaussian" else (score,),
        mask=("bias", bias.numpy()),
        scale=1.0,
    )
    # One-hot-like softmax: the output picks (almost) one value row; half rounding of v only.
    np.testing.assert_allclose(np_of(out), ref_out, atol=0.05, rtol=0.02)
    if want:
        w, lse = res[1], res[2]
        assert w.dtype == torch.float32 and lse.dtype == torch.float32
        assert torch.isfinite(w).all() and not w[0, :, 2].any()
        assert torch.isneginf(lse[0, :, 2]).all()
        finite = torch.isfinite(lse)
        assert finite.sum() == lse.numel() - lse[0, :, 2].numel()
        np.testing.assert_allclose(np_of(w), ref_w, atol=0.02)
        # Logits of ~1e3..1e4 from half inputs: a few units of error is the half rounding
        # of the inputs themselves (plain half math does no better).
        np.testing.assert_allclose(np_of(lse)[finite.numpy()], ref_lse[finite.numpy()], rtol=1e-2)
