"""Gradients: gradcheck in float64 for every score and mask kind, on every backend
that supports autograd; fully masked rows give zero gradients and never NaN."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks

from cases import MASKS, SCORES, make_case, matrix_backends, refused
from tolerance import FLOAT64_REL, GRADCHECK_ATOL, assert_close_to_scale

BACKENDS = matrix_backends("cpu")


def _runs(case, backend: str) -> bool:  # type: ignore[no-untyped-def]
    ex = attnkit.explain(case.q, case.k, case.v, score=case.score, mask=case.mask, backend=backend)
    return not ex.reasons[backend]


@pytest.mark.pairwise(unsupported=refused)
@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("score_name", SCORES)
def test_gradcheck(score_name: str, mask_name: str, device: str, backend: str) -> None:
    case = make_case(
        score_name, mask_name, (2, 2, 1, 3, 4, 3, 2), seed=21, dtype=torch.float64, device=device
    )
    if not _runs(case, backend):
        pytest.skip(f"{backend} does not run {score_name} (checked in the oracle tests)")
    params = [p for p in case.score.parameters()]
    leaves = [t.clone().requires_grad_(True) for t in (case.q, case.k, case.v)]
    for p in params:
        p.requires_grad_(True)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, score=case.score, mask=case.mask, backend=backend)

    assert torch.autograd.gradcheck(
        fn, (*leaves, *params), eps=1e-6, atol=GRADCHECK_ATOL, fast_mode=True
    )


@pytest.mark.parametrize("query_grad", [False, True])
@pytest.mark.parametrize("lse", ["return_lse", "sinks"])
def test_a_learnable_bias_mask_gets_its_gradient_through_the_lse(
    lse: str, query_grad: bool, backend: str
) -> None:
    """A bias mask that requires grad, in a call whose lse is differentiated (asked for,
    or taken by sinks to join the softmax): the bias's gradient is exact on every
    backend that runs the call, automatic dispatch included (sdpa's fused lse carries no
    gradient to a bias, so it refuses the call)."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(1, 2, 3, 4, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, 5, 3, generator=g, dtype=torch.float64)
    bias = torch.randn(1, 2, 3, 5, generator=g, dtype=torch.float64).requires_grad_()
    q.requires_grad_(query_grad)
    kwargs = {"return_lse": True} if lse == "return_lse" else {"mods": attnkit.mods.sinks(
        torch.tensor([0.3, -0.2], dtype=torch.float64))}  # fmt: skip
    for name in (backend, None):
        ex = attnkit.explain(q, k, v, mask=masks.bias(bias), backend=name, **kwargs)
        if ex.chosen is None:
            continue

        def fn(q: torch.Tensor, b: torch.Tensor, name: str | None = name) -> torch.Tensor:
            got = attnkit.attention(q, k, v, mask=masks.bias(b), backend=name, **kwargs)
            if isinstance(got, tuple):  # (out, lse): both differentiated
                return got[0].sum(-1) + got[1]  # (B, H, L)
            return got

        assert torch.autograd.gradcheck(fn, (q, bias), eps=1e-6, atol=GRADCHECK_ATOL)


@pytest.mark.parametrize("score_name", ["gaussian", "bilinear", "additive"])
def test_learnable_score_parameters_get_gradients(
    score_name: str, device: str, backend: str
) -> None:
    case = make_case(
        score_name, "causal", (2, 2, 2, 5, 5, 4, 3), seed=4, dtype=torch.float64, device=device
    )
    if score_name == "gaussian":
        case.score = attnkit.scores.Gaussian(1.3, learnable=True).double().to(device)
    if not _runs(case, backend):
        pytest.skip(f"{backend} does not run {score_name}")
    params = list(case.score.parameters())
    assert params

    def grads(name: str) -> tuple[torch.Tensor, ...]:
        out = attnkit.attention(
            case.q, case.k, case.v, score=case.score, mask=case.mask, backend=name
        )
        return torch.autograd.grad(out.square().sum(), params)

    got, ref = grads(backend), grads("reference")
    for g, r in zip(got, ref, strict=True):
        assert g.abs().sum() > 0
        assert_close_to_scale(g, r, rel=FLOAT64_REL)


@pytest.mark.parametrize("score_name", SCORES)
def test_fully_masked_rows_have_zero_output_and_gradients(score_name: str, backend: str) -> None:
    case = make_case(score_name, "none", (2, 2, 2, 4, 6, 3, 5), seed=9, dtype=torch.float32)
    if not _runs(case, backend):
        pytest.skip(f"{backend} does not run {score_name}")
    q = case.q.clone().requires_grad_(True)
    k = case.k.clone().requires_grad_(True)
    v = case.v.clone().requires_grad_(True)
    keep = torch.ones(2, 1, 4, 6, dtype=torch.bool)
    keep[0, :, 1] = False  # batch 0, query 1: nothing to attend
    keep[1] = False  # batch 1: every row dead
    out = attnkit.attention(q, k, v, score=case.score, mask=masks.keep(keep), backend=backend)
    assert not out.isnan().any()
    assert not out[0, :, 1].any() and not out[1].any()
    (out * torch.randn_like(out)).sum().backward()
    for g in (q.grad, k.grad, v.grad):
        assert g is not None and not g.isnan().any()
    assert not q.grad[0, :, 1].any() and not q.grad[1].any()  # type: ignore[index]
    assert not k.grad[1].any() and not v.grad[1].any()  # type: ignore[index]


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_bottom_right_causal_with_more_queries_than_keys_gives_dead_rows(align: str) -> None:
    q = torch.randn(1, 5, 3, requires_grad=True)
    k = torch.randn(1, 2, 3)
    for backend in BACKENDS:
        out, w, lse = attnkit.attention(
            q,
            k,
            k,
            mask=masks.causal(align),
            return_weights=True,
            return_lse=True,
            backend=[backend, "reference"],
        )
        dead = 3 if align == "bottom_right" else 0  # rows i < L - S see no key
        assert not out[:, :dead].any() and not w[:, :dead].any()
        assert torch.isinf(lse[:, :dead]).all() and torch.isfinite(lse[:, dead:]).all()


