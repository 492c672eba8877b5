"""Context-parallel layouts, block skipping and strategy choice, on one process."""

from __future__ import annotations

import pytest
import torch

from attnkit import distributed as cp
from attnkit import masks
from attnkit.distributed.blocks import block_is_empty, slice_mask_heads
from attnkit.scores import Additive


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize(("n", "world"), [(16, 4), (13, 4), (7, 2), (3, 4), (0, 2)])
def test_shard_then_assemble_is_the_identity(layout: str, n: int, world: int) -> None:
    x = torch.arange(2 * n, dtype=torch.float64).reshape(2, n, 1)  # (B, N, 1)
    shards = [cp.shard(x, rank=r, world_size=world, layout=layout, dim=1) for r in range(world)]  # type: ignore[arg-type]
    assert [s.shape[1] for s in shards] == cp.shard_lengths(n, world, layout)  # type: ignore[arg-type]
    assert max(cp.shard_lengths(n, world, layout)) - min(cp.shard_lengths(n, world, layout)) <= 2  # type: ignore[arg-type]
    torch.testing.assert_close(cp.assemble(shards, layout=layout, dim=1), x, rtol=0, atol=0)  # type: ignore[arg-type]


def test_zigzag_holds_chunk_r_and_its_mirror() -> None:
    assert cp.segments(16, 4, "zigzag") == [
        [(0, 2), (14, 2)],
        [(2, 2), (12, 2)],
        [(4, 2), (10, 2)],
        [(6, 2), (8, 2)],
    ]
    assert cp.segments(10, 3, "contiguous") == [[(0, 4)], [(4, 3)], [(7, 3)]]


def test_assemble_refuses_shards_off_the_layout() -> None:
    with pytest.raises(ValueError, match="rank 0's shard has 3 positions"):
        cp.assemble([torch.zeros(3, 1), torch.zeros(5, 1)], layout="contiguous")
    with pytest.raises(ValueError, match="layout: expected 'zigzag' or 'contiguous'"):
        cp.segments(8, 2, "striped")  # type: ignore[arg-type]


def test_causal_blocks_are_skipped_and_kv_stops_travelling() -> None:
    q = torch.zeros(1, 4, 4, 8)  # a shard: (B, H, N/P, E)
    contiguous = cp.explain_context_parallel(
        q, q, q, world_size=4, mask=masks.causal(), layout="contiguous", strategy="ring"
    )
    assert contiguous.ring_blocks == [1, 2, 3, 4]  # rank r sees keys of ranks 0..r
    assert contiguous.ring_hops == [3, 2, 1, 0]  # the last rank's K/V never leaves it
    zigzag = cp.explain_context_parallel(
        q, q, q, world_size=4, mask=masks.causal(), layout="zigzag", strategy="ring"
    )
    assert zigzag.ring_blocks_total == 16
    assert len(set(zigzag.ring_blocks)) == 1  # balanced: every rank computes as many blocks
    no_mask = cp.explain_context_parallel(q, q, q, world_size=4, strategy="ring")
    assert no_mask.ring_blocks == [16] * 4 and no_mask.ring_hops == [3] * 4


@pytest.mark.parametrize("combine", ["or", "and"])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_blocks_of_a_mask_whose_tensors_do_not_name_the_call_dims(
    layout: str, combine: str
) -> None:
    """A per-head dense mask (H, 1, S) or'ed with per-batch lengths (B,): neither tensor
    tells the call's leading dims (B, H), so the planner takes them from q and k (it once
    guessed them from the first tensor and failed to broadcast). Every block the plan keeps
    holds a pair the dense mask keeps, and every skipped block holds none (``and`` skips
    some)."""
    B, H, N, world = 2, 4, 17, 4
    g = torch.Generator().manual_seed(3)
    heads = torch.rand(H, 1, N, generator=g) < 0.3  # (H, 1, S): 1 = masked
    lens = masks.valid_lens(torch.tensor([6, 5]), queries=True)
    mask = masks.tf(heads) | lens if combine == "or" else masks.tf(heads) & lens
    dense = mask.to_dense(N, N, (B, H)).any(dim=(0, 1))  # (L, S): kept by some row
    q = torch.zeros(B, H, cp.shard_lengths(N, world, layout)[0], 3)  # rank 0's shard
    ex = cp.explain_context_parallel(q, q, q, world_size=world, seq_len=N, kv_seq_len=N,
                                     mask=mask, layout=layout, strategy="ring")  # fmt: skip
    segs = cp.segments(N, world, layout)
    want = [
        sum(bool(dense[q0 : q0 + L, k0 : k0 + S].any())
            for q0, L in segs[r] for o in range(world) for k0, S in segs[o])
        for r in range(world)
    ]  # fmt: skip
    assert ex.ring_blocks == want


