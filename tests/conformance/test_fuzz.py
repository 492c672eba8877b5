"""The non-finite fuzz campaign (tests/fuzz.py) with a fixed seed.

The default run takes a small sample of it (seconds); the full campaign, 20,000 cases,
is marked slow (``scripts/test.sh --full``). Its counts are printed by
``python tests/fuzz.py --cases 20000 --seed 19``.
"""

from __future__ import annotations

import pytest

import fuzz

SEED = 19


def _check(report: fuzz.Report) -> None:
    findings = report.mismatches + report.nan_beyond_reference
    assert not findings, report.line() + "\n" + "\n".join(findings[:20])
    assert report.cases - report.skipped > report.cases // 2, "most cases did not run"


def test_fuzz_sample() -> None:
    """Cases 0-99: poisoned positions (with gradients) and every key masked with NaN."""
    report = fuzz.campaign(100, SEED)
    _check(report)
    assert report.grad_cases > 20


@pytest.mark.slow
def test_fuzz_campaign() -> None:
    """20,000 cases (about 10 minutes on two cores)."""
    report = fuzz.campaign(20_000, SEED)
    _check(report)
