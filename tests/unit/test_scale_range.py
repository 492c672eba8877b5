"""A float ``scale`` whose logits would overflow is refused before any compute (issue 19,
row 18: ``scale=1e38`` gave NaN on every backend).

- Above the ceiling (the square root of the compute dtype's range: about 1.8e19 for
  float32 logits, which half inputs use too) every call is refused, on every path:
  CPU, accelerator semantics (no host reads) and torch.compile.
- Below it, above 1e4, where the inputs can be read for free the largest logit is
  bounded from them; a scale that would overflow is refused with the largest usable
  one, and a scale just under that runs and matches the float64 reference.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch

import attnkit
from attnkit import masks, scores
from attnkit._host import device_semantics

from tolerance import FLOAT64_REL, assert_close_to_scale

SCORES = ("dot", "scaled_dot", "gaussian", "bilinear", "additive")
BACKENDS = ("sdpa", "chunked", "reference")


def _score(name: str, dtype: torch.dtype) -> scores.Score | str:
    torch.manual_seed(3)
    if name == "bilinear":
        return scores.Bilinear(4, 4, dtype=dtype)
    if name == "additive":
        return scores.Additive(4, 4, 6, dtype=dtype)
    return name


def _inputs(dtype: torch.dtype, magnitude: float = 1.0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 2, 5, 4, generator=g, dtype=torch.float64) * magnitude
    k = torch.randn(2, 2, 6, 4, generator=g, dtype=torch.float64) * magnitude
    v = torch.randn(2, 2, 6, 3, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _runs(backend: str, score: object) -> bool:
    return not (backend == "sdpa" and score == "additive")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("score_name", SCORES)
def test_scale_1e38_is_refused_on_every_backend(score_name: str, dtype: torch.dtype) -> None:
    """The issue's call: unit-size inputs, ``scale=1e38``: a clear error naming the
    largest scale, on every backend, readable or not (no NaN output)."""
    q, k, v = _inputs(dtype)
    score = _score(score_name, dtype)
    for backend in BACKENDS:
        if not _runs(backend, score_name):
            continue
        for strict in (False, True):
            with pytest.raises(
                ValueError, match=r"scale: expected at most 1\.84e\+19 .*got 1e\+38"
            ):
                if strict:
                    with device_semantics():
                        attnkit.attention(q, k, v, score=score, scale=1e38, backend=backend)
                else:
                    attnkit.attention(q, k, v, score=score, scale=1e38, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_per_head_scale_is_checked_as_a_float_scale(backend: str) -> None:
    """A (H,) tensor scale of 1e38 gave NaN outputs where a float 1e38 is refused: where
    it can be read, its largest multiplier now goes through the float scale's checks."""
    q, k, v = _inputs(torch.float32)
    with pytest.raises(ValueError, match=r"scale: expected at most 1\.84e\+19 .*got 1e\+38"):
        attnkit.attention(q, k, v, scale=torch.tensor([1.0, 1e38]), backend=backend)
    with pytest.raises(ValueError, match=r"scale: 1e\+18 would overflow the logits"):
        attnkit.attention(q * 1e10, k * 1e10, v, scale=torch.full((2,), 1e18), backend=backend)
    fine = attnkit.attention(q, k, v, scale=torch.tensor([0.5, 2.0]), backend=backend)
    assert torch.isfinite(fine).all()


def test_float64_takes_the_scale_its_range_allows() -> None:
    """float64 logits have room for ``scale=1e38`` with unit-size inputs: it runs, finite
    (hard attention), on every backend; 1e160 is past float64's ceiling."""
    q, k, v = _inputs(torch.float64)
    want = attnkit.attention(q, k, v, scale=1e38, backend="reference")
    assert torch.isfinite(want).all()
    for backend in ("sdpa", "chunked"):
        assert_close_to_scale(
            attnkit.attention(q, k, v, scale=1e38, backend=backend), want, rel=FLOAT64_REL
        )
    with pytest.raises(ValueError, match=r"at most 1\.34e\+154"):
        attnkit.attention(q, k, v, scale=1e160)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("score_name", SCORES)