def test_explain_refuses_a_mask_of_other_lengths_in_one_line() -> None:
    q = torch.zeros(2, 4, 5, 3)  # a shard of 17 positions over 4 ranks, zigzag
    mask = masks.tf(torch.zeros(4, 1, 17, dtype=torch.bool))
    with pytest.raises(
        ValueError, match=r"mask: must describe the full sequence of 17 queries and 20 keys"
    ):
        cp.explain_context_parallel(q, q, q, world_size=4, seq_len=17, mask=mask)


def test_block_emptiness_reads_bands_and_cpu_lengths() -> None:
    # keys [8, 12) for queries [0, 4) under causal: empty; the reverse: full
    assert block_is_empty(masks.causal(), 0, 8, 4, 4, 16, 16)
    assert not block_is_empty(masks.causal(), 8, 0, 4, 4, 16, 16)
    # bottom_right with S > L shifts the diagonal right by S - L
    assert not block_is_empty(masks.causal("bottom_right"), 0, 8, 4, 4, 8, 16)
    assert block_is_empty(masks.window(1, 1), 0, 6, 4, 4, 16, 16)
    lens = masks.valid_lens(torch.tensor([5, 7]))
    assert block_is_empty(lens, 0, 8, 4, 4, 16, 16)
    assert not block_is_empty(lens, 0, 4, 4, 4, 16, 16)
    rows = masks.valid_lens(torch.tensor([3, 2]), queries=True)
    assert block_is_empty(rows, 4, 0, 4, 4, 16, 16)  # every query row past its length
    pad = torch.zeros(2, 16, dtype=torch.bool)
    pad[:, 12:] = True
    assert block_is_empty(masks.key_padding(pad), 0, 12, 4, 4, 16, 16)
    assert block_is_empty(masks.causal() & masks.key_padding(pad), 0, 4, 4, 4, 16, 16)
    # dense keep tensors held on the CPU are read too
    none_kept = torch.zeros(16, 16, dtype=torch.bool)
    assert block_is_empty(masks.keep(none_kept), 0, 0, 4, 4, 16, 16)
    one_kept = none_kept.clone()
    one_kept[2, 3] = True
    assert not block_is_empty(masks.keep(one_kept), 0, 0, 4, 4, 16, 16)
    assert block_is_empty(masks.keep(one_kept), 4, 0, 4, 4, 16, 16)


def test_strategy_choice_and_its_reasons() -> None:
    four = torch.zeros(2, 4, 8, 16)  # (B, H, L_r, E)
    chosen = cp.explain_context_parallel(four, four, four, world_size=2)
    assert chosen.chosen == "all_to_all" and "divide" in chosen.why
    three = torch.zeros(2, 3, 8, 16)
    fallback = cp.explain_context_parallel(three, three, three, world_size=2)
    assert fallback.chosen == "ring"
    assert fallback.reasons["all_to_all"] == [
        "3 query heads do not divide by 2 ranks",
        "3 key/value heads do not divide by 2 ranks",
    ]
    assert "all_to_all" in str(fallback)
    with pytest.raises(cp.ContextParallelError, match="'all_to_all' cannot run"):
        cp.explain_context_parallel(three, three, three, world_size=2, strategy="all_to_all")
    with pytest.raises(ValueError, match="world_size: expected an int >= 2, got 1"):
        cp.explain_context_parallel(four, four, four, world_size=1)


