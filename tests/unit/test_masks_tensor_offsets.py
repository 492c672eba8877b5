"""Band masks whose global positions are tensors (a decode step against a static KV cache).

A 0-d integer tensor as ``q_offset``/``k_offset`` keeps the same pairs as the int, on
every path: read on the host where that is free (a band), or lowered to per-query key
ranges on the device where it is not (accelerators, torch.compile). A compiled call
keeps one graph while the offset moves.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo
import torch._dynamo.utils

import attnkit
from attnkit import _host, masks, mods
from attnkit.blockplan import build_plan

from cases import matrix_backends
from tolerance import (
    FLOAT32_CALL_REL,
    FLOAT32_REL,
    FLOAT64_REL,
    assert_close_to_scale,
    scaled_error,
)

BANDS = [(None, 0), (2, 0), (1, 3), (0, None)]  # causal, sliding, two-sided, anti-causal
PLACES = [(0, 0), (5, 2), (3, 7)]  # (q_offset, k_offset)
SIZES = [(1, 9), (4, 9), (9, 9), (7, 3)]  # (L, S)


def _expected(left, right, align, q0, k0, L, S) -> np.ndarray:  # type: ignore[no-untyped-def]
    """keep[i, j] at global positions: the query of row i sits at q0 + i (+ S - L at the
    bottom right), the key of column j at k0 + j."""
    keep = np.zeros((L, S), dtype=bool)
    for i in range(L):
        p = q0 + i + (S - L if align == "bottom_right" else 0)
        for j in range(S):
            d = (k0 + j) - p
            keep[i, j] = (left is None or d >= -left) and (right is None or d <= right)
    return keep


@pytest.mark.parametrize("band", BANDS, ids=str)
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("place", PLACES, ids=str)
def test_tensor_offsets_keep_what_int_offsets_keep(band, align, place) -> None:  # type: ignore[no-untyped-def]
    left, right = band
    q0, k0 = place
    for L, S in SIZES:
        want = _expected(left, right, align, q0, k0, L, S)
        m = masks.window(left, right, align, q_offset=torch.tensor(q0), k_offset=torch.tensor([k0]))
        assert np.array_equal(m.to_dense(L, S).numpy(), want)
        i = torch.arange(L).view(1, 1, L, 1)
        j = torch.arange(S).view(1, 1, 1, S)
        b, h = torch.arange(2).view(2, 1, 1, 1), torch.zeros(1, 1, 1, 1, dtype=torch.long)
        for strict in (False, True):  # read for free / lowered on the device
            mask = masks.window(left, right, align, q_offset=torch.tensor(q0), k_offset=k0)
            if strict:
                with _host.device_semantics():
                    plan = build_plan(mask, L, S, (2,), "cpu")
            else:
                plan = build_plan(mask, L, S, (2,), "cpu")
            assert (plan.band() is not None) == (not strict)  # a band, or key ranges
            kept = plan.keep_fn()(b, h, i, j).expand(2, 1, L, S)
            assert np.array_equal(kept[0, 0].numpy(), want)
            assert np.array_equal(kept[1, 0].numpy(), want)
            exact = build_plan(masks.keep(torch.from_numpy(want)), L, S, (2,), "cpu")
            for bq, bk in ((1, 1), (2, 4)):
                got = plan.with_blocks(bq, bk).tile_states()
                assert torch.equal(got, exact.with_blocks(bq, bk).tile_states().expand_as(got))


@pytest.mark.parametrize("backend", matrix_backends("cpu"))
def test_every_backend_attends_at_tensor_offsets(backend: str) -> None:
    g = torch.Generator().manual_seed(0)
    L, S = 3, 11
    q = torch.randn(2, 2, L, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, S, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, S, 8, generator=g, dtype=torch.float64)
    pad = torch.zeros(2, S, dtype=torch.bool)
    pad[1, :2] = True
    for left, right in BANDS:
        keep = torch.from_numpy(_expected(left, right, "top_left", 6, 1, L, S)) & ~pad.view(
            2, 1, 1, S
        )  # (B, 1, L, S)
        logits = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(~keep, float("-inf"))
        weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a row with no key: zeros
        want = weights @ v
        for strict in (False, True):
            mask = masks.window(left, right, q_offset=torch.tensor(6), k_offset=1)
            mask = mask & masks.key_padding(pad)
            try:
                if strict:
                    with _host.device_semantics():
                        out = attnkit.attention(q, k, v, mask=mask, backend=backend)
                else:
                    out = attnkit.attention(q, k, v, mask=mask, backend=backend)
            except attnkit.BackendNotSupportedError:
                continue  # (the backend says why it cannot run such a call)
            assert_close_to_scale(out, want, rel=FLOAT64_REL)


def test_an_offset_changed_in_place_is_seen_by_the_next_call() -> None:
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 2, 1, 8, generator=g), torch.randn(1, 2, 9, 8, generator=g)
    offset = torch.tensor(8)
    mask = masks.causal(q_offset=offset)
    first = attnkit.attention(q, k, k, mask=mask)  # the query at position 8 sees every key
    assert_close_to_scale(first, attnkit.attention(q, k, k), rel=FLOAT32_CALL_REL)
    offset.fill_(2)  # the same mask object, the query now at position 2
    second = attnkit.attention(q, k, k, mask=mask)
    assert_close_to_scale(
        second, attnkit.attention(q, k, k, mask=masks.causal(q_offset=2)), rel=FLOAT32_CALL_REL
    )
    assert scaled_error(first, second) > FLOAT32_REL


def test_bad_tensor_offsets_are_refused() -> None:
    with pytest.raises(TypeError, match="q_offset must have an integer dtype"):
        masks.causal(q_offset=torch.tensor(1.0))
    with pytest.raises(ValueError, match="k_offset must be an int or a tensor of one element"):
        masks.window(2, 0, k_offset=torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="q_offset must be an int or a 0-d integer tensor"):
        masks.causal(q_offset=1.5)  # type: ignore[arg-type]


@pytest.mark.torch_feature("compile")
def test_a_compiled_call_keeps_one_graph_while_the_offset_moves() -> None:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    g = torch.Generator().manual_seed(2)
    B, S = 2, 9
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, :2] = True

    def step(q: torch.Tensor, k: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(
            q, k, k, mask=masks.causal(q_offset=offset) & masks.key_padding(pad)
        )

    compiled = torch.compile(step, fullgraph=True, dynamic=False, backend="aot_eager")
    q, k = torch.randn(B, 2, 1, 8, generator=g), torch.randn(B, 2, S, 8, generator=g)
    for pos in range(3, S):
        want = attnkit.attention(q, k, k, mask=masks.causal(q_offset=pos) & masks.key_padding(pad))
        got = compiled(q, k, torch.tensor(pos))
        assert_close_to_scale(got, want, rel=FLOAT32_CALL_REL)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_a_symmetric_alibi_at_a_moved_tensor_offset_keeps_its_bias() -> None:
    """Whether a symmetric ALiBi folds into a key bias (sdpa) depends on the offset's
    value, which the mask's signature does not hold: the backend chosen at one offset
    must not be reused at another where it would drop the bias (a decode loop moving
    its position tensor in place, or a fresh mask at another position)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    alibi = mods.alibi(2)  # symmetric: it folds while every kept key is at or before its query
    position = torch.tensor(0)
    mask = masks.causal(q_offset=position)
    for shift in (0, 3, 0):
        position.fill_(shift)
        for given in (mask, masks.causal(q_offset=torch.tensor(shift))):
            got = attnkit.attention(q, k, v, mask=given, mods=alibi)
            want = attnkit.attention(
                q.double(), k.double(), v.double(), mask=masks.causal(q_offset=shift),
                mods=alibi, backend="reference",
            )  # fmt: skip
            assert_close_to_scale(got, want, rel=FLOAT32_CALL_REL)


