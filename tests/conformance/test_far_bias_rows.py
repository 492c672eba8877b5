"""Bias rows far from 0 (``-1e30``, the lowest float32, TensorFlow's ``-1e9``) on every
CPU backend, forward and backward, against the peer: softmax of ``q·k + b`` written
out in float32 with torch's autograd, which is what torch's layers, transformers' eager
attention and Keras compute. Such a row's logits round to its bias, so it spreads over
its keys; its lse, ``-1e30 + log S``, rounds to ``-1e30``. torch's fused backward
recomputes each weight as ``exp(s - lse)`` from it and gave gradients ``S`` times too
large (relative error 5.3 at S = 16); every backend now matches the peer. See
``attnkit._far_rows``.
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
    bias[:, :, 3] = -1e9  # TensorFlow's
    bias[:, :, 4, : S // 2] = -1e30  # half a row: its other keys take the weight
    return bias


def _peer(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, keep: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) written out in float32, differentiable: the peers' softmax. The lse is
    ``m + log(sum(exp(s - m)))`` with its row maximum m held constant: torch's own
    logsumexp differentiates through ``exp(s - lse)`` and has these rows' error."""
    s = q @ k.transpose(-1, -2) / E**0.5 + bias  # (B, H, L, S)
    s = s.masked_fill(~keep, float("-inf"))
    top = s.detach().amax(dim=-1, keepdim=True)  # (B, H, L, 1)
    lse = (top + torch.log(torch.exp(s - top).sum(dim=-1, keepdim=True))).squeeze(-1)
    return torch.softmax(s, dim=-1) @ v, lse


def _grads(
    out: torch.Tensor, lse: torch.Tensor | None, wrt: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(9)
    loss = (out * torch.randn(out.shape, generator=gen)).sum()
    if lse is not None:
        loss = loss + (lse * torch.randn(lse.shape, generator=gen)).sum()
    return torch.autograd.grad(loss, wrt)


def _inputs(seed: int, learnable_bias: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, E, generator=gen).requires_grad_() for n in (L, S, S))
    return q, k, v, _bias(gen).requires_grad_(learnable_bias)


def _check(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], names: str) -> None:
    for name, g, w in zip(names.split(), got, want, strict=True):
        assert_close_to_scale(g, w, what=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_far_rows_with_a_differentiable_lse(backend: str) -> None:
    """The lse's own gradient (sdpa: the fused backward from the lse, handed to the
    materialized backward for such rows, which normalizes them by their own sums)."""
    q, k, v, bias = _inputs(2, False)
    out, lse = attnkit.attention(q, k, v, mask=masks.bias(bias), backend=backend, return_lse=True)
    want_out, want_lse = _peer(q, k, v, bias, torch.ones(L, S, dtype=torch.bool))
    _check(_grads(out, lse, (q, k, v)), _grads(want_out, want_lse, (q, k, v)), "dq dk dv")
    for row in range(L):  # rows of 1e30 beside rows of 1: each against its own size
        assert_close_to_scale(lse[..., row], want_lse[..., row], what=f"lse row {row}")


@pytest.mark.parametrize("causal", [False, True], ids=["bias", "bias&causal"])
@pytest.mark.parametrize("learnable", [False, True], ids=["fixed", "learnable"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_far_rows_match_the_peer_forward_and_backward(
    backend: str, learnable: bool, causal: bool
) -> None:
    """Under the causal mask rows 0-2 keep only keys that carry -1e30 (the later keys
    are ordinary)."""
    if learnable and backend == "chunked":
        pytest.skip("chunked refuses a learnable bias (its gradient is L×S)")
    q, k, v, bias = _inputs(1, learnable)
    keep = torch.ones(L, S, dtype=torch.bool)
    mask = masks.bias(bias)
    if causal:
        with torch.no_grad():
            bias[..., :3] = -1e30
        keep, mask = keep.tril(), mask & masks.causal()
    wrt = (q, k, v, bias) if learnable else (q, k, v)
    out = attnkit.attention(q, k, v, mask=mask, backend=backend)
    want = _peer(q, k, v, bias, keep)[0]
    names = "dq dk dv dbias" if learnable else "dq dk dv"
    _check((out, *_grads(out, None, wrt)), (want, *_grads(want, None, wrt)), "out " + names)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_backward_refuses_an_lse_that_lost_its_row(backend: str) -> None:
    """attention_backward from (out, lse) of a call with a row of -1e30: the lse is
    -1e30 in float32, its log S lost, and the gradients were 14x too large; it is
    refused by name. A block of such a row whose lse is ordinary (other keys of the
    row dominate it, as in a context-parallel ring) is exact as given."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, n, E, generator=gen).requires_grad_() for n in (L, S, S))
    bias = torch.randn(L, S, generator=gen)
    bias[1] = -1e30
    out, lse = attnkit.attention(q, k, v, mask=masks.bias(bias), backend=backend, return_lse=True)
    d_out = torch.randn(out.shape, generator=gen)
    given = (q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), d_out)
    with pytest.raises(ValueError, match=r"^lse: 2 row\(s\) have a bias far from 0 for every"):
        attnkit.attention_backward(*given, mask=masks.bias(bias), backend=backend)
    # two key blocks of a row whose first block is ordinary: the second's far row is exact
    block = torch.randn(L, 2 * S, generator=gen)
    block[1, S:] = -1e30
    k2, v2 = (torch.randn(1, 2, 2 * S, E, generator=gen).requires_grad_() for _ in range(2))
    out2, lse2 = attnkit.attention(q, k2, v2, mask=masks.bias(block), return_lse=True)
    want = torch.autograd.grad((out2 * d_out).sum(), (k2, v2))
    parts = [
        attnkit.attention_backward(
            q.detach(),
            k2.detach()[..., sl, :],
            v2.detach()[..., sl, :],
            out2.detach(),
            lse2.detach(),
            d_out,
            mask=masks.bias(block[:, sl]),
            backend=backend,
        )
        for sl in (slice(0, S), slice(S, 2 * S))
    ]
    assert_close_to_scale(torch.cat([p[1] for p in parts], dim=-2), want[0], what="dk")
    assert_close_to_scale(torch.cat([p[2] for p in parts], dim=-2), want[1], what="dv")


def test_a_bias_changed_in_place_is_read_again() -> None:
    """A bias is read once per version: an in-place update (an optimizer's step) to a
    far row is seen, and an inference-mode tensor, which keeps no version, is read."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, n, E, generator=gen).requires_grad_() for n in (L, S, S))
    bias = torch.zeros(L, S)
    mask = masks.bias(bias)
    attnkit.attention(q, k, v, mask=mask, backend="sdpa")  # read: nothing far
    bias[1] = -1e30
    out = attnkit.attention(q, k, v, mask=mask, backend="sdpa")
    want = _peer(q, k, v, bias, torch.ones(L, S, dtype=torch.bool))[0]
    _check(_grads(out, None, (q, k, v)), _grads(want, None, (q, k, v)), "dq dk dv")
    assert mask.has_bias_beyond(64.0)
    with torch.inference_mode():
        frozen = torch.zeros(L, S)
        frozen[1] = -1e30
        assert masks.bias(frozen).has_bias_beyond(64.0)
