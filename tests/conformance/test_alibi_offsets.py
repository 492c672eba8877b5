"""ALiBi in float32 at large positions: the error against float64 does not grow with the
offset, on every CPU backend (sdpa folds causal ALiBi into the features as a key bias;
chunked and reference form it per pair).

Each shape runs at q_offset = k_offset = 0, 10**5 and 10**6: the same relative positions,
so the exact answer is the same. The bias is formed from relative positions, so its
float32 rounding is bounded by the window (slope x half the sequence), not by the
offset. (Regression: sdpa formed it as the difference of two absolute positions:
errors of 2e-3 at 10**5 and 2e-2 at 10**6 where 4e-6 is right.)
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import attnkit
from attnkit import masks, mods

from cases import np_of
from reference import oracle

H, E = 8, 16  # eight heads: the steepest slope is 0.5
OFFSETS = (0, 100_000, 1_000_000)
# (L, S, align): a prefill, a decoding step, a chunk of queries over a long cache
SHAPES = ((256, 256, "top_left"), (1, 1024, "bottom_right"), (64, 700, "bottom_right"))
EPS = torch.finfo(torch.float32).eps


def _bound(L: int, S: int) -> float:
    """A few float32 roundings of the largest bias a fused kernel holds: the steepest
    slope (0.5) times half the window (the positions are relative to its middle)."""
    return 4 * EPS * (1 + 0.5 * max(L, S) / 2)


def _call(L: int, S: int, align: str, offset: int) -> tuple[list[torch.Tensor], mods.ALiBi]:
    """(q, k, v) in float32, the same at every offset, and the ALiBi at ``offset``."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, L, E, generator=g)
    k, v = (torch.randn(1, H, S, E, generator=g) for _ in range(2))
    alibi = mods.alibi(H, causal=True, align=align, q_offset=offset, k_offset=offset)
    return [q, k, v], alibi


@functools.cache
def _float64(L: int, S: int, align: str, offset: int) -> tuple[np.ndarray, ...]:
    """The oracle's output and lse, and the float64 reference backend's gradients."""
    (q, k, v), alibi = _call(L, S, align, offset)
    q0 = offset + (S - L if align == "bottom_right" else 0)
    slopes = mods.alibi_slopes(H).double().numpy()
    out, _, lse = oracle(np_of(q), np_of(k), np_of(v), mask=("causal", align),
                         mods=[("alibi", slopes, True, q0, offset)])  # fmt: skip
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    out64 = attnkit.attention(*leaves, mask=masks.causal(align), mods=alibi, backend="reference")
    grads = torch.autograd.grad(out64.sum(), leaves)
    return (out, lse, *(np_of(d) for d in grads))


def _errors(L: int, S: int, align: str, offset: int, backend: str) -> tuple[float, float, float]:
    """(output, lse, gradient) errors of a float32 call against float64, relative to scale."""
    (q, k, v), alibi = _call(L, S, align, offset)
    ref_out, ref_lse, *ref_grads = _float64(L, S, align, offset)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out, lse = attnkit.attention(*leaves, mask=masks.causal(align), mods=alibi, return_lse=True,
                                 backend=backend)  # fmt: skip
    grads = torch.autograd.grad(out.sum(), leaves)

    def err(got: torch.Tensor, want: np.ndarray) -> float:
        return float(np.abs(np_of(got) - want).max() / np.abs(want).max())

    grad_err = max(err(a, b) for a, b in zip(grads, ref_grads, strict=True))
    return err(out, ref_out), err(lse, ref_lse), grad_err


