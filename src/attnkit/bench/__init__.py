"""The benchmark suite behind ``attnkit bench``: attnkit side by side with its baselines.

:mod:`attnkit.bench.cases` defines the cases (one per performance target, with
full and quick shapes); :mod:`attnkit.bench.runner` times them interleaved in
one process and measures peak memory in child processes.
"""

from .cases import CASES, SUITES, BenchCase, Sides
from .runner import CaseResult, machine_info, measure_memory, run_case

__all__ = [
    "CASES",
    "SUITES",
    "BenchCase",
    "CaseResult",
    "Sides",
    "machine_info",
    "measure_memory",
    "run_case",
]
