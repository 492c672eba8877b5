"""attnkit.nn.SelfAttention against self-attention written out with plain torch ops."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit import _host, masks
from attnkit.nn import KVCache, SelfAttention

from tolerance import (
    FLOAT32_CHAIN_REL,
    FLOAT32_REL,
    FLOAT32_ULPS_REL,
    FLOAT64_REL,
    assert_close_to_scale,
    scaled_error,
)


def _written_out(layer: SelfAttention, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d)) v per head, keep (B, S, S) with True = attend; dead rows 0."""
    if layer.proj is not None:
        q, k, v = layer.proj(x).split(layer.hidden_dim, dim=-1)
    else:
        assert layer.q is not None and layer.k is not None and layer.v is not None
        q, k, v = layer.q(x), layer.k(x), layer.v(x)
    B, S, _ = x.shape
    H, D = layer.num_heads, layer.head_dim
    q, k, v = (t.reshape(B, S, H, D).permute(0, 2, 1, 3) for t in (q, k, v))
    logits = q @ k.transpose(-1, -2) / math.sqrt(D)
    if keep is not None:
        logits = logits.masked_fill(~keep[:, None], float("-inf"))
    w = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    out = (w @ v).permute(0, 2, 1, 3).reshape(B, S, H * D)
    return layer.output_proj(out) if layer.output_proj is not None else out


@pytest.mark.parametrize(
    ("heads", "fused", "out_proj", "bias"),
    list(itertools.product([1, 2, 3], [True, False], [True, False], [True, False])),
)
def test_matches_written_out(heads: int, fused: bool, out_proj: bool, bias: bool) -> None:
    torch.manual_seed(heads)
    layer = SelfAttention(6, heads, fused_qkv=fused, out_proj=out_proj, bias=bias)
    x = torch.randn(3, 5, 6)
    lens = torch.tensor([5, 2, 0])
    keep2 = torch.arange(5)[None, :] < lens[:, None]  # (B, S)
    out = layer(x, keep2.to(torch.int64))  # 0/1 integers, as the classic scripts build them
    ref = _written_out(layer, x, keep2[:, None, :].expand(3, 5, 5))
    assert_close_to_scale(out, ref, rel=FLOAT32_ULPS_REL)
    assert torch.equal(out[2], ref[2]) and not torch.isnan(out).any()
    keep3 = torch.rand(3, 5, 5) < 0.6
    assert_close_to_scale(layer(x, keep3), _written_out(layer, x, keep3), rel=FLOAT32_ULPS_REL)
    causal = torch.ones(5, 5, dtype=torch.bool).tril().expand(3, 5, 5)
    assert_close_to_scale(
        layer(x, masks.causal()), _written_out(layer, x, causal), rel=FLOAT32_ULPS_REL
    )
    assert_close_to_scale(layer(x), _written_out(layer, x, None), rel=FLOAT32_ULPS_REL)


def test_seed_state_dict_names_and_unbatched() -> None:
    fused = SelfAttention(4)
    assert set(fused.state_dict()) == {
        "proj.weight",
        "proj.bias",
        "output_proj.weight",
        "output_proj.bias",
    }
    sep = SelfAttention(4, fused_qkv=False, out_proj=False, bias=False)
    assert set(sep.state_dict()) == {"q.weight", "k.weight", "v.weight"}
    x = torch.randn(5, 4)
    out, w = sep(x, return_weights=True)
    assert out.shape == (5, 4) and w.shape == (1, 5, 5)
    assert_close_to_scale(out, sep(x[None])[0], rel=FLOAT32_ULPS_REL)


def test_dropout_on_weights_only_while_training() -> None:
    torch.manual_seed(1)
    layer = SelfAttention(4, dropout=0.5)
    x = torch.randn(2, 6, 4)
    layer.eval()
    ref = layer(x)
    assert_close_to_scale(ref, _written_out(layer, x, None), rel=FLOAT32_ULPS_REL)
    layer.train()
    assert scaled_error(layer(x), ref) > FLOAT32_REL


