"""Document ids in any order against the float64 oracle, on every CPU backend.

``masks.document(ids)`` keeps the keys of a query's own document, whatever the ids'
order: a document may come back after another (``[0, 1, 0, 1]``), hold padding inside
(``[3, 3, -1, 3]``), or have ids of any int64 size. sdpa's ragged path runs each
document on its own (gathering a document that is not one run), so every backend must
match the oracle: output, weights, lse and gradients, with and without a causal mask
and query lengths, on the host-read paths and under ``device_semantics`` (an
accelerator's paths: nothing read on the host).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import attnkit
from attnkit import masks
from attnkit._host import device_semantics
from attnkit._inputs import validate_inputs
from attnkit.backends import varlen

from cases import CPU_BACKENDS, assert_within_tolerance, np_of
from reference import oracle
from tolerance import FLOAT64_REL, assert_close_elementwise, assert_close_to_scale

BIG = 2**40
IDS = {
    "interleaved": [[0, 1, 0, 1, 2, 2, 0, 1, 2], [5, 5, 7, 5, 7, 7, 5, -1, 7]],
    "padding_inside": [[3, 3, 3, -1, 3, 3, 4, 4, 4], [-1, 0, 0, -1, -1, 0, 0, 1, -1]],
    "out_of_order": [[2, 2, 2, 0, 0, 1, 1, 1, 1], [9, 9, 4, 4, 4, 4, -1, -1, 0]],
    "huge_ids": [
        [BIG, BIG + 1, BIG, 2**62, 2**62, -(2**62), BIG + 1, 2**31, 2**31 + 2**32],
        [2**31 - 1, 2**31, 2**31, 2**31 - 1, -1, 0, 0, 2**33, 2**33],
    ],
}
"""Two rows (B = 2) of 9 positions each; no row is a sequence of runs in ascending order."""


def _mask(ids: torch.Tensor, extra: str) -> tuple[masks.Mask, tuple]:
    doc = masks.document(ids)
    spec: tuple = ("document", ids.numpy(), ids.numpy())
    if extra == "causal":
        return doc & masks.causal(), ("and", spec, ("causal", "top_left"))
    if extra == "query_lens":
        lens = torch.tensor([7, 4])
        return doc & masks.valid_lens(lens, queries=True), (
            "and", spec, ("valid_lens", lens.numpy(), True),
        )  # fmt: skip
    return doc, spec


def _qkv(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = ((2, 3, 9, 5), (2, 3, 9, 5), (2, 3, 9, 4))  # (B, H, N, E), Ev = 4
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]


@pytest.mark.pairwise
@pytest.mark.parametrize("strict", [False, True], ids=["host", "device_semantics"])
@pytest.mark.parametrize("extra", ["none", "causal", "query_lens"])
@pytest.mark.parametrize("family", sorted(IDS))
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_documents_in_any_order_match_the_oracle(
    backend: str, family: str, extra: str, strict: bool
) -> None:
    ids = torch.tensor(IDS[family])
    mask, spec = _mask(ids, extra)
    q, k, v = _qkv(seed=len(family))
    if backend == "sdpa" and not strict:
        assert varlen.can_unpad(validate_inputs(q, k, v, mask=mask))  # the ragged path
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    kw = {"mask": mask, "return_weights": True, "return_lse": True, "backend": backend}
    with device_semantics() if strict else contextlib.nullcontext():
        if attnkit.explain(*leaves, **kw).reasons[backend]:
            pytest.skip(f"{backend} declines this call here (its reason is tested elsewhere)")
        out, w, lse = attnkit.attention(*leaves, **kw)
    ref_out, ref_w, ref_lse = oracle(np_of(q), np_of(k), np_of(v), mask=spec)
    assert_close_to_scale(np_of(out), ref_out, rel=FLOAT64_REL, what="output")
    assert_close_to_scale(np_of(w), ref_w, rel=FLOAT64_REL, what="weights")
    np.testing.assert_array_equal(np.isneginf(np_of(lse)), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    assert_close_elementwise(np_of(lse)[fin], ref_lse[fin], rel=FLOAT64_REL, what="lse")
    # gradients of a random loss on the output against the reference backend (float64)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    grads = torch.autograd.grad(out, leaves, g)
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = attnkit.attention(*ref_leaves, mask=mask, backend="reference")
    for name, a, b in zip("qkv", grads, torch.autograd.grad(ref, ref_leaves, g), strict=True):
        assert_close_to_scale(a, b, rel=FLOAT64_REL, what=f"d{name}")


def test_a_spread_document_is_one_sequence_of_the_ragged_batch() -> None:
    """[0, 1, 0, 1, 2, 2]: document 0 at positions 0 and 2 is one gathered sequence (never
    two runs of their own), document 2 a contiguous run; -1 is no sequence at all."""
    ids = torch.tensor([[0, 1, 0, 1, 2, 2, -1]])
    q = torch.randn(1, 2, 7, 3)
    plan = validate_inputs(q, q, q, mask=masks.document(ids)).block_plan()
    layout = plan.ragged()
    assert layout is not None
    seqs, causal = layout
    assert not causal and len(seqs) == 3
    got = {}
    for sq in seqs:
        rows = (
            sq.query_idx.tolist()
            if sq.query_idx is not None
            else list(range(sq.q0, sq.q0 + sq.q_len))
        )
        keys = (
            sq.key_idx.tolist() if sq.key_idx is not None else list(range(sq.k0, sq.k0 + sq.k_len))
        )
        assert rows == keys
        got[tuple(rows)] = sq
    assert set(got) == {(0, 2), (1, 3), (4, 5)}


def test_ids_are_numbered_for_the_kernels_without_losing_a_document() -> None:
    """The lowering renumbers ids in order of value (int32 holds them): ids 2**31 apart,
    or 2**32 apart, stay different documents; order and padding are kept."""
    ids = torch.tensor([[2**31, 2**31 + 2**32, -5, 2**31, 7, 2**62]])
    q = torch.randn(1, 1, 6, 2)
    plan = validate_inputs(q, q, q, mask=masks.document(ids)).block_plan()
    doc = plan.clauses[0].docs[0]
    assert doc.q_ids is doc.k_ids
    assert doc.q_ids.tolist() == [[1, 2, -1, 1, 0, 3]]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_two_dim_inputs_with_documents_and_a_dense_mask(backend: str) -> None:
    """(L, E) inputs have no batch dim: a plan whose ids are per-batch tensors (B0 = 1)
    must not index one when it cuts a dense keep into tiles."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(12, 4, generator=g, dtype=torch.float64)
    k = torch.randn(9, 4, generator=g, dtype=torch.float64)
    v = torch.randn(9, 3, generator=g, dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2])
    key_ids = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    keep = torch.rand(12, 9, generator=g) < 0.7
    mask = masks.keep(keep) & masks.document(ids, key_ids=key_ids)
    out = attnkit.attention(q, k, v, mask=mask, backend=backend)
    spec = ("and", ("keep", keep.numpy()), ("document", ids.numpy(), key_ids.numpy()))
    ref, _, _ = oracle(np_of(q), np_of(k), np_of(v), mask=spec)
    assert_close_to_scale(np_of(out), ref, rel=FLOAT64_REL)


