"""The supported range, tested at each end: one nox session per end, and a summary.

    nox                          every end, then the summary table
    nox -s torch_floor           one end (its own virtual environment under .nox/)
    nox -s summary               the table of the last results, without running anything

Each end builds its own virtual environment, installs torch first at an explicit
version (a bare ``torch`` requirement pulls a CUDA build of whatever is newest), then
attnkit with its test tools and the transformers of that end, and runs the default
test suite (``pytest``: conformance, unit, backends and integration tests, without
the ``slow`` ones) on every core. Each end leaves pytest's JUnit XML and the versions
it ran under in ``.nox/matrix/``, which the summary reads.

An end whose versions are those of the environment the command runs in (CI's own,
after the README's test command) is not installed again when that run left its
results: ``ATTNKIT_HOST_RESULTS=DIR`` names a folder holding that run's JUnit XML
(``host.xml``) and versions (``host.json``, written by ``python noxfile.py
--host-versions``); the end takes those results, marked as the host's, and is skipped.

An environment with a CUDA build of torch takes about 6 GB. With
``ATTNKIT_NOX_DISCARD=1`` (CI sets it) each end removes its environment once its
results are written, so that only one lies on disk at a time; without it the
environments stay for ``nox -r`` to reuse.

The versions below are the tested ends of the range that ``pyproject.toml`` and the
README declare (``tests/integration/test_packaging.py`` checks that the three agree).
torch has two lower ends: the package floor (``torch_floor``: attnkit installs and
runs there; the features with a torch floor of their own, listed once in
``attnkit/_torch_features.py``, refuse with one line and their tests are skipped), and
the oldest torch on which every feature runs (``torch_oldest``: the highest of those
floors, where nothing is skipped for the torch version).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import nox

# The ends of the supported range, each tested by one session below.
TORCH_FLOOR = "2.6.0"  # pyproject's torch floor (transformers' own)
TORCH_OLDEST = "2.12.1"  # every feature of attnkit/_torch_features.py runs from here on
TORCH_NEWEST = "2.15.0"
TRANSFORMERS_OLDEST = "5.0.0"
TRANSFORMERS_NEWEST = "5.24.0"
# torch for the transformers ends: the version scripts/install.sh installs (a CPU
# build, which pip may take from a local wheel cache).
TORCH_DEFAULT = "2.13.0"

ROOT = Path(__file__).resolve().parent
REPORTS = ROOT / ".nox" / "matrix"

# A machine may cap pip's choice of torch with a constraints file (PIP_CONSTRAINT or
# pip's own configuration); the versions here are explicit, so every install in these
# environments replaces it by an empty one, and only there (the rest of pip's
# configuration, such as a local wheel folder, stays).
PIP_ENV = {"PIP_CONSTRAINT": os.devnull}

ENDS = {
    "torch_floor": (TORCH_FLOOR, TRANSFORMERS_NEWEST),
    "torch_oldest": (TORCH_OLDEST, TRANSFORMERS_NEWEST),
    "torch_newest": (TORCH_NEWEST, TRANSFORMERS_NEWEST),
    "transformers_oldest": (TORCH_DEFAULT, TRANSFORMERS_OLDEST),
    "transformers_newest": (TORCH_DEFAULT, TRANSFORMERS_NEWEST),
}

nox.options.sessions = [*ENDS, "summary"]

_VERSIONS = "import torch, transformers; print(torch.__version__, transformers.__version__)"


def _base(version: str) -> str:
    """A version without its local part: ``2.13.0+cpu`` -> ``2.13.0``."""
    return version.split("+", 1)[0]


def _host_results(torch_version: str, transformers_version: str) -> Path | None:
    """The folder of the host run's results when its versions are this end's, else None."""
    folder = os.environ.get("ATTNKIT_HOST_RESULTS")
    if not folder:
        return None
    meta, junit = Path(folder) / "host.json", Path(folder) / "host.xml"
    if not (meta.exists() and junit.exists()):
        return None
    host = json.loads(meta.read_text())
    same = _base(host["torch"]) == torch_version and host["transformers"] == transformers_version
    return Path(folder) if same else None


def _run_end(session: nox.Session, torch_version: str, transformers_version: str) -> None:
    """Install one end of the range into the session's environment and run the tests."""
    REPORTS.mkdir(parents=True, exist_ok=True)
    junit = REPORTS / f"{session.name}.xml"
    meta = REPORTS / f"{session.name}.json"
    junit.unlink(missing_ok=True)
    meta.unlink(missing_ok=True)
    host = _host_results(torch_version, transformers_version)
    if host is not None:
        shutil.copyfile(host / "host.xml", junit)
        record = json.loads((host / "host.json").read_text())
        meta.write_text(json.dumps({**record, "stage": "done", "minutes": 0.0, "host": True}))
        session.skip(f"torch {record['torch']} and transformers {record['transformers']} are "
                     "the host's: its test run's results stand for this end")  # fmt: skip
    record = {"torch": torch_version, "transformers": transformers_version, "stage": "install"}
    start = time.monotonic()
    try:
        session.install(f"torch=={torch_version}", env=PIP_ENV)
        # torch again, pinned, so that nothing the test tools require moves it.
        session.install(
            "-e", ".[test]", f"torch=={torch_version}",
            f"transformers=={transformers_version}", env=PIP_ENV,
        )  # fmt: skip
        out = session.run("python", "-c", _VERSIONS, silent=True)
        if out is None:  # ``nox --install-only``: nothing ran, nothing to record
            return
        record["torch"], record["transformers"] = str(out).split()[-2:]
        record["stage"] = "tests"
        session.run(
            "python", "-m", "pytest", "-n", "auto", "--maxprocesses", "4",
            f"--junitxml={junit}", *session.posargs,
        )  # fmt: skip
        record["stage"] = "done"
    finally:
        record["minutes"] = round((time.monotonic() - start) / 60, 2)
        meta.write_text(json.dumps(record))
        if os.environ.get("ATTNKIT_NOX_DISCARD") == "1":
            shutil.rmtree(str(session.virtualenv.location), ignore_errors=True)


