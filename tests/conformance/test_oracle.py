"""Every score × every mask kind × every backend against the float64 oracle.

Tolerance rule: a backend's error may be at most 2× the error of plain
same-dtype math (a user's hand-written softmax(QKᵀ)V in float32), with a
float32 backstop of 1e-5 relative to the largest reference value.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnkit
from attnkit import BackendNotSupportedError

from cases import (
    MASKS,
    SCORES,
    capabilities,
    check_case,
    make_case,
    matrix_backends,
    np_of,
    refused,
    shapes_for,
)
from reference import oracle
from tolerance import FLOAT64_REL, assert_close_to_scale

CPU_BACKENDS = matrix_backends("cpu")


@pytest.mark.pairwise(unsupported=refused)
@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("score_name", SCORES)
def test_matches_oracle(score_name: str, mask_name: str, device: str, backend: str) -> None:
    for n, shape in enumerate(shapes_for(device)):
        case = make_case(score_name, mask_name, shape, seed=1000 * n + 7, device=device)
        check_case(case, backend)


@pytest.mark.pairwise(unsupported=refused)
@pytest.mark.parametrize("where", ["inside", "made_inside"])
@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("score_name", ["scaled_dot", "additive"])  # no parameters; parameters
def test_matches_oracle_under_inference_mode(
    score_name: str, mask_name: str, where: str, device: str, backend: str
) -> None:
    """Serving code runs under ``torch.inference_mode()``: a call inside it, and inputs,
    scores and masks made inside it used outside it, hold to the oracle (forward only,
    one small shape)."""
    with torch.inference_mode():
        case = make_case(score_name, mask_name, shapes_for(device)[0], seed=31, device=device)
        assert case.q.is_inference()
        if where == "inside":
            check_case(case, backend)
    if where == "made_inside":
        check_case(case, backend)


@pytest.mark.parametrize("score_name", SCORES)
def test_float64_matches_oracle_tightly(score_name: str, device: str, backend: str) -> None:
    case = make_case(
        score_name, "causal_and_padding", (2, 4, 2, 9, 11, 6, 5), 3, torch.float64, device=device
    )
    runs, _, _ = capabilities(case, backend)
    if not runs:
        # The very call refused, with the reasons explain gives on this device (float64 on
        # triton, a key-padding mask's lengths read on the host on CUDA, a score on sdpa).
        kw = {"score": case.score, "mask": case.mask, "backend": backend}
        reasons = attnkit.explain(case.q, case.k, case.v, **kw).reasons[backend]
        assert reasons
        detail = re.escape(f"{backend}: {', '.join(reasons)}")
        with pytest.raises(BackendNotSupportedError, match=detail):
            attnkit.attention(case.q, case.k, case.v, **kw)
        return
    out = attnkit.attention(
        case.q, case.k, case.v, score=case.score, mask=case.mask, backend=backend
    )
    ref, _, _ = oracle(
        np_of(case.q), np_of(case.k), np_of(case.v), score=case.score_spec, mask=case.mask_spec
    )
    assert_close_to_scale(np_of(out), ref, rel=FLOAT64_REL)


def test_broadcast_batch_dims(backend: str) -> None:
    """query (B, H, L, E) with key/value (1, S, E): leading dims broadcast."""
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(3, 2, 6, 4, generator=gen)
    k = torch.randn(1, 5, 4, generator=gen)
    v = torch.randn(1, 5, 3, generator=gen)
    out = attnkit.attention(q, k, v, backend=backend)
    ref, _, _ = oracle(np_of(q), np_of(k), np_of(v))
    assert out.shape == (3, 2, 6, 3)
    assert_close_to_scale(out, torch.from_numpy(ref))


def test_unbatched_2d_inputs(backend: str) -> None:
    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(n, 4, generator=gen) for n in (3, 7, 7))
    out = attnkit.attention(q, k, v, mask=attnkit.masks.causal("bottom_right"), backend=backend)
    ref, _, _ = oracle(np_of(q), np_of(k), np_of(v), mask=("causal", "bottom_right"))
    assert_close_to_scale(out, torch.from_numpy(ref))


def test_empty_sequences(backend: str) -> None:
    q = torch.randn(2, 0, 4, requires_grad=True)
    k = torch.randn(2, 5, 4)
    out = attnkit.attention(q, k, k, backend=backend)
    assert out.shape == (2, 0, 4)
    q = torch.randn(2, 3, 4, requires_grad=True)
    k = torch.randn(2, 0, 4)
    out = attnkit.attention(q, k, k, backend=backend)
    assert out.shape == (2, 3, 4) and not out.any()
    out.sum().backward()
    assert q.grad is not None and not q.grad.any()


def test_same_call_twice_is_bitwise_equal(backend: str) -> None:
    case = make_case("scaled_dot", "causal_and_padding", (2, 4, 2, 33, 29, 16, 8), 5)
    a = attnkit.attention(case.q, case.k, case.v, mask=case.mask, backend=backend)
    b = attnkit.attention(case.q, case.k, case.v, mask=case.mask, backend=backend)
    assert torch.equal(a, b)


def test_explicit_scale(backend: str) -> None:
    case = make_case("dot", "none", (2, 2, 2, 4, 6, 3, 3), 8)
    out = attnkit.attention(case.q, case.k, case.v, score="dot", scale=0.37, backend=backend)
    ref, _, _ = oracle(np_of(case.q), np_of(case.k), np_of(case.v), score=("dot",), scale=0.37)
    assert_close_to_scale(out, torch.from_numpy(ref))


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    score_name=st.sampled_from(SCORES),
    mask_name=st.sampled_from(MASKS),
    backend=st.sampled_from(CPU_BACKENDS),
    B=st.integers(1, 3),
    H=st.integers(1, 3),
    gqa=st.booleans(),
    L=st.integers(1, 20),
    S=st.integers(1, 20),
    E=st.integers(1, 9),
    Ev=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_property_random_cases(
    score_name: str,
    mask_name: str,
    backend: str,
    B: int,
    H: int,
    gqa: bool,
    L: int,
    S: int,
    E: int,
    Ev: int,
    seed: int,
) -> None:
    Hq = 2 * H if gqa else H
    case = make_case(score_name, mask_name, (B, Hq, H, L, S, E, Ev), seed)
    check_case(case, backend)


def test_empty_batch_dim(backend: str) -> None:
    q = torch.randn(3, 0, 5, 4)
    k = torch.randn(3, 0, 6, 4)
    out, w, lse = attnkit.attention(q, k, k, return_weights=True, return_lse=True, backend=backend)
    assert out.shape == (3, 0, 5, 4) and w.shape == (3, 0, 5, 6) and lse.shape == (3, 0, 5)
    q.requires_grad_(True)
    attnkit.attention(q, k, k, backend=backend).sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


@pytest.mark.parametrize("empty", [(0, 2), (2, 0)], ids=["no_batch", "no_heads"])
def test_empty_batch_dims_with_a_bias_and_a_head_scale(
    backend: str, empty: tuple[int, int]
) -> None:
    # a bias with no value, and a (0,) per-head scale, once read with min/max and failed
    q = torch.randn(*empty, 3, 5, requires_grad=True)  # (B, H, L, E)
    k = torch.randn(*empty, 4, 5, requires_grad=True)  # (B, H, S, E)
    v = torch.randn(*empty, 4, 6, requires_grad=True)  # (B, H, S, Ev)
    bias = torch.zeros(*empty, 3, 4)  # (B, H, L, S)
    scale = torch.ones(empty[1])  # (H,)
    for kwargs in ({"mask": bias}, {"mask": attnkit.masks.bias(bias)}, {"scale": scale}):
        out = attnkit.attention(q, k, v, backend=backend, **kwargs)  # type: ignore[arg-type]
        assert out.shape == (*empty, 3, 6)
        out.sum().backward()
        assert q.grad is not None and q.grad.shape == q.shape


@pytest.mark.parametrize("mask_name", MASKS)
def test_every_cpu_backend_takes_every_mask_kind(mask_name: str) -> None:
    """No CPU backend declines a mask kind: a decline would let the oracle tests above pass
    without computing anything."""
    case = make_case("scaled_dot", mask_name, (2, 3, 3, 5, 7, 8, 4), seed=5)
    for backend in CPU_BACKENDS:
        reasons = attnkit.explain(case.q, case.k, case.v, mask=case.mask, backend=backend).reasons
        assert reasons[backend] == [], (backend, reasons[backend])
