"""What ``attnkit show`` prints and the picture it saves.

The terminal gets the tokens (elided when long), each layer's most focused
head with its pattern class (the classes of :mod:`attnkit.viz.stats`, as on
the page's statistics table), and where the files are. The picture is the
layers × heads grid of every kind of attention the page holds.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..viz.reduce import ReducedSet
from ..viz.stats import describe
from ..viz.tokens import mark

__all__ = ["elide_text", "focus_lines", "open_page", "save_picture", "tokens_line"]

_HEAD, _TAIL = 40, 10  # tokens printed before and after the elision


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_text(text: str) -> str:
    """``text`` with its control characters written out (``\\x1b``): a token or a text
    from elsewhere must not move the cursor, clear the screen or retitle the terminal.
    Newlines and tabs stay."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def tokens_line(tokens: Sequence[str]) -> str:
    """``tokens: the ·cat ·sat …``, the middle elided past 50 tokens."""
    shown = [mark(t) for t in tokens]
    if len(shown) > _HEAD + _TAIL:
        hidden = len(shown) - _HEAD - _TAIL
        shown = [*shown[:_HEAD], f"… ({hidden:,} more) …", *shown[-_TAIL:]]
    return terminal_text("tokens: " + " ".join(shown))


def elide_text(text: str, limit: int = 300) -> str:
    """The text, cut in the middle past ``limit`` characters (control characters written
    out, :func:`terminal_text`)."""
    if len(text) > limit:
        keep = limit // 2
        text = f"{text[:keep]} … ({len(text) - 2 * keep:,} more characters) … {text[-keep // 2 :]}"
    return terminal_text(text)


def focus_lines(s: ReducedSet, layers: Sequence[int], heads: Sequence[int]) -> list[str]:
    """One line per layer: its head with the lowest mean entropy, and that head's class."""
    ent = np.asarray(s.stats["entropy"])  # (layers, heads)
    width = max(len(str(h)) for h in heads)
    lines = []
    for li, layer in enumerate(layers):
        hi = int(np.argmin(ent[li]))
        lines.append(
            f"  layer {layer}: head {heads[hi]:<{width}}  entropy {float(ent[li, hi]):.2f} nats, "
            + terminal_text(describe(s.stats, li, hi))
        )
    return lines


def page_views(sets: Sequence[Any], first: Sequence[str] = ()) -> str:
    """The views a written page offers, as its closing line names them: ``first`` (the
    image view of a picture's page, the Explain view of ``--explain``), then the five every page has, and the neuron view
    where a set kept its queries and keys."""
    names = [*first, "head", "matrix", "model", "statistics", "rollout"]
    if any(getattr(s, "neuron", None) is not None for s in sets):
        names.append("neuron")
    return ", ".join(names[:-1]) + f" and {names[-1]} views"


def _panels(s: ReducedSet) -> np.ndarray:
    """(layers, heads, Q', K') what the picture draws: every weight, or the block max."""
    if s.dense is not None:
        return s.dense.astype(np.float32)
    assert s.pooled_max is not None
    return s.pooled_max.astype(np.float32)


def save_picture(
    sets: Sequence[ReducedSet], path: Path, fmt: str, model_name: str, scale: str
) -> tuple[int, int] | None:
    """Draw every set's layers × heads grid in one picture; the PNG's size, or None for SVG."""
    from ..viz.heatmap import attention_grid

    first = sets[0]
    if len(sets) == 1 and first.dense is not None:
        grid = _panels(first)
        kwargs: dict[str, Any] = {
            "tokens": [mark(t) for t in first.tokens],
            "key_tokens": [mark(t) for t in first.key_tokens] if first.key_tokens else None,
        }
        rows = list(first.layer_labels)
        title = f"{model_name}: {first.name} of each layer (rows) and head (columns); " \
                "queries down, keys across"  # fmt: skip
    else:
        panels = [_panels(s) for s in sets]
        Q = max(p.shape[2] for p in panels)
        K = max(p.shape[3] for p in panels)
        H = max(p.shape[1] for p in panels)
        stacked = []
        rows = []
        for s, p in zip(sets, panels, strict=True):
            padded = np.full((p.shape[0], H, Q, K), np.nan, np.float32)
            padded[:, : p.shape[1], : p.shape[2], : p.shape[3]] = p
            stacked.append(padded)
            short = s.name.split(" (")[0].replace("self-attention", "self").replace(
                "cross-attention", "cross")  # fmt: skip
            rows += [f"{short}, {label}" for label in s.layer_labels]
        grid = np.concatenate(stacked)
        kwargs = {}
        what = ", ".join(s.name for s in sets)
        pooled = " (long input: each cell is the max of a block of tokens)" if first.long else ""
        title = f"{model_name}: {what}; rows: kind and layer, columns: heads{pooled}"
    fig = attention_grid(grid, row_labels=rows, col_labels=list(first.head_labels),
                         title=title, scale=scale, **kwargs)  # fmt: skip
    fig.savefig(path, dpi=100, format=fmt)
    if fmt != "png":
        return None
    with path.open("rb") as f:
        head = f.read(24)
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def open_page(page: Path) -> None:
    """Open ``page`` in the default web browser (``--open``); a warning when there is none."""
    import webbrowser

    url = page.resolve().as_uri()
    if webbrowser.open(url):
        print(f"opened {url}")
    else:
        print(f"attnkit show: warning: no web browser to open {url}", file=sys.stderr)