def test_gradcheck_and_training() -> None:
    torch.manual_seed(2)
    layer = SelfAttention(4, 2, dtype=torch.float64)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    keep = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert torch.autograd.gradcheck(lambda x: layer(x, keep), (x,), fast_mode=True)

    layer32 = SelfAttention(8, 2)
    data = torch.randn(16, 6, 8)
    target = data.cumsum(1) / torch.arange(1, 7).view(1, 6, 1)  # running mean: causal attention
    opt = torch.optim.Adam(layer32.parameters(), lr=0.03)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = ((layer32(data, masks.causal()) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.torch_feature("compile")
@pytest.mark.parametrize("path", ["plain", "keep", "causal"])
def test_compile_fullgraph(path: str) -> None:
    torch.manual_seed(3)
    layer = SelfAttention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    mask: object = {
        "plain": None,
        "keep": torch.tensor([[True] * 5, [True, True, False, False, False]]),
        "causal": masks.causal(),
    }[path]

    def run(x: torch.Tensor) -> torch.Tensor:
        return layer(x, mask)  # type: ignore[return-value, arg-type]

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="eager")
    assert_close_to_scale(compiled(x), run(x))


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="num_heads=4 must divide hidden_dim=6"):
        SelfAttention(6, 4)
    with pytest.raises(ValueError, match="dropout"):
        SelfAttention(6, dropout=-0.1)
    layer = SelfAttention(6, 2)
    with pytest.raises(ValueError, match=r"x must have shape \(B, S, 6\) .* got \(2, 3, 5\)"):
        layer(torch.randn(2, 3, 5))
    with pytest.raises(
        ValueError, match=r"mask must have shape \(2, 3\) or \(2, 3, 3\), got \(2, 4\)"
    ):
        layer(torch.randn(2, 3, 6), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"0 \(masked\) and 1"):
        layer(torch.randn(2, 3, 6), torch.full((2, 3), 0.5))
    with pytest.raises(TypeError, match="mask must be an attnkit mask"):
        layer(torch.randn(2, 3, 6), [[1, 1, 1]])
    with pytest.raises(TypeError, match=r"x is torch\.float64 .* parameters are torch\.float32"):
        layer(torch.randn(2, 3, 6, dtype=torch.float64))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        layer(torch.ones(2, 3, 6, dtype=torch.int64))


# ---------------------------------------------------------------- decoder: causal, GQA, KV cache


def _written_out_gqa(layer: SelfAttention, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """Grouped-query attention written out: each K/V head repeated for its query heads."""
    H, Hkv, D = layer.num_heads, layer.num_kv_heads, layer.head_dim
    if layer.proj is not None:
        q, k, v = layer.proj(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
    else:
        assert layer.q is not None and layer.k is not None and layer.v is not None
        q, k, v = layer.q(x), layer.k(x), layer.v(x)
    B, S, _ = x.shape
    q = q.reshape(B, S, H, D).permute(0, 2, 1, 3)
    k, v = (t.reshape(B, S, Hkv, D).permute(0, 2, 1, 3) for t in (k, v))
    k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))  # query head h uses h // g
    logits = q @ k.transpose(-1, -2) / math.sqrt(D)
    if causal:
        logits = logits.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    out = (torch.softmax(logits, dim=-1) @ v).permute(0, 2, 1, 3).reshape(B, S, H * D)
    return layer.output_proj(out) if layer.output_proj is not None else out


