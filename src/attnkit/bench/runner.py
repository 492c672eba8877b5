"""Timing and memory measurement of benchmark cases.

Timing: both sides run in this process, interleaved (A B, then B A, ...), after
one warm-up call each; every pair gives a ratio baseline/attnkit and the case
reports the median of those ratios, which cancels slow drifts in machine load
(the cores may be shared). A sample is ``Sides.repeat`` calls in a row (many for
microsecond calls), reported per call.

Peak memory: each side runs once in a fresh child process
(``python -m attnkit.bench._child CASE SIDE``). The child first warms torch up
on the quick shapes (thread pools, lazily loaded kernels), builds the full
inputs, resets the kernel's resident-memory high-water mark (VmHWM, through
``/proc/self/clear_refs``), runs the side once and reads the mark again: the
difference from the resident size before the call is the side's peak *extra*
memory, everything it allocated beyond its inputs, torch's allocations and any
other alike. (``ru_maxrss`` would not do: a child inherits its parent's peak.)
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .cases import BenchCase

__all__ = [
    "CaseResult",
    "judge",
    "machine_info",
    "measure_memory",
    "peak_since",
    "reset_peak",
    "run_case",
]


@dataclass
class CaseResult:
    """What one case measured; times in seconds, memory in MiB, speedup = baseline/attnkit."""

    name: str
    target: str
    shape: str
    baseline_name: str
    attnkit_s: float | None = None
    baseline_s: float | None = None
    speedup: float | None = None
    pairs: int = 0
    ratios: list[float] = field(default_factory=list)
    goal: float | None = None
    met: bool | None = None
    attnkit_mib: float | None = None
    baseline_mib: float | None = None
    mem_ratio: float | None = None
    mem_met: bool | None = None
    max_abs_diff: float | None = None
    backend: str | None = None
    extra_s: float | None = None
    """Median per-pair difference attnkit - baseline of per-call times (seconds)."""
    counts: dict[str, int] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)
    """Further measured figures: TFLOP/s of each side, the weights' copy floor, ..."""
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _timed(fn: Callable[[], Any], repeat: int = 1, sync: Callable[[], None] | None = None) -> float:
    """Seconds per call of ``repeat`` calls in a row (then ``sync``, inside the timing)."""
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    if sync is not None:
        sync()
    return (time.perf_counter() - t0) / repeat


def judge(case: BenchCase, res: CaseResult) -> bool | None:
    """Whether the timing target (ratio, extra time per call) and count limits are met;
    None when the case has no such target or was not timed."""
    verdicts: list[bool] = []
    if case.goal is not None and res.speedup is not None:
        verdicts.append(res.speedup >= case.goal)
    if case.max_extra_s is not None and res.extra_s is not None:
        verdicts.append(res.extra_s <= case.max_extra_s)
    for name, limit in case.count_limits:
        if name in res.counts:
            verdicts.append(res.counts[name] <= limit)
    return all(verdicts) if verdicts else None


