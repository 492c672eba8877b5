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
SHAPES = ((512, 512, "top_left"), (1, 1024, "bottom_right"), (64, 700, "bottom_right"))
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
