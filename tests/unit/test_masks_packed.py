"""Document (packed sequences) and prefix-LM masks, and the | and ~ combinations."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.blockplan import build_plan

from tolerance import FLOAT64_REL, assert_close_to_scale


def test_document_from_lengths_numbers_the_documents_and_pads_the_tail() -> None:
    m = masks.document(lengths=torch.tensor([[2, 3, 0], [1, 1, 1]]))
    assert m.q_ids.tolist() == [[0, 0, 1, 1, 1], [0, 1, 2, -1, -1]]
    assert masks.document(lengths=[3, 1]).q_ids.tolist() == [0, 0, 0, 1]


def test_document_keeps_pairs_of_one_document_and_nothing_for_padding() -> None:
    ids = torch.tensor([[0, 0, 1, -1]])
    keep = masks.document(ids).to_dense(4, 4, (1, 2))
    assert keep.shape == (1, 2, 4, 4)
    assert keep[0, 0].int().tolist() == [
        [1, 1, 0, 0],
        [1, 1, 0, 0],
        [0, 0, 1, 0],
        [0, 0, 0, 0],
    ]
    causal = (masks.document(ids) & masks.causal()).to_dense(4, 4, (1,))
    assert causal[0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]


def test_prefix_lm_sees_the_prefix_both_ways_and_is_causal_after_it() -> None:
    keep = masks.prefix_lm(2).to_dense(4, 4)
    assert keep.int().tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    per_batch = masks.prefix_lm(torch.tensor([0, 3])).to_dense(3, 3, (2, 1))
    assert per_batch[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert per_batch[1, 0].all()


def test_or_and_not_follow_boolean_algebra() -> None:
    g = torch.Generator().manual_seed(0)
    a = masks.keep(torch.rand(5, 6, generator=g) < 0.5)
    b = masks.window(1, 0)
    c = masks.key_padding(torch.rand(2, 6, generator=g) < 0.5)
    L, S, batch = 5, 6, (2, 3)

    def dense(m: masks.Mask) -> torch.Tensor:
        return m.to_dense(L, S, batch).expand(*batch, L, S)

    assert torch.equal(dense(a | b), dense(a) | dense(b))
    assert torch.equal(dense(~(a | b)), dense(~a) & dense(~b))  # De Morgan
    assert torch.equal(dense(~(b & c)), ~dense(b) | ~dense(c))
    assert torch.equal(dense(~~b), dense(b))
    assert (~~b) is b


@pytest.mark.parametrize(
    "make",
    [
        lambda: masks.bias(torch.zeros(3, 3)) | masks.causal(),
        lambda: masks.causal() | masks.bias(torch.zeros(3, 3)),
        lambda: ~masks.bias(torch.zeros(3, 3)),
        lambda: ~(masks.causal() & masks.bias(torch.zeros(3, 3))),
    ],
)
def test_a_bias_has_no_or_and_no_not(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match="bias"):
        make()


def test_or_with_a_tensor_names_the_constructors() -> None:
    with pytest.raises(TypeError, match=r"masks\.keep"):
        masks.causal() | torch.ones(3, 3, dtype=torch.bool)  # type: ignore[operator]


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: masks.document(), "exactly one"),
        (lambda: masks.document(torch.zeros(2, 3, 4, dtype=torch.long)), "shape"),
        (lambda: masks.document(torch.zeros(3)), "integer"),
        (lambda: masks.document(lengths=[2, -1]), ">= 0"),
        (lambda: masks.prefix_lm(-1), ">= 0"),
        (lambda: masks.prefix_lm(1.5), "int"),  # type: ignore[arg-type]
    ],
)
def test_bad_constructor_arguments_are_named(make, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises((TypeError, ValueError), match=match):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda: masks.keep(torch.ones(4, 4, dtype=torch.bool, device="meta")),
        lambda: masks.valid_lens(torch.ones(2, dtype=torch.long, device="meta")),
        lambda: masks.document(torch.zeros(2, 4, dtype=torch.long, device="meta")),
    ],
)
def test_a_mask_on_the_meta_device_is_refused_at_the_call(make) -> None:  # type: ignore[no-untyped-def]
    """Built on meta it describes shapes (``attnkit explain`` does that); a call with real
    tensors gets a clear error instead of torch's "Cannot copy out of meta tensor"."""
    q = torch.randn(2, 1, 4, 8)
    with pytest.raises(ValueError, match="meta device"):
        attnkit.attention(q, q, q, mask=make())


