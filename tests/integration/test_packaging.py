"""Packaging metadata: the licence, the sdist's contents, the test extras."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_licence_is_an_spdx_string_with_its_file() -> None:
    data = _project()
    project = data["project"]
    assert isinstance(project, dict)
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "attnkit contributors" in text
    assert not any("License ::" in c for c in project["classifiers"])  # the SPDX string says it
    requires = data["build-system"]["requires"]  # type: ignore[index]
    assert requires == ["setuptools>=77"]


def test_metadata_and_test_extras() -> None:
    project = _project()["project"]
    assert isinstance(project, dict)
    assert project["keywords"] and project["classifiers"]
    assert "torch>=2.4" in project["dependencies"]
    test_extra = project["optional-dependencies"]["test"]
    assert "transformers" in test_extra
    assert "triton>=3.0; platform_system == 'Linux'" in test_extra


def test_sdist_manifest_carries_the_tests_and_package_data() -> None:
    manifest = (ROOT / "MANIFEST.in").read_text(encoding="utf-8").splitlines()
    assert (
        "graft tests" in manifest
        and "include LICENSE README.md CHANGELOG.md BENCHMARKS.md" in manifest
    )
    for name in ("reference.py", "cases.py", "conftest.py"):
        assert (ROOT / "tests" / name).is_file()
    package_data = _project()["tool"]["setuptools"]["package-data"]["attnkit"]  # type: ignore[index]
    assert {"py.typed", "kernels/*.c", "viz/static/*"} <= set(package_data)
