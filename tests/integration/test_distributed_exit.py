"""Two gloo ranks that ran context-parallel attention leave as a user's script does.

Each run is ``scripts/gloo_exit_repro.py --mode attnkit``: two processes form a gloo
group on 127.0.0.1, run one ring attention call forward and backward, call
``destroy_process_group()`` and return from the script: no barrier, no ``os._exit``.
Every rank must exit with code 0 (an abort in the interpreter's teardown is -6,
SIGABRT), and with ``--strict`` no gloo thread may be left once the group is destroyed
(a rank that has one exits with 3): a transfer left posted in gloo keeps its connection
thread running into the interpreter's teardown, where it now and then aborted the
process. The error path is checked too (``attnkit-error``: rank 0's first ring block
raises and rank 0 keeps the error). The default run makes a few runs; the slow run
makes 12 of each, beside a busy process (the races at exit show under CPU contention).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPRO = Path(__file__).resolve().parents[2] / "scripts" / "gloo_exit_repro.py"
SRC = Path(__file__).resolve().parents[2] / "src"


def _runs(runs: int, load: int, mode: str, deadline_s: float = 540.0) -> str:
    """Run the repro ``runs`` times; its report. Fails unless every rank exited with 0."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(REPRO), "--mode", mode, "--strict", "--runs", str(runs),
         "--jobs", "2", "--load", str(load), "--max-seconds", str(deadline_s)],
        capture_output=True, text=True, timeout=deadline_s + 60, env=env,
    )  # fmt: skip
    report = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, f"{report}\n{proc.stderr[-3000:]}"
    assert report.startswith(f"{mode}: {runs} runs,"), f"{report}\n{proc.stderr[-3000:]}"
    return report


@pytest.mark.parametrize(
    "mode",
    [
        # a plain call's ranks also exit as a user's do in every test_distributed.py case
        pytest.param("attnkit", marks=pytest.mark.slow),
        pytest.param("attnkit-error", marks=pytest.mark.slow),
    ],
)
def test_ranks_exit_cleanly_after_context_parallel_attention(mode: str) -> None:
    report = _runs(runs=2, load=0, mode=mode)
    assert report.endswith(f"{{'exit 0': {2 * 2}}}"), report


@pytest.mark.slow
def test_a_compile_after_the_group_keeps_nothing_alive() -> None:
    """A user's first ``torch.compile`` (the first ``import torch._dynamo``) after
    ``init_process_group`` would keep the group alive past ``destroy_process_group``
    (torch binds it as a default argument then); ``attnkit.distributed``, imported
    before the group, binds those defaults first."""
    report = _runs(runs=2, load=0, mode="attnkit-compile")
    assert report.endswith(f"{{'exit 0': {2 * 2}}}"), report


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["attnkit", "attnkit-error"])
def test_ranks_exit_cleanly_after_context_parallel_attention_under_load(mode: str) -> None:
    report = _runs(runs=12, load=1, mode=mode, deadline_s=900.0)
    assert report.endswith(f"{{'exit 0': {12 * 2}}}"), report
