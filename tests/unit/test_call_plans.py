"""Plans of plain calls: a repeated call skips validation and dispatch, never correctness.

Each test first makes a call to store its plan, then checks that the next call with
the same key behaves exactly as the full path would: same answer, same errors, same
non-finite policy, the backend ``use_backend`` forces, a fresh choice after a backend
is registered.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit import _inputs, _plans, masks
from attnkit.backends import dispatch
from attnkit.backends.reference import ReferenceBackend
from attnkit.backends.sdpa import run as sdpa_run
from attnkit.kernels import _native

from cases import qkv
from tolerance import FLOAT32_CALL_REL, assert_close_to_scale


def _qkv(L: int = 8, S: int = 8, seed: int = 0) -> tuple[torch.Tensor, ...]:
    return qkv(2, 3, L, S, 16, seed=seed)


@pytest.fixture
def count_validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often attention() validated in full (attnkit.functional's validate_inputs)."""
    seen: list[int] = []
    original = _inputs.validate_inputs

    def counting(*args: object, **kwargs: object) -> _inputs.AttentionInputs:
        seen.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(attnkit.functional, "validate_inputs", counting)
    return seen


@pytest.mark.parametrize(
    "mask", [None, masks.causal(), masks.causal("bottom_right"), masks.window(2, 1)]
)
def test_a_repeated_plain_call_skips_validation_and_gives_the_same_answer(
    count_validations: list[int], mask: masks.Mask | None
) -> None:
    q, k, v = _qkv(L=5, S=9)
    first = attnkit.attention(q, k, v, mask=mask)
    assert len(count_validations) == 1
    q2, k2, v2 = _qkv(L=5, S=9, seed=1)
    second = attnkit.attention(q2, k2, v2, mask=mask)
    assert len(count_validations) == 1  # the plan ran
    expected = attnkit.attention(q2, k2, v2, mask=mask, backend="reference")
    assert_close_to_scale(second, expected)
    assert_close_to_scale(
        first, attnkit.attention(q, k, v, mask=mask, backend="reference"), rel=FLOAT32_CALL_REL
    )


def test_plans_are_not_shared_across_shapes_dtypes_or_flags(count_validations: list[int]) -> None:
    q, k, v = _qkv()
    attnkit.attention(q, k, v)
    attnkit.attention(q[:, :2], k[:, :2], v[:, :2])  # other shapes
    attnkit.attention(q.double(), k.double(), v.double())  # other dtype
    attnkit.attention(q, k, v, scale=0.5)  # other scale
    attnkit.attention(q, k, v, score="dot")  # other score
    assert len(count_validations) == 5
    with pytest.raises(TypeError, match="dtypes must match"):
        attnkit.attention(q, k.double(), v)  # a bad call after good ones is still refused
    with pytest.raises(TypeError, match="scale"):
        attnkit.attention(q, k, v, scale=True)  # never mistaken for scale=1.0


def test_a_plan_follows_grad_mode_and_requires_grad() -> None:
    q, k, v = _qkv()
    with torch.no_grad():
        attnkit.attention(q, k, v)
    qg = q.clone().requires_grad_(True)
    out = attnkit.attention(qg, k, v)
    out.sum().backward()
    assert qg.grad is not None and torch.isfinite(qg.grad).all()
    with torch.no_grad():
        assert not attnkit.attention(qg, k, v).requires_grad


def test_use_backend_and_a_new_backend_are_honoured_after_a_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    q, k, v = _qkv()
    attnkit.attention(q, k, v)
    attnkit.attention(q, k, v)  # from the plan
    with attnkit.use_backend("reference"):
        calls: list[int] = []
        original = ReferenceBackend.forward

        def spy(self: ReferenceBackend, inputs: _inputs.AttentionInputs) -> object:
            calls.append(1)
            return original(self, inputs)

        monkeypatch.setattr(ReferenceBackend, "forward", spy)
        attnkit.attention(q, k, v)
        attnkit.attention(q, k, v)
        assert len(calls) == 2

    cleared: list[int] = []
    stop = dispatch.on_registry_change(lambda: cleared.append(1))
    try:
        assert _plans.lookup(_plans.plan_key(q, k, v, "scaled_dot", None, None, 0.0, None))
        reference = attnkit.unregister_backend("reference")  # caches go
        assert cleared == [1]
        key = _plans.plan_key(q, k, v, "scaled_dot", None, None, 0.0, None)
        assert _plans.lookup(key) is None
        attnkit.attention(q, k, v)
        attnkit.register_backend(reference)  # a registration clears them too
        assert cleared == [1, 1]
        assert _plans.lookup(key) is None
    finally:
        stop()
    attnkit.register_backend(reference)  # (registered again where it is)
    assert cleared == [1, 1]  # stopped: no more calls