@nox.session
def torch_floor(session: nox.Session) -> None:
    """The oldest torch attnkit installs on, with the newest transformers; the tests of
    features whose torch floor is higher are skipped (attnkit/_torch_features.py)."""
    _run_end(session, *ENDS["torch_floor"])


@nox.session
def torch_oldest(session: nox.Session) -> None:
    """The oldest torch on which every feature runs, with the newest transformers."""
    _run_end(session, *ENDS["torch_oldest"])


@nox.session
def torch_newest(session: nox.Session) -> None:
    """The newest torch, with the newest transformers."""
    _run_end(session, *ENDS["torch_newest"])


@nox.session
def transformers_oldest(session: nox.Session) -> None:
    """The oldest transformers the integration supports, with the default torch."""
    _run_end(session, *ENDS["transformers_oldest"])


@nox.session
def transformers_newest(session: nox.Session) -> None:
    """The newest transformers, with the default torch."""
    _run_end(session, *ENDS["transformers_newest"])


def _counts(junit: Path) -> tuple[int, int, int, float]:
    """(passed, failed, skipped, minutes) from pytest's JUnit XML; errors count as failed."""
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = failed = skipped = 0
    seconds = 0.0
    for suite in suites:
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
        seconds += float(suite.get("time", 0.0))
    return total - failed - skipped, failed, skipped, seconds / 60


def summary_table(reports: Path = REPORTS) -> list[str]:
    """The matrix's results, one row per end, as the lines of a Markdown table."""
    lines = [
        "| session | torch | transformers | passed | failed | skipped | pytest min | session min |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (torch_version, transformers_version) in ENDS.items():
        meta_path, junit = reports / f"{name}.json", reports / f"{name}.xml"
        if not meta_path.exists():
            lines.append(f"| {name} | {torch_version} | {transformers_version} | not run | | | | |")
            continue
        meta = json.loads(meta_path.read_text())
        head = f"| {name} | {meta['torch']} | {meta['transformers']} |"
        if junit.exists():
            passed, failed, skipped, minutes = _counts(junit)
            cells = f" {passed} | {failed} | {skipped} | {minutes:.1f} |"
        else:  # the install (or pytest's start) failed before any report was written
            cells = f" {meta['stage']} failed | | | |"
        took = "the host's run" if meta.get("host") else f"{meta['minutes']:.1f}"
        lines.append(f"{head}{cells} {took} |")
    return lines


@nox.session(python=False)
def summary(session: nox.Session) -> None:
    """Print the table of the ends' last results (read from their JUnit reports)."""
    for line in summary_table():
        print(line)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site into site/ with ``mkdocs build --strict``.

    Not in the default sessions. Any warning fails the build: a docstring the
    reference cannot read, a broken link, a page outside the nav, an asset loaded from
    another host.
    """
    session.install(f"torch=={TORCH_DEFAULT}", env=PIP_ENV)
    session.install("-e", ".[docs]", f"torch=={TORCH_DEFAULT}", env=PIP_ENV)
    session.run("mkdocs", "build", "--strict", *session.posargs)


def host_versions() -> dict[str, str]:
    """The torch and transformers versions of the running interpreter."""
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


if __name__ == "__main__":  # python noxfile.py --host-versions > DIR/host.json
    import sys

    if sys.argv[1:] != ["--host-versions"]:
        sys.exit("usage: python noxfile.py --host-versions")
    print(json.dumps(host_versions()))