@pytest.mark.parametrize("backend", [None, "sdpa"], ids=["auto", "sdpa"])
@pytest.mark.parametrize("extra", ["lse", "sinks"])
def test_score_parameters_are_those_of_the_forward(backend: str | None, extra: str) -> None:
    """A backward from (out, lse) (sdpa with return_lse or sinks) recomputes the logits:
    with the parameters of the forward, not those the module holds at backward time.
    Under torch.func.functional_call the module got its own weight back before the
    backward (dW 0.77 off, dq 0.74); an in-place change before the backward raises, as
    in torch."""
    from torch.func import functional_call

    from attnkit import mods, scores

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    q.requires_grad_(True)
    score = scores.Bilinear(4, 4).double()
    sinks = mods.sinks(torch.zeros(2, dtype=torch.float64))

    def run(module: torch.nn.Module, query: torch.Tensor) -> torch.Tensor:
        if extra == "lse":
            out, lse = attnkit.attention(query, k, v, score=module, backend=backend,
                                         return_lse=True)  # fmt: skip
            return out.sum(-1) + lse
        return attnkit.attention(query, k, v, score=module, backend=backend, mods=sinks).sum(-1)

    weight = (score.weight.detach() * 1.5 + 0.3).requires_grad_(True)
    y = functional_call(_Caller(score, run), {"score.weight": weight}, (q,))
    d_weight, d_q = torch.autograd.grad((y * y).sum(), [weight, q])
    reference = scores.Bilinear(4, 4).double()
    with torch.no_grad():
        reference.weight.copy_(weight)
    reference.weight.requires_grad_(True)
    want_y = run(reference, q)
    want_w, want_q = torch.autograd.grad((want_y * want_y).sum(), [reference.weight, q])
    assert_close_to_scale(d_weight, want_w, rel=FLOAT64_REL, what="dW")
    assert_close_to_scale(d_q, want_q, rel=FLOAT64_REL, what="dq")
    y = run(score, q)
    with torch.no_grad():
        score.weight.mul_(2.0)  # an optimizer step before the backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


class _Caller(torch.nn.Module):
    def __init__(self, score: torch.nn.Module, run) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.score, self.run = score, run

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return self.run(self.score, q)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sinks_second_derivatives_with_a_row_that_keeps_no_key(backend: str) -> None:
    """A row with no key has lse -inf: the sink's join took derivatives at -inf, and the
    second derivative of the sink logits through the lse was NaN on every backend."""
    from attnkit import mods

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 3, dtype=torch.float64) for n in (3, 4, 4))
    sink = torch.randn(2, dtype=torch.float64)
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[1] = False  # row 1 keeps no key

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor) -> tuple:  # type: ignore[type-arg]
        return attnkit.attention(q, k, v, mask=masks.keep(keep), mods=mods.sinks(sink),
                                 backend=backend, return_lse=True)  # fmt: skip

    inputs = tuple(t.requires_grad_(True) for t in (q, k, v, sink))
    assert torch.autograd.gradgradcheck(fn, inputs, atol=GRADCHECK_ATOL)


@pytest.mark.parametrize("backend", [None, "sdpa"], ids=["auto", "sdpa"])
@pytest.mark.parametrize("learnt", ["head_scale", "alibi_slopes"])
def test_an_lse_differentiates_a_learnt_scale_or_slopes_alone(backend: str | None,
                                                              learnt: str) -> None:  # fmt: skip
    """With q, k and v constant, a call still needs its gradient when a per-head scale or
    ALiBi slopes require grad: sdpa's lse had no grad_fn for the scale and gave the
    slopes [-3, -3] for [-5.55, -6.44]."""
    from attnkit import mods

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    p = torch.tensor([0.5, 1.2] if learnt == "head_scale" else [0.5, 0.25],
                     dtype=torch.float64, requires_grad=True)  # fmt: skip
    kw: dict = (  # type: ignore[type-arg]
        {"scale": p} if learnt == "head_scale"
        else {"mods": mods.alibi(p, causal=True), "mask": masks.causal()}
    )  # fmt: skip
    _, lse = attnkit.attention(q, k, v, return_lse=True, backend=backend, **kw)
    (got,) = torch.autograd.grad(lse.sum(), p)
    _, want_lse = attnkit.attention(q, k, v, return_lse=True, backend="reference", **kw)
    (want,) = torch.autograd.grad(want_lse.sum(), p)
    assert_close_to_scale(got, want, rel=FLOAT64_REL)
