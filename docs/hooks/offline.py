"""mkdocs hook: the built site loads nothing from another host.

Every page is checked as it is written: a script, style sheet, font, image or frame
whose address starts with ``http://``, ``https://`` or ``//`` fails the build. Links a
reader clicks (``<a href>``) may point anywhere.
"""

from __future__ import annotations

import re
from typing import Any

from mkdocs.exceptions import PluginError

_ASSET = re.compile(
    r"<(?:script|img|iframe|source|video|audio)\b[^>]*\bsrc=[\"']?((?:https?:)?//[^\"' >]+)"
    r"|<link\b[^>]*\bhref=[\"']?((?:https?:)?//[^\"' >]+)"
    r"|@import\s+(?:url\()?[\"']?((?:https?:)?//[^\"') ]+)"
    r"|url\([\"']?((?:https?:)?//[^\"') ]+)",
    re.I,
)


def remote_assets(html: str) -> list[str]:
    """The addresses on another host that ``html`` would load."""
    return [next(g for g in m.groups() if g) for m in _ASSET.finditer(html)]


def on_post_page(output: str, page: Any, **kwargs: Any) -> str:
    found = remote_assets(output)
    if found:
        raise PluginError(f"{page.file.src_uri} loads from another host: {', '.join(found)}")
    return output
