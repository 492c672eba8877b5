"""Half precision on the triton backend under the interpreter.

- bfloat16 results are rounded to nearest even, as a GPU rounds them: Triton's
  interpreter truncates float32 to bfloat16, a one-sided error that made interpreted
  Gaussian and Bilinear results 2.8-265x less exact than plain bfloat16 math; the
  kernels round on the bits first.
- Cases the fuzz found beyond the suite's rule (at most 2x the error of plain
  same-dtype math) hold it.
- Every score and every mask kind in float16 and in bfloat16, at one small shape
  (the conformance suite leaves triton out on the CPU: the interpreter is slow).
"""

from __future__ import annotations

from interpreted_triton import interpreted_triton  # first: sets TRITON_INTERPRET=1

# isort: split

from collections.abc import Iterator

import pytest
import torch

import attnkit

from cases import MASKS, SCORES, check_case, make_case
from tolerance import FLOAT32_CALL_REL, assert_close_to_scale


@pytest.fixture(scope="module", autouse=True)
def triton_registered() -> Iterator[None]:
    """The backend under the interpreter for this module only (tests/interpreted_triton.py)."""
    with interpreted_triton():
        yield


def test_bfloat16_output_is_rounded_to_nearest_even() -> None:
    """Equal logits: every weight is exactly 1/S and the float32 output is the mean of
    the values (exact sums: values are multiples of 1/8); its bfloat16 rounding must be
    torch's (round to nearest even), which truncation misses for about half of them."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 5, 16, generator=gen).to(torch.bfloat16)
    k = torch.zeros(2, 2, 40, 16, dtype=torch.bfloat16)
    v = (torch.randint(-64, 64, (2, 2, 40, 32), generator=gen) / 8).to(torch.bfloat16)
    out = attnkit.attention(q, k, v, score="dot", backend="triton")
    want = (v.float().sum(dim=-2, keepdim=True) / 40).to(torch.bfloat16).expand_as(out)
    assert (want.float() != v.float().sum(dim=-2, keepdim=True).div(40)).any()  # rounding
    torch.testing.assert_close(out, want, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("score", "mask", "shape", "magnitude", "seed"),
    [  # (B, H, Hk, L, S, E, Ev); before the fix: 3.4x, 2.8x, 266x, 3.6x, 2.9x, 9.6x
        ("gaussian", "causal_bottom_right", (2, 6, 3, 8, 2, 15, 2), 0.25, 37642),
        ("bilinear", "keep_heads", (1, 2, 1, 10, 21, 20, 6), 0.25, 33429),
        ("bilinear", "valid_lens_queries", (2, 3, 3, 15, 4, 17, 6), 3.0, 53824),
        ("bilinear", "block", (1, 2, 1, 2, 7, 12, 3), 0.25, 64273),
        ("gaussian", "tf_lookahead", (1, 2, 1, 12, 8, 21, 5), 0.25, 35297),
        ("gaussian", "valid_lens_2d", (1, 2, 1, 16, 9, 20, 1), 3.0, 34373),
    ],
)
def test_bfloat16_cases_the_fuzz_found_hold_twice_plain_math(
    score: str, mask: str, shape: tuple[int, ...], magnitude: float, seed: int
) -> None:
    case = make_case(score, mask, shape, seed, torch.bfloat16)
    case.q = (case.q * magnitude).to(torch.bfloat16)
    case.k = (case.k * magnitude).to(torch.bfloat16)
    check_case(case, "triton")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.slow
def test_every_score_and_mask_kind_in_half_precision(dtype: torch.dtype) -> None:
    """Each mask kind once per dtype, the scores taking turns (every score meets
    several mask kinds in each dtype)."""
    offset = 0 if dtype == torch.float16 else 2
    for n, mask in enumerate(MASKS):
        score = SCORES[(n + offset) % len(SCORES)]
        check_case(make_case(score, mask, (1, 2, 1, 3, 17, 12, 8), 700 + n, dtype), "triton")


@pytest.mark.parametrize("fill", [torch.finfo(torch.float32).min, -2.5e38, -1e38])
def test_a_row_of_the_lowest_finite_bias_is_a_uniform_row(fill: float) -> None:
    """A bias row of finfo(float32).min (an additive padding mask) is finite: the row
    attends to every key uniformly, as on the other backends. In the kernels' log2 units
    such a value overflowed to -inf, and the row read as masked (output 0)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, n, 8, generator=gen) for n in (4, 16, 16))
    bias = torch.zeros(4, 16)
    bias[3] = fill
    want = attnkit.attention(q, k, v, mask=attnkit.masks.bias(bias), backend="reference")
    got = attnkit.attention(q, k, v, mask=attnkit.masks.bias(bias), backend="triton")
    assert_close_to_scale(got, want, rel=FLOAT32_CALL_REL)
    assert_close_to_scale(got[0, 0, 3], v[0, 0].mean(0), rel=FLOAT32_CALL_REL)


@pytest.mark.parametrize("fill", [torch.finfo(torch.float32).min, -1e30])
def test_a_row_of_a_far_finite_bias_with_a_gradient_is_kept_off_the_kernels(fill: float) -> None:
    """Such a row's lse, -1e30 + log S, is -1e30 in float32: the backward kernels'
    ``exp(s - lse)`` gave each of its keys weight 1, not 1/S (gradients S times too
    large). With a gradient, triton declines the call by name and the next backend
    runs it (attnkit._far_rows); without one, triton runs it."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, n, 8, generator=gen).requires_grad_() for n in (4, 16, 16))
    bias = torch.randn(4, 16, generator=gen)
    bias[1] = fill
    mask = attnkit.masks.bias(bias)
    with pytest.raises(attnkit.BackendNotSupportedError, match=r"triton: .*far from 0"):
        attnkit.attention(q, k, v, mask=mask, backend="triton")
    assert (
        attnkit.explain(q, k, v, mask=mask, backend=["triton", "reference"]).chosen == "reference"
    )
    with torch.no_grad():
        assert attnkit.explain(q, k, v, mask=mask, backend="triton").chosen == "triton"
        # head-mean weights come from exp(s - lse) too: each of the row's keys got 1
        mean = attnkit.explain(
            q, k, v, mask=mask, return_weights="mean", backend=["triton", "reference"]
        )
        assert mean.chosen == "reference"
        _, w = attnkit.attention(q, k, v, mask=mask, return_weights="mean",
                                 backend=["triton", "reference"])  # fmt: skip
        assert_close_to_scale(w[0, 1], torch.full((16,), 1 / 16), rel=FLOAT32_CALL_REL)
