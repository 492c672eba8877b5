"""The benchmark suites behind ``attnkit bench``: attnkit side by side with its baselines.

- :mod:`attnkit.bench.cases`: the CPU throughput cases (one per performance
  target, with full and quick shapes) and the records every suite shares;
- :mod:`attnkit.bench.overhead`: per-call overhead, layer, decode step, compiled;
- :mod:`attnkit.bench.gpu_cases`: the GPU cases, their shapes and FLOP counts;
- :mod:`attnkit.bench.suites`: which cases each ``--suite`` runs, per device;
- :mod:`attnkit.bench.runner`: times CPU cases interleaved in one process and
  measures peak memory in child processes;
- :mod:`attnkit.bench.gpu_runner`: times GPU cases on CUDA (TFLOP/s, peak memory).
"""

from .cases import CASES, BenchCase, Sides
from .gpu_cases import GPU_CASES, GpuCase, GpuShape
from .overhead import OVERHEAD_CASES, overhead_cases
from .runner import CaseResult, judge, machine_info, measure_memory, run_case
from .suites import SUITES, all_suite_names, cpu_case, suite_cases

__all__ = [
    "CASES",
    "GPU_CASES",
    "OVERHEAD_CASES",
    "SUITES",
    "BenchCase",
    "CaseResult",
    "GpuCase",
    "GpuShape",
    "Sides",
    "all_suite_names",
    "cpu_case",
    "judge",
    "machine_info",
    "measure_memory",
    "overhead_cases",
    "run_case",
    "suite_cases",
]
