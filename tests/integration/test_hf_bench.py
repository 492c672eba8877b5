"""`attnkit bench --suite models`: registered, and each case computes what its peer does."""

from __future__ import annotations

import pytest

from attnkit.bench import SUITES, cpu_case, run_case
from attnkit.bench.models import MODEL_CASES

from tolerance import BENCH_SIDES_ABS

pytest.importorskip("transformers")


def test_models_suite_is_its_own() -> None:
    assert SUITES["models"] == tuple(c.name for c in MODEL_CASES)
    assert not set(SUITES["models"]) & set(SUITES["all"])
    assert all(cpu_case(c.name) is c for c in MODEL_CASES)  # the memory children find them


@pytest.mark.parametrize("case", MODEL_CASES, ids=lambda c: c.name)
def test_each_case_agrees_with_its_peer(case) -> None:
    res = run_case(case, quick=True, memory=False, budget_s=0, max_pairs=1)
    assert res.error is None, res.error
    assert res.speedup is not None and res.speedup > 0
    assert res.max_abs_diff is not None and res.max_abs_diff < BENCH_SIDES_ABS, res
