"""Packaging metadata: the licence, the sdist's contents, the test extras."""

from __future__ import annotations

import ast
import re
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
    test_extra = project["optional-dependencies"]["test"]
    assert "attnkit[transformers]" in test_extra  # the tests use the supported transformers
    assert {"pytest-xdist>=3.5", "nox>=2024.4.15"} <= set(test_extra)
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


def _nox_constants() -> dict[str, str]:
    """The version constants of noxfile.py, read without importing nox."""
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    out[target.id] = node.value.value
    return out


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_the_supported_range_is_declared_once_and_tested_at_both_ends() -> None:
    """pyproject's floors are the oldest versions noxfile.py tests, and the README's table
    names the same oldest and newest versions."""
    nox = _nox_constants()
    project = _project()["project"]
    assert isinstance(project, dict)
    torch_floor = [d for d in project["dependencies"] if d.startswith("torch")]
    assert torch_floor == [f"torch>={_minor(nox['TORCH_OLDEST'])}"]
    assert project["optional-dependencies"]["transformers"] == [
        f"transformers>={_minor(nox['TRANSFORMERS_OLDEST'])}"
    ]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = {
        "torch": (nox["TORCH_OLDEST"], nox["TORCH_NEWEST"]),
        "transformers": (nox["TRANSFORMERS_OLDEST"], nox["TRANSFORMERS_NEWEST"]),
    }
    for name, (oldest, newest) in rows.items():
        row = rf"\| {name}\b[^|\n]*\| {re.escape(oldest)} \| {re.escape(newest)} \|"
        assert re.search(row, readme), f"README: no row '| {name} | {oldest} | {newest} |'"
    install = (ROOT / "scripts" / "install.sh").read_text(encoding="utf-8")
    assert f"torch=={nox['TORCH_DEFAULT']}" in install  # the transformers ends' torch
