"""The shared variable-length unpadding: kept lengths, key indices, groups."""

from __future__ import annotations

import pytest
import torch

from attnkit import _host, masks
from attnkit._inputs import validate_inputs
from attnkit.backends import varlen


def _inputs(mask: masks.Mask, B: int = 3, L: int = 6, S: int = 8):  # type: ignore[no-untyped-def]
    q = torch.randn(B, 2, L, 4)
    k = torch.randn(B, 2, S, 4)
    return validate_inputs(q, k, k, mask=mask)


def test_lengths_combine_valid_lens_and_key_padding_without_a_loop_over_keys() -> None:
    pad = torch.tensor(
        [
            [False] * 8,  # every key
            [False, True, False, False, True, True, True, True],  # keys 0, 2, 3: not a prefix
            [False, False, False, True, True, True, True, True],  # a prefix of 3
        ]
    )
    mask = masks.valid_lens(torch.tensor([5, 8, 2]), queries=True) & masks.key_padding(pad)
    inputs = _inputs(mask, L=8)
    assert varlen.can_unpad(inputs)
    lens = varlen.lengths(inputs, torch.device("cpu"))
    assert lens.q_len == [5, 8, 2]
    assert lens.k_len == [5, 3, 2]
    assert lens.key_idx[0] is None and lens.key_idx[2] is None
    assert lens.key_idx[1] is not None and lens.key_idx[1].tolist() == [0, 2, 3]
    assert not lens.causal


def test_no_unpadding_when_lengths_would_be_read_from_a_device() -> None:
    inputs = _inputs(masks.valid_lens(torch.tensor([5, 8, 2])))
    assert varlen.can_unpad(inputs)
    with _host.device_semantics():
        assert not varlen.can_unpad(inputs)


@pytest.mark.parametrize(
    "mask",
    [
        masks.valid_lens(torch.randint(0, 9, (3, 6))),  # per-query lengths
        masks.causal("bottom_right") & masks.valid_lens(torch.tensor([1, 2, 3])),
        masks.window(2, 0) & masks.valid_lens(torch.tensor([1, 2, 3])),
        masks.causal(),
    ],
)
def test_masks_that_cannot_be_unpadded(mask: masks.Mask) -> None:
    assert not varlen.can_unpad(_inputs(mask))


def test_take_keys_pads_the_kept_rows() -> None:
    t = torch.arange(12.0).view(1, 6, 2)
    out = varlen.take_keys(t, torch.tensor([1, 4]), 3)
    assert out.tolist() == [[[2.0, 3.0], [8.0, 9.0], [0.0, 0.0]]]
    assert varlen.take_keys(t, None, 2).tolist() == [[[0.0, 1.0], [2.0, 3.0]]]
