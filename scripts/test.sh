#!/usr/bin/env bash
# Install attnkit with its test tools, then lint, type-check and run the test suite.
#
#   scripts/test.sh [--full] [pytest arguments...]
#
# The default run leaves out the tests marked `slow` (benchmarks, torch.compile checks,
# the 20,000-case fuzz campaign); --full runs them too (pytest -m "slow or not slow").
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
"$PY" -m ruff check src tests examples
"$PY" -m ruff format --check src tests examples
"$PY" -m mypy
"$PY" -m pytest ${FULL[@]+"${FULL[@]}"} ${ARGS[@]+"${ARGS[@]}"}
