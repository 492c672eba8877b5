"""The `attnkit` command: demo, explain, usage and errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

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


@pytest.mark.slow
def test_python_dash_m_runs_the_command() -> None:
    """Slow: a fresh interpreter's import, seconds. The default run holds ``main(["demo"])``
    in process (test_demo_prints_the_nadaraya_watson_result) and ``python -m attnkit`` in a real process
    (test_show_cli.py's end-to-end run)."""
    res = subprocess.run(
        [sys.executable, "-m", "attnkit", "demo"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "prediction 45.5000" in res.stdout


def test_explain_huge_sizes_allocate_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    # 2e14 elements per input, and (E, E) score weights of 4e10 elements: any real
    # allocation of these would fail.
    argv = ["explain", "--batch", "100000", "-L", "250000", "-E", "200000"]
    assert main([*argv, "--score", "additive", "--mask", "valid_lens", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "query (100000, 8, 250000, 200000)" in out
    assert "chosen: chunked" in out  # sdpa cannot run the additive score
    assert main([*argv, "--score", "bilinear", "--mask", "key_padding", "--grad"]) == 0
    assert "chosen: none" not in capsys.readouterr().out


def test_explain_describes_the_call_on_cpu_views(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnkit.commands import explain as command

    devices: list[tuple[str, int]] = []
    real = command.explain

    def recording(q: torch.Tensor, *args: object, **kwargs: object) -> object:
        devices.append((q.device.type, q.untyped_storage().nbytes()))
        return real(q, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(command, "explain", recording)
    assert main(["explain", "-L", "4096", "--mask", "window"]) == 0
    assert devices == [("cpu", 4)]  # one float32 element, expanded


def test_explain_describes_a_gaussian_of_any_size_without_reading_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # its form was measured from the views' values: a float64 copy of 57 GiB of queries
    argv = ["explain", "--score", "gaussian", "--batch", "100", "-L", "100000"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "not read here" in out and "chosen: sdpa" in out


def test_explain_refuses_sizes_beyond_int64_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "--batch", "100000", "--heads", "64000", "-L", "10000000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sizes too large" in err and "2**62" in err


@pytest.mark.parametrize("seed", ["99999999999999999999999", "-1", "1.5"])
def test_demo_refuses_a_seed_out_of_range(seed: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--seed", seed]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--seed: expected an integer in [0, 18446744073709551615]" in err


def test_demo_accepts_the_largest_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--seed", str(2**64 - 1)]) == 0
    assert "prediction 45.5000" in capsys.readouterr().out


def test_command_help_returns_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--help"]) == 0
    assert "--seed" in capsys.readouterr().out


def test_no_command_is_a_usage_error_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: attnkit COMMAND")


def test_an_interrupt_or_a_closed_pipe_ends_a_command_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnkit.commands import demo

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "run", interrupted)
    assert main(["demo"]) == 130
    assert capsys.readouterr().err == "attnkit demo: interrupted\n"
    # a reader that leaves at once (`attnkit demo | true`): BrokenPipeError once
    proc = subprocess.Popen([sys.executable, "-m", "attnkit", "demo"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait() == 1 and "Traceback" not in err, err


def test_explain_counts_bytes_and_the_weights_in_its_size_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # (E, E) float32 weights of 2**62 elements passed an element count, then torch
    # raised; (B, H, L, S) weights were not counted at all
    one = ["--batch", "1", "--heads", "1"]
    assert main(["explain", *one, "-L", "1", "-E", str(2**31), "--score", "bilinear"]) == 2
    assert main(["explain", *one, "-E", "1", "-L", str(2**32), "--weights"]) == 2
    err = capsys.readouterr().err
    assert err.count("sizes too large") == 2 and "Traceback" not in err


def test_bench_says_in_one_line_that_its_json_could_not_be_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (a file every write to fails)")
    argv = ["bench", "--suite", "dense", "--quick", "--no-memory", "--json", "/dev/full"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "cannot write --json /dev/full" in err and "Traceback" not in err