def test_a_prefix_lm_offset_changed_in_place_is_seen_by_the_next_call() -> None:
    """prefix_lm's causal part takes a tensor offset like causal(): an in-place change
    reaches the next call's plan."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    position = torch.tensor(0)
    mask = masks.prefix_lm(1, q_offset=position)
    first = attnkit.attention(q, k, v, mask=mask)
    position.fill_(-3)
    got = attnkit.attention(q, k, v, mask=mask)
    want = attnkit.attention(
        q.double(), k.double(), v.double(), mask=masks.prefix_lm(1, q_offset=-3),
        backend="reference",
    )  # fmt: skip
    assert_close_to_scale(got, want, rel=FLOAT32_CALL_REL)
    assert scaled_error(got, first) > FLOAT32_REL


def test_the_backend_run_at_a_moved_offset_is_the_one_explain_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Which band a tensor offset keeps decides, say, whether sdpa would build it densely:
    dispatch keys its cached choice on the lowered plan, so the call at a moved offset
    runs the backend that explain() names for it, not the one chosen at the old value."""
    from attnkit.backends.chunked import ChunkedBackend
    from attnkit.backends.reference import ReferenceBackend
    from attnkit.backends.sdpa import SDPABackend

    ran: list[str] = []
    for cls in (SDPABackend, ChunkedBackend, ReferenceBackend):

        def spy(self, inputs, _forward=cls.forward):  # type: ignore[no-untyped-def]
            ran.append(self.name)
            return _forward(self, inputs)

        monkeypatch.setattr(cls, "forward", spy)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g) for _ in range(3))
    position = torch.tensor(0)
    mask = masks.causal(q_offset=position)
    chosen = set()
    for shift in (0, 3, 0, 3):
        position.fill_(shift)
        named = attnkit.explain(q, k, v, mask=mask).chosen
        ran.clear()
        attnkit.attention(q, k, v, mask=mask)
        assert ran == [named], (shift, ran, named)
        chosen.add(named)
    assert len(chosen) == 2  # (the two offsets are lowered differently)