@pytest.mark.parametrize(
    ("kv_heads", "fused", "causal"),
    list(itertools.product([1, 2, 4], [True, False], [True, False])),
)
def test_causal_and_grouped_query_match_written_out(
    kv_heads: int, fused: bool, causal: bool
) -> None:
    torch.manual_seed(10 + kv_heads)
    layer = SelfAttention(8, 4, fused_qkv=fused, causal=causal, num_kv_heads=kv_heads)
    x = torch.randn(2, 6, 8)
    assert_close_to_scale(layer(x), _written_out_gqa(layer, x, causal), rel=FLOAT32_ULPS_REL)
    kv = 2 * kv_heads
    shapes = {name: tuple(p.shape) for name, p in layer.named_parameters()}
    if fused:
        assert shapes["proj.weight"] == (8 + 2 * kv, 8)
    else:
        assert shapes["k.weight"] == shapes["v.weight"] == (kv, 8)
        assert shapes["q.weight"] == (8, 8)


def test_grouped_query_keys_are_not_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    import attnkit.nn._common as common

    shapes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    real = common.attention

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: object) -> object:
        shapes.append((tuple(q.shape), tuple(k.shape)))
        return real(q, k, v, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(common, "attention", spy)
    layer = SelfAttention(12, 6, causal=True, num_kv_heads=2)
    layer(torch.randn(3, 5, 12))
    assert shapes == [((3, 6, 5, 2), (3, 2, 5, 2))]


def _decoder(seed: int, fused: bool = True) -> tuple[SelfAttention, torch.Tensor]:
    torch.manual_seed(seed)
    layer = SelfAttention(16, 4, fused_qkv=fused, causal=True, num_kv_heads=2)
    return layer.double().eval(), torch.randn(3, 11, 16, dtype=torch.float64)


@pytest.mark.parametrize("fused", [True, False])
def test_step_by_step_decoding_equals_full_causal_forward(fused: bool) -> None:
    layer, x = _decoder(20, fused)
    full = layer(x)
    cache = layer.new_cache(3, 16)
    with torch.no_grad():
        steps = [layer(x[:, i : i + 1], cache=cache) for i in range(11)]
    assert cache.length == 11
    assert_close_to_scale(torch.cat(steps, dim=1), full, rel=FLOAT64_REL)


def test_prefill_then_steps_equal_a_single_forward() -> None:
    layer, x = _decoder(21)
    full, full_w = layer(x, return_weights=True)
    cache = layer.new_cache(3, 11)
    outs, weights = [], []
    with torch.no_grad():
        for a, b in ((0, 5), (5, 6), (6, 9), (9, 10), (10, 11)):  # prompt, then 1 or more tokens
            out, w = layer(x[:, a:b], return_weights=True, cache=cache)
            assert w.shape == (3, 4, b - a, b)  # (B, H, new tokens, filled length)
            outs.append(out)
            weights.append(w)
    assert_close_to_scale(torch.cat(outs, dim=1), full, rel=FLOAT64_REL)
    for (a, b), w in zip(((0, 5), (5, 6), (6, 9), (9, 10), (10, 11)), weights, strict=True):
        assert_close_to_scale(w, full_w[:, :, a:b, :b], rel=FLOAT64_REL)
    # A reset cache decodes a new batch from the start.
    cache.reset()
    with torch.no_grad():
        again = layer(x[:, :4].flip(0), cache=cache)
    assert_close_to_scale(again, layer(x[:, :4].flip(0)), rel=FLOAT64_REL)


def test_unbatched_decoding_and_unfilled_cache_contents_do_not_matter() -> None:
    layer, x = _decoder(22)
    cache = layer.new_cache(1, 12)
    cache.keys.fill_(float("nan"))  # never-written positions must not be read
    cache.values.fill_(float("nan"))
    with torch.no_grad():
        head = layer(x[0, :3], cache=cache)  # (S, hidden) unbatched
        tail = layer(x[0, 3:5], cache=cache)
    assert head.shape == (3, 16) and tail.shape == (2, 16)
    assert_close_to_scale(torch.cat([head, tail]), layer(x[0, :5]), rel=FLOAT64_REL)


_SYNCING = frozenset(
    {
        torch.ops.aten._local_scalar_dense.default,
        torch.ops.aten.nonzero.default,
        torch.ops.aten.masked_select.default,
    }
)


class _NoSync(TorchDispatchMode):
    """Fails on operations that wait for the device (.item(), bool(t), data-dependent shapes)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _SYNCING:
            raise AssertionError(f"host sync on the decode path: {func}")
        return func(*args, **(kwargs or {}))


def test_decode_steps_make_no_host_sync() -> None:
    layer, x = _decoder(23)
    ref = layer(x)
    cache = layer.new_cache(3, 11)
    with torch.no_grad():
        prompt = layer(x[:, :6], cache=cache)
        with _host.device_semantics(), _NoSync():  # every tensor counts as a device's
            steps = [layer(x[:, i : i + 1], cache=cache) for i in range(6, 11)]
    assert_close_to_scale(torch.cat([prompt, *steps], dim=1), ref, rel=FLOAT64_REL)


@pytest.mark.torch_feature("compile")
def test_decode_step_compiles_without_recompiling_each_step() -> None:
    layer, x = _decoder(24)
    layer.float()
    xf = x.float()
    ref = layer(xf)
    cache = layer.new_cache(3, 11)

    def step(t: torch.Tensor, c: KVCache) -> torch.Tensor:
        return layer(t, cache=c)  # type: ignore[return-value]

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    with torch.no_grad():
        outs = [compiled(xf[:, :4], cache), compiled(xf[:, 4:5], cache)]
        graphs = counters["stats"]["unique_graphs"]  # the prompt's and a step's
        outs += [compiled(xf[:, i : i + 1], cache) for i in range(5, 11)]
    assert counters["stats"]["unique_graphs"] == graphs <= 2
    assert not counters["graph_break"]
    assert_close_to_scale(torch.cat(outs, dim=1), ref, rel=FLOAT32_CHAIN_REL)


def test_decoder_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=4"):
        SelfAttention(8, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive int, got 0"):
        SelfAttention(8, 4, num_kv_heads=0)
    with pytest.raises(TypeError, match="causal must be True or False"):
        SelfAttention(8, 4, causal=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"dtype must be a floating-point torch\.dtype"):
        SelfAttention(8, 4, dtype=torch.int64)
    x = torch.randn(2, 3, 8)
    encoder = SelfAttention(8, 4)
    with pytest.raises(ValueError, match="needs causal=True"):
        encoder(x, cache=encoder.new_cache(2, 8))
    layer = SelfAttention(8, 4, causal=True, num_kv_heads=2)
    with pytest.raises(ValueError, match="cache holds 1 sequences, x has batch size 2"):
        layer(x, cache=layer.new_cache(1, 8))
    with pytest.raises(ValueError, match="holds 0 of 2 positions and cannot take 3 more"):
        layer(x, cache=layer.new_cache(2, 2))
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        layer(x, cache={"k": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="with a cache, mask must be None or an attnkit mask"):
        layer(x, torch.ones(2, 3, dtype=torch.bool), cache=layer.new_cache(2, 8))
    wrong_dtype = KVCache(2, 2, 8, 2, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"cache holds torch\.float64"):
        layer(x, cache=wrong_dtype)
    wrong_heads = KVCache(2, 4, 8, 2)
    with pytest.raises(ValueError, match="do not fit the cache"):
        layer(x, cache=wrong_heads)
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        layer.new_cache(2, 0)
    layer.proj.bias.data = layer.proj.bias.data.double()  # type: ignore[union-attr]
    with pytest.raises(TypeError, match=r"parameter proj\.bias is torch\.float64"):
        layer(x)


def test_a_failed_step_leaves_the_cache_length_unchanged() -> None:
    layer, x = _decoder(25)
    cache = layer.new_cache(3, 11)
    with torch.no_grad():
        layer(x[:, :4], cache=cache)
        bad = masks.keep(torch.ones(3, 1, 2, 9, dtype=torch.bool))  # (.., 2, 9): wrong key count
        with pytest.raises(ValueError, match="mask"):
            layer(x[:, 4:6], bad, cache=cache)
        assert cache.length == 4
        good = masks.keep(torch.ones(3, 1, 2, 6, dtype=torch.bool))  # (.., new 2, filled 6)
        tail = layer(x[:, 4:6], good, cache=cache)
    assert cache.length == 6
    assert_close_to_scale(tail, layer(x[:, :6])[:, 4:], rel=FLOAT64_REL)


def test_kv_cache_on_its_own() -> None:
    cache = KVCache(2, 3, 5, 4, value_dim=6, dtype=torch.float64)
    k = torch.randn(2, 3, 2, 4, dtype=torch.float64)
    v = torch.randn(2, 3, 2, 6, dtype=torch.float64)
    keys, values = cache.append(k, v)
    assert cache.length == 2 and keys.shape == (2, 3, 2, 4) and values.shape == (2, 3, 2, 6)
    keys, values = cache.append(k.flip(2), v.flip(2))
    assert torch.equal(keys, torch.cat([k, k.flip(2)], dim=2))
    assert torch.equal(values, torch.cat([v, v.flip(2)], dim=2))
    with pytest.raises(ValueError, match=r"KVCache: the cache holds 4 of 5 positions"):
        cache.append(k, v)
    cache.reset()
    assert cache.length == 0 and cache.max_len == 5
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        KVCache(1, 1, 2, 2, dtype=torch.int32)
    # advance(-3) set length -3, and the next write of 2 returned 5 positions; 2.5 was kept
    for count in (-3, 2.5, 6, True):
        with pytest.raises(ValueError, match=r"KVCache.advance: count must be an int from 0"):
            cache.advance(count)  # type: ignore[arg-type]
        assert cache.length == 0
    cache.advance(np.int64(2))  # type: ignore[arg-type]
    assert cache.length == 2 and type(cache.length) is int
    cache.reset()
    with pytest.raises(ValueError, match=r"the new keys must be a tensor \(batch_size"):
        cache.append(k[0, 0], v[0, 0])
    with pytest.raises(TypeError, match=r"the new keys must be a tensor .* got list"):
        cache.append(k.tolist(), v)  # type: ignore[arg-type]


def test_attention_override_routes_every_layer_inside_the_block_only() -> None:
    """attnkit.nn.attention_override: the layers' attention goes to the given function
    inside the block (how ContextParallel runs a layer across ranks), and back after."""
    import attnkit.nn as ann

    seen: list[tuple[int, ...]] = []

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> object:
        seen.append(tuple(q.shape))
        return torch.zeros(*q.shape[:-1], v.shape[-1]), None

    sa = ann.SelfAttention(8, 2)
    mha = ann.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 3, 8)
    before = sa(x)
    with ann.attention_override(spy):
        inside = sa(x)
        mha(x, x, x, need_weights=False)
    assert seen == [(1, 2, 3, 4), (1, 2, 3, 4)]
    assert scaled_error(inside, before) > FLOAT32_REL  # the spy's zeros reached the output
    torch.testing.assert_close(sa(x), before, rtol=0, atol=0)  # unchanged after the block
    assert len(seen) == 2


@pytest.mark.parametrize(
    ("name", "value"), [("num_heads", 2), ("num_kv_heads", 1), ("head_dim", 8), ("hidden_dim", 8)]
)
def test_a_size_the_projections_were_built_for_cannot_be_set_again(name: str, value: int) -> None:
    """Setting a size after construction would split the heads against weights built for
    another: it is refused at once, naming the size, and the layer still works; other
    attributes (causal, dropout) stay settable."""
    sa = SelfAttention(16, num_heads=4, num_kv_heads=2)
    x = torch.randn(1, 3, 16, generator=torch.Generator().manual_seed(2))
    before = sa(x)
    with pytest.raises(AttributeError, match=f"{name} is fixed when the layer is built"):
        setattr(sa, name, value)
    torch.testing.assert_close(sa(x), before, rtol=0, atol=0)
    sa.causal = True
    assert sa.causal is True
