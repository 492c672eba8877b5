"""Packed sequences (``masks.document``) as a ragged batch: sdpa runs each document on
its own (the unpadded path), chunked skips other documents' tiles; both against the
reference backend, forward (with weights and lse) and gradients."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit._inputs import validate_inputs
from attnkit.backends import varlen

from tolerance import FLOAT64_REL, assert_close_to_scale


def _packed(causal: bool):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(11)
    ids = torch.tensor([[0, 0, 0, 0, 1, 1, 2, 2, 2, -1, -1], [3] * 5 + [4] * 6])
    q, k = (torch.randn(2, 3, 11, 6, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, 11, 4, generator=g, dtype=torch.float64)
    mask = masks.document(ids) & masks.causal() if causal else masks.document(ids)
    return q, k, v, mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
def test_packed_documents_match_the_reference(backend: str, causal: bool) -> None:
    q, k, v, mask = _packed(causal)
    if backend == "sdpa":
        assert varlen.can_unpad(validate_inputs(q, k, v, mask=mask))  # the ragged path
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, w = attnkit.attention(*leaves, mask=mask, return_weights=True, backend=backend)
    ref, ref_w = attnkit.attention(*ref_leaves, mask=mask, return_weights=True,
                                   backend="reference")  # fmt: skip
    assert_close_to_scale(out, ref, rel=FLOAT64_REL)
    assert_close_to_scale(w, ref_w, rel=FLOAT64_REL)
    assert (out[0, :, 9:] == 0).all()  # padding rows keep nothing
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, g)
    ref_grads = torch.autograd.grad(ref, ref_leaves, g)
    for a, b in zip(grads, ref_grads, strict=True):
        assert_close_to_scale(a, b, rel=FLOAT64_REL)
    with torch.no_grad():
        _, lse = attnkit.attention(q, k, v, mask=mask, return_lse=True, backend=backend)
        _, ref_lse = attnkit.attention(q, k, v, mask=mask, return_lse=True, backend="reference")
    assert_close_to_scale(lse, ref_lse, rel=FLOAT64_REL)


def test_automatic_dispatch_keeps_a_packed_causal_batch_on_sdpa() -> None:
    q, k, v, mask = _packed(True)
    assert attnkit.explain(q.float(), k.float(), v.float(), mask=mask).chosen == "sdpa"
