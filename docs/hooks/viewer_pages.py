"""mkdocs hook: the viewer guide's real offline pages, made by ``attnkit show`` when the
site is built.

Each entry of ``PAGES`` is the arguments of one ``attnkit show`` run on the default
model (all-MiniLM-L6-v2, read offline from an installed package); its page becomes
``viewer-pages/NAME`` of the site, which the guide links and shows in a frame. The pages
are made by the viewer as it is, so they never drift from it, and the repository holds
no built copy of the viewer's scripts.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any

TEXT = "The animal didn't cross the street because it was too tired."

# file name under viewer-pages/ -> the arguments of `attnkit show` before its outputs
PAGES: dict[str, list[str]] = {
    "the-animal.html": [TEXT],
    "compare.html": [TEXT, "--compare", TEXT.replace("tired", "wide")],
}


def make_page(args: list[str], folder: Path, name: str) -> bytes:
    """The page of ``attnkit show ARGS`` (written in ``folder``), as bytes."""
    from mkdocs.exceptions import PluginError

    from attnkit.cli import main

    out = folder / name
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    said = io.StringIO()  # the command's summary: shown only when it fails
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        code = main(["show", *args, "--out", str(out), "--no-png", "--quiet"])
    if code != 0:
        raise PluginError(f"viewer_pages: attnkit show {' '.join(args)} failed:\n{said.getvalue()}")
    return out.read_bytes()


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    from mkdocs.structure.files import File

    with tempfile.TemporaryDirectory(prefix="attnkit-docs-pages-") as folder:
        for name, args in PAGES.items():
            content = make_page(args, Path(folder), name)
            files.append(File.generated(config, f"viewer-pages/{name}", content=content))
    return files
