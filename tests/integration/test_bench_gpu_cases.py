"""The GPU suite's definitions, checked without a GPU: shapes, FLOP counts, and the
attnkit and peer sides agreeing at tiny sizes on the CPU."""

from __future__ import annotations

import pytest
import torch

from attnkit.bench import GPU_CASES, GpuShape, suite_cases
from attnkit.bench.gpu_cases import BWD_FACTOR, attention_flops, ragged_lengths, window_pairs
from attnkit.bench.gpu_runner import cuda_missing

from tolerance import BENCH_SIDES_ABS, FLOAT64_REL

BY_NAME = {c.name: c for c in GPU_CASES}


def test_gpu_cases_use_the_issue_shapes() -> None:
    dense = BY_NAME["dense_fwd"].shape
    assert (dense.B, dense.H, dense.L, dense.S, dense.E) == (4, 16, 4096, 4096, 128)
    assert dense.dtype == torch.bfloat16
    ragged = BY_NAME["ragged_vs_flex"].shape
    assert (ragged.B, ragged.L, ragged.S) == (16, 2048, 2048)
    window = BY_NAME["window_vs_sdpa"].shape
    assert (window.L, window.window) == (8192, 256)
    bf16, fp32 = BY_NAME["additive_bf16"].shape, BY_NAME["additive_fp32"].shape
    assert (bf16.B, bf16.L, bf16.S, bf16.hidden) == (2, 2048, 2048, 128)
    assert (bf16.dtype, fp32.dtype) == (torch.bfloat16, torch.float32)
    assert BY_NAME["weights_vs_plain"].shape.L == 1024 and BY_NAME["weights_vs_plain"].weights_floor
    assert {c.suite for c in GPU_CASES} == {
        "dense",
        "ragged",
        "window",
        "scores",
        "additive",
        "weights",
    }
    assert [c.name for c in suite_cases("all", "cuda")] == list(BY_NAME)
    peers = {c.peer for c in GPU_CASES}
    assert {"SDPA", "FlexAttention", "d2l", "materialized softmax"} <= peers


def test_dense_and_causal_flops() -> None:
    s = BY_NAME["dense_fwd"].shape
    fwd = 4 * 4 * 16 * 4096 * 4096 * 128
    assert BY_NAME["dense_fwd"].flops(s) == fwd
    assert BY_NAME["dense_fwd_bwd"].flops(s) == fwd * BWD_FACTOR
    assert BY_NAME["causal_fwd"].flops(s) == 4 * 4 * 16 * 128 * (4096 * 4097 // 2)
    assert BY_NAME["gaussian"].flops(s) == fwd
    assert BY_NAME["bilinear"].flops(s) == fwd + 2 * 4 * 16 * 4096 * 128 * 128


def test_window_pairs_count_the_band() -> None:
    for n, w in [(1, 0), (5, 2), (17, 4), (8, 20), (64, 7)]:
        i = torch.arange(n)
        band = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - w)  # (L, S)
        assert window_pairs(n, w) == int(band.sum()), (n, w)


def test_ragged_lengths_and_flops() -> None:
    lens = ragged_lengths(16, 2048)
    assert lens.shape == (16,) and int(lens.min()) >= 2048 // 10 and int(lens.max()) <= 2048
    assert 0.54 < float(lens.float().mean()) / 2048 < 0.56  # mean of U[N/10, N]: 0.55
    assert len(set(lens.tolist())) == 16
    s = BY_NAME["ragged_vs_sdpa"].shape
    expected = 4 * 16 * 128 * float((lens.double() ** 2).sum())
    assert BY_NAME["ragged_vs_sdpa"].flops(s) == pytest.approx(expected, rel=FLOAT64_REL)
    assert attention_flops(GpuShape(B=1, H=1, E=1), 1.0) == 4.0


def test_additive_flops() -> None:
    s = BY_NAME["additive_fp32"].shape
    pairs = 2 * 2048 * 2048
    expected = pairs * (4 * 128 + 2 * 128) + 2 * 2 * (2048 + 2048) * 128 * 128
    assert BY_NAME["additive_fp32"].flops(s) == expected
    assert BY_NAME["additive_fwd_bwd_bf16"].flops(s) == expected * BWD_FACTOR


@pytest.mark.parametrize("name", [c.name for c in GPU_CASES if not c.needs_flex])
def test_sides_agree_at_tiny_sizes_on_the_cpu(name: str) -> None:
    case = BY_NAME[name]
    sides = case.build(case.shape.small(), "cpu")
    assert sides.baseline is not None
    sides.attnkit()
    sides.baseline()
    if sides.check is not None:
        assert sides.check() < BENCH_SIDES_ABS
    assert sides.backend is not None and sides.backend() is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_missing_says_so() -> None:
    assert (cuda_missing() or "").startswith("no CUDA device")