@pytest.mark.parametrize("backend", ["sdpa", "chunked", "reference"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"L{s[0]}-S{s[1]}-{s[2]}")
def test_causal_alibi_keeps_float32_precision_at_any_offset(shape: tuple[int, int, str],
                                                            backend: str) -> None:  # fmt: skip
    L, S, align = shape
    alibi = mods.alibi(H, causal=True, align=align, q_offset=10**6, k_offset=10**6)
    q = torch.zeros(1, H, L, E)
    k = torch.zeros(1, H, S, E)
    ex = attnkit.explain(q, k, k, mask=masks.causal(align), mods=alibi, return_lse=True)
    assert ex.chosen == "sdpa", ex.reasons  # the fused path is the one under test by default
    at_zero = _errors(L, S, align, 0, backend)
    bound = _bound(L, S)
    for offset in OFFSETS:
        errs = at_zero if offset == 0 else _errors(L, S, align, offset, backend)
        for what, err, err0 in zip(("output", "lse", "gradient"), errs, at_zero, strict=True):
            assert err <= bound, f"{what} at offset {offset}: error {err:.3g} > {bound:.3g}"
            assert err <= 2 * err0 + 2 * EPS, (
                f"{what}: error {err:.3g} at offset {offset} grew from {err0:.3g} at offset 0"
            )


# ---------------------------------------------------------------------- far keys
#
# Queries and keys far apart (k_offset - q_offset = D): every pair's ALiBi bias is the
# bias at D = 0 of slopes s' plus the same s' * D, with s' = s for the causal form and
# for the symmetric one when the keys are far before the queries (-|d| = d), s' = -s
# when they are far after them (-|d| = -d). Softmax ignores s' * D, so output, weights
# and the gradients of q, k, v are those of the call at D = 0, the lse is shifted by
# s' * D, and the slopes' gradient gains D times each head's sum of the lse's gradient.
# The call at D = 0 has small numbers only: the float64 reference backend there is the
# oracle. (Regression: chunked formed the bias from the absolute offsets, so float32
# lost it (errors of 1e-2 on the output at D = 10**6), and the slopes' gradient, a sum
# of terms of size D that cancel, was off by 1e-5 even in float64; sdpa's folded key
# bias grew with D as well.)

FAR_GAPS = (10_007, 1_000_003, -1_000_000, -(2**40))
FAR_FORMS = ("causal", "symmetric")
FAR_SHAPES = ((7, 9, "top_left"), (1, 33, "bottom_right"))  # (L, S, align)


def _far_call(L: int, S: int, align: str, dtype: torch.dtype, seed: int = 3
              ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:  # fmt: skip
    """(q, k, v) (2, H, L or S, E) in ``dtype`` and the loss's weights, float64."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, L, E, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, H, S, E, generator=g, dtype=torch.float64) for _ in range(2))
    w = {"out": torch.randn(2, H, L, E, generator=g, dtype=torch.float64),
         "lse": torch.randn(2, H, L, generator=g, dtype=torch.float64),
         "weights": torch.randn(2, H, L, S, generator=g, dtype=torch.float64)}  # fmt: skip
    return [t.to(dtype) for t in (q, k, v)], w


def _run_far(qkv: list[torch.Tensor], w: dict[str, torch.Tensor], slopes: torch.Tensor,
             causal: bool, align: str, gap: int, backend: str, mask: object,
             with_lse: bool) -> dict[str, torch.Tensor]:  # fmt: skip
    """Output, weights, lse and the gradients of a random loss on them (the lse in the loss
    only ``with_lse``) of ALiBi with keys ``gap`` positions from the queries."""
    leaves = [t.clone().requires_grad_() for t in (*qkv, slopes)]
    alibi = mods.alibi(leaves[3], causal=causal, align=align, q_offset=0, k_offset=gap)
    out, weights, lse = attnkit.attention(*leaves[:3], mask=mask, mods=alibi, backend=backend,
                                          return_weights=True, return_lse=True)  # fmt: skip
    got = {"out": out, "weights": weights, "lse": lse}
    loss = sum((got[n].double() * w[n]).sum() for n in ("out", "weights"))
    if with_lse:
        loss = loss + (lse.double() * w["lse"]).sum()
    grads = torch.autograd.grad(loss, leaves)
    got.update(zip(("d_q", "d_k", "d_v", "d_slopes"), grads, strict=True))
    return {n: t.detach().double() for n, t in got.items()}


def _far_expected(L: int, S: int, align: str, form: str, gap: int, mask: object,
                  with_lse: bool) -> dict[str, torch.Tensor]:  # fmt: skip
    """The far call's results from the float64 reference backend at D = 0 (see above)."""
    qkv, w = _far_call(L, S, align, torch.float64)
    base = mods.alibi_slopes(H).double()
    sign = -1.0 if form == "symmetric" and gap > 0 else 1.0  # s' = sign * s
    near = _run_far(qkv, w, sign * base, True, align, 0, "reference", mask, with_lse)
    lse_shift = (sign * base * gap).view(H, 1)  # s' * D per head
    near["lse"] = near["lse"] + lse_shift
    d_common = w["lse"].sum(dim=(0, 2)) * gap if with_lse else torch.zeros(H, dtype=torch.float64)
    near["d_slopes"] = sign * (near["d_slopes"] + d_common)  # d/ds = sign * d/ds'
    return near


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin)
    scale = float(want[fin].abs().max()) if bool(fin.any()) else 1.0
    return float((got[fin] - want[fin]).abs().max()) / max(scale, 1e-300)


@pytest.mark.pairwise
@pytest.mark.parametrize("backend", ["sdpa", "chunked", "reference"])
@pytest.mark.parametrize("with_lse", [False, True], ids=["loss-out-weights", "loss-lse-too"])
@pytest.mark.parametrize("gap", FAR_GAPS)
@pytest.mark.parametrize("form", FAR_FORMS)
@pytest.mark.parametrize("shape", FAR_SHAPES, ids=lambda s: f"L{s[0]}-S{s[1]}-{s[2]}")
def test_alibi_with_far_keys_matches_the_near_call(shape: tuple[int, int, str], form: str,
                                                   gap: int, with_lse: bool,
                                                   backend: str) -> None:  # fmt: skip
    L, S, align = shape
    causal = form == "causal"
    # the symmetric form runs fused only under a causal band (its keys at or before the
    # queries); a key padding mask otherwise, so that masks with lengths are covered too
    mask = masks.causal(align) if form == "symmetric" and gap < 0 else masks.key_padding(
        torch.tensor([[False] * (S - 1) + [True], [False] * S])
    )  # fmt: skip
    qkv, _ = _far_call(L, S, align, torch.float32)
    alibi = mods.alibi(H, causal=causal, align=align, k_offset=gap)
    ex = attnkit.explain(*qkv, mask=mask, mods=alibi, return_weights=True, return_lse=True,
                         backend=backend)  # fmt: skip
    if ex.reasons[backend]:
        assert backend == "sdpa" and not causal and gap > 0, ex.reasons  # (no causal band)
        pytest.skip(f"{backend} declines: {ex.reasons[backend]}")
    want = _far_expected(L, S, align, form, gap, mask, with_lse)
    for dtype, tol in ((torch.float64, 1e-13), (torch.float32, 1e-5)):
        qkv, w = _far_call(L, S, align, dtype)
        slopes = mods.alibi_slopes(H).to(dtype)
        got = _run_far(qkv, w, slopes, causal, align, gap, backend, mask, with_lse)
        for name, t in got.items():
            err = _rel_error(t, want[name])
            assert err <= tol, f"{name} in {dtype}: error {err:.3g} > {tol:g} at gap {gap}"
