"""The SDPA backend's unpadded path (valid_lens, key_padding, causal) and its
weights recomputed from the fused kernel's log-sum-exp."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks, scores
from attnkit.backends import varlen

from cases import qkv
from tolerance import FLOAT64_REL, assert_close_to_scale


def _qkv(B: int, H: int, Hk: int, L: int, S: int, E: int, Ev: int, seed: int):  # type: ignore[no-untyped-def]
    return qkv(B, H, L, S, E, Ev, Hk=Hk, seed=seed)


def _mask(name: str, B: int, L: int, S: int) -> masks.Mask:
    g = torch.Generator().manual_seed(len(name))
    lens = torch.randint(0, min(L, S) + 1, (B,), generator=g)
    lens[0] = min(L, S)
    lens[-1] = 0
    pad = torch.rand(B, S, generator=g) < 0.3
    pad[1, :3] = False  # one row whose padding is a suffix (sliced, not gathered)
    pad[1, 3:] = True
    table = {
        "lens": masks.valid_lens(lens),
        "lens_queries": masks.valid_lens(lens, queries=True),
        "key_padding": masks.key_padding(pad),
        "lens_and_padding": masks.valid_lens(lens) & masks.key_padding(pad),
        "causal_and_lens": masks.causal() & masks.valid_lens(lens, queries=True),
        "causal_and_lens_keys": masks.causal() & masks.valid_lens(lens),
    }
    return table[name]


NAMES = (
    "lens",
    "lens_queries",
    "key_padding",
    "lens_and_padding",
    "causal_and_lens",
    "causal_and_lens_keys",
)


@pytest.mark.parametrize("score_name", ["scaled_dot", "gaussian", "bilinear"])
@pytest.mark.parametrize("name", NAMES)
def test_unpadded_path_matches_reference(name: str, score_name: str) -> None:
    B, H, Hk, L, S, E, Ev = 5, 4, 2, 11, 13, 6, 5
    q, k, v = _qkv(B, H, Hk, L, S, E, Ev, seed=3)
    torch.manual_seed(0)
    score: scores.Score | str = scores.Bilinear(E, E) if score_name == "bilinear" else score_name
    if score_name == "gaussian":
        # a bandwidth at which the dot form keeps float32's precision (a narrower one is
        # formed from q - k on another backend: tests/conformance/test_gaussian_precision.py)
        score = scores.Gaussian(2.0)
    mask = _mask(name, B, L, S)
    assert attnkit.explain(q, k, v, score=score, mask=mask).chosen == "sdpa"
    leaves = [q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)]
    results = []
    for backend in ("sdpa", "reference"):
        for t in leaves:
            t.grad = None
        out, w = attnkit.attention(
            q, k, v, score=score, mask=mask, backend=backend, return_weights=True
        )
        with torch.no_grad():
            _, lse = attnkit.attention(
                q, k, v, score=score, mask=mask, backend=backend, return_lse=True
            )
        (out.square().sum() + (w * w.detach().flip(-1)).sum()).backward()
        results.append([out.detach(), w.detach(), lse] + [t.grad.clone() for t in leaves])  # type: ignore[union-attr]
    for what, a, b in zip(("out", "w", "lse", "dq", "dk", "dv"), *results, strict=True):
        assert torch.isfinite(a).all() or what == "lse", what
        assert_close_to_scale(a, b, what=what)


def test_grouping_minimizes_padded_work_plus_call_cost() -> None:
    q_len = [1000, 1000, 1000, 1000]
    k_len = [10, 11, 500, 900]
    groups = varlen.group_lengths([0, 1, 2, 3], q_len, k_len, head_work=512)
    assert sorted(b for g in groups for b in g) == [0, 1, 2, 3]
    assert [0, 1] in groups  # near-equal lengths share a call
    assert [3] in groups  # a long one does not pad the short ones
    assert varlen.group_lengths([], [], [], 64) == []


def test_three_dim_inputs_and_weights_from_lse() -> None:
    g = torch.Generator().manual_seed(4)
    q = torch.randn(3, 9, 4, generator=g)
    k = torch.randn(3, 12, 4, generator=g)
    v = torch.randn(3, 12, 7, generator=g)  # Ev > E: the lse kernel needs padding
    out, w, lse = attnkit.attention(q, k, v, return_weights=True, return_lse=True, backend="sdpa")
    ref = attnkit.attention(q, k, v, return_weights=True, return_lse=True, backend="reference")
    for a, b in zip((out, w, lse), ref, strict=True):
        assert_close_to_scale(a, b)


def test_lse_with_grad_stays_on_sdpa_with_its_backward_from_the_lse() -> None:
    """The fused kernel's lse has no autograd; sdpa's own backward from (out, lse) gives
    it one (the lse's gradient included), so the call stays on sdpa."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    mask = masks.valid_lens(torch.tensor([3, 0]), queries=True)
    assert attnkit.explain(q, q, q, return_lse=True, mask=mask).chosen == "sdpa"

    def fn(x: torch.Tensor, backend: str) -> torch.Tensor:
        out, lse = attnkit.attention(x, x, x, mask=mask, return_lse=True, backend=backend)
        return out.sum() + torch.where(torch.isfinite(lse), lse, 0.0).square().sum()

    got = torch.autograd.grad(fn(q, "sdpa"), q)[0]
    want = torch.autograd.grad(fn(q, "reference"), q)[0]
    assert_close_to_scale(got, want, rel=FLOAT64_REL)
    assert torch.autograd.gradcheck(lambda x: fn(x, "sdpa"), (q,))
    with pytest.raises(attnkit.BackendNotSupportedError, match="dropout"):
        attnkit.attention(q, q, q, return_lse=True, dropout_p=0.1, backend="sdpa")


def test_weights_with_dropout_are_the_weights_before_dropout() -> None:
    torch.manual_seed(5)
    q = torch.randn(2, 3, 6, 4)
    k = torch.randn(2, 3, 7, 4)
    out, w = attnkit.attention(q, k, k, dropout_p=0.5, return_weights=True, backend="sdpa")
    ref_w = attnkit.attention(q, k, k, return_weights=True, backend="reference")[1]
    assert_close_to_scale(w, ref_w)
    assert out.shape == (2, 3, 6, 4) and torch.isfinite(out).all()


@pytest.mark.torch_feature("compile")
def test_under_torch_compile_no_host_syncs() -> None:
    q = torch.randn(2, 2, 5, 4)
    mask = masks.key_padding(torch.tensor([[False] * 5, [False, False, False, True, True]]))

    def run(x: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(x, x, x, mask=mask)

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q), run(q), rtol=0, atol=0)


