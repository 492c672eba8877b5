"""The triton backend at the edges of its arguments' ranges, under the interpreter.

- Band bounds (window sides, causal offsets) just under 2**31 fit int32, so Triton typed
  them int32 and their sums with row indices wrapped: every row came back 0 (lse -inf)
  with nonzero value gradients. The host now holds each bound to [-L, S].
- A Gaussian whose dot form has terms beyond DOT_FORM_GRAD_TERMS gave rounding noise
  (1e5x the true gradient) where dq and dk vanish; triton now declines it, as sdpa hands
  such gradients to chunked's tiles.
"""

from __future__ import annotations

from interpreted_triton import interpreted_triton  # first: sets TRITON_INTERPRET=1

# isort: split

from collections.abc import Iterator

import pytest
import torch

import attnkit
from attnkit import masks, scores

from tolerance import (
    FLOAT32_CALL_REL,
    FLOAT32_GRAD_REL,
    assert_close_to_scale,
)


@pytest.fixture(scope="module", autouse=True)
def triton_registered() -> Iterator[None]:
    """The backend under the interpreter for this module only (tests/interpreted_triton.py)."""
    with interpreted_triton():
        yield


NEAR = 2**31 - 3  # fits int32; its sums with row indices do not


BANDS = {
    "window_right": masks.window(2, NEAR),
    "window_open": masks.window(None, NEAR + 2),
    "causal_offset": masks.causal(q_offset=NEAR),
    "window_left": masks.window(NEAR, 0),
}


@pytest.mark.parametrize("mask", list(BANDS.values()), ids=list(BANDS))
def test_band_bounds_near_2_31_keep_their_band(mask: masks.Mask) -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 20, n, generator=g, dtype=torch.float64) for n in (4, 4, 3))
    want = {}
    for backend, dtype in (("reference", torch.float64), ("triton", torch.float32)):
        qq, kk, vv = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
        out, lse = attnkit.attention(qq, kk, vv, mask=mask, return_lse=True, backend=backend)
        out.backward(torch.ones_like(out))
        got = (out, lse, qq.grad, kk.grad, vv.grad)
        if backend == "reference":
            want = dict(enumerate(got))
            continue
        for i, name in enumerate(("out", "lse", "dq", "dk", "dv")):
            assert_close_to_scale(got[i], want[i], rel=FLOAT32_GRAD_REL, what=name)


def test_a_gaussian_with_large_dot_form_terms_and_gradients_is_declined() -> None:
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(5, 5, generator=g) * 30 for _ in "qk")  # terms of thousands of logits
    v = torch.randn(5, 4, generator=g)
    q.requires_grad_()
    with pytest.raises(attnkit.BackendNotSupportedError, match="dot form has terms of"):
        attnkit.attention(q, k, v, score=scores.Gaussian(1.0), backend="triton")
    with torch.no_grad():  # without a gradient the forward is exact: it runs
        out = attnkit.attention(q, k, v, score=scores.Gaussian(1.0), backend="triton")
        want = attnkit.attention(q.double(), k.double(), v.double(), score=scores.Gaussian(1.0))
    assert_close_to_scale(out, want, rel=FLOAT32_CALL_REL)


def test_more_rows_than_a_grid_axis_holds_are_declined() -> None:
    """The kernels' grids hold the (batch × head) rows on an axis CUDA limits to 65535
    blocks: a call with more is declined (by its shapes alone), not launched to fail."""
    q = torch.zeros(1, 1, 1, 4).expand(65536, 1, 2, 4)  # (B, H, L, E), no memory
    reasons = attnkit.explain(q, q, q, backend="triton").reasons["triton"]
    assert any("65536 (batch × head) rows" in r for r in reasons), reasons
    fits = torch.zeros(1, 1, 1, 4).expand(65535, 1, 2, 4)
    assert not any("rows" in r for r in attnkit.explain(fits, fits, fits).reasons["triton"])
