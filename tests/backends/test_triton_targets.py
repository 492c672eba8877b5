"""The triton kernels compile for every NVIDIA target, without a GPU.

The interpreter accepts code that the Triton compiler refuses, and knows nothing of
a GPU's limits. Here ``python -m attnkit.backends.triton.targets`` compiles, in one
fresh process without ``TRITON_INTERPRET``, every kernel specialization that a set of
calls makes attnkit's host code pick, for sm_75, sm_80, sm_86, sm_89 and sm_90, and
reads shared memory (Triton's metadata) and register spills (``ptxas -v``). Per
target: every call compiles; every kernel fits the per-block shared memory; no
half-precision kernel spills on sm_80 or newer (float32 kernels and the Additive
backward may; they are reported). Triton's cache and a cache of the ptxas reports
make reruns cheap. The default run compiles a representative subset of calls for
one target (sm_86: the ampere checks and the tightest shared memory of the targets
from sm_80 on); the same subset on every target, and the whole matrix, are marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

LIMITS = {75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}


def _reports(*flags: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-W", "ignore", "-m", "attnkit.backends.triton.targets", "--json"]
    proc = subprocess.run(
        [*cmd, *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if proc.returncode == 3:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check(data: dict, archs: list[int]) -> None:
    reports = data["targets"]
    assert sorted(r["arch"] for r in reports) == sorted(archs)
    for r in reports:
        arch, kernels = r["arch"], r["kernels"]
        assert not r["errors"], f"sm_{arch}: {r['errors']}"
        assert r["compiled"] == r["calls"] > 0
        names = {k["name"] for k in kernels}
        assert names >= {
            "attention_forward_kernel",
            "attention_weights_kernel",
            "attention_backward_dkdv_kernel",
            "attention_backward_dq_kernel",
        }, f"sm_{arch}: {names}"
        for k in kernels:
            where = f"sm_{arch} {k['name']} ({k['call']})"
            assert 0 < k["shared"] <= LIMITS[arch], f"{where}: {k['shared']} B of shared memory"
            assert k["registers"] > 0, f"{where}: no ptxas report"
            if arch >= 80 and k["score"] != "additive" and k["dtype"] != "fp32":
                assert k["mma"] > 0, f"{where}: no tensor-core instruction"
            exempt = k["dtype"] == "fp32" or (k["score"] == "additive" and "backward" in k["name"])
            if arch >= 80 and not exempt:
                spilled = k["spill_stores"] + k["spill_loads"]
                assert spilled == 0, f"{where}: {spilled} B of register spills"
        assert r["passed"]


DEFAULT_TARGET = 86


@pytest.mark.parametrize(
    "archs",
    [
        pytest.param([DEFAULT_TARGET], id="sm86", marks=pytest.mark.slow),
        pytest.param(sorted(LIMITS), id="every_target", marks=pytest.mark.slow),
    ],
)
@pytest.mark.torch_feature("triton")
def test_targets_compile_fit_and_keep_half_precision_in_registers(archs: list[int]) -> None:
    targets = ",".join(str(a) for a in archs)
    data = _reports("--targets", targets, "--jobs", "2")  # one child process per target
    _check(data, archs)
    if data["traced"] is not None:  # triton ops: torch.compile sees into them
        assert data["traced"] == {
            "attention_forward_kernel": ["LSE", "OUT"],
            "attention_weights_kernel": ["OUT"],
            "attention_backward_dkdv_kernel": ["DK", "DKB", "DV"],
            "attention_backward_dq_kernel": ["DQ"],
        }


@pytest.mark.slow
@pytest.mark.torch_feature("triton")
def test_the_whole_matrix_on_every_target() -> None:
    """Every score, mask kind and dtype, head dims 16..256 (odd ones too), weights and
    the backward."""
    jobs = str(max(1, min(5, os.cpu_count() or 1)))  # one child process per target
    _check(_reports("--full", "--jobs", jobs), sorted(LIMITS))


def test_the_table_and_the_command() -> None:
    from attnkit.backends.triton.targets import TargetReport, table
    from attnkit.cli import main

    report = TargetReport(86, calls=2, compiled=2)
    report.kernels.append(
        {"name": "attention_backward_dkdv_kernel", "shared": 120 * 1024, "registers": 255,
         "spill_stores": 8, "spill_loads": 4, "call": "c", "dtype": "fp16", "score": "dot",
         "mma": 12}
    )  # fmt: skip
    text = table([report])
    assert (
        "| sm_86 (RTX 30xx, A10, 99 KiB) | 2/2 | 1 | 1: attention_backward_dkdv_kernel 120 KiB"
        in text
    )
    assert "backward_dkdv_kernel fp16 8+4 B | yes | NO |" in text
    assert not report.passed and report.forbidden_spills()
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        assert main(["explain", "--gpu-targets"]) == 2  # the interpreter compiles nothing
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def test_bfloat16_is_refused_on_sm75_with_a_reason() -> None:
    import torch

    from attnkit.backends.triton.backend import arch_reason

    assert "float16" in str(arch_reason(torch.bfloat16, 75))
    assert arch_reason(torch.float16, 75) is None
    assert arch_reason(torch.bfloat16, 80) is None
    assert arch_reason(torch.bfloat16, 0) is None  # the interpreter
