"""The Gaussian score at a small bandwidth or a large input scale, against the float64
oracle: every backend that runs it keeps within a small multiple of plain float32 math
(the error of -‖q - k‖²/2σ² and softmax written out in float32), forward and backward.

Its dot form q·k/σ² - ‖k‖²/2σ² evaluates a logit near 0 as the difference of terms of
the size of ‖q - c‖²/2σ²; on inputs spanning many bandwidths that cancelled (1-D
Nadaraya–Watson on [0, 5] at σ = 0.03: a hundred times plain float32's error). There
the score is formed from the differences q - k, and the dot-product kernels decline it.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import BackendNotSupportedError, masks, scores
from attnkit.nn import NadarayaWatson

import fuzz_calls
from cases import CPU_BACKENDS
from tolerance import (
    PLAIN_FLOOR_REL,
    PLAIN_RATIO,
    assert_close_to_scale,
    plain_math_rel,
    scaled_error,
)


def _oracle(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sigma: float, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """(out, d_q, d_k, d_v) of -‖q - k‖²/2σ² attention written out in ``dtype``, for the
    loss sum(out * g) with a fixed g."""
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    qq, kk, vv = leaves
    diff = qq.unsqueeze(-2) - kk.unsqueeze(-3)  # (..., L, S, E)
    logits = -(diff * diff).sum(-1) / (2 * sigma**2)  # (..., L, S)
    out = torch.softmax(logits, dim=-1) @ vv  # (..., L, Ev)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    grads = torch.autograd.grad((out * g.to(dtype)).sum(), leaves)
    return (out.detach(), *grads)


def _attnkit(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sigma: float, backend: str | None
) -> tuple[torch.Tensor, ...]:
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = attnkit.attention(*leaves, score=scores.Gaussian(sigma), backend=backend)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    grads = torch.autograd.grad((out * g.to(out.dtype)).sum(), leaves)
    return (out.detach(), *grads)


def _within_plain(
    got: tuple[torch.Tensor, ...],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sigma: float,
) -> None:
    want = _oracle(q, k, v, sigma, torch.float64)
    plain = _oracle(q, k, v, sigma, torch.float32)
    for name, g, w, p in zip(("out", "d_q", "d_k", "d_v"), got, want, plain, strict=True):
        err, base = scaled_error(g, w), scaled_error(p, w)
        assert err <= max(PLAIN_RATIO * base, PLAIN_FLOOR_REL), (
            f"{name}: error {err:.3g} of its scale, plain float32 math {base:.3g}"
        )


def _regression(sigma: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-D Nadaraya–Watson on [0, 5]: 50 queries, 100 noisy samples of 2 sin x + x^0.8."""
    gen = torch.Generator().manual_seed(0)
    x = torch.sort(torch.rand(100, generator=gen) * 5).values  # (100,)
    y = 2 * torch.sin(x) + x**0.8 + torch.randn(100, generator=gen) * 0.5  # (100,)
    xq = torch.arange(0, 5, 0.1)  # (50,)
    return xq.reshape(50, 1), x.reshape(100, 1), y.reshape(100, 1)


@pytest.mark.parametrize("sigma", [0.03, 0.1])
@pytest.mark.parametrize("backend", [*CPU_BACKENDS, None])
def test_regression_small_sigma(backend: str | None, sigma: float) -> None:
    """Within 4x plain float32 math on every backend that runs it (the default call too);
    a dot-product kernel declines, naming the cancellation."""
    q, k, v = _regression(sigma)
    try:
        got = _attnkit(q, k, v, sigma, backend)
    except BackendNotSupportedError as exc:
        assert backend == "sdpa", exc
        assert "would cancel" in str(exc)
        return
    _within_plain(got, q, k, v, sigma)


