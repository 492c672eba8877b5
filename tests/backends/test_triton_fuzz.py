"""The conformance fuzz (tests/fuzz_calls.py) on the triton backend under Triton's
interpreter: the campaign's random valid calls that triton takes (about a third of them:
it takes no score modifier, per-head scale or float64), each held to the float64 oracle
with every miss replayed in float64, as on the CPU backends.

An interpreted call costs about 0.3 s on one core, so the default run takes cases 0-29
(a few triton calls, seconds) and the slow run cases 0-1,799 in two chunks (about 600
triton calls, a few minutes). Larger campaigns run as ``TRITON_INTERPRET=1 python
tests/fuzz_calls.py --backend triton --per-backend 5000`` (about 16,000 drawn; well over
half an hour on two cores), and are for a change to the kernels: on a GPU the
conformance suite covers them at full speed.
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
    """Cases 0-29 of the conformance campaign on triton."""
    _check(fuzz_calls.campaign(30, SEED, backends=TRITON), 5)


CHUNK = 900
"""Cases drawn per chunk of the slow campaign (about 300 of them run on triton)."""


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(2))
def test_triton_conformance_fuzz_campaign(chunk: int) -> None:
    """Cases 0-1,799 in two chunks."""
    _check(fuzz_calls.campaign(CHUNK, SEED, start=chunk * CHUNK, backends=TRITON), CHUNK // 5)
