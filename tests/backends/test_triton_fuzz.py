"""The conformance fuzz (tests/fuzz_calls.py) on the triton backend under Triton's
interpreter: the campaign's random valid calls that triton takes (about a third of them:
it takes no score modifier, per-head scale or float64), each held to the float64 oracle
with every miss replayed in float64, as on the CPU backends.

An interpreted call costs about 0.1 s, so the default run takes cases 0-59 (a dozen
triton calls, seconds) and the slow run 5,000 triton cases (about 9 minutes on two
cores). The campaign to 20,000 triton cases (about 65,000 drawn, 35 minutes) runs as
``TRITON_INTERPRET=1 python tests/fuzz_calls.py --backend triton --per-backend 20000``.
"""

from __future__ import annotations

from interpreted_triton import interpreted_triton  # first: sets TRITON_INTERPRET=1

# isort: split

from collections.abc import Iterator

import pytest

import fuzz_calls

SEED = 28  # the CPU campaign's: the same calls
TRITON = ("triton",)


@pytest.fixture(scope="module", autouse=True)
def triton_registered() -> Iterator[None]:
    """The backend under the interpreter for this module only (tests/interpreted_triton.py)."""
    with interpreted_triton():
        yield


def _check(report: fuzz_calls.Report, at_least: int) -> None:
    found = report.findings
    assert not found, "\n".join(report.lines() + [f.line() for f in found[:20]])
    assert report.per_backend["triton"] >= at_least, report.lines()


def test_triton_conformance_fuzz_sample() -> None:
    """Cases 0-59 of the conformance campaign on triton."""
    _check(fuzz_calls.campaign(60, SEED, backends=TRITON), 10)


@pytest.mark.slow
def test_triton_conformance_fuzz_campaign() -> None:
    """Until triton has run 5,000 cases (about 16,000 drawn)."""
    _check(fuzz_calls.campaign_until(5_000, SEED, max_cases=40_000, backends=TRITON), 5_000)
