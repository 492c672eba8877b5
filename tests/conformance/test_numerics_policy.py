"""Half precision for every score, and the non-finite policy, on every backend.

Policy: a NaN (or inf) in a position that is used propagates to the rows that use
it; a position masked out never contributes, whatever it holds.
"""

from __future__ import annotations

import copy

import pytest
import torch

import attnkit
from attnkit import masks, scores

from cases import SCORES, make_case, plain_math
from tolerance import FLOAT16_REL, FLOAT64_REL, assert_close_to_scale, plain_math_rel

HALF = (torch.float16, torch.bfloat16)


def _can_run(backend: str, **kw: object) -> bool:
    ex = attnkit.explain(**kw, backend=backend)  # type: ignore[arg-type]
    return not ex.reasons[backend]


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("score_name", SCORES)
def test_half_precision_stays_within_twice_plain_math(
    score_name: str, dtype: torch.dtype, device: str, backend: str
) -> None:
    """Every score: error against float64 at most 2x that of plain same-dtype math, and
    the output does not change when the weights are asked for too."""
    case = make_case(score_name, "causal_and_padding", (2, 4, 2, 9, 11, 8, 6), 5, device=device)
    half = copy.copy(case)
    half.q, half.k, half.v = (t.to(dtype) for t in (case.q, case.k, case.v))
    half.score = copy.deepcopy(case.score).to(dtype)
    kw = {"query": half.q, "key": half.k, "value": half.v, "score": half.score, "mask": half.mask}
    if not _can_run(backend, **kw):
        pytest.skip(f"{backend} does not run {score_name} in {dtype}")
    exact = copy.copy(half)  # the same rounded inputs, in float64
    exact.q, exact.k, exact.v = (t.double() for t in (half.q, half.k, half.v))
    exact.score = copy.deepcopy(half.score).double()
    ref = attnkit.attention(exact.q, exact.k, exact.v, score=exact.score, mask=exact.mask,
                            backend="reference")  # fmt: skip
    plain, _, _ = plain_math(half)
    out = attnkit.attention(half.q, half.k, half.v, score=half.score, mask=half.mask,
                            backend=backend)  # fmt: skip
    alive = ref.abs().sum(-1, keepdim=True) > 0
    rel = plain_math_rel(plain.double() * alive, ref * alive)
    assert_close_to_scale(out.double() * alive, ref * alive, rel=rel, what="output")
    if _can_run(backend, **kw, return_weights=True):
        again, _ = attnkit.attention(half.q, half.k, half.v, score=half.score, mask=half.mask,
                                     return_weights=True, backend=backend)  # fmt: skip
        assert torch.equal(again, out)


def test_float16_gaussian_keeps_every_key_when_the_key_term_overflows(backend: str) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 16, 64, generator=g) * 300
    k = q + torch.randn(1, 1, 16, 64, generator=g)
    v = torch.randn(1, 1, 16, 64, generator=g)
    score = scores.Gaussian(300.0)
    if not _can_run(backend, query=q.half(), key=k.half(), value=v.half(), score=score):
        pytest.skip(f"{backend} does not run float16")
    out = attnkit.attention(q.half(), k.half(), v.half(), score=score, backend=backend)
    ref = attnkit.attention(q.double(), k.double(), v.double(), score=score, backend="reference")
    assert not (out == 0).all(-1).any()
    assert_close_to_scale(out, ref, rel=FLOAT16_REL)


def test_a_finite_bias_stays_finite_in_float16(backend: str) -> None:
    """A row of -1e9 biases is the uniform average (TensorFlow's convention), not 0."""
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 4, 8, generator=g).half(), torch.randn(1, 1, 6, 8, generator=g).half()
    v = torch.randn(1, 1, 6, 8, generator=g).half()
    bias = torch.zeros(1, 1, 4, 6)
    bias[..., 0, :] = -1e9
    if not _can_run(backend, query=q, key=k, value=v, mask=masks.bias(bias)):
        pytest.skip(f"{backend} does not run float16")
    out = attnkit.attention(q, k, v, mask=masks.bias(bias), backend=backend)
    assert_close_to_scale(out[0, 0, 0], v[0, 0].float().mean(0), rel=FLOAT16_REL)


B, H, L, S, E = 2, 2, 6, 9, 4


def _policy_cases() -> list[tuple[str, masks.Mask | None, str, int]]:
    keep = torch.ones(B, 1, L, S, dtype=torch.bool)
    keep[..., 3] = False
    return [
        ("value masked by keep", masks.keep(keep), "v", 3),
        ("key masked by keep", masks.keep(keep), "k", 3),
        ("value past valid_lens", masks.valid_lens(torch.tensor([5, 8])), "v", 8),
        (
            "value of a padded key",
            masks.key_padding(torch.arange(S) == 8).expand(B, S)
            if False
            else masks.key_padding((torch.arange(S) == 8).expand(B, S)),
            "v",
            8,
        ),
        ("future value under causal", masks.causal(), "v", 8),
        ("future key under causal", masks.causal(), "k", 8),
        ("key outside a window", masks.window(1, 0), "k", 0),
        ("key behind a -inf bias", masks.bias(torch.where(keep, 0.0, float("-inf"))), "k", 3),
        ("used value", None, "v", 2),
        ("used query", None, "q", 1),
    ]


@pytest.mark.parametrize(
    "name, mask, where, pos", _policy_cases(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_nan_propagates_where_used_and_never_from_masked_positions(
    name: str, mask: masks.Mask | None, where: str, pos: int, backend: str
) -> None:
    g = torch.Generator().manual_seed(2)
    t = {n: torch.randn(B, H, m, E, generator=g, dtype=torch.float64) for n, m in
         (("q", L), ("k", S), ("v", S))}  # fmt: skip
    clean = {n: x.clone() for n, x in t.items()}
    t[where][..., pos, :] = float("nan")
    clean[where][..., pos, :] = 0.0
    out = attnkit.attention(t["q"], t["k"], t["v"], mask=mask, backend=backend)
    ref = attnkit.attention(clean["q"], clean["k"], clean["v"], mask=mask, backend="reference")
    if where == "q":
        uses = torch.zeros(B, H, L, dtype=torch.bool)
        uses[..., pos] = True
    else:
        dense = (
            mask.to_dense(L, S, (B, H)) if mask is not None else torch.ones(L, S, dtype=torch.bool)
        )
        dense = dense.expand(B, H, L, S)
        uses = dense[..., pos] if dense.dtype == torch.bool else dense[..., pos] > float("-inf")
    assert out[uses].isnan().all(), f"{name}: a row that uses the NaN must be NaN"
    assert_close_to_scale(out[~uses], ref[~uses], rel=FLOAT64_REL)
