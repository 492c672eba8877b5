"""torch.func's transforms (grad, jacrev, jvp, vmap) and forward-mode AD over
attnkit.attention and the drop-in MultiheadAttention: the numbers of plain torch math
under the same transform (automatic dispatch runs the reference backend there), or a
BackendNotSupportedError naming the transform for a backend forced by name; never a
torch-internal error about autograd Functions."""

from __future__ import annotations

import pytest
import torch
import torch.func as tf

import attnkit
from attnkit import masks, mods
from attnkit.nn import MultiheadAttention

from tolerance import FLOAT64_REL, assert_close_to_scale

L = 5
CAUSAL = torch.ones(L, L, dtype=torch.bool).tril()


def _qkv() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 2, L, 4, generator=g, dtype=torch.float64) for _ in range(3))


def _plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cap: float | None) -> torch.Tensor:
    s = (q @ k.transpose(-1, -2)) / 2.0  # (B, H, L, L)
    if cap is not None:
        s = torch.tanh(s / cap) * cap
    return torch.softmax(s.masked_fill(~CAUSAL, float("-inf")), -1) @ v


@pytest.mark.parametrize("cap", [None, 3.0], ids=["plain", "softcap"])
def test_transforms_give_the_numbers_of_plain_math(cap: float | None) -> None:
    q, k, v = _qkv()
    extra = {} if cap is None else {"mods": mods.softcap(cap)}

    def ours(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=masks.causal(), **extra)

    def plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _plain(q, k, v, cap)

    pairs = {
        "grad": [tf.grad(lambda q, f=f: f(q, k, v).square().sum())(q) for f in (ours, plain)],
        "jacrev": [tf.jacrev(lambda q, f=f: f(q, k, v))(q) for f in (ours, plain)],
        "jvp": [tf.jvp(lambda q, f=f: f(q, k, v), (q,), (v,))[1] for f in (ours, plain)],
        "vmap": [tf.vmap(lambda x, f=f: f(x, x, x))(q) for f in (ours, plain)],
    }
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(q, v)
        pairs["forward_ad"] = [
            torch.autograd.forward_ad.unpack_dual(f(dual, k, v)).tangent for f in (ours, plain)
        ]
    for name, (got, want) in pairs.items():
        assert_close_to_scale(got, want, rel=FLOAT64_REL, what=name)


def test_the_drop_in_layer_takes_grad_and_vmap_as_torch_s_does() -> None:
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    ours = MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    params = {n: t.detach() for n, t in theirs.named_parameters()}

    def loss(m: torch.nn.Module) -> dict[str, torch.Tensor]:
        return tf.grad(
            lambda p: tf.functional_call(m, p, (x, x, x), {"need_weights": False})[0].sum()
        )(params)

    for name, g in loss(ours).items():
        assert_close_to_scale(g, loss(theirs)[name], rel=FLOAT64_REL, what=name)
    batched = [tf.vmap(lambda xx, m=m: m(xx, xx, xx, need_weights=False)[0])(x[:, None])
               for m in (ours, theirs)]  # fmt: skip
    assert_close_to_scale(batched[0], batched[1], rel=FLOAT64_REL)


def test_a_backend_forced_inside_a_transform_is_refused_by_name() -> None:
    q, k, v = _qkv()
    with pytest.raises(attnkit.BackendNotSupportedError, match=r"inside a torch\.func transform"):
        tf.grad(lambda q: attnkit.attention(q, k, v, backend="sdpa").sum())(q)