@pytest.mark.parametrize("causal", [False, True])
def test_non_finite_inputs_on_a_planned_call_follow_the_policy(causal: bool) -> None:
    mask = masks.causal() if causal else None
    q, k, v = _qkv()
    attnkit.attention(q, k, v, mask=mask)  # the plan
    qn = q.clone()
    qn[0, 1, 3] = math.nan  # one query row
    out = attnkit.attention(qn, k, v, mask=mask)
    assert torch.isnan(out[0, 1, 3]).all()
    clean = attnkit.attention(q, k, v, mask=mask)
    keep = torch.ones_like(out, dtype=torch.bool)
    keep[0, 1, 3] = False
    torch.testing.assert_close(out[keep], clean[keep], rtol=0, atol=0)
    kn = k.clone()
    kn[1, 2] = math.nan  # every key of one head
    out = attnkit.attention(q, kn, v, mask=mask)
    assert torch.isnan(out[1, 2]).all() and torch.isfinite(out[0]).all()
    if causal:  # a NaN value masked out for every row but the last never contributes
        vn = v.clone()
        vn[0, 0, -1] = math.nan
        out = attnkit.attention(q, k, vn, mask=mask)
        assert torch.isnan(out[0, 0, -1]).all()
        torch.testing.assert_close(out[0, 0, :-1], clean[0, 0, :-1], rtol=0, atol=0)


def test_more_keys_than_queries_on_a_planned_call_follow_the_policy() -> None:
    """Unmasked, S > L: the plan probes the queries and the first key; a NaN anywhere in
    a head's keys still makes every row of that head NaN, and nowhere else."""
    q, k, v = _qkv(L=3, S=9)
    clean = attnkit.attention(q, k, v)  # the plan
    for key_row in (0, 5):
        kn = k.clone()
        kn[1, 2, key_row, 4] = math.nan
        out = attnkit.attention(q, kn, v)
        assert torch.isnan(out[1, 2]).all(), key_row
        keep = torch.ones(2, 3, dtype=torch.bool)
        keep[1, 2] = False
        torch.testing.assert_close(out[keep], clean[keep], rtol=0, atol=0)
    kn = k.clone()
    kn[0, 1] = math.nan  # every key of one head
    assert torch.isnan(attnkit.attention(q, kn, v)[0, 1]).all()


