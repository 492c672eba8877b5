"""Softcap caps over their whole accepted range, on every CPU backend that takes them,
against the float64 oracle: finite caps from float32's smallest normal value to its
largest give finite outputs and gradients in float32, bfloat16 and float16 (a cap of
3.5e38 used to give all-NaN outputs), and ``softcap(inf)`` is no cap at all."""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit import mods
from attnkit.mods.logits import CAP_RANGE

from cases import CPU_BACKENDS, make_case, np_of
from reference import oracle
from tolerance import (
    BFLOAT16_REL,
    FLOAT16_REL,
    FLOAT32_CALL_REL,
    assert_close_to_scale,
    half_grad_rel,
)

SHAPE = (2, 2, 2, 5, 7, 4, 3)  # (B, H, Hk, L, S, E, Ev)
REL = {torch.float32: FLOAT32_CALL_REL, torch.bfloat16: BFLOAT16_REL, torch.float16: FLOAT16_REL}
"""The output's error allowed relative to its scale: one float32 call against float64
math, or the output rounded to the half dtype (its gradients: ``half_grad_rel``)."""


@pytest.mark.parametrize("dtype", list(REL), ids=str)
@pytest.mark.parametrize("cap", [CAP_RANGE[0], 0.5, 2.0, 1e30, CAP_RANGE[1]], ids=repr)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_caps_across_the_accepted_range(backend: str, cap: float, dtype: torch.dtype) -> None:
    case = make_case("scaled_dot", "causal_bottom_right", SHAPE, seed=3, dtype=dtype)
    q, k, v = (t.detach().requires_grad_() for t in (case.q, case.k, case.v))
    kw = {"mask": case.mask, "mods": mods.softcap(cap), "backend": backend}
    if attnkit.explain(q, k, v, **kw).reasons[backend]:
        pytest.skip(f"{backend} does not take softcap")
    out = attnkit.attention(q, k, v, **kw)
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    ref_out, _, _ = oracle(np_of(q), np_of(k), np_of(v), score=case.score_spec,
                           mask=case.mask_spec, mods=[("softcap", cap)])  # fmt: skip
    assert_close_to_scale(out, torch.from_numpy(ref_out), rel=REL[dtype], what="output")
    t64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = attnkit.attention(*t64, mask=case.mask, mods=mods.softcap(cap), backend="reference")
    want = torch.autograd.grad(ref.square().sum(), t64)
    for name, g, w in zip("qkv", grads, want, strict=True):
        assert torch.isfinite(g).all(), f"d{name}: not finite"
        assert_close_to_scale(g, w, rel=half_grad_rel(dtype), what=f"d{name}")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_an_infinite_cap_is_no_cap(backend: str) -> None:
    case = make_case("gaussian", "key_padding", SHAPE, seed=4, dtype=torch.float64)
    args = (case.q, case.k, case.v)
    capped = attnkit.attention(*args, score=case.score, mask=case.mask,
                               mods=mods.softcap(math.inf), backend=backend)  # fmt: skip
    plain = attnkit.attention(*args, score=case.score, mask=case.mask, backend=backend)
    assert torch.equal(capped, plain)


def test_an_infinite_cap_keeps_a_call_on_sdpa() -> None:
    case = make_case("scaled_dot", "causal", SHAPE, seed=5)
    ex = attnkit.explain(case.q, case.k, case.v, mask=case.mask, mods=mods.softcap(math.inf))
    assert ex.chosen == "sdpa"
