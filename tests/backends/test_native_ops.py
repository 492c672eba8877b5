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


_PATHS_SCRIPT = """
import json, math, sys, torch, attnkit
from attnkit.backends.sdpa import run as sdpa_run
for lib in sys.argv[1:]:
    torch.ops.load_library(lib)
names = [f"attnkit_check_{i}" for i in range(len(sys.argv) - 1)]
failures = []
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for E in (64, 80, 8, 3):  # whole vectors, a tail, fewer values than a vector
        gen = torch.Generator().manual_seed(E)
        q, k, v = (torch.randn(2, 3, 7, E, generator=gen).to(dtype) for _ in range(3))
        for case in ("finite", "nan_query_row", "inf_value", "zero_values"):
            qq, kk, vv = q.clone(), k.clone(), v.clone()
            if case == "nan_query_row":
                qq[0, 1, 3] = math.nan
            elif case == "inf_value":
                vv[1, 2, 0, E - 1] = math.inf
            elif case == "zero_values":
                vv.zero_()
            for causal in (False, True):
                want = sdpa_run._checked_call(qq, kk, vv, causal, 0.5, False)
                for name in names:
                    for flash in (False, True):
                        got = getattr(torch.ops, name).sdpa_settled.default(
                            qq, kk, vv, causal, 0.5, False, flash)
                        same = torch.equal(got.isnan(), want.isnan()) and torch.allclose(
                            got.nan_to_num().float(), want.nan_to_num().float(),
                            rtol=1e-2, atol=1e-3)
                        if not same:
                            failures.append([name, str(dtype), E, case, causal, flash])
print(json.dumps(failures))
"""


@pytest.mark.slow
def test_every_vector_path_of_the_output_check_gives_the_python_op_s_answer(
    tmp_path: Path,
) -> None:
    """The C++ op's output check has three paths, chosen when it is compiled: AVX-512,
    AVX2 and plain loops. Each, built here under a namespace of its own, gives the
    Python op's rows (NaN where it is NaN, and its numbers within half precision) on
    finite outputs, a NaN query row (without a mask torch's flash kernel answers it with
    a row of zeros), an inf value and all-zero values, with and without the causal mask,
    for float32, bfloat16 and float16 rows of 64, 80, 8 and 3 values."""
    from attnkit.kernels import _native_ops

    _compiler_or_skip()
    cxx = _native_ops._compiler()
    assert cxx is not None
    portable = _native_ops._flag_sets()[-1]  # no -march: plain loops
    variants = [portable]
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if " avx2 " in flags:
        variants.append([*portable, "-mavx2", "-mfma"])
    if " avx512bw " in flags:
        variants.append([*portable, "-mavx512f", "-mavx512bw"])
    code = _native_ops.source()
    libs = []
    for i, variant in enumerate(variants):
        named = code.replace("TORCH_LIBRARY_FRAGMENT(attnkit,", f"TORCH_LIBRARY(attnkit_check_{i},")
        named = named.replace(
            "TORCH_LIBRARY_IMPL(attnkit,", f"TORCH_LIBRARY_IMPL(attnkit_check_{i},"
        )
        src = tmp_path / f"check_{i}.cpp"
        src.write_text(named)
        lib = tmp_path / f"check_{i}.so"
        built = subprocess.run(
            [cxx, *variant, str(src), "-o", str(lib), *_native_ops._link_flags()],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert built.returncode == 0, built.stderr[-3000:]
        libs.append(str(lib))
    done = subprocess.run(
        [sys.executable, "-c", _PATHS_SCRIPT, *libs], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
