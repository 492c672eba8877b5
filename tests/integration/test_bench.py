"""`attnkit bench` keeps working: the quick suite on tiny shapes, JSON, one memory child,
arguments refused up front, the table's order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnkit import cli
from attnkit.bench import CASES, SUITES, BenchCase, CaseResult, judge, measure_memory
from attnkit.commands import bench as bench_command

from tolerance import BENCH_SIDES_ABS


def test_bench_quick_runs_every_case_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    status = cli.main(["bench", "--quick", "--no-memory", "--budget", "0", "--json", str(out)])
    assert status == 0
    printed = capsys.readouterr()
    assert "dense" in printed.out
    assert f"[{len(CASES)}/{len(CASES)}]" in printed.err  # progress
    data = json.loads(out.read_text())
    assert data["mode"] == "quick" and data["machine"]["cores"] >= 1
    assert [c["name"] for c in data["cases"]] == [c.name for c in CASES]
    for case in data["cases"]:
        assert case["error"] is None, case
        if case["speedup"] is not None:
            assert case["speedup"] > 0 and case["pairs"] >= 3
        if case["max_abs_diff"] is not None:
            assert case["max_abs_diff"] < BENCH_SIDES_ABS, case  # both sides compute the same


def test_bench_suite_names_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(SUITES) >= {"all", "dense", "ragged", "causal", "window", "additive", "weights"}
    assert "overhead" in SUITES and not set(SUITES["overhead"]) & set(SUITES["all"])
    assert cli.main(["bench", "--suite", "nope"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_memory_child_reports_peak_extra() -> None:
    mib = measure_memory("additive", "baseline", quick=True)
    assert mib is not None and mib >= 0


@pytest.fixture
def no_case_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any case that starts fails the test: refusals must come first."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a case ran before the arguments were checked")

    monkeypatch.setattr("attnkit.bench.run_case", refuse)
    monkeypatch.setattr("attnkit.bench.gpu_runner.run_gpu_case", refuse)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--json", "missing/dir/x.json"], "--json: the folder 'missing/dir' does not exist"),
        (["--budget", "-1"], "--budget: expected a finite number of seconds >= 0, got -1"),
        (["--budget", "nan"], "--budget: expected a finite number of seconds >= 0, got nan"),
        (["--budget", "inf"], "--budget: expected a finite number of seconds >= 0, got inf"),
        (["--budget", "soon"], "--budget: expected a number of seconds >= 0, got 'soon'"),
    ],
)
def test_bench_refuses_bad_arguments_before_running(
    argv: list[str], message: str, no_case_runs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["bench", "--quick", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bench_refuses_a_json_path_that_is_a_folder(
    tmp_path: Path, no_case_runs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["bench", "--json", str(tmp_path)]) == 2
    assert "is a folder; expected a file name" in capsys.readouterr().err


def test_bench_json_check_leaves_no_file_behind(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    assert bench_command.json_path_problem(str(target)) is None
    assert not target.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_bench_on_cuda_without_a_gpu_refuses_cleanly(
    no_case_runs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["bench", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit bench: error: --device cuda: no CUDA device")
    assert err.count("\n") == 1


def test_quick_runs_no_memory_child_and_says_tiny_shapes_are_not_judged(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("quick mode started a memory child")

    monkeypatch.setattr("attnkit.bench.runner.measure_memory", no_child)
    assert cli.main(["bench", "--quick", "--suite", "dense", "--budget", "0"]) == 0
    printed = capsys.readouterr()
    first, head, *_ = printed.out.splitlines()
    assert first.startswith("quick mode: tiny shapes") and "no speedup or verdict" in first
    # the figures without a judgement: no ratio, target or verdict anywhere
    assert head.split()[:4] == ["case", "attnkit", "baseline", "status"]
    assert "speedup" not in head and "target" not in head and "met" not in head.split()
    assert "×" not in printed.out and "×" not in printed.err
    assert "yes" not in printed.out.split() and "NO" not in printed.out.split()


def test_quick_table_keeps_the_run_order_and_names_errors() -> None:
    rows = [_result("b", 0.2), _result("a", 3.0), _result("c", None, error="RuntimeError: x")]
    lines = bench_command.table(rows, judged=False).splitlines()
    assert "speedup" not in lines[0] and "met" not in lines[0].split()
    assert [line.split()[0] for line in lines[2:]] == ["b", "a", "c"]
    assert lines[4].split()[3] == "ERROR" and lines[2].split()[3] == "ran"


def _result(name: str, speedup: float | None, error: str | None = None) -> CaseResult:
    return CaseResult(
        name=name, target="-", shape="-", baseline_name="-", speedup=speedup, error=error
    )


def test_table_leads_with_the_largest_speedups() -> None:
    rows = [
        _result("slow", 0.5),
        _result("broken", None, error="RuntimeError: x"),
        _result("fast", 3.0),
        _result("untimed", None),
        _result("even", 1.0),
    ]
    lines = bench_command.table(rows).splitlines()[2:]
    assert [line.split()[0] for line in lines] == ["fast", "even", "slow", "untimed", "broken"]


def test_judge_reads_ratio_extra_time_and_count_limits() -> None:
    def build(quick: bool) -> object:
        raise AssertionError

    case = BenchCase(
        "c",
        "s",
        "t",
        0.9,
        build,
        max_extra_s=10e-6,
        count_limits=(("recompiles", 0),),  # type: ignore[arg-type]
    )
    res = _result("c", 1.0)
    res.extra_s, res.counts = 5e-6, {"recompiles": 0}
    assert judge(case, res) is True
    res.extra_s = 12e-6
    assert judge(case, res) is False
    res.extra_s, res.counts = 5e-6, {"recompiles": 1}
    assert judge(case, res) is False
    res.counts, res.speedup = {"recompiles": 0}, 0.8
    assert judge(case, res) is False
