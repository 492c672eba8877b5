"""attention() and the layers under activation checkpointing, and batched gradients.

Selective activation checkpointing keeps the outputs of the operations a policy names
(here the matrix products, the usual choice) and hands them back in the recomputation,
refusing one that was written to since, or a region differentiated twice. A backward
through it must give the gradients of the same call without checkpointing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import attnkit
from attnkit import masks, mods, scores
from attnkit.nn import MultiheadAttention

_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default}


def _save_matmuls(ctx: object, op: object, *args: object, **kwargs: object) -> object:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective() -> object:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_save_matmuls)


def _bias() -> torch.Tensor:
    return torch.randn(1, 1, 9, 9, generator=torch.Generator().manual_seed(3), requires_grad=True)


CALLS: dict[str, Callable[..., torch.Tensor]] = {
    # sdpa's twice-differentiable call (weights, or a bias that takes a gradient)
    "sdpa_weights": lambda q, k, v: attnkit.attention(q, k, v, backend="sdpa", return_weights=True)[
        1
    ],
    "sdpa_learned_bias": lambda q, k, v: attnkit.attention(
        q, k, v, backend="sdpa", mask=masks.bias(_BIAS)
    ),
    # chunked's tiles (it scaled a matrix product's own output in place)
    "chunked": lambda q, k, v: attnkit.attention(q, k, v, backend="chunked"),
    "chunked_window": lambda q, k, v: attnkit.attention(
        q, k, v, backend="chunked", mask=masks.window(2, 0)
    ),
    # small blocks: the window's runs of whole blocks go through batched products
    "chunked_window_blocks": lambda q, k, v: _in_small_blocks(
        lambda: attnkit.attention(q, k, v, backend="chunked", mask=masks.window(2, 0))
    ),
    "alibi_automatic": lambda q, k, v: attnkit.attention(q, k, v, mods=mods.alibi(4)),
    "bilinear_chunked": lambda q, k, v: attnkit.attention(
        q, k, v, score=_BILINEAR, backend="chunked"
    ),
}


def _in_small_blocks(call: Callable[[], torch.Tensor]) -> torch.Tensor:
    from attnkit.backends.chunked.sizes import block_sizes

    with block_sizes(2, 2):
        return call()


_BIAS = _bias()
torch.manual_seed(0)
_BILINEAR = scores.Bilinear(8, 8)


def _grads(name: str, selective: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 9, 8, generator=g, requires_grad=True) for _ in range(3))
    fn = CALLS[name]
    if selective:
        out = checkpoint(fn, q, k, v, use_reentrant=False, context_fn=_selective)
    else:
        out = fn(q, k, v)
    out.sum().backward()
    grads = [t.grad for t in (q, k, v)]
    extra = [_BIAS, *_BILINEAR.parameters()]
    grads += [p.grad.clone() if p.grad is not None else None for p in extra]
    for p in extra:
        p.grad = None
    return grads  # type: ignore[return-value]


@pytest.mark.parametrize("name", list(CALLS))
def test_selective_checkpointing_gives_the_gradients_of_the_plain_call(name: str) -> None:
    want, got = _grads(name, selective=False), _grads(name, selective=True)
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)


def test_the_drop_in_with_its_default_weights_under_selective_checkpointing() -> None:
    torch.manual_seed(0)
    ours = MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(2, 7, 16)
    grads = []
    for selective in (False, True):
        ours.zero_grad()
        xi = x.clone().requires_grad_()
        run = functools.partial(ours, need_weights=True)
        if selective:
            out = checkpoint(run, xi, xi, xi, use_reentrant=False, context_fn=_selective)
        else:
            out = run(xi, xi, xi)
        (out[0].sum() + out[1].sum()).backward()
        grads.append([xi.grad, *(p.grad.clone() for p in ours.parameters())])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_batched_gradients_run_or_are_refused_by_name() -> None:
    # is_grads_batched: chunked's backward read a batched tensor on the host and failed
    # inside torch ("Batching rule not implemented for aten::is_nonzero")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 4, 3, generator=g, requires_grad=True) for _ in range(3))
    cotangents = torch.randn(3, 2, 2, 4, 3, generator=g)
    out = attnkit.attention(q, k, v, backend="reference")
    (batched,) = torch.autograd.grad(
        out, (q,), cotangents, is_grads_batched=True, retain_graph=True
    )
    for n in range(3):
        (one,) = torch.autograd.grad(out, (q,), cotangents[n], retain_graph=True)
        assert torch.equal(batched[n], one)
    out = attnkit.attention(q, k, v, backend="chunked")
    with pytest.raises(RuntimeError, match="chunked backend's backward cannot take batched"):
        torch.autograd.grad(out, (q,), cotangents, is_grads_batched=True)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_checkpointing_with_dropout_recomputes_the_same_mask(backend: str, reentrant: bool) -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, dropout_p=0.3, backend=backend)

    grads = []
    for checkpointed in (False, True):
        g = torch.Generator().manual_seed(4)
        q, k, v = (torch.randn(2, 2, 6, 4, generator=g, requires_grad=True) for _ in range(3))
        torch.manual_seed(5)
        out = checkpoint(fn, q, k, v, use_reentrant=reentrant) if checkpointed else fn(q, k, v)
        torch.manual_seed(6)  # (the backward's draws differ from the forward's)
        out.sum().backward()
        grads.append([t.grad for t in (q, k, v)])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)