@pytest.mark.parametrize("Ev", [1, 3, 6])
def test_permuted_inputs_with_weights_and_lse(Ev: int) -> None:
    """Views with heads and positions swapped (as einsum layers produce) stay exact."""
    g = torch.Generator().manual_seed(13)
    q = torch.randn(2, 5, 3, 2, generator=g).transpose(1, 2)  # (B, H, L, E), not contiguous
    k = torch.randn(2, 7, 3, 2, generator=g).transpose(1, 2)
    v = torch.randn(2, 7, 3, Ev, generator=g).transpose(1, 2)
    keep = torch.rand(2, 1, 5, 7, generator=g) < 0.6
    keep[..., 0] = True
    mask = masks.keep(keep)
    with torch.no_grad():
        got = attnkit.attention(
            q, k, v, mask=mask, backend="sdpa", return_weights=True, return_lse=True
        )
        ref = attnkit.attention(
            q, k, v, mask=mask, backend="reference", return_weights=True, return_lse=True
        )
    for a, b in zip(got, ref, strict=True):
        assert_close_to_scale(a, b)


@pytest.mark.parametrize("want", ["out", "weights"])
def test_a_key_row_mask_of_shape_s(want: str) -> None:
    """A keep mask given as one (S,) row, broadcast over every query, batch and head."""
    g = torch.Generator().manual_seed(14)
    q = torch.randn(2, 3, 2, 5, 4, generator=g)  # 5-D: (B, X, H, L, E)
    k = torch.randn(2, 3, 2, 6, 4, generator=g)
    v = torch.randn(2, 3, 2, 6, 3, generator=g)
    keep = torch.tensor([True, False, True, True, False, False])
    kw = {"mask": masks.keep(keep), "return_weights": want == "weights"}
    got = attnkit.attention(q, k, v, backend="sdpa", **kw)
    ref = attnkit.attention(q, k, v, backend="reference", **kw)
    for a, b in zip(
        got if isinstance(got, tuple) else (got,),
        ref if isinstance(ref, tuple) else (ref,),
        strict=True,
    ):
        assert_close_to_scale(a, b)


@pytest.mark.parametrize(
    "mask",
    [
        masks.valid_lens([3, 0, 6, 5]),
        masks.valid_lens([3, 0, 6, 5], queries=True),
        masks.key_padding(
            torch.tensor([[False, True] * 4, [True] * 8, [False] * 8, [True, False] * 4])
        ),
    ],
    ids=["lens", "lens_queries", "key_padding"],
)
def test_unpadded_three_dim_grouped_query(mask: masks.Mask) -> None:
    """(H, L, E) inputs: the per-element dim of the unpadded path is the query head dim."""
    g = torch.Generator().manual_seed(15)
    q = torch.randn(4, 6, 4, generator=g)  # 4 query heads
    k = torch.randn(2, 8, 4, generator=g)  # 2 key heads
    v = torch.randn(2, 8, 3, generator=g)
    got = attnkit.attention(q, k, v, mask=mask, backend="sdpa", return_weights=True)
    ref = attnkit.attention(q, k, v, mask=mask, backend="reference", return_weights=True)
    for a, b in zip(got, ref, strict=True):
        assert_close_to_scale(a, b)


@pytest.mark.parametrize("return_weights", [False, True])
def test_unpadded_every_element_masked_gives_zero_gradients(return_weights: bool) -> None:
    q, k, v = (t.requires_grad_(True) for t in _qkv(2, 4, 2, 5, 7, 4, 3, seed=16))
    mask = masks.valid_lens([0, 0])
    res = attnkit.attention(q, k, v, mask=mask, backend="sdpa", return_weights=return_weights)
    out = res[0] if return_weights else res
    assert not out.any()
    out.sum().backward()  # connected to the inputs, like every other fully masked row
    for t in (q, k, v):
        assert t.grad is not None and not t.grad.any()


@pytest.mark.parametrize("mask", [None, masks.causal(), masks.valid_lens([0, 0, 0])])
def test_empty_batch_with_weights_does_not_crash(mask: masks.Mask | None) -> None:
    """A zero-sized head dim: the lse kernel would divide by zero and kill the process."""
    q = torch.randn(3, 0, 5, 4)
    k = torch.randn(3, 0, 6, 4)
    out, w, lse = attnkit.attention(
        q, k, k, mask=mask, backend="sdpa", return_weights=True, return_lse=True
    )
    assert out.shape == (3, 0, 5, 4) and w.shape == (3, 0, 5, 6) and lse.shape == (3, 0, 5)
