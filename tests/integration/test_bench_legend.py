"""Every table `attnkit bench` prints names each case's baseline and the shape measured."""

from __future__ import annotations

import pytest

from attnkit import cli
from attnkit.bench.runner import CaseResult
from attnkit.commands import bench as bench_command


def test_quick_run_prints_the_baseline_and_the_shape(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("quick mode started a memory child")

    monkeypatch.setattr("attnkit.bench.runner.measure_memory", no_child)
    assert cli.main(["bench", "--quick", "--suite", "causal", "--budget", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    table_end = out.index("times: median per call of interleaved pairs; MiB = peak extra")
    legend = out[table_end + 1 :]
    assert legend[0].startswith("baseline and shape of each case")
    (line,) = [entry for entry in legend[1:] if entry.split()[0] == "causal"]
    assert "baseline: SDPA + dense bool causal" in line  # once only in the JSON
    assert "shape: B=2 H=2 L=S=64 E=16" in line  # the quick shape, as measured


def test_judged_legend_follows_the_table_order_and_names_unbuilt_cases() -> None:
    rows = [
        CaseResult("slow", "-", "B=1 L=8", "torch SDPA", speedup=0.5),
        CaseResult("broken", "-", "-", "-", error="RuntimeError: x"),
        CaseResult("fast", "-", "B=4 L=S=4096", "d2l masked_softmax", speedup=3.0),
    ]
    lines = bench_command.legend(bench_command._judged_order(rows)).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["fast", "slow", "broken"]
    assert lines[1].endswith("baseline: d2l masked_softmax; shape: B=4 L=S=4096")
    assert lines[3].endswith("baseline: not built; shape: not built")
    table_rows = bench_command.table(rows).splitlines()[2:]
    assert [line.split()[0] for line in table_rows] == ["fast", "slow", "broken"]
