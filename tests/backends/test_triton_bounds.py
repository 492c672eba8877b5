"""Every load and store of the triton kernels stays inside its tensors, at a GPU's tiles.

The interpreter's 16 x 16 tiles leave most edge cases of a GPU's 64- and 128-row tiles
unvisited, and an out-of-range access goes unnoticed on the host. Here the kernels run
interpreted with the tile sizes of a GPU architecture (tests/triton_bounds.py), every
access checked against the launch's tensor arguments: the forward, the weights and,
with gradients, the dq and dk/dv kernels, over the mask kinds and a grouped-query
shape. Two masks by default, on two batches of two query heads; under ``slow``,
every mask on a shape with partial tiles at sm_90's sizes, and a sample of masks at
sm_80's (the 257 x 300 shapes of the GPU conformance run were swept once this way:
forward and weights, float16, every mask, sm_90, all in bounds). Each checked call
costs seconds, mostly the interpreter's per-program set-up, so the matrix is no
larger than that.
"""

from __future__ import annotations

from interpreted_triton import interpreted_triton  # first: sets TRITON_INTERPRET=1

# isort: split

from collections.abc import Iterator

import pytest
import torch

import attnkit

from cases import MASKS, check_case, make_case
from triton_bounds import bounds_checked, target_tiles

HALF_SHAPE = (2, 2, 1, 17, 19, 16, 8)  # (B, H, Hk, L, S, E, Ev): grouped heads, L != S
# two 128-row tiles and two 64-key tiles, each with a partial last one (sm_90's sizes)
EDGE_SHAPE = (1, 2, 1, 130, 70, 16, 8)
SAMPLE_MASKS = ("none", "causal_bottom_right", "valid_lens_queries", "document", "prefix_lm")
DEFAULT_MASKS = ("causal_bottom_right", "document")  # a band and per-row data, shifted


@pytest.fixture(scope="module", autouse=True)
def triton_registered() -> Iterator[None]:
    """The backend under the interpreter for this module only (tests/interpreted_triton.py)."""
    with interpreted_triton():
        yield


def _checked_forward_and_backward(
    mask_name: str, shape: tuple[int, ...], dtype: torch.dtype, arch: int, seed: int
) -> None:
    case = make_case("dot", mask_name, shape, seed, dtype)
    with target_tiles(arch), bounds_checked() as seen:
        check_case(case, "triton")  # forward, weights and lse against the oracle
        q, k, v = (t.detach().requires_grad_() for t in (case.q, case.k, case.v))
        out = attnkit.attention(q, k, v, score="dot", mask=case.mask, backend="triton")
        out.float().square().sum().backward()
    assert seen.launches >= 3 and seen.lanes > 0  # the kernels ran, checked
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("mask_name", DEFAULT_MASKS)
def test_kernels_stay_in_bounds_at_sm90_tiles(mask_name: str) -> None:
    _checked_forward_and_backward(mask_name, HALF_SHAPE, torch.float16, 90, 500)


@pytest.mark.slow
@pytest.mark.parametrize("mask_name", MASKS)
def test_kernels_stay_in_bounds_on_every_mask(mask_name: str) -> None:
    _checked_forward_and_backward(mask_name, EDGE_SHAPE, torch.float16, 90, 501)


@pytest.mark.slow
@pytest.mark.parametrize("mask_name", SAMPLE_MASKS)
def test_kernels_stay_in_bounds_at_sm80_tiles(mask_name: str) -> None:
    _checked_forward_and_backward(mask_name, EDGE_SHAPE, torch.float16, 80, 501)


def test_an_access_past_a_tensor_is_caught() -> None:
    """The check itself: with every tensor argument one element shorter than it is, the
    kernel's accesses to the last elements count as outside and raise."""
    q, k, v = (torch.randn(1, 1, 16, 16, dtype=torch.float16) for _ in range(3))
    with bounds_checked() as seen:
        attnkit.attention(q, k, v, score="dot", backend="triton")
    assert seen.launches == 1 and len(seen.ranges) >= 4  # q, k, v, out (and lse)
    with bounds_checked(short_by=2), pytest.raises(Exception, match="outside every tensor"):
        attnkit.attention(q, k, v, score="dot", backend="triton")
