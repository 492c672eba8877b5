"""The compiled C++ ops (``attnkit.kernels._native_ops``): built when torch.compile first
traces a checked call, into the private per-user cache, never by an eager call; refused
where the cache is not private; and where they cannot be built, the Python op gives the
same numbers.

Loading a library of torch ops cannot be undone in a process, so each case runs in a
fresh interpreter with a cache folder of its own, and builds there (about 10 s): these
run under ``slow``. The default run builds the ops once, into the user's cache, through
the compiled calls of ``tests/integration/test_compile_traced_calls.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch_feature("compile")

_SCRIPT = """
import json, math, torch, attnkit
from attnkit import masks
from attnkit.backends.sdpa import run as sdpa_run
from attnkit.kernels import _native_ops
torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))  # (B, H, N, E)
before = _native_ops.status()
for _ in range(3):  # eager calls, planned after the first: they never build the ops
    attnkit.attention(q, k, v, mask=masks.causal())
eager = _native_ops.status()
compiled = torch.compile(lambda q, k, v: attnkit.attention(q, k, v, is_causal=True), fullgraph=True)
q[0, 1, 2, 0] = math.nan
got = compiled(q, k, v)
want = attnkit.attention(q, k, v, mask=masks.causal(), backend="reference")
same = bool(torch.equal(got.isnan(), want.isnan())) and bool(
    torch.allclose(got[~want.isnan()], want[~want.isnan()], rtol=1e-5, atol=1e-6))
print(json.dumps({"before": before, "eager": eager, "after": _native_ops.status(),
                  "op": sdpa_run.checked_op_name(), "same": same}))
"""


def _run(cache: Path, **env: str) -> dict[str, object]:
    """The script's report, run with ``cache`` as the kernel cache and ``env`` set."""
    environ = {k: v for k, v in os.environ.items() if k != "ATTNKIT_NO_COMPILE"}
    environ.update(ATTNKIT_CACHE_DIR=str(cache), **env)
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=environ, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def _compiler_or_skip() -> None:
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        pytest.skip("no C++ compiler")


@pytest.mark.slow
def test_the_first_trace_builds_the_ops_privately_and_eager_calls_never_do(tmp_path: Path) -> None:
    """Eager calls leave the ops unbuilt; the first compiled checked call builds them into
    the private cache (mode 0700, no temporary file left) and runs the C++ op, with the
    policy's NaN row."""
    _compiler_or_skip()
    cache = tmp_path / "kernels"
    report = _run(cache)
    assert "not built yet" in str(report["before"]) and report["eager"] == report["before"]
    assert report["after"] == "compiled C++ ops" and report["op"] == "sdpa_settled"
    assert report["same"]
    built = list(cache.glob("attnkit_ops_*.so"))
    assert len(built) == 1 and not list(cache.glob("*.tmp*"))
    assert stat.S_IMODE(built[0].stat().st_mode) == 0o700
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


@pytest.mark.slow
@pytest.mark.parametrize("case", ["no_compile", "open_cache", "failing_compiler"])
def test_without_the_ops_the_python_op_gives_the_same_answer(tmp_path: Path, case: str) -> None:
    """``ATTNKIT_NO_COMPILE=1``, a cache folder others can write to, and a compiler that
    fails: nothing is loaded, the status says why, and the graph runs the Python op."""
    cache = tmp_path / "kernels"
    env: dict[str, str] = {}
    if case == "no_compile":
        env["ATTNKIT_NO_COMPILE"] = "1"
    elif case == "open_cache":
        cache.mkdir()
        cache.chmod(0o777)
    else:
        env["CXX"] = shutil.which("false") or "/bin/false"
    report = _run(cache, **env)
    assert report["op"] == "sdpa_checked" and report["same"]
    assert str(report["after"]).startswith("Python ops: ")
    reason = {"no_compile": "ATTNKIT_NO_COMPILE", "open_cache": "writable by group or others",
              "failing_compiler": "building the compiled ops failed"}[case]  # fmt: skip
    assert reason in str(report["after"])
    assert not list(cache.glob("attnkit_ops_*.so"))
