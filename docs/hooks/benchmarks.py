"""mkdocs hook: the performance page carries BENCHMARKS.md as it is in the repository.

A page holding the line ``<!-- BENCHMARKS.md -->`` gets, in its place, the body of the
repository's BENCHMARKS.md (its title left out, each heading one level down), so the
site's figures are the measured ones and never a copy that drifts. A link from that
file to a page of the site is pointed at the page; a link to another file of the
repository becomes its plain text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MARKER = "<!-- BENCHMARKS.md -->"
ROOT = Path(__file__).resolve().parents[2]


def benchmarks_markdown(page_dir: str) -> str:
    """BENCHMARKS.md's body for a page in ``page_dir`` (relative to docs/)."""
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    text = re.sub(r"\A# .*\n", "", text)
    up = "../" * len(Path(page_dir).parts)

    def link(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if re.match(r"[a-z]+://|#", target):
            return match.group(0)
        if target.startswith("docs/"):
            return f"[{label}]({up}{target.removeprefix('docs/')})"
        return label

    text = re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", link, text)
    fenced = False
    lines = []
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("#"):
            line = "#" + line
        lines.append(line)
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER in markdown:
        page_dir = str(Path(page.file.src_uri).parent)
        return markdown.replace(MARKER, benchmarks_markdown("" if page_dir == "." else page_dir))
    return markdown