@pytest.mark.parametrize("score", ["scaled_dot", "gaussian"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_documents_in_any_order_in_half_precision(backend: str, dtype: torch.dtype,
                                                  score: str) -> None:  # fmt: skip
    """Half inputs with spread documents, within the suite's rule of the oracle (2x plain
    same-dtype math). The Gaussian score runs sdpa's ragged path upcast to float32.
    (Regression: its gathered rows came back in half into a float32 output: a dtype
    error from index_copy_.)"""
    ids = torch.tensor(IDS["interleaved"])
    q, k, v = (t.to(dtype) for t in _qkv(seed=11))
    kw = {"score": score, "mask": masks.document(ids), "return_lse": True}
    out, lse = attnkit.attention(q, k, v, backend=backend, **kw)
    plain_out, plain_lse = attnkit.attention(q, k, v, backend="reference", **kw)
    score_spec = ("gaussian", 1.0) if score == "gaussian" else ("scaled_dot",)
    ref_out, _, ref_lse = oracle(np_of(q), np_of(k), np_of(v), score=score_spec,
                                 mask=("document", ids.numpy(), ids.numpy()))  # fmt: skip
    assert_within_tolerance(np_of(out), ref_out, np_of(plain_out), "output")
    assert_within_tolerance(np_of(lse), ref_lse, np_of(plain_lse), "lse")
