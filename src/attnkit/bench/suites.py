"""Which cases each ``attnkit bench --suite NAME`` runs, per device.

On the CPU: ``all`` is every throughput case of :mod:`attnkit.bench.cases`, each
of their groups (``dense``, ``ragged``, ...) is a suite of its own,
``overhead`` is the four cases of :mod:`attnkit.bench.overhead` (not part of
``all``: it compiles with torch.compile), ``models`` the cases of
:mod:`attnkit.bench.models` (not part of ``all``: transformers models and score
modifiers at 4k tokens), and ``show`` the cases of :mod:`attnkit.bench.show`
(``attnkit show`` at 2,000 and 8,000 tokens against the model's forward, and
``attnkit show --explain`` at 2,000 tokens against its forward plus backward; minutes). On CUDA (``--device cuda``): ``all`` is
every case of :mod:`attnkit.bench.gpu_cases`, with their groups, and ``overhead``
the overhead cases with their inputs on the GPU.
"""

from __future__ import annotations

from .cases import CASES, BenchCase
from .gpu_cases import GPU_CASES, GpuCase
from .models import MODEL_CASES
from .overhead import OVERHEAD_CASES, overhead_cases
from .show import SHOW_CASES, ShowCase
from .show_explain import EXPLAIN_CASES, ExplainCase

__all__ = ["DEVICES", "SUITES", "all_suite_names", "cpu_case", "suite_cases"]

DEVICES = ("cpu", "cuda")

Case = BenchCase | GpuCase | ShowCase | ExplainCase


def _grouped(cases: tuple[Case, ...]) -> dict[str, tuple[Case, ...]]:
    out: dict[str, tuple[Case, ...]] = {"all": cases}
    for case in cases:
        out[case.suite] = (*out.get(case.suite, ()), case)
    return out


def _suites(device: str) -> dict[str, tuple[Case, ...]]:
    if device == "cpu":
        return {**_grouped(CASES), "overhead": OVERHEAD_CASES, "models": MODEL_CASES,
                "show": (*SHOW_CASES, *EXPLAIN_CASES)}  # fmt: skip
    if device == "cuda":
        return {**_grouped(GPU_CASES), "overhead": overhead_cases("cuda")}
    raise ValueError(f"device: expected one of {DEVICES}, got {device!r}")


def suite_cases(suite: str, device: str = "cpu") -> tuple[Case, ...]:
    """The cases of ``suite`` on ``device``; ValueError naming the suites there when unknown."""
    suites = _suites(device)
    if suite not in suites:
        raise ValueError(
            f"--suite: no suite {suite!r} on device {device!r}; expected one of "
            f"{', '.join(sorted(suites))}"
        )
    return suites[suite]


def all_suite_names() -> list[str]:
    """Every suite name on any device (the choices of ``--suite``)."""
    names = {
        *(c.suite for c in CASES),
        *(c.suite for c in GPU_CASES),
        "all",
        "overhead",
        "models",
        "show",
    }
    return sorted(names)


def cpu_case(name: str) -> BenchCase | None:
    """The CPU case (throughput or overhead) called ``name``, or None."""
    for case in (*CASES, *OVERHEAD_CASES, *MODEL_CASES):
        if case.name == name:
            return case
    return None


SUITES: dict[str, tuple[str, ...]] = {
    name: tuple(c.name for c in cases) for name, cases in _suites("cpu").items()
}
"""CPU suite name -> case names."""
