"""`attnkit bench --suite overhead`: the eight cases run, compare equal results, and count
graph breaks and recompiles."""

from __future__ import annotations

import pytest
import torch

from attnkit.bench import OVERHEAD_CASES, run_case, suite_cases
from attnkit.bench.overhead import compile_counts
from attnkit.bench.runner import CaseResult

from tolerance import BENCH_SIDES_ABS, FLOAT64_REL


def test_overhead_suite_names_its_eight_cases_and_targets() -> None:
    cases = {c.name: c for c in suite_cases("overhead")}
    assert list(cases) == [
        "call_overhead",
        "call_overhead_causal",
        "layer_mha",
        "layer_mha_train",
        "decode_step",
        "compiled",
        "compiled_unchecked",
        "compiled_small",
    ]
    for name in ("call_overhead", "call_overhead_causal"):
        assert cases[name].max_extra_s == 10e-6 and cases[name].goal is None
    assert cases["layer_mha"].goal == pytest.approx(1 / 1.1, rel=FLOAT64_REL)
    assert cases["layer_mha_train"].goal == pytest.approx(1 / 1.1, rel=FLOAT64_REL)
    assert cases["decode_step"].goal == pytest.approx(1 / 1.1, rel=FLOAT64_REL)
    assert cases["compiled"].goal == pytest.approx(1 / 1.05, rel=FLOAT64_REL)
    for name in ("compiled", "compiled_unchecked", "compiled_small"):
        assert cases[name].goal == pytest.approx(1 / 1.05, rel=FLOAT64_REL)
        assert dict(cases[name].count_limits) == {"graph_breaks": 0, "recompiles": 0}


def _run_quick(names: set[str]) -> dict[str, CaseResult]:
    results = {}
    for case in OVERHEAD_CASES:
        if case.name not in names:
            continue
        res = results[case.name] = run_case(case, quick=True, memory=False, budget_s=0)
        assert res.error is None, res
        assert res.pairs >= 3 and res.speedup is not None and res.speedup > 0
        assert res.extra_s is not None
        assert res.max_abs_diff is not None and res.max_abs_diff < BENCH_SIDES_ABS, res
        assert res.met is None  # quick shapes are not judged
    return results


COMPILED = {"compiled", "compiled_unchecked", "compiled_small"}


def test_overhead_cases_run_and_agree_with_torch() -> None:
    """Every eager case; the compiled ones (inductor compiles, seconds of C++ each on a
    cold cache) under ``slow``."""
    names = {c.name for c in OVERHEAD_CASES} - COMPILED
    results = _run_quick(names)
    assert set(results) == names
    stages = results["call_overhead_causal"].figures  # the causal call's host time by stage
    expected = {"validation", "lowering", "dispatch", "backend", "wrap_up", "plan_key",
                "kernel", "finite_check"}  # fmt: skip
    assert {n.removeprefix("stage_").removesuffix("_us") for n in stages} == expected | {"call"}
    assert all(0 < f < 1e6 for f in stages.values()), stages
    assert not results["call_overhead"].figures  # only the causal case is broken down


@pytest.mark.slow
@pytest.mark.torch_feature("compile")
def test_the_compiled_cases_run_and_count_breaks_and_recompiles() -> None:
    results = _run_quick(COMPILED)
    for res in results.values():
        assert set(res.counts) == {"graph_breaks", "recompiles"}
        assert res.backend is not None


def test_compile_counts_sees_a_recompile() -> None:
    fn = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    inputs = [torch.ones(3), torch.ones(5)]
    calls = iter(range(10))

    def call() -> torch.Tensor:
        # the second call changes the shape once; every later call reuses a graph
        return fn(inputs[min(next(calls), 1)])

    counts = compile_counts(call, 10)
    assert counts["graph_breaks"] == 0
    assert counts["recompiles"] >= 1
    steady = compile_counts(lambda: fn(inputs[1]), 10)
    assert steady == {"graph_breaks": 0, "recompiles": 0}


def test_overhead_cases_start_no_memory_child(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("an overhead case started a memory child")

    monkeypatch.setattr("attnkit.bench.runner.measure_memory", no_child)
    assert all(not case.memory for case in OVERHEAD_CASES)
    res = run_case(OVERHEAD_CASES[0], quick=True, memory=True, budget_s=0)
    assert res.error is None and res.attnkit_mib is None
