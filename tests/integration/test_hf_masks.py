"""The "attnkit" mask function against transformers' own dense masks.

Every pattern transformers composes (causal, sliding windows, chunks, packed
sequences, block ids, padding, and/or, at any cache offset) must become attnkit
masks that keep exactly the pairs ``sdpa_mask`` keeps, without a dense tensor.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import transformers.masking_utils as mu

from attnkit import masks
from attnkit.integrations.transformers import SymbolicMask, attnkit_mask

B = 2


def _expected(fn, L, S, q0, k0, padding=None) -> torch.Tensor:
    t = mu.sdpa_mask(
        batch_size=B, q_length=L, kv_length=S, q_offset=q0, kv_offset=k0, mask_function=fn,
        attention_mask=padding, allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
    )  # fmt: skip
    return torch.ones(B, 1, L, S, dtype=torch.bool) if t is None else t.expand(B, 1, L, S)


def _got(sym: SymbolicMask, L: int, S: int) -> torch.Tensor:
    if sym.mask is None:
        return torch.ones(B, 1, L, S, dtype=torch.bool)
    return sym.mask.to_dense(L, S, (B, 1))


def _dense_kinds(m: masks.Mask | None) -> set[str]:
    return set() if m is None else set(m.kinds()) & {"keep", "bias"}


def _padding(n: int) -> torch.Tensor:
    pad = torch.ones(B, n, dtype=torch.bool)
    pad[1, :3] = False  # left padding of the second row
    return pad


LEFT = torch.tensor([0, 3])
IDS = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3], [0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2]])
BLOCKS = torch.tensor([[-1, -1, 0, 0, 0, -1, 1, 1, -1, -1, -1, -1]] * B)
PATTERNS = {
    "causal": mu.causal_mask_function,
    "bidirectional": mu.bidirectional_mask_function,
    "sliding": mu.sliding_window_causal_mask_function(3),
    "sliding_bidirectional": mu.sliding_window_bidirectional_mask_function(2),
    "chunked": mu.chunked_causal_mask_function(4, LEFT),
    "blockwise": mu.or_masks(mu.causal_mask_function, mu.blockwise_overlay(BLOCKS)),
    "padding_fn": mu.and_masks(mu.causal_mask_function, mu.padding_mask_function(_padding(12))),
}


# (L, S, q_offset, kv_offset): a prefill, a chunked prefill and a decode step against a
# cache, and a sliding cache that dropped its oldest keys.
SIZES = [(12, 12, 0, 0), (5, 12, 7, 0), (1, 12, 11, 0), (1, 4, 11, 8), (3, 6, 9, 6)]


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "L{}S{}q{}k{}".format(*s))
@pytest.mark.parametrize("padded", [False, True])
def test_patterns_keep_what_transformers_keeps(name: str, sizes: tuple, padded: bool) -> None:
    L, S, q0, k0 = sizes
    if q0 + L > 12 or k0 + S > 12:
        pytest.skip("the pattern's tensors cover 12 positions")
    padding = _padding(q0 + L) if padded else None  # shorter than k0 + S: a static cache
    fn = PATTERNS[name]
    sym = attnkit_mask(B, L, S, q0, k0, mask_function=fn, attention_mask=padding)
    assert sym.symbolic and not _dense_kinds(sym.mask), sym
    assert torch.equal(_got(sym, L, S), _expected(fn, L, S, q0, k0, padding))


def test_packed_sequences_are_documents() -> None:
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 1, 2], [0, 1, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4]])
    packed = mu.find_packed_sequence_indices(pos)
    for base in (mu.causal_mask_function, mu.sliding_window_causal_mask_function(2)):
        fn = mu.packed_sequence_compatibility_function(base, pos, packed)
        sym = attnkit_mask(B, 12, 12, mask_function=fn)
        assert "document" in sym.mask.kinds() and not _dense_kinds(sym.mask)
        assert torch.equal(_got(sym, 12, 12), _expected(fn, 12, 12, 0, 0))


def test_an_unknown_pattern_is_evaluated_exactly_and_said_so() -> None:
    def every_other(b, h, q, kv):
        return (kv % 2 == 0) | (kv == q)

    fn = mu.and_masks(mu.causal_mask_function, every_other)
    sym = attnkit_mask(B, 12, 12, mask_function=fn, attention_mask=_padding(12))
    assert not sym.symbolic and sym.mask.kinds() == {"keep"}
    assert torch.equal(_got(sym, 12, 12), _expected(fn, 12, 12, 0, 0, _padding(12)))


def test_positions_and_shape_travel_with_the_mask() -> None:
    sym = attnkit_mask(B, 1, 9, torch.tensor(8), 0)  # a static cache keeps q_offset in a tensor
    assert (sym.q_offset, sym.kv_offset, sym.shape, sym.ndim) == (8, 0, (B, 1, 1, 9), 4)
    assert sym.contiguous() is sym
    assert attnkit_mask(B, 1, 9, 8, 0, attention_mask=sym) is sym  # prepared ahead: as it is
    assert sym.mask is None and sym.for_call(1, 5) is None  # one new token sees its whole cache
    causal = attnkit_mask(B, 4, 9, 5, 0)
    assert torch.equal(
        causal.for_call(4, 7).to_dense(4, 7), causal.mask.to_dense(4, 9)[:, :7]
    )  # fewer keys than the mask covers: the first ones
    with pytest.raises(ValueError, match="built for 4 queries and 9 keys"):
        causal.for_call(3, 9)
