"""Timing the GPU suite on CUDA: medians of per-round ratios, TFLOP/s, peak memory.

Each round times both sides once, in alternating order, with
``triton.testing.do_bench`` (median of its repetitions) when triton is importable,
else with CUDA events (median of 20 calls after 5 warm-up calls); a case reports
the median of the per-round ratios peer time / attnkit time. Peak memory is
``torch.cuda.max_memory_allocated`` during one call, above what was allocated
before it. The copy-bandwidth floor of the weights case is the weights' bytes
over the bandwidth of one large device-to-device copy, measured here.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from .gpu_cases import GpuCase, flex_available
from .runner import CaseResult

__all__ = ["copy_bandwidth", "cuda_missing", "cuda_time", "peak_extra_mib", "run_gpu_case"]

WEIGHTS_SLACK = 1.3
"""The weights target: total time ≤ 1.3 × (plain call + weights bytes / copy bandwidth)."""


def cuda_missing() -> str | None:
    """Why the GPU suite cannot run here ("no CUDA device"), or None."""
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def cuda_time(fn: Callable[[], Any]) -> float:
    """Median seconds of one call of ``fn`` on the current CUDA device."""
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        return float(do_bench(fn, warmup=25, rep=100, return_mode="median")) / 1e3
    for _ in range(5):
        fn()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def peak_extra_mib(fn: Callable[[], Any]) -> float:
    """Peak CUDA memory one call of ``fn`` allocates above what was allocated before."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del result
    return max(0, peak - before) / 2**20


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device copy bandwidth in bytes/s: bytes read plus bytes written by one large copy."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = cuda_time(lambda: dst.copy_(src))
    return 2 * nbytes / seconds


def run_gpu_case(case: GpuCase, *, rounds: int = 5, device: str = "cuda") -> CaseResult:
    """Time one GPU case; never raises for a failing side (the error is recorded)."""
    res = CaseResult(
        name=case.name, target=case.target, shape="-", baseline_name=case.peer, goal=case.goal
    )
    try:
        if case.needs_flex and (why := flex_available()) is not None:
            raise RuntimeError(why)
        sides = case.build(case.shape, device)
        res.shape, res.baseline_name = sides.shape, sides.baseline_name
        assert sides.baseline is not None
        ours, theirs = sides.attnkit, sides.baseline
        ours()  # compile, autotune, build caches
        theirs()
        ta_all, tb_all, ratios = [], [], []
        for r in range(rounds):
            if r % 2 == 0:
                ta, tb = cuda_time(ours), cuda_time(theirs)
            else:
                tb, ta = cuda_time(theirs), cuda_time(ours)
            ta_all.append(ta)
            tb_all.append(tb)
            ratios.append(tb / ta)
        res.attnkit_s = statistics.median(ta_all)
        res.baseline_s = statistics.median(tb_all)
        res.speedup = statistics.median(ratios)
        res.ratios = [round(x, 4) for x in ratios]
        res.pairs = rounds
        flops = case.flops(case.shape)
        res.figures["attnkit_tflops"] = flops / res.attnkit_s / 1e12
        res.figures["baseline_tflops"] = flops / res.baseline_s / 1e12
        res.attnkit_mib = peak_extra_mib(ours)
        res.baseline_mib = peak_extra_mib(theirs)
        if res.baseline_mib:
            res.mem_ratio = res.attnkit_mib / res.baseline_mib
        verdicts = []
        if case.goal is not None:
            verdicts.append(res.speedup >= case.goal)
        if case.weights_floor:
            s = case.shape
            weights_bytes = s.B * s.H * s.L * s.S * 4  # float32 weights (half inputs too)
            floor_s = weights_bytes / copy_bandwidth()
            res.figures["floor_ms"] = floor_s * 1e3
            bound = WEIGHTS_SLACK * (res.baseline_s + floor_s)
            res.figures["time_over_bound"] = res.attnkit_s / bound
            verdicts.append(res.attnkit_s <= bound)
        if case.mem_goal is not None and res.mem_ratio is not None:
            res.mem_met = res.mem_ratio <= case.mem_goal
        res.met = all(verdicts) if verdicts else None
        if sides.backend is not None:
            res.backend = sides.backend()
        if sides.check is not None:
            res.max_abs_diff = sides.check()
    except Exception as exc:  # report and go on with the other cases
        res.error = f"{type(exc).__name__}: {exc}"
    return res
