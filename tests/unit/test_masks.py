"""Mask constructors: polarity, broadcasting, alignment, composition, to_dense."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch

import attnkit
from attnkit import masks

from reference import oracle_mask
from tolerance import FLOAT32_ULPS_REL, assert_close_to_scale


def test_keep_and_block_are_opposite_polarities() -> None:
    t = torch.tensor([[True, False, True]])
    assert torch.equal(masks.keep(t).to_dense(1, 3), t)
    assert torch.equal(masks.block(t).to_dense(1, 3), ~t)


def test_tf_mask_one_means_masked_and_matches_the_tutorial_where_rows_live() -> None:
    """The TF tutorial adds mask * -1e9; attnkit blocks exactly. Same result on live rows."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 8, generator=gen) for n in (6, 6, 6))
    look_ahead = 1 - torch.tril(torch.ones(6, 6))  # (L, S), 1 = masked
    padding = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 1, 0, 0, 0, 0]], dtype=torch.float32)
    padding = padding[:, None, None, :]  # (B, 1, 1, S), the tutorial's layout
    combined = torch.maximum(look_ahead, padding)
    out = attnkit.attention(q, k, v, mask=masks.tf(combined))
    logits = q @ k.transpose(-1, -2) / 8**0.5 + combined * -1e9
    tutorial = torch.softmax(logits, dim=-1) @ v
    assert_close_to_scale(out, tutorial)


def test_valid_lens_matches_d2l_semantics_and_broadcasts_over_heads() -> None:
    d = masks.valid_lens(torch.tensor([2, 3])).to_dense(2, 4, (2, 5))
    assert d.shape == (2, 5, 2, 4)
    assert d[0, 3].tolist() == [[True, True, False, False]] * 2
    assert d[1, 0].tolist() == [[True, True, True, False]] * 2
    per_query = masks.valid_lens(torch.tensor([[1, 3], [2, 4]])).to_dense(2, 4, (2,))
    assert per_query[0].tolist() == [[True, False, False, False], [True, True, True, False]]


def test_valid_lens_queries_masks_padded_query_rows() -> None:
    d = masks.valid_lens(torch.tensor([2]), queries=True).to_dense(3, 3, (1,))
    assert d[0].tolist() == [[True, True, False], [True, True, False], [False, False, False]]


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize(("L", "S"), [(3, 5), (5, 3), (4, 4), (1, 7)])
def test_causal_and_window_alignment_match_the_oracle(align: str, L: int, S: int) -> None:
    got = masks.causal(align).to_dense(L, S).numpy()  # type: ignore[arg-type]
    ref, _ = oracle_mask(("causal", align), L, S, 0)
    np.testing.assert_array_equal(got, ref)
    got_w = masks.window(1, 2, align=align).to_dense(L, S).numpy()  # type: ignore[arg-type]
    ref_w, _ = oracle_mask(("window", 1, 2, align), L, S, 0)
    np.testing.assert_array_equal(got_w, ref_w)


def test_causal_docstring_picture() -> None:
    tl = masks.causal("top_left").to_dense(3, 5).int().tolist()
    br = masks.causal("bottom_right").to_dense(3, 5).int().tolist()
    assert tl == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    assert br == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_and_combines_keeps_and_adds_biases() -> None:
    b1 = torch.tensor([[0.5, 1.0, 2.0]])
    b2 = torch.tensor([[1.0, 1.0, 1.0]])
    m = masks.bias(b1) & masks.causal() & masks.bias(b2)
    assert [p.kind for p in m.parts()] == ["bias", "causal", "bias"]
    d = m.to_dense(1, 3)
    assert d.dtype == torch.float32
    assert d.tolist() == [[1.5, float("-inf"), float("-inf")]]


def test_key_padding_is_true_for_padding() -> None:
    pad = torch.tensor([[False, True, False]])
    d = masks.key_padding(pad).to_dense(2, 3, (1, 4))
    assert d.shape == (1, 4, 2, 3)
    assert d[0, 2].tolist() == [[True, False, True]] * 2


def test_window_with_unbounded_side_is_causal() -> None:
    assert torch.equal(masks.window(None, 0).to_dense(6, 6), masks.causal().to_dense(6, 6))


