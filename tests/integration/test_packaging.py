"""Packaging: the licence, the sdist's contents, the test extras, the wheel's files."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

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
    included = {
        name for line in manifest if line.startswith("include ") for name in line.split()[1:]
    }
    assert "graft tests" in manifest
    # the tests read noxfile.py (test_packaging) and the docs build reads mkdocs.yml
    assert {"LICENSE", "README.md", "CHANGELOG.md", "noxfile.py", "mkdocs.yml"} <= included
    for name in ("reference.py", "cases.py", "conftest.py"):
        assert (ROOT / "tests" / name).is_file()
    package_data = _project()["tool"]["setuptools"]["package-data"]["attnkit"]  # type: ignore[index]
    assert {"py.typed", "kernels/*.c", "kernels/*.cpp", "viz/static/*"} <= set(package_data)


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
    """pyproject's floors are the oldest versions noxfile.py tests, the gated features'
    highest torch floor (attnkit/_torch_features.py) is noxfile's torch_oldest end, and
    the README's table names the same versions."""
    from attnkit import _torch_features

    nox = _nox_constants()
    project = _project()["project"]
    assert isinstance(project, dict)
    torch_floor = [d for d in project["dependencies"] if d.startswith("torch")]
    assert torch_floor == [f"torch>={_minor(nox['TORCH_FLOOR'])}"]
    floor = ".".join(map(str, _torch_features.PACKAGE_FLOOR))
    assert floor == _minor(nox["TORCH_FLOOR"])  # the record's floor is pyproject's
    every_feature = max(f.floor for f in _torch_features.FEATURES.values())
    assert ".".join(map(str, every_feature)) == _minor(nox["TORCH_OLDEST"])
    assert project["optional-dependencies"]["transformers"] == [
        f"transformers>={_minor(nox['TRANSFORMERS_OLDEST'])}"
    ]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = {  # a row's first cell starts with its name
        "torch": (nox["TORCH_FLOOR"], nox["TORCH_NEWEST"]),
        "torch, every feature": (nox["TORCH_OLDEST"], nox["TORCH_NEWEST"]),
        "transformers": (nox["TRANSFORMERS_OLDEST"], nox["TRANSFORMERS_NEWEST"]),
    }
    for name, (oldest, newest) in rows.items():
        cell = rf"\| {re.escape(name)}(?: [^|\n]*)?"
        row = rf"{cell}\| {re.escape(oldest)} \| {re.escape(newest)} \|"
        assert re.search(row, readme), f"README: no row '| {name} | {oldest} | {newest} |'"
    install = (ROOT / "scripts" / "install.sh").read_text(encoding="utf-8")
    assert f"torch=={nox['TORCH_DEFAULT']}" in install  # the transformers ends' torch


def test_noxfile_tests_the_floor_with_the_newest_transformers() -> None:
    """The torch floor is an end of its own in the default nox run, next to the others."""
    text = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    assert '"torch_floor": (TORCH_FLOOR, TRANSFORMERS_NEWEST)' in text
    assert "nox.options.sessions = [*ENDS" in text
    for end in ("torch_floor", "torch_oldest", "torch_newest", "transformers_oldest"):
        assert f"def {end}(session" in text


def _package_files() -> set[str]:
    """Every file of the package in the checkout, as the wheel names it (attnkit/...)."""
    src = ROOT / "src"
    skip = {"__pycache__"}
    return {
        p.relative_to(src).as_posix()
        for p in (src / "attnkit").rglob("*")
        if p.is_file() and not skip & set(p.parts) and p.suffix not in (".pyc", ".so")
    }


def test_the_wheel_holds_every_package_file(tmp_path: Path) -> None:
    """The wheel setuptools builds from this checkout lists every file of the package:
    the modules and the data the package reads at run time (viz/static/*, kernels/*.c,
    py.typed). Built without build isolation from a copy of the sources (a few seconds);
    scripts/check_wheel.sh builds it the release way and runs `attnkit show` from it."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} is older than the build requires (77)")
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, tree / name)
    dist = tmp_path / "dist"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from setuptools import build_meta; print(build_meta.build_wheel({str(dist)!r}))",
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = dist / done.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as zf:
        listed = set(zf.namelist())
    package = _package_files()
    data = {f for f in package if not f.endswith(".py")}
    assert {"attnkit/py.typed", "attnkit/kernels/native.c", "attnkit/kernels/native_ops.cpp",
            "attnkit/viz/static/page.html"} <= data  # fmt: skip
    assert not package - listed, f"missing from the wheel: {sorted(package - listed)}"
    assert any(f.endswith("entry_points.txt") for f in listed)
