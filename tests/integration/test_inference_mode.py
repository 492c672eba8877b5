"""Every public call under ``torch.inference_mode()``, and with inference tensors (masks,
inputs, caches) made there and used outside it, as serving code makes them; each result
against the same call on ordinary tensors. attention() meets every mask kind on every
backend in tests/conformance/test_oracle.py (test_matches_oracle_under_inference_mode)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit import nn as ann

from tolerance import assert_close_to_scale

Build = Callable[[], tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]]


def _mha(**kw: Any) -> Build:
    def build() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
        g = torch.Generator().manual_seed(3)
        layer = ann.MultiheadAttention(8, 2, batch_first=True, **kw).eval()
        x = torch.randn(2, 5, 8, generator=g)  # (N, L, E)
        y = torch.randn(2, 6, 8, generator=g)  # (N, S, E)
        kpm = torch.rand(2, 6, generator=g) < 0.4  # (N, S), True = padding
        kpm[:, 0] = False
        if kw:  # add_bias_kv, add_zero_attn: torch's (L, N, E) layout, general path
            return layer, (y, y, y), {"key_padding_mask": kpm, "is_causal": True}
        return layer, (x, y, y), {"key_padding_mask": kpm, "attn_mask": torch.rand(5, 6) < 0.2}

    return build


def _mha_fused() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    """Self-attention with a key_padding_mask: torch's fused op."""
    layer = ann.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(4))
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])  # (N, S)
    return layer, (x, x, x), {"key_padding_mask": kpm}


def _einsum() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    layer = ann.EinsumMultiHeadAttention(2, 4, query_features=8).eval()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 5, 8, generator=g)  # (B, T, F)
    keep = torch.rand(2, 5, 5, generator=g) < 0.7  # (B, T, S), True = attend
    keep[..., 0] = True
    return layer, (x, x), {"attention_mask": keep, "return_attention_scores": True,
                           "use_causal_mask": True}  # fmt: skip


def _self_attention() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    layer = ann.SelfAttention(8, 2, causal=True).eval()
    g = torch.Generator().manual_seed(6)
    keep = torch.rand(2, 5, generator=g) < 0.7  # (B, S), nonzero = may attend
    keep[:, 0] = True
    return layer, (torch.randn(2, 5, 8, generator=g),), {"mask": keep, "return_weights": True}


def _dot_product() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(2, 5, 8, generator=g), torch.randn(2, 6, 8, generator=g)
    return ann.DotProductAttention(0.1).eval(), (q, k, k, torch.tensor([3, 6])), {}


def _additive() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(8)
    torch.manual_seed(8)
    layer = ann.AdditiveAttention(key_size=8, query_size=8, num_hiddens=4, dropout=0.0)
    q, k = torch.randn(2, 5, 8, generator=g), torch.randn(2, 6, 8, generator=g)
    lens = torch.tensor([[3, 1, 6, 2, 5], [6, 6, 4, 4, 1]])  # (B, L)
    return layer.eval(), (q, k, k, lens), {}


def _nadaraya_watson() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    keys, values = torch.tensor([51.0, 56.0, 58.0]), torch.tensor([40.0, 43.0, 48.0])
    return ann.NadarayaWatson(sigma=2.0, learnable=True), (torch.tensor([57.0, 50.0]), keys,
                                                           values), {}  # fmt: skip


LAYERS: dict[str, Build] = {
    "mha": _mha(),
    "mha_fused_op": _mha_fused,
    "mha_bias_kv_zero_attn": _mha(add_bias_kv=True, add_zero_attn=True),
    "einsum": _einsum,
    "self_attention": _self_attention,
    "d2l_dot_product": _dot_product,
    "d2l_additive": _additive,
    "nadaraya_watson": _nadaraya_watson,
}


def _outputs(result: Any) -> list[torch.Tensor]:
    items = result if isinstance(result, tuple) else (result,)
    return [t for t in items if isinstance(t, torch.Tensor)]


def _inference_copy(value: Any) -> Any:
    """``value`` with every tensor copied into an inference tensor."""
    if isinstance(value, torch.Tensor):
        with torch.inference_mode():
            copy = value.clone()
        assert copy.is_inference()
        return copy
    if isinstance(value, tuple):
        return tuple(_inference_copy(v) for v in value)
    if isinstance(value, dict):
        return {n: _inference_copy(v) for n, v in value.items()}
    return value