def test_a_mask_that_requires_grad_is_kept_off_the_ring() -> None:
    """The ring's backward gives a mask no gradient: a learnable bias goes to the head
    exchange, whose one attention call differentiates it, or is refused by name."""
    four, three = torch.zeros(1, 4, 4, 8), torch.zeros(1, 3, 4, 8)  # (B, H, L_r, E)
    learnt = masks.bias(torch.zeros(1, 1, 8, 8, requires_grad=True))
    ex = cp.explain_context_parallel(four, four, four, world_size=2, mask=learnt)
    assert ex.chosen == "all_to_all" and "the mask no gradient" in ex.reasons["ring"][0]
    with pytest.raises(cp.ContextParallelError, match=r"'ring' cannot run.*requires grad"):
        cp.explain_context_parallel(four, four, four, world_size=2, mask=learnt, strategy="ring")
    with pytest.raises(cp.ContextParallelError, match="neither strategy can run"):
        cp.explain_context_parallel(three, three, three, world_size=2, mask=learnt)
    with torch.no_grad():  # no graph, no gradient to give
        ex = cp.explain_context_parallel(three, three, three, world_size=2, mask=learnt)
    assert ex.chosen == "ring"


def test_explain_and_shard_name_their_bad_arguments() -> None:
    """A float tensor is a bias for explain as for the call; a length or a dim of the
    wrong kind is refused naming its own argument."""
    q = torch.zeros(1, 2, 4, 8)  # (B, H, L_r, E)
    ex = cp.explain_context_parallel(q, q, q, world_size=2, mask=torch.zeros(8, 8))
    assert ex.chosen == "all_to_all"
    with pytest.raises(ValueError, match=r"^seq_len: expected None or an int >= 0, got 10\.0"):
        cp.explain_context_parallel(q, q, q, world_size=2, seq_len=10.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^dim: expected an int in \[-4, 4\)"):
        cp.shard(q, rank=0, world_size=2, dim=7)
    # calls attention() refuses, and lengths no rank holds, were said to "can run"
    for k, v, words in (
        (torch.zeros(1, 2, 4, 5), q, "needs equal feature dims"),
        (q, torch.zeros(1, 2, 3, 8), "the same number of keys S"),
        (q, q.int(), "value: expected a floating-point tensor"),
    ):
        with pytest.raises((TypeError, ValueError), match=words):
            cp.explain_context_parallel(q, k, v, world_size=2)
    five = torch.zeros(1, 2, 4, 5)  # key features of an Additive score's own size
    explained = cp.explain_context_parallel(q, five, q, world_size=2, score=Additive(8, 5, 16))
    assert explained.chosen is not None
    with pytest.raises(ValueError, match=r"^query: 4 positions is no rank's shard of 5"):
        cp.explain_context_parallel(q, q, q, world_size=2, seq_len=5)
    # shards assembled without a group are checked as unshard checks them
    with pytest.raises(ValueError, match=r"rank 1's shard \(1, 2, 4, 9\) differs from rank 0's"):
        cp.assemble([q, torch.zeros(1, 2, 4, 9)])
    with pytest.raises(TypeError, match=r"shards: expected a list of tensors, one per rank"):
        cp.assemble(torch.zeros(2, 1, 2, 4, 8))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"shards: rank 0's shard is a int, not a tensor"):
        cp.assemble([1, 2])  # type: ignore[list-item]