def run_case(
    case: BenchCase,
    *,
    quick: bool,
    memory: bool,
    budget_s: float | None = None,
    min_pairs: int = 3,
    max_pairs: int | None = None,
) -> CaseResult:
    """Time (and optionally measure memory of) one case; never raises for a failing side.

    ``max_pairs``: interleaved pairs at most (default: the case's ``max_pairs``).
    """
    res = CaseResult(
        name=case.name, target=case.target, shape="-", baseline_name="-", goal=case.goal
    )
    budget = budget_s if budget_s is not None else (0.2 if quick else 8.0)
    most = max_pairs if max_pairs is not None else case.max_pairs
    try:
        sides = case.build(quick)
        res.shape, res.baseline_name = sides.shape, sides.baseline_name
        if case.timed and sides.baseline is not None:
            ta_all, tb_all, ratios = [], [], []
            sides.attnkit()  # warm-up
            sides.baseline()
            ours, theirs, rep, sync = sides.attnkit, sides.baseline, sides.repeat, sides.sync
            start = time.perf_counter()
            n = 0
            while n < most and (n < min_pairs or time.perf_counter() - start < budget):
                if n % 2 == 0:
                    ta, tb = _timed(ours, rep, sync), _timed(theirs, rep, sync)
                else:
                    tb, ta = _timed(theirs, rep, sync), _timed(ours, rep, sync)
                ta_all.append(ta)
                tb_all.append(tb)
                ratios.append(tb / ta)
                n += 1
            res.attnkit_s = statistics.median(ta_all)
            res.baseline_s = statistics.median(tb_all)
            res.speedup = statistics.median(ratios)
            res.extra_s = statistics.median(a - b for a, b in zip(ta_all, tb_all, strict=True))
            res.ratios = [round(r, 4) for r in ratios]
            res.pairs = n
        elif case.timed:
            res.attnkit_s = _timed(sides.attnkit, sides.repeat, sides.sync)
        if sides.counts is not None:
            res.counts = dict(sides.counts())
        if sides.figures is not None:
            res.figures.update(sides.figures())
        if sides.backend is not None:
            res.backend = sides.backend()
        if not quick:  # targets speak of the full shapes only
            res.met = judge(case, res)
        if sides.check is not None:
            res.max_abs_diff = sides.check()
        if memory and case.memory:
            res.attnkit_mib = measure_memory(case.name, "attnkit", quick=quick)
            if sides.baseline is not None:
                res.baseline_mib = measure_memory(case.name, "baseline", quick=quick)
            if res.attnkit_mib is not None and res.baseline_mib:
                res.mem_ratio = res.attnkit_mib / res.baseline_mib
            if case.mem_goal is not None and res.mem_ratio is not None and not quick:
                res.mem_met = res.mem_ratio <= case.mem_goal
            if case.mem_limit_mib is not None and res.attnkit_mib is not None and not quick:
                res.mem_met = res.attnkit_mib < case.mem_limit_mib
    except Exception as exc:  # report and go on with the other cases
        res.error = f"{type(exc).__name__}: {exc}"
    return res


def measure_memory(name: str, side: str, *, quick: bool, timeout_s: float = 600) -> float | None:
    """Peak extra memory (MiB) of one side of a case, run once in a child process."""
    cmd = [sys.executable, "-m", "attnkit.bench._child", name, side]
    if quick:
        cmd.append("--quick")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"memory child for {name}/{side} failed: {tail}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["peak_extra_mib"])


def _status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])  # kB
    except OSError:
        pass
    return None


def reset_peak() -> int:
    """Start a peak-memory measurement; returns the resident KiB now.

    Linux: the high-water mark (VmHWM) is reset to the current RSS through
    ``/proc/self/clear_refs``. ``ru_maxrss`` is no use in a child process: it
    keeps the parent's peak across fork and exec.
    """
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    rss = _status_kib("VmRSS")
    return rss if rss is not None else _max_rss_kib()


def _max_rss_kib() -> int:
    """The process's peak resident size in KiB (``getrusage``), or 0 where the system has
    no ``resource`` module (Windows): the peak columns then read 0."""
    try:
        import resource
    except ImportError:
        return 0
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def peak_since(start_kib: int) -> float:
    """Peak extra MiB since :func:`reset_peak` returned ``start_kib``."""
    hwm = _status_kib("VmHWM")
    if hwm is None:
        hwm = _max_rss_kib()
    return max(0, hwm - start_kib) / 1024


def machine_info() -> dict[str, Any]:
    """Cores, SIMD flags, torch version and threads, how the additive kernel runs here."""
    from ..kernels import additive

    flags: list[str] = []
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags") and not flags:
                    wanted = ("avx", "fma", "f16c", "amx", "sse4_2")
                    flags = sorted(f for f in line.split(":", 1)[1].split() if f.startswith(wanted))
                if line.startswith("model name") and model in ("", platform.machine()):
                    model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {
        "cpu": model or platform.machine(),
        "cores": os.cpu_count(),
        "simd_flags": flags,
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "additive_kernel": additive.status(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