def test_overflowing_scale_names_the_largest_usable_one(
    score_name: str, dtype: torch.dtype
) -> None:
    """Large inputs and a scale under the ceiling whose logits overflow: refused on every
    backend with the largest usable scale for these inputs; 0.9 times that runs on every
    backend, finite and equal to the float64 reference."""
    magnitude = 1e12 if dtype != torch.float64 else 1e140
    scale = 1e16 if dtype != torch.float64 else 1e150
    q, k, v = _inputs(dtype, magnitude)
    score = _score(score_name, dtype)
    if score_name == "additive":  # its logits are bounded by sum |w_v|: make that large
        with torch.no_grad():
            score.w_v.weight.fill_(1e30 if dtype != torch.float64 else 1e300)  # type: ignore[union-attr]
    largest = None
    for backend in BACKENDS:
        if not _runs(backend, score_name):
            continue
        with pytest.raises(ValueError, match="largest usable scale for these inputs") as err:
            attnkit.attention(q, k, v, score=score, scale=scale, backend=backend)
        found = re.search(r"is about ([0-9.e+-]+)", str(err.value))
        assert found, str(err.value)
        largest = float(found.group(1))
    assert largest is not None and largest < scale
    usable = 0.9 * largest
    s64 = score if isinstance(score, str) else copy.deepcopy(score).double()
    want = attnkit.attention(
        q.double(), k.double(), v.double(), score=s64, scale=usable, backend="reference"
    )
    for backend in BACKENDS:
        if score_name == "gaussian" and backend == "sdpa":  # many bandwidths apart at this
            reasons = attnkit.explain(q, k, v, score=score, scale=usable).reasons[backend]
            assert any("would cancel" in r for r in reasons), reasons  # scale: declined
            continue
        if _runs(backend, score_name):
            got = attnkit.attention(q, k, v, score=score, scale=usable, backend=backend)
            assert torch.isfinite(got).all(), backend
            if score_name != "additive":  # (its huge w_v leaves the choice of key to rounding)
                assert_close_to_scale(got, want, what=backend)


def test_gaussian_scale_that_empties_every_row_is_refused() -> None:
    """A scale that sends every Gaussian logit to -inf would make every row look empty
    (output 0): refused instead."""
    q, k, v = _inputs(torch.float32, 1e9)
    with pytest.raises(ValueError, match="largest usable scale"):
        attnkit.attention(q, k, v, score="gaussian", scale=1e19, mask=masks.causal())


def test_repeated_plain_calls_are_checked_with_their_own_values() -> None:
    """A plain call is planned (validated once per shape); a scale above 1e4 is not, so
    new inputs that the same scale would overflow are still refused."""
    small = _inputs(torch.float32)
    attnkit.attention(*small, scale=1e8)
    attnkit.attention(*small, scale=1e8)
    large = _inputs(torch.float32, 1e14)
    with pytest.raises(ValueError, match="largest usable scale"):
        attnkit.attention(*large, scale=1e8)


@pytest.mark.slow  # one compilation
@pytest.mark.torch_feature("compile")
def test_ceiling_holds_under_torch_compile() -> None:
    q, k, v = _inputs(torch.float32)
    compiled = torch.compile(lambda q, k, v: attnkit.attention(q, k, v, scale=1e38))
    with pytest.raises(ValueError, match="scale: expected at most"):
        compiled(q, k, v)


def test_a_scores_own_scale_is_checked_as_the_calls_is() -> None:
    # scores.ScaledDot(scale=1e300) skipped the check that attention(scale=1e300) makes,
    # and the output was NaN
    q = torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"^score: the scale of 'scaled_dot': expected at most"):
        attnkit.attention(q, q, q, score=scores.ScaledDot(1e300))
    with pytest.raises(
        ValueError, match=r"^score: the scale of 'scaled_dot': 1e\+18 would overflow"
    ):
        attnkit.attention(q * 1e9, q * 1e9, q, score=scores.ScaledDot(1e18))