def test_a_decoding_step_reads_the_first_key_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """One query against a long cache: the finiteness probe does not sum the cache, with
    the output's one-pass read and with the sums that stand in for it."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 1, 32, generator=g)
    k = torch.randn(1, 4, 4096, 32, generator=g)
    v = torch.randn(1, 4, 4096, 32, generator=g)
    mask = masks.causal("bottom_right")
    attnkit.attention(q, k, v, mask=mask)
    original = torch.Tensor.sum
    summed: list[int] = []

    def spy(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        summed.append(self.numel())
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    for settled_read in (_native.library() is not None, False):
        summed.clear()
        if not settled_read:
            monkeypatch.setattr(sdpa_run, "rows_settled", lambda t: False)
        monkeypatch.setattr(torch.Tensor, "sum", spy)
        out = attnkit.attention(q, k, v, mask=mask)
        monkeypatch.undo()
        assert max(summed, default=0) <= 4 * 32  # at most the queries and a key row per head
        assert bool(summed) != settled_read
        want = F.scaled_dot_product_attention(q, k, v)
        assert_close_to_scale(out, want, rel=FLOAT32_CALL_REL)


@pytest.mark.parametrize("S", [8, 12])
@pytest.mark.parametrize("causal", [False, True])
def test_a_planned_call_reads_its_output_its_queries_and_a_key_probe(
    causal: bool, S: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finiteness check of a planned call reads its output once
    (:func:`attnkit.kernels.finite.rows_settled`) and sums nothing. Where that read does
    not show the output settled, it sums the output, the queries (a NaN query row comes
    back from torch's kernel as zeros at some head sizes) and the keys when there are no
    more of them than queries, else the first key row: three sums, never the values."""
    q, k, v = _qkv(L=8, S=S)
    mask = masks.causal() if causal else None
    attnkit.attention(q, k, v, mask=mask)  # the plan
    summed: list[torch.Tensor] = []
    read: list[torch.Tensor] = []
    original = torch.Tensor.sum
    settled = sdpa_run.rows_settled

    def spy(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        summed.append(self)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    def read_spy(t: torch.Tensor) -> bool:
        read.append(t)
        return settled(t)

    monkeypatch.setattr(torch.Tensor, "sum", spy)
    monkeypatch.setattr(sdpa_run, "rows_settled", read_spy)
    out = attnkit.attention(q, k, v, mask=mask)
    monkeypatch.undo()
    assert len(read) == 1 and read[0] is out
    if _native.library() is not None:
        assert not summed
    monkeypatch.setattr(sdpa_run, "rows_settled", lambda t: False)
    monkeypatch.setattr(torch.Tensor, "sum", spy)
    summed.clear()
    out = attnkit.attention(q, k, v, mask=mask)
    monkeypatch.undo()
    assert len(summed) == 3 and summed[0] is out and summed[1] is q
    if S <= 8:
        assert summed[2] is k
    else:
        assert summed[2].shape == (*k.shape[:-2], 1, k.shape[-1])  # (B, Hk, 1, E)
        assert summed[2].data_ptr() == k.data_ptr()
    assert_close_to_scale(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal))


def test_a_half_output_whose_sum_passes_the_half_range_stays_on_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finite float16 values whose sum passes 65504 are not mistaken for an inf."""
    q, k, v = (t.to(torch.float16) for t in _qkv(L=7, S=5, seed=5))  # a shape of its own
    v = v.abs() * 300 + 200  # (2, 3, 5, 16): every output entry >= 200, the sum ~ 1e5
    assert attnkit.explain(q, k, v).chosen == "sdpa"
    slow: list[int] = []
    original = sdpa_run.direct

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        slow.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sdpa_run, "direct", spy)
    attnkit.attention(q, k, v)  # the plan, built with the spy as its slow path
    slow.clear()
    out = attnkit.attention(q, k, v)
    assert not slow
    assert torch.isfinite(out).all() and float(out.float().sum()) > 65504


def test_recording_sees_planned_calls() -> None:
    layer = attnkit.nn.SelfAttention(16, 2)
    x = torch.randn(1, 5, 16)
    layer(x)
    layer(x)  # planned
    with attnkit.viz.capture(layer) as cap:
        layer(x)
    assert len(cap) == 1
    assert cap.weights(0).shape == (1, 2, 5, 5)


def test_plans_key_on_a_mask_s_static_key() -> None:
    """A band with integer offsets keys a plan by its static key; a mask holding data
    (lengths) or a tensor offset keeps each call on the full path."""
    q = torch.randn(1, 2, 8, 4)
    assert masks.window(3, 0).static_key() == masks.window(3, 0).static_key()
    assert masks.window(3, 0).static_key() != masks.window(2, 0).static_key()
    band = _plans.plan_key(q, q, q, "scaled_dot", masks.causal(), None, 0.0, None)
    assert band is not None and masks.causal().static_key() in band
    lens = masks.valid_lens(torch.tensor([3]))
    assert lens.static_key() is None
    assert _plans.plan_key(q, q, q, "scaled_dot", lens, None, 0.0, None) is None
    shifted = masks.causal(q_offset=torch.tensor(2))
    assert shifted.static_key() is None
    assert _plans.plan_key(q, q, q, "scaled_dot", shifted, None, 0.0, None) is None
