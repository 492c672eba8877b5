#!/usr/bin/env bash
# Install attnkit with its test tools, then lint, type-check and run the test suite.
#
#   scripts/test.sh [--full] [pytest arguments...]
#
# The default run leaves out the tests marked `slow` (benchmarks, torch.compile checks,
# the 20,000-case fuzz campaign, the whole GPU-target and context-parallel matrices);
# --full runs them too (pytest -m "slow or not slow"). pytest runs on every core
# (pytest-xdist, at most 4 workers); `-n 0` among the arguments runs it in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
FULL=()
ARGS=()
for arg in "$@"; do
    if [[ "$arg" == "--full" ]]; then
        FULL=(-m "slow or not slow")
    else
        ARGS+=("$arg")
    fi
done
bash scripts/install.sh --test
"$PY" -m ruff check src tests examples noxfile.py
"$PY" -m ruff format --check src tests examples noxfile.py
"$PY" -m mypy
"$PY" -m pytest -n auto --maxprocesses 4 ${FULL[@]+"${FULL[@]}"} ${ARGS[@]+"${ARGS[@]}"}
