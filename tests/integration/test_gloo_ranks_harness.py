"""The spawned-rank harness of the context-parallel tests (tests/gloo_ranks.py): a group
that does not finish fails with every running rank's stack, so a hang says where."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gloo_ranks import run_ranks


def _stuck_rank(rank: int, seconds: float) -> None:
    """Rank 1 sleeps past the deadline in a frame the stack must name; rank 0 returns."""
    if rank == 1:
        time.sleep(seconds)


@pytest.mark.slow
def test_a_rank_past_the_deadline_is_killed_and_its_stack_reported(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError) as caught:
        run_ranks(_stuck_rank, 2, (120.0,), str(tmp_path), deadline_s=20)
    said = str(caught.value)
    assert "the 2-process group did not finish in 20 s" in said
    assert "rank 1 still running" in said and "_stuck_rank" in said
    assert "rank 0 still running" not in said
    assert time.monotonic() - start < 60