def test_mask_heads_are_sliced_for_the_head_exchange() -> None:
    bias = torch.randn(2, 4, 5, 5)
    keep = torch.rand(1, 5, 5) > 0.5  # broadcast over heads: unchanged
    sliced = slice_mask_heads(masks.bias(bias) & masks.keep(keep), (2, 4), 2, 2)
    assert sliced is not None
    parts = sliced.parts()
    torch.testing.assert_close(parts[0].tensor, bias[:, 2:4], rtol=0, atol=0)  # type: ignore[attr-defined]
    assert parts[1].tensor is keep  # type: ignore[attr-defined]
    lens = slice_mask_heads(masks.valid_lens(torch.tensor([1, 2, 3, 4])), (4,), 2, 2)
    assert lens is not None and lens.lens.tolist() == [3, 4]  # type: ignore[attr-defined]
    # one row of document ids broadcast over the heads (3-D input, heads the batch dim):
    # every rank keeps it, where ranks past the first got 0 rows (and the exchange hung)
    ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2]])  # (1, N)
    doc = slice_mask_heads(masks.document(ids), (4,), 2, 2)
    assert doc is not None
    torch.testing.assert_close(doc.tensors()[0], ids, rtol=0, atol=0)


def test_calls_outside_a_process_group_are_refused() -> None:
    x = torch.zeros(1, 2, 4, 3)
    with pytest.raises(ValueError, match=r"torch\.distributed is not initialized"):
        cp.context_parallel_attention(x, x, x)
    with pytest.raises(ValueError, match="pass rank= and world_size="):
        cp.shard(x)
    with pytest.raises(ValueError, match=r"^unshard: torch\.distributed is not initialized"):
        cp.unshard(x)
    with pytest.raises(ValueError, match=r"^all_reduce_grads: torch\.distributed is not"):
        cp.all_reduce_grads(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"module: expected a torch\.nn\.Module, got int"):
        cp.all_reduce_grads(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"layer must be an attnkit\.nn\.SelfAttention"):
        cp.ContextParallel(torch.nn.Linear(2, 2))


def test_a_far_bias_row_is_kept_off_the_ring() -> None:
    """A row whose kept bias is all -1e30: each key block's lse rounds to -1e30 in
    float32, so the ring's merge weighed unequal blocks equally (and its backward took
    the weights from that lse); the all-to-all runs one call over the full row. A bias
    with -1e30 beside ordinary values in every row is fine on the ring."""
    four = torch.randn(1, 4, 3, 8)  # (B, H, L_r, E): 4 heads over 2 ranks
    far = torch.zeros(6, 6)
    far[2] = -1e30
    ex = cp.explain_context_parallel(four, four, four, world_size=2, mask=masks.bias(far))
    assert ex.chosen == "all_to_all"
    assert "lies beyond ±64 for every key it keeps" in " ".join(ex.reasons["ring"])
    with pytest.raises(cp.ContextParallelError, match=r"strategy: 'ring' cannot run .* beyond ±64"):
        cp.explain_context_parallel(
            four, four, four, world_size=2, mask=masks.bias(far), strategy="ring"
        )
    padding = torch.zeros(6, 6)
    padding[:, 4:] = -1e30  # every row keeps ordinary keys too
    ex = cp.explain_context_parallel(
        four, four, four, world_size=2, mask=masks.bias(padding), strategy="ring"
    )
    assert ex.chosen == "ring"


def test_the_ring_s_far_row_limit_follows_the_dtype() -> None:
    """float64 keeps an lse of -100 (or -1e9) to its log-sum: the ring runs such rows
    there (it refused them in float64 too, and a row at -100 in float32 as well, whose
    lse float32 keeps to 7e-7)."""
    one = torch.randn(1, 1, 3, 8)  # (B, H, L_r, E): one head, so no all-to-all
    for value, dtype in ((-100.0, torch.float64), (-1e9, torch.float64), (-60.0, torch.float32)):
        row = torch.zeros(6, 6, dtype=dtype)
        row[2] = value
        x = one.to(dtype)
        ex = cp.explain_context_parallel(x, x, x, world_size=2, mask=masks.bias(row))
        assert ex.chosen == "ring", (value, dtype)
    row = torch.zeros(6, 6, dtype=torch.float64)
    row[2] = -1e12
    x = one.double()
    with pytest.raises(cp.ContextParallelError, match=r"beyond ±3\.44e\+10 .* float64"):
        cp.explain_context_parallel(x, x, x, world_size=2, mask=masks.bias(row))
