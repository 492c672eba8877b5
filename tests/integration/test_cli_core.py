"""The `attnkit` command: demo, explain, usage and errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnkit.cli import main


def test_demo_prints_the_nadaraya_watson_result(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "prediction 45.5000" in out
    assert "weights    [0.0000, 0.5000, 0.5000]" in out
    assert "a length of 0 gives a zero row, not NaN: [0.0000, 0.0000, 0.0000, 0.0000]" in out
    assert "additive (Bahdanau) score: runs on" in out
    assert "score 'additive' does not reduce to a dot product" in out


def test_explain_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--score", "additive", "-L", "64", "--mask", "causal"]) == 0
    out = capsys.readouterr().out
    assert "chosen:" in out and "sdpa: score 'additive' does not reduce to a dot product" in out


def test_explain_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "-L", "0"]) == 2
    assert "--queries must be >= 1, got 0" in capsys.readouterr().err


def test_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_usage_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("demo", "explain", "show", "bench"):
        assert f"  {name}" in out


def test_python_dash_m_runs_the_command() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "attnkit", "demo"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "prediction 45.5000" in res.stdout
