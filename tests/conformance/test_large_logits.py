"""Large logits (|logit| about 1e3, 1e4 and 1e6) with the weights returned, on every CPU
backend, every score, masks with fully masked rows, in float32, bfloat16 and float16.

The cases are near ties far from 0: every logit of a row is ``±magnitude`` plus a term
of order 1, so the softmax spreads over several keys while ``|lse|`` is the magnitude.
A softmax computed in float32 (the compute dtype of every dtype here) rounds such
logits by about ``|lse| * eps``, so that is the bound:

- the weights are a softmax: no entry above 1 or below 0, every row that keeps a key
  sums to 1 within ``|lse| * eps``, and a fully masked row is 0 (never NaN);
- they match the float64 oracle (``tests/reference.py``) within a few ``|lse| * eps``
  of their scale;
- gradients through the weights are finite wherever the float64 gradients (the same
  math written out here from the formulas) fit the inputs' dtype, and up to |logit| 1e4
  within a small multiple of the error of that math in float32 (the suite's rule, with
  half inputs upcast and their gradients rounded back; see :data:`GRADS`).

The weights of a call must be normalized over the logits they are computed from: weights
rebuilt as ``exp(s - lse)`` with an lse from another computation of the same logits
(torch's fused kernel) are off by that computation's rounding, ``|lse| * eps`` of
*its* own, which pushed entries above 1 (1.024 at |lse| 1.5e5) and sent gradients
astray.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import pytest
import torch

import attnkit
from attnkit import masks, scores
from attnkit._host import device_semantics

from cases import Case, make_case, make_mask, np_of
from reference import oracle, oracle_mask
from tolerance import FLOAT32_REL, ONE_HOT_REL, assert_close_to_scale, plain_math_rel

SHAPE = (2, 2, 1, 7, 11, 6, 3)  # (B, H, Hk, L, S, E, Ev): GQA, L != S, odd sizes
MAGNITUDES = (1e3, 1e4, 1e6)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SCORE_NAMES = ("dot", "scaled_dot", "bilinear", "additive", "gaussian")
MASK_NAMES = ("none", "causal", "keep", "bias", "key_padding", "valid_lens_queries")
"""No mask, a symbolic causal mask, a dense keep mask with a fully masked row, an
additive bias with -inf entries, key padding and query lengths (fully masked rows)."""
EPS = torch.finfo(torch.float32).eps
"""The softmax accumulates in float32 for every dtype here."""
ROW_SUM = 0.25
"""Row sums within ``ROW_SUM * |lse| * eps`` of 1: a softmax divided by its own row sums
meets it with room to spare (the chunked backend's ``exp(s - lse)``, from its own lse,
was off by up to 0.4 |lse| eps before its weights were divided by their sums)."""
MEAN_ROW_SUM = 1.0
"""Head means computed tile by tile without gradients (chunked, triton) average each
head's ``exp(s - lse)`` without holding every head's weights: their rows meet
``|lse| * eps``."""
WEIGHTS = 4.0
"""Weights within ``WEIGHTS * max|lse| * eps`` of the oracle's: a logit rounded by
``|s| * eps / 2``, the difference of two by ``|lse| * eps``, a few roundings on the way."""
GRADS = 8.0
"""Gradients within ``GRADS`` times the error of float32 math: these gradients amplify
each float32 writing's own rounding of the row sums by the magnitude (torch's softmax
and the reference backend's differ by 3x here). At |logit| 1e6 float32 rounds the
logits themselves by about 0.06 and any float32 writing is tens of percent off:
there only finiteness is held."""
SIGMA = 1.7


# ------------------------------------------------------------------ cases


def large_case(
    score_name: str,
    mask_name: str,
    magnitude: float,
    dtype: torch.dtype,
    seed: int,
    *,
    scale: float | None = None,
) -> Case:
    """Inputs whose logits are ``±magnitude`` plus terms of order 1 (near ties far from 0).

    ``scale`` (default: the magnitude) multiplies the score, whose raw values are then
    ``±magnitude / scale`` plus terms of order ``1 / scale``: one shared feature carries
    the offset (``q[..., 0]``, ``k[..., 0]``), the others are random and scaled by
    ``scale ** -0.5`` (the Additive score's by ``1 / scale``: it is not bilinear).
    Tensors and score parameters are rounded to ``dtype``; the specs hold the rounded values.
    """
    B, H, Hk, L, S, E, Ev = SHAPE
    scale = magnitude if scale is None else scale
    c = magnitude / scale  # the raw score's offset
    gen = torch.Generator().manual_seed(seed)
    Ek = E + 2 if score_name in ("bilinear", "additive") else E
    x = torch.randn(B, H, L, E - 1, generator=gen, dtype=torch.float64)  # (B, H, L, E - 1)
    y = torch.randn(B, Hk, S, Ek - 1, generator=gen, dtype=torch.float64)  # (B, Hk, S, Ek - 1)
    v = torch.randn(B, Hk, S, Ev, generator=gen, dtype=torch.float64)
    small = scale**-0.5

    def with_first(first: float, rest: torch.Tensor) -> torch.Tensor:
        lead = torch.full((*rest.shape[:-1], 1), first, dtype=torch.float64)
        return torch.cat([lead, rest], dim=-1)  # (..., N, 1 + D)

    score: scores.Score
    if score_name in ("dot", "scaled_dot"):
        q, k = with_first(c, x * small), with_first(1.0, y * small)
        score = scores.Dot() if score_name == "dot" else scores.ScaledDot()
        spec: tuple[Any, ...] = (score_name,)
    elif score_name == "bilinear":
        q, k = with_first(c, x * small), with_first(1.0, y * small)
        W = torch.zeros(E, Ek, dtype=torch.float64)
        W[0, 0] = 1.0
        W[1:, 1:] = torch.randn(E - 1, Ek - 1, generator=gen, dtype=torch.float64) / E**0.5
        score = scores.Bilinear(E, Ek, dtype=dtype)
        with torch.no_grad():
            score.weight.copy_(W)
        spec = ("bilinear", score.weight.detach().double().numpy())
    elif score_name == "additive":
        hidden = 4
        q, k = with_first(1.0, x / scale), with_first(1.0, y / scale)
        a = 0.5 + 0.1 * torch.randn(hidden, generator=gen, dtype=torch.float64)
        Wq = torch.randn(hidden, E, generator=gen, dtype=torch.float64)
        Wk = torch.randn(hidden, Ek, generator=gen, dtype=torch.float64)
        Wq[:, 0], Wk[:, 0] = a, 0.0  # pre-activations a + O(1 / scale)
        wv = c / torch.tanh(a).sum() * torch.ones(hidden, dtype=torch.float64)  # wv . tanh(a) = c
        score = scores.Additive(E, Ek, hidden, dtype=dtype)
        with torch.no_grad():
            for lin, w in ((score.W_q, Wq), (score.W_k, Wk), (score.w_v, wv[None])):
                lin.weight.copy_(w)
        spec = (
            "additive",
            score.W_q.weight.detach().double().numpy(),
            score.W_k.weight.detach().double().numpy(),
            score.w_v.weight.detach().double().numpy()[0],
        )
    elif score_name == "gaussian":
        # ‖q - k‖² = 2σ²c + ‖x - y‖² / scale: logits -magnitude - ‖x - y‖² / 2σ²; the
        # score's dot form q·k/σ² - ‖k‖²/2σ² is of the same size (the query term is small)
        q, k = with_first(0.0, x * small), with_first(-SIGMA * math.sqrt(2 * c), y * small)
        score = scores.Gaussian(SIGMA)
        spec = ("gaussian", SIGMA)
    else:
        raise ValueError(score_name)
    mask, mask_spec = make_mask(mask_name, B, H, L, S, gen, torch.float32)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    return Case(q, k, v, score, spec, mask, mask_spec, scale)


def _oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Weights (..., L, S) and lse (..., L) of the case in float64."""
    _, w, lse = oracle(
        np_of(case.q),
        np_of(case.k),
        np_of(case.v),
        score=case.score_spec,
        mask=case.mask_spec,
        scale=case.scale,
    )
    return w, lse


def _runs(case: Case, backend: str | None, **kw: Any) -> bool:
    if backend is None:
        return True
    reasons = attnkit.explain(
        case.q, case.k, case.v, score=case.score, mask=case.mask, scale=case.scale,
        backend=backend, **kw,
    ).reasons[backend]  # fmt: skip
    return not reasons


def _weights(case: Case, backend: str | None, return_weights: Any = True) -> torch.Tensor:
    _, w = attnkit.attention(
        case.q, case.k, case.v, score=case.score, mask=case.mask, scale=case.scale,
        return_weights=return_weights, backend=backend,
    )  # fmt: skip
    return w


def assert_softmax(
    w: torch.Tensor, ref_w: np.ndarray, ref_lse: np.ndarray, what: str, row_sum: float = ROW_SUM
) -> None:
    """``w`` is a softmax of logits whose float64 weights and lse are ``ref_w``/``ref_lse``:
    entries in [0, 1], live rows summing to 1 within ``row_sum * |lse| * eps`` (plus
    ``S * eps``, the rounding of a sum of S terms), dead rows 0, and the oracle's weights
    within ``WEIGHTS * max|lse| * eps``."""
    got = np_of(w)
    assert got.shape == ref_w.shape, f"{what}: shape {got.shape} != {ref_w.shape}"
    assert not np.isnan(got).any(), f"{what}: NaN in the weights"
    assert got.max() <= 1.0, f"{what}: an entry {got.max():.9g} above 1"
    assert got.min() >= 0.0, f"{what}: an entry {got.min():.3g} below 0"
    live = np.isfinite(ref_lse)
    assert not got[~live].any(), f"{what}: a fully masked row is not 0"
    if not live.any():
        return
    sums_err = np.abs(got.sum(-1) - 1.0)[live]  # (rows,)
    bound = EPS * (row_sum * np.abs(ref_lse[live]) + ref_w.shape[-1])  # (+ the sum's rounding)
    worst = int(np.argmax(sums_err / bound))
    assert (sums_err <= bound).all(), (
        f"{what}: a row sums to 1 {sums_err[worst]:+.3g} off, bound |lse| eps "
        f"{bound[worst]:.3g} (|lse| {np.abs(ref_lse[live])[worst]:.3g})"
    )
    lse_max = float(np.abs(ref_lse[live]).max())
    err = float(np.abs(got - ref_w).max())
    allowed = WEIGHTS * EPS * lse_max
    assert err <= allowed, (
        f"{what}: weights {err:.3g} off the oracle's, allowed {allowed:.3g} "
        f"({WEIGHTS:g} max|lse| eps, max|lse| {lse_max:.3g})"
    )


# ------------------------------------------------------------------ weights


@pytest.mark.pairwise
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("magnitude", MAGNITUDES, ids=repr)
@pytest.mark.parametrize("score_name", SCORE_NAMES)
def test_weights_are_a_softmax_at_large_logits(
    score_name: str, magnitude: float, dtype: torch.dtype, backend: str
) -> None:
    ran = 0
    for n, mask_name in enumerate(MASK_NAMES):
        case = large_case(score_name, mask_name, magnitude, dtype, seed=70 + n)
        if not _runs(case, backend, return_weights=True):
            continue
        ran += 1
        ref_w, ref_lse = _oracle(case)
        assert np.abs(ref_lse[np.isfinite(ref_lse)]).min() > magnitude / 2  # large indeed
        what = f"{backend} {score_name} {mask_name} {dtype} |logit| {magnitude:g}"
        assert_softmax(_weights(case, backend), ref_w, ref_lse, what)
    if not ran:
        pytest.skip(f"{backend} does not return weights for {score_name}")


@pytest.mark.parametrize("magnitude", MAGNITUDES, ids=repr)
@pytest.mark.parametrize("score_name", ["scaled_dot", "bilinear", "gaussian"])
def test_head_averaged_weights_at_large_logits(
    score_name: str, magnitude: float, backend: str
) -> None:
    """``return_weights="mean"``: the mean of each head's softmax."""
    case = large_case(score_name, "key_padding", magnitude, torch.float32, seed=80)
    if not _runs(case, backend, return_weights="mean"):
        pytest.skip(f"{backend} does not run {score_name}")
    ref_w, ref_lse = _oracle(case)  # (B, H, L, S), (B, H, L)
    got = _weights(case, backend, "mean")  # (B, L, S)
    # the mean of softmaxes whose rows are live in every head or in none (key padding):
    # its rows sum to 1 within the largest |lse| of the heads
    live = np.isfinite(ref_lse).all(axis=-2)  # (B, L)
    lse = np.where(live, np.abs(np.where(np.isfinite(ref_lse), ref_lse, 0.0)).max(-2), -np.inf)
    assert_softmax(got, ref_w.mean(-3), lse, f"{backend} {score_name} mean", MEAN_ROW_SUM)


@pytest.mark.parametrize("score_name", SCORE_NAMES)
def test_default_call_weights_at_large_logits(score_name: str) -> None:
    """The default call (no backend named: the dispatcher's choice, sdpa for the dot
    forms) in float32 and float16."""
    for dtype in (torch.float32, torch.float16):
        for n, mask_name in enumerate(("none", "causal", "keep")):
            case = large_case(score_name, mask_name, 1e4, dtype, seed=90 + n)
            ref_w, ref_lse = _oracle(case)
            what = f"default {score_name} {mask_name} {dtype}"
            assert_softmax(_weights(case, None), ref_w, ref_lse, what)


# ------------------------------------------------------------------ gradients


def _plain_weights(case: Case, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """softmax(scale * score(q, k) + mask) written out from the formulas, in the dtype of
    q and k (float64: the gradient oracle; float32: the yardstick), differentiable."""
    spec, dt = case.score_spec, q.dtype
    if q.shape[-3] != k.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)  # (B, H, S, Ek)
    kind = spec[0]
    if kind in ("dot", "scaled_dot"):
        s = q @ k.transpose(-2, -1)  # (B, H, L, S)
    elif kind == "bilinear":
        s = q @ torch.from_numpy(spec[1]).to(dt) @ k.transpose(-2, -1)
    elif kind == "additive":
        Wq, Wk, wv = (torch.from_numpy(a).to(dt) for a in spec[1:4])
        z = (q @ Wq.T).unsqueeze(-2) + (k @ Wk.T).unsqueeze(-3)  # (B, H, L, S, hidden)
        s = torch.tanh(z) @ wv
    else:
        s = -(q.unsqueeze(-2) - k.unsqueeze(-3)).square().sum(-1) / (2 * spec[1] ** 2)
    assert case.scale is not None
    s = s * case.scale
    keep, bias = oracle_mask(case.mask_spec, q.shape[-2], k.shape[-2], q.ndim - 2)
    if bias is not None:
        s = s + torch.from_numpy(bias).to(dt)
    if keep is not None:
        s = s.masked_fill(~torch.from_numpy(np.ascontiguousarray(keep)), float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0)  # a fully masked row: 0


def _grads_through_weights(case: Case, backend: str | None, compute: torch.dtype | None = None
                           ) -> list[torch.Tensor]:  # fmt: skip
    """Gradients of q and k of ``sum(weights * G)`` (G fixed), from attnkit (``compute``
    None) or from :func:`_plain_weights` with q and k in ``compute`` (then rounded to the
    inputs' dtype)."""
    q, k = (t.detach().requires_grad_() for t in (case.q, case.k))
    if compute is None:
        _, w = attnkit.attention(
            q, k, case.v, score=case.score, mask=case.mask, scale=case.scale,
            return_weights=True, backend=backend,
        )  # fmt: skip
    else:
        w = _plain_weights(case, q.to(compute), k.to(compute))
    gen = torch.Generator().manual_seed(7)
    G = torch.randn(w.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((w.double() * G).sum(), (q, k))
    return [g.to(case.q.dtype) for g in grads]


def assert_grads(case: Case, backend: str | None, what: str, *, compare: bool) -> None:
    """Gradients through the weights are finite wherever float64's fit the inputs' dtype;
    with ``compare``, also within ``GRADS`` times the error of the same math in float32
    there (never held tighter than the dtype's rounding, or 1e-5, of their scale)."""
    got = _grads_through_weights(case, backend)
    want = _grads_through_weights(case, None, torch.float64)
    plain = _grads_through_weights(case, None, torch.float32)
    w64 = np_of(_plain_weights(case, case.q.double(), case.k.double()))
    ref_w, ref_lse = _oracle(case)  # the same float64 math as the oracle's:
    lse_max = np.abs(ref_lse[np.isfinite(ref_lse)]).max()
    assert np.abs(w64 - ref_w).max() <= 16 * np.finfo(np.float64).eps * lse_max
    info = torch.finfo(case.q.dtype)
    for name, g, w, p in zip("qk", got, want, plain, strict=True):
        g64, w64_, p64 = g.double(), w.double(), p.double()
        fits = w64_.abs() <= info.max / 2  # (the float64 gradient, rounded, is finite)
        assert torch.isfinite(g64[fits]).all(), (
            f"{what} d{name}: {int((~torch.isfinite(g64[fits])).sum())} entries not finite "
            "where float64's fit the dtype"
        )
        if not compare:
            continue
        scale = float(w64_[fits].abs().max())
        err = float((g64 - w64_)[fits].abs().max())
        plain_err = float((p64 - w64_)[fits].abs().max())
        allowed = max(GRADS * plain_err, max(1e-5, info.eps) * scale)
        assert err <= allowed, (
            f"{what} d{name}: error {err:.3g} > allowed {allowed:.3g} (float32 math "
            f"{plain_err:.3g}, scale {scale:.3g})"
        )


@pytest.mark.pairwise
@pytest.mark.parametrize("magnitude", MAGNITUDES, ids=repr)
@pytest.mark.parametrize("score_name", SCORE_NAMES)
def test_float32_gradients_through_the_weights(
    score_name: str, magnitude: float, backend: str
) -> None:
    ran = 0
    for n, mask_name in enumerate(("none", "causal", "keep", "key_padding")):
        case = large_case(score_name, mask_name, magnitude, torch.float32, seed=100 + n)
        if not _runs(case, backend, return_weights=True):
            continue
        ran += 1
        what = f"{backend} {score_name} {mask_name} {magnitude:g}"
        assert_grads(case, backend, what, compare=magnitude < 1e6)
    if not ran:
        pytest.skip(f"{backend} does not return weights for {score_name}")


@pytest.mark.pairwise
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("magnitude", [1e4, 1e6], ids=repr)
def test_half_gradients_through_the_weights_bilinear_at_scale_1e4(
    magnitude: float, dtype: torch.dtype, backend: str
) -> None:
    """Bilinear at scale 1e4 in half precision: |logit| 1e4 (offset 1) and 1e6 (offset
    100, where the keys' float64 gradients pass the float16 range and only the others
    are held). By default an all-pairs set of backend, magnitude and dtype
    (tests/pairwise.py); the rest under ``slow``."""
    for n, mask_name in enumerate(("none", "causal", "keep", "key_padding")):
        case = large_case("bilinear", mask_name, magnitude, dtype, seed=110 + n, scale=1e4)
        what = f"{backend} bilinear {mask_name} {dtype} |logit| {magnitude:g}"
        assert_grads(case, backend, what, compare=magnitude < 1e6)
        assert_softmax(_weights(case, backend), *_oracle(case), what)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_head_mean_of_one_hot_rows_bilinear_at_scale_1e4(
    dtype: torch.dtype, backend: str
) -> None:
    """Random inputs (queries x10, keys x3), Bilinear at scale 1e4: |lse| up to 7.5e6 and
    every row one-hot. The head mean of the weights is exact (0, 1/H, ...) and the true
    gradients vanish; weights rebuilt from another lse were 0.43 off and gave 5 infinite
    query gradients in float16."""
    c = make_case("bilinear", "none", (2, 4, 2, 17, 19, 16, 8), seed=500, dtype=dtype)
    case = Case(c.q * 10, c.k * 3, c.v, c.score, c.score_spec, None, None, 1e4)
    if not _runs(case, backend, return_weights="mean"):
        pytest.skip(f"{backend} does not return weights for bilinear")
    q = case.q.detach().requires_grad_()
    _, w = attnkit.attention(q, case.k, case.v, score=case.score, scale=case.scale,
                             return_weights="mean", backend=backend)  # fmt: skip
    ref_w, ref_lse = _oracle(case)  # (B, H, L, S), (B, H, L)
    lse = np.abs(ref_lse).max(-2)  # (B, L): every row is live
    assert lse.min() > 1e5
    assert_softmax(w, ref_w.mean(-3), lse, f"{backend} {dtype} mean", MEAN_ROW_SUM)
    G = torch.randn(w.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    (dq,) = torch.autograd.grad((w.double() * G).sum(), q)
    q64 = case.q.double().requires_grad_()
    w64 = _plain_weights(case, q64, case.k.double()).mean(-3)  # (B, L, S)
    (dq64,) = torch.autograd.grad((w64 * G).sum(), q64)
    assert dq64.abs().max() < 1  # one-hot rows: the true gradients vanish
    assert torch.isfinite(dq).all(), f"{backend}: {int((~torch.isfinite(dq)).sum())} not finite"
    assert dq.abs().max() <= 1, f"{backend}: a query gradient of {dq.abs().max():.3g}"


def test_default_call_gradients_in_float16() -> None:
    """The default call, float16, Bilinear at scale 1e4, |logit| 1e6."""
    case = large_case("bilinear", "none", 1e6, torch.float16, seed=120, scale=1e4)
    assert_grads(case, None, "default bilinear float16", compare=False)


# ------------------------------------------------------------------ layers


def test_multihead_attention_layer_weights_at_large_logits() -> None:
    """``attnkit.nn.MultiheadAttention`` (weights per head and averaged) against torch's
    layer in float64 with the same parameters: identity projections, so head 0's logits
    are ``1e4`` plus terms of order 1 and head 1's of order 1."""
    N, L, S, E, H = 2, 5, 9, 8, 2
    d = E // H
    gen = torch.Generator().manual_seed(130)
    xq = torch.randn(N, L, E, generator=gen, dtype=torch.float64) * d**0.25
    xk = torch.randn(N, S, E, generator=gen, dtype=torch.float64) * d**0.25
    xq[..., 0], xk[..., 0] = 1e4 * d**0.5, 1.0  # head 0: q·k / sqrt(d) = 1e4 + x·y
    xv = torch.randn(N, S, E, generator=gen, dtype=torch.float64)
    pad = torch.zeros(N, S, dtype=torch.bool)
    pad[1, 3:] = True
    layer = attnkit.nn.MultiheadAttention(E, H, batch_first=True)
    peer = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    assert layer.in_proj_weight is not None and layer.in_proj_bias is not None
    with torch.no_grad():
        layer.in_proj_weight.copy_(torch.eye(E).repeat(3, 1))  # (3E, E): q, k, v = inputs
        layer.in_proj_bias.zero_()
    peer.load_state_dict({n: t.double() for n, t in layer.state_dict().items()})
    qh = xq.view(N, L, H, d).transpose(1, 2)  # (N, H, L, d)
    kh = xk.view(N, S, H, d).transpose(1, 2)  # (N, H, S, d)
    logits = (qh @ kh.transpose(-2, -1) / d**0.5).masked_fill(pad[:, None, None], -math.inf)
    lse = np_of(torch.logsumexp(logits, dim=-1))  # (N, H, L)
    for average in (False, True):
        args = (xq.float(), xk.float(), xv.float())
        _, w = layer(*args, key_padding_mask=pad, average_attn_weights=average)
        _, want = peer(xq, xk, xv, key_padding_mask=pad, average_attn_weights=average)
        if average:  # the mean of two softmaxes: rows sum to 1 within head 0's bound
            w, want = w.unsqueeze(1), want.unsqueeze(1)  # (N, 1, L, S)
            lse = np.abs(lse).max(axis=1, keepdims=True)  # (N, 1, L)
        assert_softmax(w, np_of(want), lse, f"MultiheadAttention average={average}")


def test_d2l_dot_product_attention_weights_at_large_logits() -> None:
    """d2l's ``DotProductAttention`` keeps its weights in ``.attention_weights``; a length
    of 0 gives a fully masked row."""
    B, L, S, d = 3, 4, 7, 6
    gen = torch.Generator().manual_seed(140)
    x = torch.randn(B, L, d - 1, generator=gen, dtype=torch.float64) * d**0.25
    y = torch.randn(B, S, d - 1, generator=gen, dtype=torch.float64) * d**0.25
    q = torch.cat([torch.full((B, L, 1), 1e4 * d**0.5, dtype=torch.float64), x], dim=-1)
    k = torch.cat([torch.ones(B, S, 1, dtype=torch.float64), y], dim=-1)
    v = torch.randn(B, S, 2, generator=gen, dtype=torch.float64)
    lens = torch.tensor([S, 3, 0])
    layer = attnkit.nn.DotProductAttention()
    layer(q.float(), k.float(), v.float(), lens)
    assert layer.attention_weights is not None
    _, ref_w, ref_lse = oracle(np_of(q), np_of(k), np_of(v), score=("scaled_dot",),
                               mask=("valid_lens", lens.numpy(), False))  # fmt: skip
    assert_softmax(layer.attention_weights, ref_w, ref_lse, "DotProductAttention")


# ------------------------------------------------------------------ triton, interpreted


@pytest.mark.slow  # Triton's interpreter: 30-40 s on two cores
def test_triton_interpreted_weights_and_gradients_at_large_logits() -> None:
    """The triton kernels under Triton's interpreter: every score at |logit| 1e3 behind key
    padding, weights and float32 gradients; weights at 1e6; Bilinear at scale 1e4 in
    float16 (finite gradients); the head mean."""
    pytest.importorskip("triton")
    from interpreted_triton import interpreted_triton  # skips if triton runs compiled

    with interpreted_triton():
        for score_name in SCORE_NAMES[1:]:  # (dot: scaled_dot's kernel with another scale)
            case = large_case(score_name, "key_padding", 1e3, torch.float32, seed=150)
            what = f"triton {score_name} |logit| 1e3"
            assert_softmax(_weights(case, "triton"), *_oracle(case), what)
            if score_name == "gaussian":  # its dot form's terms: declined with a gradient
                with pytest.raises(attnkit.BackendNotSupportedError, match="dot form has terms"):
                    assert_grads(case, "triton", what, compare=True)
                continue
            assert_grads(case, "triton", what, compare=True)
        case = large_case("scaled_dot", "causal", 1e6, torch.float32, seed=150)
        assert_softmax(_weights(case, "triton"), *_oracle(case), "triton |logit| 1e6")
        # (finite only: the kernels' half-precision products are test_triton.py's subject)
        case = large_case("bilinear", "causal", 1e4, torch.float16, seed=151, scale=1e4)
        assert_grads(case, "triton", "triton bilinear float16", compare=False)
        mean = large_case("scaled_dot", "key_padding", 1e4, torch.float32, seed=152)
        ref_w, ref_lse = _oracle(mean)
        lse = np.where(np.isfinite(ref_lse).all(-2), np.abs(ref_lse).max(-2), -np.inf)
        with torch.no_grad():  # the head mean computed tile by tile
            got = _weights(mean, "triton", "mean")
        assert_softmax(got, ref_w.mean(-3), lse, "triton mean", MEAN_ROW_SUM)


# ------------------------------------------------ gradients of the output and the lse

ONE_HOT_SCALE = 1e5
"""Logits of about 1e5 whose rows are one-hot: each softmax is a single 1, so the exact
gradients of q and k are 0 and plain float32 math gets them exactly (``p * (dp - sum_j p
dp)`` with p exactly 1 and 0)."""


def _one_hot_grads(backend: str, dtype: torch.dtype, want_lse: bool) -> list[torch.Tensor]:
    """Gradients of q, k and v of a fixed random loss on out, weights (and lse) of a dot
    call at scale :data:`ONE_HOT_SCALE` with a causal mask, in ``dtype``."""
    gen = torch.Generator().manual_seed(3)
    B, H, L, S, E, Ev = 2, 2, 6, 6, 3, 37  # (Ev: rowsum(dO * O) and dO @ v^T sum apart)
    q, k, v = (torch.randn(B, H, n, e, generator=gen, dtype=torch.float64).to(dtype)
               for n, e in ((L, E), (S, E), (S, Ev)))  # fmt: skip
    leaves = [t.requires_grad_() for t in (q, k, v)]
    res = attnkit.attention(*leaves, score="dot", scale=ONE_HOT_SCALE, mask=masks.causal(),
                            return_weights=True, return_lse=want_lse, backend=backend)  # fmt: skip
    loss = torch.zeros((), dtype=torch.float64)
    for t in res:
        g = torch.randn(t.shape, generator=gen, dtype=torch.float64)
        loss = loss + (t.double() * g).sum()
    return [g.double() for g in torch.autograd.grad(loss, leaves)]


@pytest.mark.parametrize("device", [False, True], ids=["host", "device_semantics"])
@pytest.mark.parametrize("want_lse", [False, True], ids=["out+weights", "out+weights+lse"])
@pytest.mark.parametrize("backend", ["reference", "chunked", "sdpa"])
def test_output_and_lse_gradients_with_weights_on_one_hot_rows(
    backend: str, want_lse: bool, device: bool
) -> None:
    """The output's (and lse's) gradients join the weights' in one softmax backward over
    the normalized weights: q and k get no rounding of the row term times the scale
    (under device semantics too, where the values are not read on the host)."""
    with device_semantics() if device else contextlib.nullcontext():
        got = _one_hot_grads(backend, torch.float32, want_lse)
    want = _one_hot_grads("reference", torch.float64, want_lse)
    assert_close_to_scale(torch.cat([g.flatten() for g in got]),
                          torch.cat([g.flatten() for g in want]), rel=ONE_HOT_REL,
                          what=f"{backend} gradients")  # fmt: skip


# ------------------------------------------------ gradients every key of a row shares


def _row_shared_grads(score_name: str, seed: int, scale: float, backend: str,
                      dtype: torch.dtype) -> list[torch.Tensor]:  # fmt: skip
    """Gradients of q, k, v and the score's parameters of a fixed random loss on the
    output and weights of a causal call in ``dtype``: random float32 inputs, keys of one
    feature (B, H, L, S) = (2, 3, 8, 7), an Additive (hidden 4) or Bilinear score."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, n, e, generator=gen, dtype=torch.float64).float()
               for n, e in ((8, 2), (7, 1), (7, 4)))  # fmt: skip
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    torch.manual_seed(seed)
    f64 = torch.float64
    score: scores.Score = (
        scores.Additive(2, 1, 4, dtype=f64) if score_name == "additive"
        else scores.Bilinear(2, 1, dtype=f64)
    )  # fmt: skip
    score = score.float().to(dtype)  # float32 parameters, the same in either dtype
    out, w = attnkit.attention(q, k, v, score=score, scale=scale, mask=masks.causal(),
                               return_weights=True, backend=backend)  # fmt: skip
    g = torch.Generator().manual_seed(seed + 1)
    loss = sum((t.double() * torch.randn(t.shape, generator=g, dtype=torch.float64)).sum()
               for t in (out, w))  # fmt: skip
    return [t.double() for t in torch.autograd.grad(loss, [q, k, v, *score.parameters()])]


@pytest.mark.parametrize(("score_name", "seed", "scale"),
                         [("additive", 3, 1e3), ("bilinear", 13, 3e3)])  # fmt: skip
def test_row_shared_gradients_at_large_logits(score_name: str, seed: int, scale: float) -> None:
    """Rows held by a few keys at logits of 1e3: the gradients of what every key of a row
    shares (a query, the Additive score's ``W_q`` and ``w_v``, the Bilinear ``W``) sum
    the logits' gradients of the row, which cancel. The tiles' backward formed them as
    ``p * (dp - sum_j p dp)``, the row term rounded at the size of ``dp``: 5-10x the
    error of plain float32 math (the conformance fuzz's large logits, cases 837, 1609,
    1863 of seed 28). Within twice plain float32's error of the float64 gradients."""
    got = _row_shared_grads(score_name, seed, scale, "chunked", torch.float32)
    want = _row_shared_grads(score_name, seed, scale, "reference", torch.float64)
    plain = _row_shared_grads(score_name, seed, scale, "reference", torch.float32)
    names = ["d_q", "d_k", "d_v"] + [f"d_param{n}" for n in range(len(want) - 3)]
    for name, g, w, p in zip(names, got, want, plain, strict=True):
        assert_close_to_scale(g, w, rel=plain_math_rel(p, w), what=f"chunked {name}")


# ------------------------------------------------ the additive score's tanh

ADDITIVE_SCALE = 1e5


def test_additive_tanh_relative_error_near_zero_and_below_it() -> None:
    """The compiled additive loop's tanh (or its torch fallback) errs by a few float32
    roundings of tanh itself at any argument: small ones (where ``1 - 2/(exp(2x) + 1)``
    erred by eps absolute, 6e-5 relative at 1e-3) and negative ones."""
    from attnkit.kernels import additive

    x = torch.cat([torch.logspace(-6, 1, 2001), -torch.logspace(-6, 1, 2001)])  # (N,)
    for hidden in (1, 8, 16):  # the scalar tail and the vector lanes
        qh = x.view(1, -1, 1).repeat(1, 1, hidden).contiguous()  # (1, N, hidden)
        w = torch.zeros(hidden)
        w[-1] = 1.0
        got = additive.logits(qh, torch.zeros(1, 1, hidden), w).flatten().double()  # (N,)
        want = torch.tanh(x.double())
        rel = float(((got - want).abs() / want.abs()).max())
        assert rel <= 4 * EPS, f"hidden {hidden}: tanh's relative error {rel:.3g}"


def test_additive_tanh_near_one_and_beyond_saturation() -> None:
    """The compiled additive loop's tanh near ±1: within one ulp of tanh (eps / 2 below 1)
    from |x| = 1.5, and exactly ±1 where float32 tanh is (|x| above 9.02: ``1 - 2/(u + 2)``
    clamped at 9 would stay one ulp below 1). Formed as ``u / (u + 2)`` it rounded at 1.5
    ulps near 1; a logit of such terms at scale 5.7e4 moved the weights of near-tied keys
    by 19 times plain float32's error (the conformance fuzz's large logits, case 579 of
    seed 29)."""
    from attnkit.kernels import additive

    x = torch.cat([torch.linspace(1.5, 12, 4001), -torch.linspace(1.5, 12, 4001)])  # (N,)
    for hidden in (1, 8, 16):  # the scalar tail and the vector lanes
        qh = x.view(1, -1, 1).repeat(1, 1, hidden).contiguous()  # (1, N, hidden)
        w = torch.zeros(hidden)
        w[-1] = 1.0
        got = additive.logits(qh, torch.zeros(1, 1, hidden), w).flatten()  # (N,)
        saturated = torch.tanh(x.double()).float().abs() == 1
        assert (got[saturated].abs() == 1).all(), f"hidden {hidden}: tanh short of ±1"
        err = float((got.double() - torch.tanh(x.double())).abs().max())
        assert err <= EPS / 2, f"hidden {hidden}: tanh's error {err:.3g} near ±1"


def test_additive_near_tied_keys_with_sinks_at_large_scale() -> None:
    """The conformance fuzz's large logits, case 579 of seed 29: an Additive score whose
    hidden units saturate, with sinks, at scale 5.7e4 (logits of 3.4e4), keys of a row
    tied to 3e-5 before the scale. The chunked backend's output and weights within twice
    plain float32's error of the float64 oracle (they were 19 times it)."""
    from fuzz_draws import draw

    d = draw(29, 579, focus="large_logits")
    got, want, plain = (
        attnkit.attention(b.q, b.k, b.v, **b.kwargs, return_weights=True, backend=backend)
        for b, backend in ((d.build(), "chunked"), (d.build(torch.float64), "reference"),
                           (d.build(), "reference"))
    )  # fmt: skip
    for name, g, w, p in zip(("output", "weights"), got, want, plain, strict=True):
        g, w, p = (t.detach().double() for t in (g, w, p))
        assert_close_to_scale(g, w, rel=plain_math_rel(p, w), what=f"chunked {name}")


@pytest.mark.parametrize("backend", ["reference", "chunked"])
def test_additive_small_hidden_at_large_scale(backend: str) -> None:
    """Additive logits of one or two hidden terms at scale 1e5, their tanh arguments near
    0 and below it: output and weights within a few roundings of the logits' size."""
    gen = torch.Generator().manual_seed(5)
    L, S, E = 5, 7, 4
    q, k, v = (torch.randn(2, n, e, generator=gen) * s for n, e, s in ((L, E, 0.05), (S, E, 0.05), (S, 3, 1.0)))  # fmt: skip
    for hidden in (1, 2):
        torch.manual_seed(hidden)
        score = scores.Additive(E, E, hidden)
        kw: dict[str, Any] = {"score": score, "scale": ADDITIVE_SCALE, "return_weights": True}
        out, w = attnkit.attention(q, k, v, **kw, backend=backend)
        out64, w64 = attnkit.attention(q.double(), k.double(), v.double(),
                                       score=score.double(), scale=ADDITIVE_SCALE,
                                       return_weights=True, backend="reference")  # fmt: skip
        score.float()
        # a logit of size |s| rounds by |s| * eps: the weights move by that much
        rel = WEIGHTS * ADDITIVE_SCALE * float(score.w_v.weight.detach().abs().sum()) * EPS
        assert_close_to_scale(w, w64, rel=max(rel, FLOAT32_REL), what=f"{backend} weights")
        assert_close_to_scale(out, out64, rel=max(rel, FLOAT32_REL), what=f"{backend} output")