def test_the_meta_message_names_the_part_that_holds_it() -> None:
    q = torch.randn(2, 1, 4, 8)
    padding = masks.key_padding(torch.zeros(2, 4, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match=r"its key_padding part holds a tensor of shape \(2, 4\)"):
        attnkit.attention(q, q, q, mask=masks.causal() & padding)


@pytest.mark.parametrize("first", [2, torch.tensor(2)], ids=["int", "tensor"])
def test_prefix_lm_counts_the_prefix_in_global_key_positions(first: object) -> None:
    """With k_offset, key column c is position k_offset + c, as the causal part reads it
    and as shard() cuts the full mask; the prefix counted local columns before (every
    backend 1.14 off)."""
    full = masks.prefix_lm(3).to_dense(8, 8)  # (L, S)
    block = masks.prefix_lm(3, k_offset=first).to_dense(8, 6)  # type: ignore[arg-type]
    assert torch.equal(block, full[:, 2:])
    assert torch.equal(masks.prefix_lm(3).shard(0, 2, 8, 6, 8, 8).to_dense(8, 6), full[:, 2:])
    q = torch.randn(1, 2, 8, 16, dtype=torch.float64)
    k, v = torch.randn(2, 1, 2, 6, 16, dtype=torch.float64)
    want = attnkit.attention(q, k, v, mask=masks.keep(full[:, 2:]), backend="reference")
    for backend in ("reference", "chunked", "sdpa"):
        got = attnkit.attention(q, k, v, mask=masks.prefix_lm(3, k_offset=first),
                                backend=backend)  # type: ignore[arg-type]  # fmt: skip
        assert_close_to_scale(got, want, rel=FLOAT64_REL, what=backend)


def test_document_ids_must_cover_the_call() -> None:
    m = masks.document(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="5 positions"):
        m.validate((1,), 4, 4)


def test_document_lengths_that_miss_the_call_are_named_as_lengths() -> None:
    m = masks.document(lengths=[2, 3])
    with pytest.raises(ValueError, match=r"lengths add up to 5 positions.* 6 queries"):
        m.validate((1,), 6, 6)


def test_packed_documents_skip_the_keys_of_other_documents() -> None:
    """Block skipping: the keys a query block may see are its own documents' keys."""
    ids = torch.repeat_interleave(torch.arange(4), 16).unsqueeze(0)  # (1, 64): 4 docs of 16
    plan = build_plan(masks.document(ids) & masks.causal(), 64, 64, (1, 2), "cpu",
                      block_q=16, block_k=16)  # fmt: skip
    rows = plan.groups()
    assert rows[0][2:] == (0, 64, 0, 64)
    assert plan.key_range(0, 32, 48, 0, 64) == (32, 48)  # document 2, causal
    states = plan.tile_states()[0]
    assert (states.diagonal() == 1).all()  # PARTIAL on the diagonal (causal)
    off = ~torch.eye(4, dtype=torch.bool)
    assert (states[off] == 0).all()  # every other tile EMPTY


def test_or_plans_are_the_union_of_their_clauses() -> None:
    m = masks.window(0, 0) | masks.prefix_lm(3)
    plan = build_plan(m, 8, 8, (1,), "cpu", block_q=4, block_k=4)
    assert len(plan.clauses) == 3  # the diagonal, the causal part, the prefix
    b = torch.arange(1).view(1, 1, 1, 1)
    i = torch.arange(8).view(1, 1, 8, 1)
    j = torch.arange(8).view(1, 1, 1, 8)
    keep = plan.keep_fn()(b, b, i, j)[0, 0]
    assert torch.equal(keep, m.to_dense(8, 8, (1,))[0])
