#!/usr/bin/env bash
# Install attnkit into the current Python environment.
#   scripts/install.sh          the package and its default model (for `attnkit show`)
#   scripts/install.sh --test   the package with the test tools and peers (for scripts/test.sh)
# torch is installed first, pinned to 2.13.0, only when no torch is present: a bare
# `torch` requirement would otherwise pull a multi-gigabyte CUDA build. The package
# itself accepts any torch in its supported range (pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
PIP=("$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore)

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "installing torch==2.13.0 (no torch found)"
    "${PIP[@]}" "torch==2.13.0"
fi

if [ "${1:-}" = "--test" ]; then
    "${PIP[@]}" -e ".[test]"
    if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
        echo "installing chromium for the browser test"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
            >/dev/null 2>&1 || echo "warning: chromium could not be installed; the browser test will skip"
    fi
else
    "${PIP[@]}" -e ".[model]"
fi
# pyenv keeps console scripts behind shims; refresh them so `attnkit` is on PATH.
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
