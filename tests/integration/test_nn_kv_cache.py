"""KVCache under autograd and at sizes no device holds."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnkit.nn import KVCache, SelfAttention

from tolerance import FLOAT64_REL, assert_close_to_scale


def _decoder(seed: int, fused: bool) -> tuple[SelfAttention, torch.Tensor]:
    torch.manual_seed(seed)
    layer = SelfAttention(8, 4, fused_qkv=fused, causal=True, num_kv_heads=2)
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    return layer.double(), x


def _grads(out: torch.Tensor, layer: SelfAttention, x: torch.Tensor) -> list[torch.Tensor]:
    seed = torch.Generator().manual_seed(0)
    weight = torch.randn(out.shape, generator=seed, dtype=out.dtype)  # a non-uniform loss
    return list(torch.autograd.grad((out * weight).sum(), [x, *layer.parameters()]))


@pytest.mark.parametrize("fused", [True, False])
def test_decoding_under_autograd_gives_the_full_forwards_gradients(fused: bool) -> None:
    layer, x = _decoder(30, fused)
    want = _grads(layer(x), layer, x)
    cache = layer.new_cache(2, 8)
    # a prompt of 2, then one token at a time, every step with gradients enabled
    steps = [layer(x[:, :2], cache=cache)] + [
        layer(x[:, i : i + 1], cache=cache) for i in (2, 3, 4)
    ]
    out = torch.cat(steps, dim=1)  # type: ignore[arg-type]
    got = _grads(out, layer, x)
    assert cache.length == 5
    assert_close_to_scale(out, layer(x), rel=FLOAT64_REL)
    # on the scale of all the gradients: the key bias's is 0 up to rounding
    scale = max(float(w.abs().max()) for w in want)
    for g, w in zip(got, want, strict=True):
        assert_close_to_scale(g, w, rel=FLOAT64_REL, scale=scale)
    # the buffers hold every step's keys, as under no_grad
    with torch.no_grad():
        ref = layer.new_cache(2, 8)
        layer(x, cache=ref)
    assert_close_to_scale(cache.keys, ref.keys, rel=FLOAT64_REL)
    assert_close_to_scale(cache.values, ref.values, rel=FLOAT64_REL)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_setting_the_length_back_rolls_the_cache_back(mode: Any) -> None:
    """Decoded with gradients to 5, rolled back to 3 and rewritten (without gradients,
    then with them): the next steps see the new tokens. The differentiable copy of the
    first steps kept the old ones (0.13 off), and gradients still reach the first 3."""
    layer, x = _decoder(32, fused=False)
    other = torch.randn_like(x)
    seq = torch.cat([x[:, :3], other[:, 3:]], dim=1)  # (B, 5, hidden)
    cache = layer.new_cache(2, 8)
    layer(x, cache=cache)  # positions 0..4 from x, with gradients
    cache.length = 3
    with mode():
        fourth = layer(seq[:, 3:4].detach(), cache=cache)
    fifth = layer(seq[:, 4:5], cache=cache)
    full = layer(seq)
    assert_close_to_scale(torch.cat([fourth, fifth], dim=1), full[:, 3:], rel=FLOAT64_REL)
    (got,) = torch.autograd.grad(fifth.sum(), [x])
    (want,) = torch.autograd.grad(full[:, 4].sum(), [x])
    assert_close_to_scale(got[:, :3], want[:, :3], rel=FLOAT64_REL)


@pytest.mark.parametrize("value", [-1, 4, 2.5, True, "3"])
def test_the_length_takes_only_written_positions(value: object) -> None:
    # -3 gave 4 positions for a write of 1; a length past the writes exposed zero keys
    # never written (a decode step 0.2 off the full forward), with no error
    cache = KVCache(1, 1, 6, 2)
    cache.append(torch.randn(1, 1, 3, 2), torch.randn(1, 1, 3, 2))
    cache.length = 1  # back, then forward again to the written positions
    cache.length = 3
    with pytest.raises(ValueError, match=r"KVCache.length: expected an int from 0 to the 3"):
        cache.length = value  # type: ignore[assignment]
    assert cache.length == 3
    cache.reset()
    with pytest.raises(ValueError, match="from 0 to the 0 positions"):
        cache.length = 2


def test_a_deep_copy_of_a_cache_filled_with_gradients_keeps_them() -> None:
    # torch refused to deep-copy the differentiable filled part (not a graph leaf)
    import copy

    layer, x = _decoder(34, fused=True)
    cache = layer.new_cache(2, 8)
    layer(x[:, :3], cache=cache)  # with gradients
    branch = copy.deepcopy(cache)
    assert branch.keys.data_ptr() != cache.keys.data_ptr()
    assert torch.equal(branch.keys, cache.keys) and branch.length == cache.length == 3
    one, two = layer(x[:, 3:4], cache=cache), layer(x[:, 3:4], cache=branch)
    assert torch.equal(one, two)
    (got,) = torch.autograd.grad(two.sum(), [x])  # through the copy, to the first steps
    (want,) = torch.autograd.grad(layer(x[:, :4])[:, 3].sum(), [x])
    assert_close_to_scale(got, want, rel=FLOAT64_REL)


def test_a_no_grad_step_between_grad_steps_keeps_the_earlier_gradients() -> None:
    """Step 3 reaches token 0's keys through the cache although step 2 ran without grad."""
    layer, x = _decoder(31, fused=True)
    cache = layer.new_cache(2, 8)
    layer(x[:, :1], cache=cache)
    with torch.no_grad():
        layer(x[:, 1:2], cache=cache)
    third = layer(x[:, 2:3], cache=cache)
    (got,) = torch.autograd.grad(third.sum(), [x])
    (want,) = torch.autograd.grad(layer(x[:, :3])[:, 2].sum(), [x])
    # token 0 only feeds token 2 through its own keys and values: the same gradient
    assert_close_to_scale(got[:, 0], want[:, 0], rel=FLOAT64_REL)
    assert got[:, 0].abs().max() > 0
    assert torch.equal(got[:, 1], torch.zeros_like(got[:, 1]))  # its step kept no graph


