"""Data flows one way between attnkit's folders: the command line uses the viewer, the
viewer uses the models and the core, never the reverse.

Every ``import`` and ``from ... import`` of each module is read from its source (lazy
imports inside functions included) and resolved to an attnkit folder.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "attnkit"

# folder -> folders it must never import (directly or from a function body)
FORBIDDEN = {
    "viz": ("commands", "cli"),
    "models": ("commands", "cli"),
    "backends": ("commands", "cli", "viz", "models", "nn", "integrations", "distributed"),
    "masks": ("commands", "cli", "viz", "models", "nn", "integrations", "distributed"),
}


def _imported(module: Path) -> list[tuple[int, str]]:
    """(line, dotted attnkit module) of every attnkit import in ``module``."""
    parts = module.relative_to(SRC.parent).with_suffix("").parts  # ("attnkit", "viz", ...)
    package = parts[:-1]  # the package a relative import starts from
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("attnkit")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            if name.startswith("attnkit"):
                out.append((node.lineno, name))
    return out


def _top(dotted: str) -> str:
    """The folder (or top-level module) of ``attnkit.<folder>...``."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_folder_imports_one_above_it(folder: str) -> None:
    wrong = [
        f"{py.relative_to(SRC)}:{line} imports {name}"
        for py in sorted((SRC / folder).rglob("*.py"))
        for line, name in _imported(py)
        if _top(name) in FORBIDDEN[folder]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_reader_sees_relative_imports() -> None:
    """The check can fail: a relative import three levels up, inside a function, is
    resolved to the folder it names (viz/sources/ reads models/ this way)."""
    probe = SRC / "viz" / "sources" / "resolve.py"
    names = [n for _, n in _imported(probe)]
    assert any(n.startswith("attnkit.models") for n in names), names