@pytest.mark.parametrize("sigma", [0.03, 0.1])
def test_nadaraya_watson_layer_small_sigma(sigma: float) -> None:
    """attnkit.nn.NadarayaWatson at a small bandwidth: its predictions and their gradient
    with respect to the queries within 4x plain float32 math."""
    q, k, v = _regression(sigma)
    xq = q.reshape(-1).requires_grad_(True)  # (50,)
    pred = NadarayaWatson(sigma=sigma)(xq, k.reshape(-1), v.reshape(-1))  # (50,)
    (d_q,) = torch.autograd.grad(pred.sum(), xq)
    want = []
    for dtype in (torch.float64, torch.float32):
        x = q.reshape(-1).to(dtype).requires_grad_(True)  # (50,)
        logits = -((x.unsqueeze(-1) - k.reshape(1, -1).to(dtype)) ** 2) / (2 * sigma**2)
        p = torch.softmax(logits, dim=-1) @ v.reshape(-1).to(dtype)  # (50,)
        want.append((p.detach(), torch.autograd.grad(p.sum(), x)[0]))
    (p64, g64), (p32, g32) = want
    for name, got, w, plain in (("pred", pred, p64, p32), ("d_q", d_q, g64, g32)):
        err, base = scaled_error(got, w), scaled_error(plain, w)
        assert err <= max(PLAIN_RATIO * base, PLAIN_FLOOR_REL), (
            f"{name}: {err:.3g} against plain {base:.3g}"
        )


@pytest.mark.parametrize("sigma", [1e4, 3e3])
@pytest.mark.parametrize("backend", [*CPU_BACKENDS, None])
def test_large_input_scale_with_gradients(backend: str | None, sigma: float) -> None:
    """Multi-head 8-D inputs of scale 1e4: output and the gradients of q, k and v."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 3, 40, 8, generator=gen) * 1e4  # (B, H, L, E)
    k = torch.randn(2, 3, 50, 8, generator=gen) * 1e4  # (B, H, S, E)
    v = torch.randn(2, 3, 50, 5, generator=gen)  # (B, H, S, Ev)
    try:
        got = _attnkit(q, k, v, sigma, backend)
    except BackendNotSupportedError as exc:
        assert backend == "sdpa", exc
        assert "would cancel" in str(exc)
        return
    _within_plain(got, q, k, v, sigma)


def test_well_conditioned_calls_keep_the_dot_product_kernel() -> None:
    """Inputs within a few bandwidths (σ = 2 on unit 64-D features) still run on sdpa."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 64, 64, generator=gen) for _ in range(3))
    ex = attnkit.explain(q, k, v, score=scores.Gaussian(2.0))
    assert not ex.reasons["sdpa"], ex.reasons["sdpa"]


@pytest.mark.parametrize("backend", ["reference", "chunked"])
def test_weights_and_gradients_far_from_every_key(backend: str) -> None:
    """Queries many bandwidths from every key (|lse| about 1e4): the returned weights stay
    at most 1 and, with the output's gradients, within 4x plain float32 math (the tiles
    recompute ``exp(s - lse)`` with the lse's rounding carried apart)."""
    gen = torch.Generator().manual_seed(5)
    q = (torch.rand(6, 1, generator=gen) * 0.5 + 10).requires_grad_(True)  # (L, E)
    k = torch.rand(9, 1, generator=gen) * 5  # (S, E)
    k[:2, 0] = torch.tensor([5.0, 4.9996])  # two nearest keys about one logit apart
    v = torch.randn(9, 2, generator=gen)  # (S, Ev)
    sigma = 0.05
    out, w = attnkit.attention(
        q, k, v, score=scores.Gaussian(sigma), return_weights=True, backend=backend
    )
    assert float(w.max()) <= 1.0
    (d_q,) = torch.autograd.grad(out.sum(), q)
    want = []
    for dtype in (torch.float64, torch.float32):
        x = q.detach().to(dtype).requires_grad_(True)  # (L, E)
        logits = -((x - k.to(dtype).T) ** 2) / (2 * sigma**2)  # (L, S)
        p = torch.softmax(logits, dim=-1)  # (L, S)
        o = p @ v.to(dtype)  # (L, Ev)
        want.append((o.detach(), p.detach(), torch.autograd.grad(o.sum(), x)[0]))
    for n, name in enumerate(("out", "weights", "d_q")):
        err = scaled_error((out, w, d_q)[n], want[0][n])
        base = scaled_error(want[1][n], want[0][n])
        assert err <= max(PLAIN_RATIO * base, PLAIN_FLOOR_REL), (
            f"{name}: {err:.3g} against plain {base:.3g}"
        )