def test_a_reset_cache_drops_the_previous_graph() -> None:
    layer, x = _decoder(32, fused=True)
    cache = layer.new_cache(2, 8)
    layer(x[:, :3], cache=cache)
    cache.reset()
    again = layer(x[:, 3:5], cache=cache)
    (g,) = torch.autograd.grad(again.sum(), [x])
    assert torch.equal(g[:, :3], torch.zeros_like(g[:, :3]))


def test_a_cache_larger_than_the_device_is_refused_before_allocating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_alloc(*args: object, **kwargs: object) -> None:
        raise AssertionError("allocated")

    monkeypatch.setattr("attnkit.nn.kv_cache.torch.zeros", no_alloc)
    with pytest.raises(ValueError, match=r"KVCache: keys \(1, 8, 1000000000000, 64\).*"):
        KVCache(1, 8, 10**12, 64)
    with pytest.raises(ValueError, match=r"need 4,096,000,000,000,000 bytes .* of memory on cpu"):
        KVCache(1, 8, 10**12, 64)
    with pytest.raises(ValueError, match=r"need 8,192,000,000,000,000 bytes"):
        KVCache(1, 8, 10**12, 64, value_dim=448, dtype=torch.float16)


def test_an_allocator_failure_names_the_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr("attnkit.nn.kv_cache.torch.zeros", fail)
    with pytest.raises(MemoryError, match=r"KVCache: could not allocate .* 2,048 bytes"):
        KVCache(2, 2, 8, 4, dtype=torch.float64)


def test_a_top_left_band_after_the_prefill_is_refused() -> None:
    """masks.window(2) over a cache would place the new query at position 0: after the
    prefill it is refused; placed at the cache's end (bottom-right, or a tensor offset)
    it decodes as the full forward does."""
    from attnkit import masks

    layer, x = _decoder(31, False)
    x = x.detach()
    window = masks.window(2)
    want = layer(x, mask=window)  # (B, 5, hidden)
    for placed in ("bottom_right", "offset"):
        cache = layer.new_cache(2, 8)
        steps = [layer(x[:, :3], mask=window, cache=cache)]  # (the prefill: L == S)
        wrongs = (
            window,
            window & masks.valid_lens(torch.tensor([4, 3])),
            masks.prefix_lm(2),  # its causal part is the band
            masks.window(1) | masks.prefix_lm(2),  # under | and ~ too: 0.5 to 1.5 off before
            ~masks.window(1, 0),
        )
        for wrong in wrongs:
            with pytest.raises(ValueError, match=r"mask holds a top-left band, which places"):
                layer(x[:, 3:4], mask=wrong, cache=cache)
        assert cache.length == 3
        for i in (3, 4):
            step = (
                masks.window(2, align="bottom_right")
                if placed == "bottom_right"
                else masks.window(2, q_offset=torch.tensor(i))
            )
            steps.append(layer(x[:, i : i + 1], mask=step, cache=cache))
        assert_close_to_scale(torch.cat(steps, dim=1), want, rel=FLOAT64_REL)  # type: ignore[arg-type]


def test_a_cache_pickled_before_its_length_was_checked_loads() -> None:
    # its state held a plain "length": loading it gave "no attribute '_length'"
    import pickle

    cache = KVCache(1, 1, 6, 2)
    cache.append(torch.randn(1, 1, 3, 2), torch.randn(1, 1, 3, 2))
    state = dict(cache.__dict__)
    state["length"] = state.pop("_length")  # the fields of a cache saved then
    state.pop("_written")
    old = KVCache.__new__(KVCache)
    old.__dict__.update(state)
    loaded = pickle.loads(pickle.dumps(old))
    assert loaded.length == 3
    loaded.length = 2  # (the written positions are known)
    assert torch.equal(loaded.keys, cache.keys)
