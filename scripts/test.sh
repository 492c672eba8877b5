#!/usr/bin/env bash
# Install attnkit with its test tools, then lint, type-check and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
bash scripts/install.sh --test
"$PY" -m ruff check src tests examples
"$PY" -m ruff format --check src tests examples
"$PY" -m mypy
"$PY" -m pytest "$@"