def test_form_is_chosen_per_call_not_per_shape() -> None:
    """A well-conditioned call, then one spanning many bandwidths with the same shapes and
    the named score: the second is not run the way the first was planned (a cached
    dispatch or plain-call plan would put it on the dot form)."""
    gen = torch.Generator().manual_seed(6)
    yk = torch.randn(100, 1, generator=gen)  # (S, Ev)
    near_q, near_k = torch.randn(50, 1, generator=gen), torch.randn(100, 1, generator=gen)
    attnkit.attention(near_q, near_k, yk, score="gaussian")
    xk = torch.sort(torch.rand(100, generator=gen) * 500).values.reshape(100, 1)  # (S, E)
    xq = torch.arange(0, 500, 10.0).reshape(50, 1)  # (L, E)
    out = attnkit.attention(xq, xk, yk, score="gaussian")
    want = torch.softmax(-((xq.double() - xk.double().T) ** 2) / 2, -1) @ yk.double()
    plain = torch.softmax(-((xq - xk.T) ** 2) / 2, -1) @ yk
    err, base = scaled_error(out, want), scaled_error(plain, want)
    assert err <= max(PLAIN_RATIO * base, PLAIN_FLOOR_REL), f"{err:.3g} against plain {base:.3g}"


@pytest.mark.parametrize("index", [4, 66, 715, 1026, 1791, 1840])
def test_extremes_fuzz_findings_on_chunked(index: int) -> None:
    """Cases of the conformance fuzz's Gaussian extremes (seed 28) that chunked once
    failed: weights and gradients far from every key (|lse| of 1e4 and more: exp(s - lse)
    lost eps * |lse|), and rows held by one key, whose gradients were the rounding of
    ``rowsum(dO * O)`` magnified by the Gaussian's derivative |q - k|/σ²."""
    report = fuzz_calls.Report()
    fuzz_calls.run_case(index, 28, report, backends=("chunked",), focus="gaussian_extremes")
    assert report.per_backend["chunked"] == 1, report.lines()
    assert not report.findings, "\n".join(f.line() for f in report.findings)


def _spread_keys_grads(backend: str, dtype: torch.dtype, want_lse: bool) -> torch.Tensor:
    """The gradients of q, k, v and a learnable σ = 1, flattened into one tensor, of a
    fixed random loss on the output (and lse) of a causal call in ``dtype``: 11 queries
    and keys of 5 features at scale 300, hundreds of bandwidths apart (the dot form's
    terms about 1e5 logits), each row held by one key; the nearest key of every query
    still far enough for the dot form's forward (within its loss limit)."""
    gen = torch.Generator().manual_seed(2)
    q, k = (torch.randn(11, 5, generator=gen, dtype=torch.float64).float() * 300 for _ in "qk")
    v = torch.randn(11, 4, generator=gen, dtype=torch.float64).float()
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    score = scores.Gaussian(1.0, learnable=True).to(dtype)
    res = attnkit.attention(q, k, v, score=score, mask=masks.causal(), return_lse=want_lse,
                            backend=backend)  # fmt: skip
    res = res if isinstance(res, tuple) else (res,)
    g = torch.Generator().manual_seed(3)
    loss = sum((t.double() * torch.randn(t.shape, generator=g, dtype=torch.float64)).sum()
               for t in res)  # fmt: skip
    grads = torch.autograd.grad(loss, [q, k, v, score.sigma])
    return torch.cat([t.double().flatten() for t in grads])


@pytest.mark.parametrize("want_lse", [False, True], ids=["out", "out+lse"])
def test_gradients_of_rows_held_by_one_key_on_sdpa(want_lse: bool) -> None:
    """The dot form runs (its forward within the limit) on inputs spanning hundreds of
    bandwidths: every row is held by one key, so the gradients of q, k and σ nearly
    vanish. The fused backward's row term ``rowsum(dO * O)`` rounds at ``eps |dO| |v|``,
    which the dot form's terms carried to q, k and σ at up to 2% of the call's largest
    gradient (the conformance fuzz's Gaussian extremes, cases 936, 1026, 1411, 1623 and
    1812 of seed 28: up to 2.7 of σ's scale); the tiles now give these gradients. All
    gradients together within twice plain float32's error of float64's."""
    got = _spread_keys_grads("sdpa", torch.float32, want_lse)
    want = _spread_keys_grads("reference", torch.float64, want_lse)
    plain = _spread_keys_grads("reference", torch.float32, want_lse)
    assert_close_to_scale(got, want, rel=plain_math_rel(plain, want), what="sdpa gradients")
