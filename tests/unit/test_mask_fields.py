"""Masks whose tensors repeat, whose fields are set anew, or whose shapes and offsets
are at their edges: every backend keeps the pairs ``to_dense`` keeps, and a cached
answer is never read for a tensor it was not computed for."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import _host, masks

from cases import matrix_backends
from tolerance import FLOAT32_CALL_REL, FLOAT64_REL, assert_close_to_scale

BACKENDS = matrix_backends("cpu")


def _qkv(L: int = 4, S: int = 8) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, n, 4, generator=g, dtype=torch.float64) for n in (L, S, S))


def _dense(mask: masks.Mask, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The float64 oracle of ``mask`` read through ``to_dense`` (a row with no key: 0)."""
    L, S = q.shape[-2], k.shape[-2]
    d = mask.to_dense(L, S, q.shape[:-2], dtype=torch.float64)
    s = q @ k.transpose(-1, -2) / 2.0  # (1, 2, L, S)
    s = s + d if d.is_floating_point() else s.masked_fill(~d, float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)
    return w @ v


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_bias_tensor_twice_is_added_twice(backend: str) -> None:
    """bias(t) & bias(t): the plan took one tensor once (the same bias sits in every
    clause of bias & (a | b), where it is added once), so chunked and triton added t
    once: 0.45 off."""
    q, k, v = _qkv()
    t = torch.randn(4, 8, dtype=torch.float64)
    b = masks.bias(t)
    for mask in (b & b, masks.bias(t) & masks.bias(t),
                 masks.bias(t) & (masks.causal() | masks.window(1, 1)) & masks.bias(t)):  # fmt: skip
        got = attnkit.attention(q, k, v, mask=mask, backend=backend)
        assert_close_to_scale(got, _dense(mask, q, k, v), rel=FLOAT64_REL, what=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_biases_of_a_float64_call_add_in_float64(backend: str) -> None:
    """bias(a) & bias(b) of float32 tensors on a float64 call: the dense form added them
    in float32 (the reference backend rounded their sum to float32, 1e-8 off), while the
    block plan casts each to the call's dtype first. Every backend now adds them exactly."""
    q, k, v = _qkv()
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randn(4, 8, generator=g) * 1e3 for _ in range(2))  # float32, (L, S)
    mask = masks.bias(a) & masks.bias(b)
    s = q @ k.transpose(-1, -2) / 2.0 + a.double() + b.double()  # (1, 2, L, S), exact
    want = torch.softmax(s, -1) @ v
    got = attnkit.attention(q, k, v, mask=mask, backend=backend)
    assert_close_to_scale(got, want, rel=FLOAT64_REL, what=backend)


def test_a_bias_tensor_set_anew_is_read_anew() -> None:
    """has_bias_beyond cached its answer by the tensor's version alone: a new tensor at
    version 0 set as the mask's tensor read as the old one (far rows unseen: dq 1.35 off
    through attention_backward, which refuses such an lse)."""
    m = masks.bias(torch.zeros(4, 8))
    assert not m.has_bias_beyond(64.0)
    far = torch.zeros(4, 8).index_fill(0, torch.tensor([1]), -1e30)  # (4, 8), version 0
    assert far._version == 0
    m.tensor = far
    assert m.has_bias_beyond(64.0)


def test_valid_lens_over_queries_set_anew_masks_the_rows_too() -> None:
    """queries=True kept the query lengths it was built with when lens was set anew."""
    q, k, v = _qkv(4, 4)
    m = masks.valid_lens(torch.tensor([4]), queries=True)
    m.lens = torch.tensor([2])
    fresh = masks.valid_lens(torch.tensor([2]), queries=True)
    assert torch.equal(m.to_dense(4, 4, (1, 2)), fresh.to_dense(4, 4, (1, 2)))
    for backend in BACKENDS:
        got = attnkit.attention(q, k, v, mask=m, backend=backend)
        assert_close_to_scale(got, _dense(fresh, q, k, v), rel=FLOAT64_REL, what=backend)


@pytest.mark.parametrize("make", [masks.keep, masks.block, masks.tf], ids=["keep", "block", "tf"])
def test_a_mask_of_one_column_runs_on_sdpa_without_host_reads(make) -> None:  # type: ignore[no-untyped-def]
    """A (L, 1) mask broadcasts over the keys: sdpa's check of which rows read a
    non-finite key took its last dim as S and failed where values are not read (an
    accelerator; here device semantics on the CPU)."""
    q, k, v = _qkv(4, 5)
    column = torch.tensor([[True], [False], [True], [True]])  # (L, 1)
    mask = make(column if make is not masks.tf else column.double())
    want = _dense(mask, q, k, v)
    with _host.device_semantics():
        got = attnkit.attention(q, k, v, mask=mask, backend="sdpa")
    assert_close_to_scale(got, want, rel=FLOAT64_REL)


def test_offsets_of_one_element_and_int32_offsets() -> None:
    """prefix_lm kept a (1, 1) offset tensor unshaped (chunked failed to expand it), and
    an int32 offset's arithmetic overflowed near 2**31 (the band kept nothing)."""
    q, k, v = _qkv(4, 6)
    m = masks.prefix_lm(torch.tensor([2, 3]), k_offset=torch.tensor([[1]]))
    q2, k2, v2 = (t.expand(2, -1, -1, -1) for t in (q, k, v))
    want = _dense(m, q2, k2, v2)
    for backend in BACKENDS:
        got = attnkit.attention(q2, k2, v2, mask=m, backend=backend)
        assert_close_to_scale(got, want, rel=FLOAT64_REL, what=backend)
    top = torch.tensor(2**31 - 1, dtype=torch.int32)
    wide = masks.causal(q_offset=top, k_offset=torch.tensor(-1, dtype=torch.int32))
    assert bool(wide.to_dense(2, 3).all())


def test_a_gaussian_key_far_enough_to_overflow_its_measure_runs_from_the_differences() -> None:
    """A padded key at 1e20 (float32) overflowed the measure of the Gaussian's dot form
    to NaN, which read as "the dot form holds": chunked gave NaN rows and sdpa zeros."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 4, generator=g) for n in (4, 8, 8))
    k[..., 6, :] = 1e20  # (a padded key)
    mask = masks.valid_lens(torch.tensor([5]))
    ex = attnkit.explain(q, k, v, score="gaussian", mask=mask)
    assert ex.chosen in ("chunked", "reference") and "would cancel" in " ".join(ex.reasons["sdpa"])
    want = attnkit.attention(q.double(), k[..., :5, :].double(), v[..., :5, :].double(),
                             score="gaussian", backend="reference")  # fmt: skip
    for backend in (None, "chunked", "reference"):
        got = attnkit.attention(q, k, v, score="gaussian", mask=mask, backend=backend)
        assert_close_to_scale(got, want, rel=FLOAT32_CALL_REL, what=str(backend))
