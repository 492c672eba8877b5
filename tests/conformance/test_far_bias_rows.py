"""Bias rows far from 0 (``-1e30``, the lowest float32, ``+1e6``) on every CPU backend.

Softmax ignores a constant added to a row, so such a row is the softmax of its logits
with the bias's largest kept value taken off: the float64 formula below, written that
way, keeps ``q·k`` in full where ``q·k + b`` would round it away (in float64 too). Every
backend must give those numbers, forward and backward, to the suite's float32 rule:
torch's fused backward recomputes each weight as ``exp(s - lse)`` and, with an lse of
``-1e30`` rounded to float32, gave gradients ``S`` times too large (5.3 relative error
at S = 16); the forward gave a uniform row; and the answer depended on whether the call
was differentiated. See ``attnkit._far_rows``.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks

from tolerance import assert_close_to_scale

BACKENDS = ("reference", "chunked", "sdpa")
B, H, L, S, E = 2, 2, 6, 16, 8
LOWEST = torch.finfo(torch.float32).min


def _bias(gen: torch.Generator) -> torch.Tensor:
    """(B, H, L, S) float32: ordinary rows and far ones."""
    bias = torch.randn(B, H, L, S, generator=gen)
    bias[:, :, 1] = -1e30  # a whole row far below: every key carries it
    bias[:, :, 2] = LOWEST  # transformers' fill value
    bias[:, :, 3] += 1e6  # far above, its values rounded to 1/16 but kept
    bias[:, :, 4, : S // 2] = -1e30  # half a row: its largest value is ordinary
    bias[0, 1, 5] = float("-inf")  # a row that keeps no key
    return bias


def _want(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, keep: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """(out, lse, dq, dk, dv, dbias) in float64 with every row shifted by its largest
    kept bias: the same function, its logits unrounded."""
    q64, k64, v64, b64 = (t.detach().double().requires_grad_() for t in (q, k, v, bias))
    kept = b64.detach().masked_fill(~keep, float("-inf"))
    top = kept.amax(dim=-1, keepdim=True)  # (B, H, L, 1)
    shift = torch.where(torch.isfinite(top), top, torch.zeros(()))
    s = q64 @ k64.transpose(-1, -2) / E**0.5 + (b64 - shift)  # (B, H, L, S)
    s = s.masked_fill(~keep, float("-inf"))
    alive = torch.isfinite(s).any(dim=-1, keepdim=True)  # (B, H, L, 1)
    p = torch.softmax(torch.where(alive, s, 0.0), dim=-1) * alive
    out = p @ v64
    lse = torch.where(alive, torch.logsumexp(torch.where(alive, s, 0.0), -1, True), -torch.inf)
    lse = (lse + shift).squeeze(-1)  # (B, H, L)
    gen = torch.Generator().manual_seed(9)
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((out * d_out).sum(), (q64, k64, v64, b64))
    return (out.detach(), lse.detach(), *grads)


def _got(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: masks.Mask, backend: str
) -> tuple[torch.Tensor, ...]:
    out = attnkit.attention(q, k, v, mask=mask, backend=backend)
    with torch.no_grad():  # (sdpa's lse carries no gradient to a bias: it refuses both)
        _, lse = attnkit.attention(q, k, v, mask=mask, backend=backend, return_lse=True)
    gen = torch.Generator().manual_seed(9)
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64).float()
    bias = mask.biases()[0]
    wrt = (q, k, v, bias) if bias.requires_grad else (q, k, v)
    grads = torch.autograd.grad((out * d_out).sum(), wrt)
    return (out.detach(), lse.detach(), *grads)


def _learnable(backend: str) -> bool:
    """Whether the backend differentiates a bias (chunked refuses: its gradient is L×S)."""
    return backend != "chunked"


def _inputs(seed: int, backend: str) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, E, generator=gen).requires_grad_() for n in (L, S, S))
    return q, k, v, _bias(gen).requires_grad_(_learnable(backend))


def _check(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    names = ("output", "lse", "dq", "dk", "dv", "dbias")
    for name, g, w in zip(names, got, want, strict=False):  # (no dbias: not learnable)
        if name == "lse":  # rows of 1e30 beside rows of 1: each row against its own size
            for row in range(L):
                assert_close_to_scale(g[..., row], w[..., row].float(), what=f"lse row {row}")
        else:
            assert_close_to_scale(g, w.float(), what=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_far_rows_are_the_softmax_of_their_logits(backend: str) -> None:
    q, k, v, bias = _inputs(1, backend)
    keep = torch.ones(L, S, dtype=torch.bool)
    got = _got(q, k, v, masks.bias(bias), backend)
    _check(got, _want(q, k, v, bias, keep))
    # the numbers do not depend on whether the call is differentiated
    with torch.no_grad():
        plain = attnkit.attention(q, k, v, mask=masks.bias(bias), backend=backend)
    assert_close_to_scale(plain, got[0], what="output without a gradient")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_far_only_where_it_keeps_keys(backend: str) -> None:
    """Causal rows 0-2 keep only keys that carry -1e30 (the later keys' bias is
    ordinary): the shift is the largest value over the kept keys."""
    q, k, v, bias = _inputs(2, backend)
    with torch.no_grad():
        bias[..., :3] = -1e30
    keep = torch.ones(L, S, dtype=torch.bool).tril(S - L)  # bottom-right causal
    mask = masks.bias(bias) & masks.causal("bottom_right")
    got = _got(q, k, v, mask, backend)
    keep_top = torch.ones(L, S, dtype=torch.bool).tril()
    mask_top = masks.bias(bias) & masks.causal()
    _check(got, _want(q, k, v, bias, keep))
    _check(_got(q, k, v, mask_top, backend), _want(q, k, v, bias, keep_top))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_key_bias_of_one_far_batch_element(backend: str) -> None:
    """A (B, 1, 1, S) padding bias of -1e9, batch element 1 padded everywhere: that
    element's rows all shift, the bias grows to (B, 1, L, S) for the call alone."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, n, E, generator=gen).requires_grad_() for n in (L, S, S))
    pad = torch.zeros(B, 1, 1, S)
    pad[0, ..., S // 2 :] = -1e9
    pad[1] = -1e9
    pad.requires_grad_(_learnable(backend))
    got = _got(q, k, v, masks.bias(pad), backend)
    want = _want(q, k, v, pad.expand(B, H, L, S), torch.ones(L, S, dtype=torch.bool))
    want = (*want[:5], want[5].sum(dim=(1, 2), keepdim=True))  # (B, 1, 1, S)
    _check(got, want)
    assert pad.shape == (B, 1, 1, S)


def test_a_bias_changed_in_place_is_read_again() -> None:
    """A bias is read once per version: an in-place update (an optimizer's step) is
    seen, and an inference-mode tensor, which keeps no version, is read every call."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, n, E, generator=gen) for n in (L, S, S))
    bias = torch.zeros(L, S)
    mask = masks.bias(bias)
    ordinary = attnkit.attention(q, k, v, mask=mask, backend="reference")
    bias[1] = -1e30  # every key of row 1: the same softmax
    far = attnkit.attention(q, k, v, mask=mask, backend="reference")
    assert_close_to_scale(far, ordinary, what="after an in-place update")
    with torch.inference_mode():
        frozen = torch.zeros(L, S)
        frozen[1] = -1e30
        got = attnkit.attention(q, k, v, mask=masks.bias(frozen), backend="reference")
    assert_close_to_scale(got, ordinary, what="an inference-mode bias")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("small_dtype", "far_dtype", "far"),
    [
        (torch.float32, torch.float32, -1e30),
        (torch.float16, torch.float32, -1e30),
        (torch.bfloat16, torch.float32, -10000.3),
        (torch.float32, torch.float64, -1e300),
    ],
    ids=["f32&f32", "f16&f32", "bf16&f32", "f32&f64"],
)
def test_two_biases_in_either_order_and_dtype(
    backend: str, small_dtype: torch.dtype, far_dtype: torch.dtype, far: float
) -> None:
    """Each bias of an & is shifted by its own largest kept value, in its own dtype: a
    far row in the second bias took the first's values away (``small + 1e30`` in
    float32: relative error 0.87), or turned NaN where the shift did not fit the first
    bias's dtype (-1e30 in float16). An lse below float32 (-1e300 + ...) is held at
    the lowest float32, not the -inf of a row with no key."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, n, E, generator=gen) for n in (L, S, S))
    small = (3 * torch.randn(L, S, generator=gen)).to(small_dtype)
    far_bias = torch.zeros(L, S, dtype=far_dtype)
    far_bias[2] = far
    want_out, want_lse = attnkit.attention(
        q.double(), k.double(), v.double(), mask=masks.bias(small.double()), return_lse=True
    )
    lowest = torch.finfo(torch.float32).min
    want_lse[..., 2] = torch.clamp(want_lse[..., 2] + far, min=lowest)
    for mask in (
        masks.bias(small) & masks.bias(far_bias),
        masks.bias(far_bias) & masks.bias(small),
    ):
        out, lse = attnkit.attention(q, k, v, mask=mask, backend=backend, return_lse=True)
        assert_close_to_scale(out, want_out.float(), what="output")
        for row in range(L):
            assert_close_to_scale(lse[..., row], want_lse[..., row].float(), what=f"lse {row}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_backward_refuses_an_lse_that_lost_its_row(backend: str) -> None:
    """attention_backward from (out, lse) of a call with a row of -1e30: the lse is
    -1e30 in float32, its log S lost, and the gradients were 14x too large; it is
    refused by name. The same row shifted by the caller (mask and lse) is exact."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, n, E, generator=gen).requires_grad_() for n in (L, S, S))
    bias = torch.randn(L, S, generator=gen)
    bias[1] = -1e30
    out, lse = attnkit.attention(q, k, v, mask=masks.bias(bias), backend=backend, return_lse=True)
    d_out = torch.randn(out.shape, generator=gen)
    want = torch.autograd.grad((out * d_out).sum(), (q, k, v))
    given = (q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), d_out)
    with pytest.raises(ValueError, match=r"^lse: 2 row\(s\) of the mask's bias are far from 0"):
        attnkit.attention_backward(*given, mask=masks.bias(bias), backend=backend)
    shifted = bias.clone()
    shifted[1] = 0.0  # the row's largest kept value taken off the mask ...
    _, lse_shifted = attnkit.attention(
        q.detach(), k.detach(), v.detach(), mask=masks.bias(shifted), return_lse=True
    )  # ... and off the lse
    got = attnkit.attention_backward(
        *given[:4], lse_shifted, d_out, mask=masks.bias(shifted), backend=backend
    )
    for name, g, w in zip(("dq", "dk", "dv"), got[:3], want, strict=True):
        assert_close_to_scale(g, w, what=name)
