"""The shared block plan against dense masks, at odd sizes, block sizes and offsets."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.blockplan import EMPTY, FULL, PARTIAL, build_plan, clear_cache

from cases import structured_masks
from tolerance import FLOAT32_CALL_REL, FLOAT32_REL, assert_close_to_scale, scaled_error

B, H, TL, TS = 3, 2, 23, 29


def _masks() -> dict[str, masks.Mask]:
    """The shared structured masks, plus a window at global offsets."""
    return {
        **structured_masks(B, TL, TS),
        "offset_window": masks.window(3, 0, q_offset=5, k_offset=1),
    }


def _combined(mask: masks.Mask) -> bool:
    """Masks whose tile states may be conservative (PARTIAL where a tile is empty): parts
    combined, documents judged from id ranges, disjunctions."""
    return len(mask.parts()) > 1 or bool(mask.kinds() & {"document", "or", "not", "prefix_lm"})


def _truth(dense: torch.Tensor, bq: int, bk: int) -> torch.Tensor:
    """(B, nq, nk) states read off a dense (B, H, L, S) keep mask."""
    L, S = dense.shape[-2:]
    nq, nk = -(-L // bq), -(-S // bk)
    out = torch.empty(dense.shape[0], nq, nk, dtype=torch.int8)
    for b, i, j in itertools.product(range(dense.shape[0]), range(nq), range(nk)):
        tile = dense[b, :, i * bq : (i + 1) * bq, j * bk : (j + 1) * bk]
        out[b, i, j] = EMPTY if not tile.any() else FULL if tile.all() else PARTIAL
    return out


def _check_states(got: torch.Tensor, truth: torch.Tensor, combined: bool) -> None:
    """Exact for one mask; for a combination a tile may be PARTIAL in the plan where it is
    empty or full in truth (each part keeps it in part), never the other way round."""
    if not combined:
        torch.testing.assert_close(got, truth, rtol=0, atol=0)
        return
    wrong = got != truth
    assert (got[wrong] == PARTIAL).all()  # never EMPTY where a pair is kept, nor FULL where not


@pytest.mark.parametrize("name", sorted(_masks()))
@pytest.mark.parametrize("bq, bk", [(4, 4), (5, 7), (8, 16), (32, 32)])
def test_tile_states_are_exact_for_structured_masks(name: str, bq: int, bk: int) -> None:
    mask = _masks()[name]
    plan = build_plan(mask, TL, TS, (B, H), "cpu", block_q=bq, block_k=bk)
    dense = mask.to_dense(TL, TS, (B, H)).expand(B, H, TL, TS)
    _check_states(plan.tile_states(), _truth(dense, bq, bk), _combined(mask))


@pytest.mark.parametrize("name", sorted(_masks()))
@pytest.mark.parametrize(
    "q0, L, k0, S", [(0, TL, 0, TS), (2, 5, 3, 11), (17, 6, 0, TS), (9, 1, 28, 1)]
)
def test_a_plan_at_offsets_equals_the_full_mask_cut(
    name: str, q0: int, L: int, k0: int, S: int
) -> None:
    """A block of a longer problem is planned at its true positions."""
    mask = _masks()[name]
    full = mask.to_dense(TL, TS, (B, H)).expand(B, H, TL, TS)
    cut = full[..., q0 : q0 + L, k0 : k0 + S]
    plan = build_plan(mask, L, S, (B, H), "cpu", block_q=3, block_k=4, q_start=q0, k_start=k0,
                      total_L=TL, total_S=TS)  # fmt: skip
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    i = torch.arange(L).view(1, 1, L, 1)
    j = torch.arange(S).view(1, 1, 1, S)
    keep = plan.keep_fn()(b, h, i, j).expand(B, H, L, S)
    assert torch.equal(keep, cut)
    _check_states(plan.tile_states(), _truth(cut, 3, 4), _combined(mask))
    shard = mask.shard(q0, k0, L, S, TL, TS)
    assert torch.equal(shard.to_dense(L, S, (B, H)).expand(B, H, L, S), cut)


def test_a_dense_bias_makes_tiles_partial_never_full() -> None:
    bias = masks.bias(torch.zeros(1, 8, 8))
    plan = build_plan(masks.causal() & bias, 8, 8, (1,), "cpu", block_q=4, block_k=4)
    assert plan.tile_states().tolist() == [[[PARTIAL, EMPTY], [PARTIAL, PARTIAL]]]


def test_shard_rejects_a_block_outside_the_problem() -> None:
    with pytest.raises(ValueError, match="inside the full problem"):
        masks.causal().shard(4, 0, 8, 8, 10, 8)
    with pytest.raises(ValueError, match="q_start"):
        masks.causal().shard(-1, 0, 8, 8, 10, 8)


def test_to_block_mask_matches_flex_attention_on_a_dense_mask() -> None:
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    mask = masks.causal() & masks.valid_lens(torch.tensor([20, 9]))
    L = S = 32
    plan = build_plan(mask, L, S, (2, 1), "cpu", block_q=8, block_k=8)
    block_mask = plan.to_block_mask()
    dense = block_mask.to_dense()  # (B, H, nq, nk) of visited blocks
    states = plan.tile_states()
    assert torch.equal(dense[:, 0].bool(), states != EMPTY)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 1, L, 8, generator=g) for _ in range(3))
    with warnings.catch_warnings():  # eager flex_attention warns that it is not fused
        warnings.simplefilter("ignore", UserWarning)
        out = flex.flex_attention(q, k, v, block_mask=block_mask)
    ref_mask = mask.to_dense(L, S, (2, 1))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=ref_mask)
    alive = ref_mask.any(-1, keepdim=True)
    assert_close_to_scale(out * alive, ref * alive)


def _set_tensors_anew(mask: masks.Mask) -> int:
    """Set each tensor field of ``mask`` and of its parts to a new tensor with other
    values (the same shape and dtype), as a user reusing the mask object would; the count
    of fields set."""
    count = 0
    for name, value in list(vars(mask).items()):
        if isinstance(value, torch.Tensor):
            if value.dtype == torch.bool:
                changed = ~value
            elif value.dim():  # lengths or ids: the same values in another order
                changed = value.flip(-1)
            else:  # an offset
                changed = value + 1
            while changed._version < value._version:  # the old version counter: only
                changed.copy_(changed.clone())  # the tensor's identity tells them apart
            assert changed._version == value._version
            setattr(mask, name, changed)
            count += 1
    return count + sum(_set_tensors_anew(c) for c in mask.children())


@pytest.mark.parametrize("backend", [None, "chunked"])
@pytest.mark.parametrize("name", sorted(structured_masks(B, TL, TS)))
def test_a_mask_whose_tensors_are_set_anew_is_planned_anew(name: str, backend: str | None) -> None:
    """A cached plan belongs to the tensors it was built from: setting a mask's tensor
    field to another tensor (whose version counter may well equal the old one's) gives
    the next call the plan of the new values, as a fresh build does."""
    mask = structured_masks(B, TL, TS)[name]
    if not mask.tensors():
        pytest.skip("a tensor-free mask is planned by value")
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(B, H, n, 8, generator=g) for n in (TL, TS, TS))
    first = attnkit.attention(q, k, v, mask=mask, backend=backend)
    assert _set_tensors_anew(mask) > 0
    again = attnkit.attention(q, k, v, mask=mask, backend=backend)
    clear_cache()
    fresh = attnkit.attention(q, k, v, mask=mask, backend=backend)
    torch.testing.assert_close(again, fresh, rtol=0, atol=0)
    assert scaled_error(again, first) > FLOAT32_REL  # the new values do change the call


@pytest.mark.parametrize(
    ("field", "value"), [("left", 0), ("align", "bottom_right"), ("k_offset", 2)]
)
def test_a_static_field_set_anew_on_a_mask_with_tensors_is_planned_anew(
    field: str, value: object
) -> None:
    """A window at a tensor offset is planned per object; its sides, its alignment and
    an int offset beside the tensor one are not tensors, so setting one anew must
    change the plan's key too."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (7, 9, 9))
    mask = masks.window(3, 1, q_offset=torch.tensor(2))
    first = attnkit.attention(q, k, v, mask=mask)
    setattr(mask, field, value)
    again = attnkit.attention(q, k, v, mask=mask)
    fields = {"left": 3, "align": "top_left", "k_offset": 0, field: value}
    fresh = masks.window(
        fields["left"], 1, fields["align"], q_offset=torch.tensor(2), k_offset=fields["k_offset"]
    )
    want = attnkit.attention(q.double(), k.double(), v.double(), mask=fresh, backend="reference")
    assert_close_to_scale(again, want, rel=FLOAT32_CALL_REL)
    assert scaled_error(again, first) > FLOAT32_REL