def test_valid_len_zero_gives_zero_rows_not_a_uniform_average() -> None:
    """d2l's masked_softmax gives a uniform average for valid length 0; attnkit gives 0."""
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 2)
    out, w = attnkit.attention(q, k, v, mask=masks.valid_lens([0, 5]), return_weights=True)
    assert not out[0].any() and not w[0].any()
    assert_close_to_scale(w[1].sum(-1), torch.ones(3), rel=FLOAT32_ULPS_REL)


@pytest.mark.torch_feature("compile")
def test_valid_lens_mask_compiles_without_graph_breaks() -> None:
    """Under torch.compile the host-side value checks are skipped, not a graph break."""
    lens = torch.tensor([3, 5])

    def run(q: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, q, q, mask=masks.valid_lens(lens))

    q = torch.randn(2, 2, 5, 4)
    compiled = torch.compile(run, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q), run(q), rtol=0, atol=0)


@pytest.mark.parametrize(
    "mask",
    [
        masks.causal(),
        masks.causal("bottom_right", q_offset=3, k_offset=1),
        masks.window(None, 2),
        masks.window(4, 0, "bottom_right"),
    ],
)
def test_a_band_comes_back_from_its_static_key(mask: masks.Mask) -> None:
    """``from_static_key`` gives a band of the same type, key and keep pattern."""
    key = mask.static_key()
    assert key is not None
    back = type(mask).from_static_key(key)
    assert type(back) is type(mask) and back.static_key() == key
    assert torch.equal(back.dense(5, 7, (), torch.device("cpu")).keep,
                       mask.dense(5, 7, (), torch.device("cpu")).keep)  # fmt: skip
    with pytest.raises(TypeError, match="no static key"):
        masks.Mask.from_static_key(key)


@pytest.mark.parametrize(
    ("factory", "cls", "args", "kwargs"),
    [
        (masks.causal, masks.CausalMask, (), {}),
        (masks.causal, masks.CausalMask, ("bottom_right",), {"q_offset": -3, "k_offset": 7}),
        (masks.window, masks.WindowMask, (None, 2), {}),
        (masks.window, masks.WindowMask, (4, None, "bottom_right"), {"q_offset": 2}),
        (masks.window, masks.WindowMask, (0, 0), {"k_offset": 2**60}),
    ],
)
def test_a_band_built_without_its_checks_is_the_constructor_s(
    factory: Any, cls: Any, args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    """The factories build a band of plain ints without the constructor's checks
    (:func:`attnkit.masks.bands.plain_band`): the mask holds exactly what the
    constructor would set."""
    got = factory(*args, **kwargs)
    want = cls(*args, **kwargs)
    assert type(got) is cls and vars(got) == vars(want)


@pytest.mark.parametrize(
    ("left", "right", "align", "q_offset"),
    [
        (True, 0, "top_left", 0),  # a bool is no int
        (-1, 0, "top_left", 0),  # below the range
        (np.int64(2), 0, "top_left", 0),  # an int the constructor converts
        (None, 0, "middle", 0),  # no align name
        (None, 0, "top_left", torch.tensor(3)),  # a tensor offset is data
        (None, 0, "top_left", 2**61),  # beyond MAX_POSITION
    ],
)
def test_a_band_of_other_arguments_goes_through_the_checks(
    left: Any, right: Any, align: Any, q_offset: Any
) -> None:
    """Anything but plain ints in range and an align name takes the constructor: its
    conversion or its error, word for word."""
    from attnkit.masks.bands import plain_band

    assert plain_band(masks.WindowMask, left, right, align, q_offset, 0) is None
    try:
        want = masks.WindowMask(left, right, align, q_offset=q_offset)
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc), match=re.escape(str(exc))):
            masks.window(left, right, align, q_offset=q_offset)
        return
    got = masks.window(left, right, align, q_offset=q_offset)
    assert type(got) is type(want)
    assert {n: v for n, v in vars(got).items() if n != "q_offset"} == {
        n: v for n, v in vars(want).items() if n != "q_offset"
    }
    assert torch.equal(torch.as_tensor(got.q_offset), torch.as_tensor(want.q_offset))
