"""The chunked backend: tiles that do not divide L or S, block skipping for every
structured mask, gradients to score parameters, fully masked rows, determinism,
weights from the lse, and the fused additive kernel against its fallback."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks, scores
from attnkit.backends import chunked
from attnkit.kernels import additive

from cases import qkv, structured_masks
from tolerance import (
    BFLOAT16_REL,
    FLOAT32_CALL_REL,
    FLOAT32_ULPS_REL,
    FLOAT64_REL,
    assert_close_elementwise,
    assert_close_to_scale,
    exp_rel,
)

# (block_q, block_k): dividing nothing, a single row/column, larger than the sequence.
BLOCKS = ((3, 5), (1, 7), (16, 4), (64, 64))


def _qkv(B: int, H: int, L: int, S: int, E: int, Ev: int, seed: int):  # type: ignore[no-untyped-def]
    return qkv(B, H, L, S, E, Ev, seed=seed, dtype=torch.float64)


_masks = structured_masks
MASK_NAMES = tuple(structured_masks(2, 4, 4))


def _reference(q, k, v, **kw):  # type: ignore[no-untyped-def]
    return attnkit.attention(
        q, k, v, backend="reference", return_lse=True, return_weights=True, **kw
    )


@pytest.mark.pairwise
@pytest.mark.parametrize("LS", [(13, 11), (11, 13), (17, 17), (1, 9)])
@pytest.mark.parametrize("mask_name", MASK_NAMES)
def test_structured_masks_skip_blocks_exactly(mask_name: str, LS: tuple[int, int]) -> None:
    L, S = LS
    q, k, v = _qkv(3, 2, L, S, 5, 3, seed=L * 31 + S)
    mask = _masks(3, L, S)[mask_name]
    ref_out, ref_w, ref_lse = _reference(q, k, v, mask=mask)
    for bq, bk in BLOCKS:
        with chunked.block_sizes(bq, bk):
            out, w, lse = attnkit.attention(
                q, k, v, mask=mask, backend="chunked", return_weights=True, return_lse=True
            )
        assert_close_to_scale(out, ref_out, rel=FLOAT64_REL, what="output")
        assert_close_to_scale(w, ref_w, rel=FLOAT64_REL, what="weights")
        assert_close_to_scale(lse, ref_lse, rel=FLOAT64_REL, what="lse")


@pytest.mark.parametrize("score_name", ["bilinear", "gaussian", "additive"])
def test_gradients_reach_score_parameters(score_name: str) -> None:
    torch.manual_seed(0)
    E = 6
    score: scores.Score
    if score_name == "bilinear":
        score = scores.Bilinear(E, E, dtype=torch.float64)
    elif score_name == "gaussian":
        score = scores.Gaussian(1.5, learnable=True).double()
    else:
        score = scores.Additive(E, E, 7, dtype=torch.float64)
    q, k, v = _qkv(2, 2, 9, 10, E, 4, seed=3)
    q.requires_grad_(True)
    mask = masks.causal("bottom_right") & masks.valid_lens([10, 6])
    leaves = [q, k.requires_grad_(True), v.requires_grad_(True), *score.parameters()]

    def grads(backend: str) -> list[torch.Tensor]:
        for t in leaves:
            t.grad = None
        with chunked.block_sizes(4, 3):
            out, w, lse = attnkit.attention(
                q, k, v, score=score, mask=mask, backend=backend,
                return_weights=True, return_lse=True,
            )  # fmt: skip
        g = torch.Generator().manual_seed(1)
        loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum()
        loss = loss + (w * torch.randn(w.shape, generator=g, dtype=w.dtype)).sum()
        loss = loss + torch.where(torch.isfinite(lse), lse, 0).sum()
        loss.backward()
        return [t.grad.clone() for t in leaves if t.grad is not None]

    got, ref = grads("chunked"), grads("reference")
    assert len(got) == len(ref) == len(leaves)
    for a, b in zip(got, ref, strict=True):
        assert_close_to_scale(a, b, rel=FLOAT64_REL)


@pytest.mark.parametrize("score_name", ["scaled_dot", "additive"])
def test_fully_masked_rows_zero_output_and_gradients(score_name: str) -> None:
    torch.manual_seed(1)
    score: scores.Score | str = scores.Additive(4, 4, 5) if score_name == "additive" else score_name
    q, k, v = (t.float().requires_grad_(True) for t in _qkv(2, 3, 7, 5, 4, 3, seed=4))
    mask = masks.valid_lens([0, 3], queries=True) & masks.window(1, 0, "bottom_right")
    with chunked.block_sizes(2, 2):
        out, lse = attnkit.attention(
            q, k, v, score=score, mask=mask, backend="chunked", return_lse=True
        )
    assert not out[0].any() and torch.isneginf(lse[0]).all()
    assert not out[1, :, 3:].any() and torch.isneginf(lse[1, :, 3:]).all()
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()
    assert q.grad is not None and not q.grad[0].any() and not q.grad[1, :, 3:].any()


def test_two_identical_calls_are_bitwise_equal() -> None:
    q, k, v = (t.float().requires_grad_(True) for t in _qkv(2, 2, 37, 41, 8, 8, seed=6))
    score = scores.Additive(8, 8, 16)
    mask = masks.window(9, 2) & masks.key_padding(torch.rand(2, 41) < 0.2)
    results = []
    for _ in range(2):
        for t in (q, k, v):
            t.grad = None
        with chunked.block_sizes(8, 16):
            out = attnkit.attention(q, k, v, score=score, mask=mask, backend="chunked")
        out.square().sum().backward()
        results.append([out.detach().clone()] + [t.grad.clone() for t in (q, k, v)])  # type: ignore[union-attr]
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_float32_additive_matches_reference_with_the_fused_kernel() -> None:
    torch.manual_seed(2)
    score = scores.Additive(16, 12, 24)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(3, 33, 16, generator=g, requires_grad=True)
    k = torch.randn(3, 29, 12, generator=g, requires_grad=True)
    v = torch.randn(3, 29, 5, generator=g, requires_grad=True)
    mask = masks.valid_lens([29, 11, 1])
    outs = []
    for backend in ("chunked", "reference"):
        for t in (q, k, v, *score.parameters()):
            t.grad = None
        out = attnkit.attention(q, k, v, score=score, mask=mask, backend=backend)
        out.square().sum().backward()
        outs.append([out.detach()] + [t.grad.clone() for t in (q, k, v, *score.parameters())])  # type: ignore[union-attr]
    for a, b in zip(*outs, strict=True):
        assert_close_to_scale(a, b)


def test_fused_kernel_agrees_with_the_torch_fallback() -> None:
    g = torch.Generator().manual_seed(8)
    qh = torch.randn(2, 13, 21, generator=g) * 3  # hidden not a multiple of 8: scalar tail
    kh = torch.randn(2, 17, 21, generator=g) * 3
    w = torch.randn(21, generator=g)
    up = torch.randn(2, 13, 17, generator=g)
    ref = additive.logits_torch(qh.double(), kh.double(), w.double())
    assert_close_to_scale(additive.logits(qh, kh, w).double(), ref)
    for got, want in zip(
        additive.grads(qh, kh, w, up),
        additive.grads_torch(qh.double(), kh.double(), w.double(), up.double()),
        strict=True,
    ):
        assert_close_to_scale(got.double(), want)
    assert isinstance(additive.status(), str) and additive.status()


def test_describe_says_how_additive_tiles_run() -> None:
    q = torch.randn(2, 5, 4)
    inputs = attnkit._inputs.validate_inputs(q, q, q, score=scores.Additive(4, 4, 8))
    note = chunked.ChunkedBackend().describe(inputs)
    assert note.startswith("additive tiles: ")
    assert ("compiled C kernel" in note) or ("pure torch" in note)
    ex = attnkit.explain(q, q, q, score=scores.Additive(4, 4, 8))
    assert ex.chosen == "chunked" and ex.note == note and note in str(ex)


def test_dropout_and_unknown_scores_are_declined_with_reasons() -> None:
    q = torch.randn(2, 5, 4)
    ex = attnkit.explain(q, q, q, dropout_p=0.1, backend="chunked")
    assert any("dropout" in r for r in ex.reasons["chunked"])

    class Cosine(scores.Score):
        name = "cosine"

        def logits(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            a = torch.nn.functional.normalize(a, dim=-1)
            return a @ torch.nn.functional.normalize(b, dim=-1).transpose(-2, -1)

    ex = attnkit.explain(q, q, q, score=Cosine())
    assert any("no tiled form" in r for r in ex.reasons["chunked"])
    assert ex.chosen == "reference"


def test_dispatch_prefers_chunked_for_band_masks_and_sdpa_for_dense() -> None:
    q = torch.randn(2, 2, 8, 4)
    assert attnkit.explain(q, q, q).chosen == "sdpa"
    assert attnkit.explain(q, q, q, mask=masks.causal()).chosen == "sdpa"
    assert attnkit.explain(q, q, q, mask=masks.valid_lens([3, 8])).chosen == "sdpa"
    ex = attnkit.explain(q, q, q, mask=masks.window(2, 0))
    assert ex.chosen == "chunked"
    assert any("window" in r for r in ex.reasons["sdpa"])
    assert (
        attnkit.explain(q, q[..., :5, :], q[..., :5, :], mask=masks.causal("bottom_right")).chosen
        == "chunked"
    )
    assert attnkit.explain(q, q, q, score=scores.Additive(4, 4, 3)).chosen == "chunked"
    # forced, sdpa still runs a window mask (densely): preferences bind only the automatic choice
    out = attnkit.attention(q, q, q, mask=masks.window(2, 0), backend="sdpa")
    ref = attnkit.attention(q, q, q, mask=masks.window(2, 0), backend="reference")
    assert_close_to_scale(out, ref, rel=FLOAT32_CALL_REL)


def test_block_sizes_restores_and_validates() -> None:
    before = (chunked.BLOCK_Q, chunked.BLOCK_K)
    with pytest.raises(RuntimeError):
        with chunked.block_sizes(3, 5):
            assert (chunked.BLOCK_Q, chunked.BLOCK_K) == (3, 5)
            raise RuntimeError("inside")
    assert (chunked.BLOCK_Q, chunked.BLOCK_K) == before
    with pytest.raises(ValueError, match="positive"):
        with chunked.block_sizes(0, 5):
            pass


def test_half_inputs_accumulate_in_float32() -> None:
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(2, 2, 19, 23, 8, 4, seed=9))
    mask = masks.window(5, 5) & masks.valid_lens([23, 7])
    with chunked.block_sizes(4, 8):
        out, w, lse = attnkit.attention(
            q, k, v, mask=mask, backend="chunked", return_weights=True, return_lse=True
        )
    assert out.dtype == torch.bfloat16 and w.dtype == lse.dtype == torch.float32
    ref_out, ref_w, ref_lse = attnkit.attention(
        q.float(), k.float(), v.float(), mask=mask, backend="reference",
        return_weights=True, return_lse=True,
    )  # fmt: skip
    assert_close_to_scale(w, ref_w)
    assert_close_to_scale(lse, ref_lse)
    assert_close_to_scale(out, ref_out, rel=BFLOAT16_REL)


def _head_mean(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> torch.Tensor:
    """Head-averaged weights, computed tile by tile by the chunked backend."""
    _, w = attnkit.attention(q, k, v, return_weights="mean", backend="chunked", **kw)  # type: ignore[arg-type]
    return w


@pytest.mark.parametrize("mask_name", ["causal_br", "valid_lens_queries", "key_padding"])
def test_head_averaged_weights_match_the_mean_of_per_head_weights(mask_name: str) -> None:
    q, k, v = _qkv(3, 4, 9, 12, 5, 2, seed=10)
    mask = _masks(3, 9, 12)[mask_name]
    with chunked.block_sizes(4, 5):
        avg = _head_mean(q, k, v, mask=mask)
    _, w = attnkit.attention(q, k, v, mask=mask, return_weights=True, backend="reference")
    assert avg.shape == (3, 9, 12)
    assert_close_to_scale(avg, w.mean(dim=1), rel=FLOAT64_REL)
    with pytest.raises(ValueError, match="head dim"):
        _head_mean(q[0, 0], k[0, 0], v[0, 0])


@pytest.mark.parametrize("score_name", ["scaled_dot", "gaussian"])
@pytest.mark.parametrize(
    "mask",
    [
        masks.window(40, 0),
        masks.window(20, 9, "bottom_right"),
        masks.causal() & masks.window(30, None),
        masks.window(16, 16) & masks.valid_lens([200, 130], queries=True),
    ],
    ids=["window", "window_br", "causal_and_window", "window_and_lens"],
)
def test_batched_band_blocks_match_reference(score_name: str, mask: masks.Mask) -> None:
    """Interior blocks of a band run many query blocks per batched product; edges do not."""
    q, k, v = _qkv(2, 2, 200, 230, 8, 5, seed=11)
    k, v = k[:, :1], v[:, :1]  # grouped-query attention: 2 query heads, 1 key head
    q.requires_grad_(True)
    grads = []
    for backend in ("chunked", "reference"):
        q.grad = None
        with chunked.block_sizes(32, 64):
            out, lse = attnkit.attention(
                q, k, v, score=score_name, mask=mask, backend=backend, return_lse=True
            )
        out.square().sum().backward()
        assert q.grad is not None
        grads.append((out.detach(), lse, q.grad.clone()))
    for a, b in zip(*grads, strict=True):
        assert_close_to_scale(a, b, rel=FLOAT64_REL)


def test_exp_rows_kernel_and_torch_fallback_agree() -> None:
    from attnkit.kernels.softmax import exp_rows_

    g = torch.Generator().manual_seed(12)
    s = torch.randn(3, 7, 37, generator=g) * 20  # 37 columns: a vector body and a scalar tail
    s[0, 1] = float("-inf")  # a fully blocked row
    s[1, :, ::3] = float("-inf")
    shift = torch.where(s.amax(-1).isfinite(), s.amax(-1), 0)
    arg = s.double() - shift.double().unsqueeze(-1)
    ref = arg.exp()
    rel = exp_rel(float(arg[arg.isfinite()].abs().max()))  # float32 arguments
    fast = s.clone()
    sums = exp_rows_(fast, shift, want_sum=True)
    slow = s.clone().transpose(0, 1)  # not contiguous: the torch path
    slow_sums = exp_rows_(slow, shift.transpose(0, 1), want_sum=True)
    assert sums is not None and slow_sums is not None
    for got, got_sum in ((fast, sums), (slow.transpose(0, 1), slow_sums.transpose(0, 1))):
        assert_close_elementwise(got, ref, rel=rel)
        assert_close_elementwise(got_sum, ref.sum(-1), rel=rel)
        assert not got[0, 1].any()


@pytest.mark.slow
def test_without_a_compiler_the_status_says_pure_torch() -> None:
    import os
    import subprocess
    import sys

    code = (
        "from attnkit.kernels import additive; import torch, attnkit;"
        "q = torch.randn(2, 5, 4);"
        "s = attnkit.scores.Additive(4, 4, 3);"
        "out = attnkit.attention(q, q, q, score=s, backend='chunked');"
        "print(additive.status())"
    )
    env = {**os.environ, "ATTNKIT_NO_COMPILE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert "pure torch" in proc.stdout and "ATTNKIT_NO_COMPILE" in proc.stdout


@pytest.mark.parametrize("score_name", ["scaled_dot", "additive"])
def test_nan_inputs_give_nan_not_zeros(score_name: str) -> None:
    """The vectorized exp and tanh propagate NaN like torch does; a bad input is not hidden."""
    torch.manual_seed(3)
    score: scores.Score | str = (
        scores.Additive(4, 4, 16) if score_name == "additive" else score_name
    )
    q, k, v = (t.float() for t in _qkv(1, 2, 5, 16, 4, 3, seed=13))  # 16: no scalar tail
    q[0, 0, 1, 2] = float("nan")
    with torch.no_grad():
        out = attnkit.attention(q, k, v, score=score, backend="chunked")
        ref = attnkit.attention(q, k, v, score=score, backend="reference")
    assert torch.isnan(ref[0, 0, 1]).all() and torch.isnan(out[0, 0, 1]).all()
    assert_close_to_scale(out[0, 1], ref[0, 1])


@pytest.mark.parametrize(
    "mask",
    [
        masks.valid_lens([3, 0, 7, 5]),
        masks.key_padding(torch.arange(7) >= torch.arange(4)[:, None]),
    ],
    ids=["lens", "key_padding"],
)
def test_head_averaged_weights_of_three_dim_inputs_with_per_batch_masks(mask: masks.Mask) -> None:
    """(H, L, E) inputs: the first (batch) dim of the mask is the head dim being averaged."""
    q, k, v = (t[0] for t in _qkv(1, 4, 6, 7, 4, 3, seed=14))
    avg = _head_mean(q, k, v, mask=mask)
    _, w = attnkit.attention(q, k, v, mask=mask, return_weights=True, backend="reference")
    assert avg.shape == (6, 7)
    assert_close_to_scale(avg, w.mean(dim=0), rel=FLOAT64_REL)


@pytest.mark.parametrize("shape", [(2, 0, 5, 7), (2, 3, 0, 7), (2, 3, 5, 0)])
def test_head_averaged_weights_of_empty_shapes(shape: tuple[int, int, int, int]) -> None:
    B, H, L, S = shape
    q, k = torch.randn(B, H, L, 4), torch.randn(B, H, S, 4)
    mask = masks.key_padding(torch.zeros(B, S, dtype=torch.bool))
    avg = _head_mean(q, k, k, mask=mask)
    assert avg.shape == (B, L, S) and not avg.any()


def test_native_kernels_never_read_past_mismatched_operands() -> None:
    """Raw-pointer kernels take only float32 operands of agreeing sizes; others go to torch."""
    from attnkit.kernels.softmax import exp_rows_

    g = torch.Generator().manual_seed(15)
    s = torch.randn(3, 4, 9, generator=g)
    shift = torch.randn(1, 4, generator=g)  # broadcast over the 3 leading rows
    ref = (s - shift.unsqueeze(-1)).exp()
    sums = exp_rows_(s, shift, want_sum=True)
    assert sums is not None
    assert_close_elementwise(s, ref, rel=FLOAT32_ULPS_REL)
    assert_close_elementwise(sums, ref.sum(-1), rel=FLOAT32_ULPS_REL)
    qh, kh = torch.randn(2, 3, 5, generator=g), torch.randn(2, 4, 5, generator=g)
    w64 = torch.randn(5, generator=g, dtype=torch.float64)
    with pytest.raises(RuntimeError):  # mixed dtypes: torch refuses, no reinterpretation
        additive.logits(qh, kh, w64)
    with pytest.raises(RuntimeError):  # a w of the wrong length: torch refuses, no over-read
        additive.logits(qh, kh, torch.randn(3, generator=g))


@pytest.mark.parametrize(
    "score_name, mask_name",
    [("scaled_dot", "causal_br"), ("gaussian", "key_padding"), ("additive", "valid_lens_queries")],
)
def test_double_backward_equals_the_reference(score_name: str, mask_name: str) -> None:
    """Tiles are exponentiated in place, out of autograd's sight; with create_graph=True the
    backward recomputes the call with differentiable operations, so second derivatives are
    exact (they used to be refused)."""
    q, k, v = (t.double().requires_grad_(True) for t in _qkv(3, 2, 9, 12, 5, 3, seed=16))
    mask = _masks(3, 9, 12)[mask_name]
    score = scores.Additive(5, 5, 4).double() if score_name == "additive" else score_name

    def second(backend: str) -> tuple[torch.Tensor, ...]:
        out = attnkit.attention(q, k, v, score=score, mask=mask, backend=backend)
        dq, dk = torch.autograd.grad(out.sin().sum(), (q, k), create_graph=True)
        return torch.autograd.grad((dq.square().sum() + dk.cos().sum()), (q, k, v))

    with chunked.block_sizes(4, 5):
        got = second("chunked")
    for g, r in zip(got, second("reference"), strict=True):
        assert_close_to_scale(g, r, rel=FLOAT64_REL)


def test_double_backward_passes_gradgradcheck() -> None:
    q, k, v = (t.double().requires_grad_(True) for t in _qkv(1, 1, 3, 5, 2, 2, seed=17))
    mask = masks.causal("bottom_right")

    def f(q_: torch.Tensor, k_: torch.Tensor, v_: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q_, k_, v_, mask=mask, backend="chunked")

    with chunked.block_sizes(2, 2):
        assert torch.autograd.gradgradcheck(f, (q, k, v), fast_mode=True)
