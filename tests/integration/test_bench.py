"""`attnkit bench` keeps working: the quick suite on tiny shapes, JSON, one memory child."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnkit import cli
from attnkit.bench import CASES, SUITES, measure_memory


def test_bench_quick_runs_every_case_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    status = cli.main(["bench", "--quick", "--no-memory", "--budget", "0", "--json", str(out)])
    assert status == 0
    printed = capsys.readouterr()
    assert "speedup" in printed.out and "dense" in printed.out
    assert f"[{len(CASES)}/{len(CASES)}]" in printed.err  # progress
    data = json.loads(out.read_text())
    assert data["mode"] == "quick" and data["machine"]["cores"] >= 1
    assert [c["name"] for c in data["cases"]] == [c.name for c in CASES]
    for case in data["cases"]:
        assert case["error"] is None, case
        if case["speedup"] is not None:
            assert case["speedup"] > 0 and case["pairs"] >= 3
        if case["max_abs_diff"] is not None:
            assert case["max_abs_diff"] < 1e-3, case  # both sides compute the same thing


def test_bench_suite_names_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(SUITES) >= {"all", "dense", "ragged", "causal", "window", "additive", "weights"}
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--suite", "nope"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_memory_child_reports_peak_extra() -> None:
    mib = measure_memory("additive", "baseline", quick=True)
    assert mib is not None and mib >= 0
