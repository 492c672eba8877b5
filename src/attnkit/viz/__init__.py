"""Pictures of attention: capture weights from a model, draw heatmaps, write a web page.

- :func:`capture` records the exact weights of a module's attention layers.
- :func:`heatmaps` draws a (rows, cols, Q, K) grid of matrices (matplotlib).
- :func:`attention_grid` draws a (layers, heads, L, L) grid fast, as one image.
- :func:`to_html` writes a self-contained page with a head view, a matrix view
  and a model view; :func:`show` returns it as a :class:`Page`, which Jupyter
  displays inline. Hugging Face ``outputs.attentions`` are accepted as they are.

matplotlib is imported only when a drawing function is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .capture import AttentionRecord, Capture, capture
from .html import AttentionSet, Page, render_html, show, to_html

if TYPE_CHECKING:
    from .heatmap import attention_grid, heatmaps

__all__ = [
    "AttentionRecord",
    "AttentionSet",
    "Capture",
    "Page",
    "attention_grid",
    "capture",
    "heatmaps",
    "render_html",
    "show",
    "to_html",
]


def __getattr__(name: str) -> Any:
    if name in ("heatmaps", "attention_grid"):
        from . import heatmap

        return getattr(heatmap, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