@pytest.mark.parametrize("where", ["inside", "made_inside"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layers_under_inference_mode(name: str, where: str) -> None:
    """Inside inference mode; or with inputs and masks made there, called outside it under
    no_grad (outside, torch refuses an inference tensor in a graph that records)."""
    layer, args, kw = LAYERS[name]()
    with torch.no_grad():
        want = _outputs(layer(*args, **kw))
    args, kw = _inference_copy(args), _inference_copy(kw)
    for _ in range(2):  # the second call meets whatever the first cached
        if where == "inside":
            with torch.inference_mode():
                got = _outputs(layer(*args, **kw))
        else:
            with torch.no_grad():
                got = _outputs(layer(*args, **kw))
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_close_to_scale(a, b, what=name)


def test_an_inference_mask_changed_in_place_is_seen() -> None:
    """Masks holding inference tensors are not cached (they have no version counter): a
    change made in place inside inference mode reaches the next call."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g) for n in (5, 7, 7))
    with torch.inference_mode():
        pad = torch.zeros(2, 7, dtype=torch.bool)  # (B, S), True = padding
        lens = torch.tensor([7, 7])
        bias = torch.zeros(5, 7)  # (L, S)
        kinds = [(masks.key_padding(pad), pad), (masks.valid_lens(lens), lens),
                 (masks.bias(bias), bias)]  # fmt: skip
        for mask, t in kinds:
            before = attnkit.attention(q, k, v, mask=mask)
            t.copy_(torch.tensor(True) if t.dtype == torch.bool else torch.full_like(t, 3))
            if t is bias:
                t[:, 4:] = float("-inf")
            after = attnkit.attention(q, k, v, mask=mask)
            want = attnkit.attention(q, k, v, mask=_rebuild(mask, t))  # built anew
            assert not torch.equal(after, before)
            assert torch.equal(after, want)


def _rebuild(mask: masks.Mask, t: torch.Tensor) -> masks.Mask:
    if isinstance(mask, masks.KeyPaddingMask):
        return masks.key_padding(t.clone())
    if isinstance(mask, masks.ValidLensMask):
        return masks.valid_lens(t.clone())
    return masks.bias(t.clone())


def test_gradients_through_a_mask_made_under_inference_mode() -> None:
    """A mask made by serving code, used in training: the same gradients as a fresh mask,
    from attention() and from attention_backward() on inference inputs."""
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g) for n in (5, 7, 7))
    pad = torch.rand(2, 7, generator=g) < 0.4
    pad[:, 0] = False
    with torch.inference_mode():
        inf_mask = masks.key_padding(pad.clone()) & masks.causal("bottom_right")
        inf_q, inf_k, inf_v = q.clone(), k.clone(), v.clone()
    mask = masks.key_padding(pad) & masks.causal("bottom_right")
    grads = []
    for m in (inf_mask, mask):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        attnkit.attention(*leaves, mask=m).square().sum().backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads, strict=True):
        assert a is not None and b is not None
        assert_close_to_scale(a, b, what="grad")
    out, lse = attnkit.attention(q, k, v, mask=mask, return_lse=True)
    d_out = torch.randn(out.shape, generator=g)
    want = attnkit.attention_backward(q, k, v, out, lse, d_out, mask=mask)
    for backend in ("reference", "chunked", "sdpa"):
        got = attnkit.attention_backward(inf_q, inf_k, inf_v, out, lse, d_out, mask=inf_mask,
                                         backend=backend)  # fmt: skip
        for a, b in zip(got[:3], want[:3], strict=True):
            assert_close_to_scale(a, b, what=f"{backend} attention_backward")


def test_a_kv_cache_made_under_inference_mode_decodes_outside_it() -> None:
    torch.manual_seed(11)
    layer = ann.SelfAttention(8, 4, causal=True, num_kv_heads=2).eval()
    x = torch.randn(1, 6, 8)  # (B, S, hidden)
    with torch.no_grad():
        want = layer(x)  # (1, 6, 8): the full causal forward
        with torch.inference_mode():
            cache = layer.new_cache(1, 8)
            first = layer(x[:, :3], cache=cache)  # a prompt of 3
        assert cache.keys.is_inference()
        rest = [layer(x[:, i : i + 1], cache=cache) for i in range(3, 6)]  # one at a time
    assert cache.length == 6
    got = torch.cat([first, *rest], dim=1)  # (1, 6, 8)
    assert isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
    assert_close_to_scale(got, want, what="decoded")


def test_explain_under_inference_mode() -> None:
    with torch.inference_mode():
        x = torch.randn(2, 5, 4)
        pad = torch.tensor([[False] * 5, [False, False, True, True, True]])
        inside = attnkit.explain(x, x, x, mask=masks.key_padding(pad))
    outside = attnkit.explain(x, x, x, mask=masks.key_padding(pad))
    assert inside.chosen is not None and inside.chosen == outside.chosen
