#!/usr/bin/env bash
# The checks that need a CUDA device, in one run:
#   1. the conformance suite's CUDA half: every test parametrized over (device, backend)
#      with device "cuda" (sdpa, triton compiled, chunked, reference against the float64
#      oracle), CUDA graphs, and dispatch on CUDA;
#   2. the GPU benchmark suite, `attnkit bench --device cuda`.
# Usage: scripts/gpu_check.sh OUTDIR [TEST_SECONDS] [BENCH_SECONDS]
# Writes OUTDIR/env.txt, tests.log, gpu_tests.xml, bench.log and bench_cuda.json (and
# blocking.log after an illegal memory access: the triton tests again, one launch at a
# time, so the faulting kernel is named). Each
# step stops at its time limit (defaults 600 s and 300 s); WORKERS sets pytest's workers.
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUTDIR [TEST_SECONDS] [BENCH_SECONDS]}
mkdir -p "$out"
py=${PYTHON:-python3}
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "scripts/gpu_check.sh: no CUDA device (torch.cuda.is_available() is False)" >&2
  exit 3
fi
"$py" - <<'PY' 2>&1 | tee "$out/env.txt"
import platform

import torch

import attnkit
from attnkit.backends import dispatch

print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
try:
    import triton

    print("triton", triton.__version__)
except ImportError:
    print("triton: not installed")
print("cuda backends", dispatch.backends_for("cuda"))
print("triton backend:", attnkit.get_backend("triton").is_available() or "available")
PY
timeout "${2:-600}" "$py" -m pytest tests/conformance tests/backends \
  tests/integration/test_cuda_graphs.py tests/unit/test_dispatch_devices.py -k cuda \
  -n "${WORKERS:-8}" -p no:cacheprovider --tb=short -rfE -v \
  --junitxml="$out/gpu_tests.xml" >"$out/tests.log" 2>&1
echo "tests: exit $?"
grep -E "^(FAILED|ERROR)|(passed|failed).* in " "$out/tests.log" | tail -n 40
# A kernel's illegal memory access is reported at a later synchronization, often in
# another test on the same worker: run the triton tests again one at a time with
# synchronous launches, so the first failure names the kernel that faulted.
if grep -q "illegal memory access" "$out/tests.log"; then
  CUDA_LAUNCH_BLOCKING=1 timeout "${BLOCKING_SECONDS:-240}" "$py" -m pytest tests/conformance \
    tests/backends -k "cuda and triton" -n 0 -x -p no:cacheprovider --tb=long -rfE \
    >"$out/blocking.log" 2>&1
  echo "synchronous triton rerun: exit $? (blocking.log)"
  grep -E "^(FAILED|ERROR)|Error|(passed|failed).* in " "$out/blocking.log" | tail -n 20
fi
timeout "${3:-300}" "$py" -m attnkit bench --device cuda --json "$out/bench_cuda.json" \
  >"$out/bench.log" 2>&1
echo "bench: exit $?"
grep -v "^\[" "$out/bench.log" | head -n 20
