"""Attention matrices as matplotlib figures: :func:`heatmaps` (d2l-style) and
:func:`attention_grid` (one image, fast for many panels, what ``attnkit show`` saves)."""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from .grid import as_grid, check_finite, max_pool, tile

__all__ = [
    "SCALES",
    "AttentionFigure",
    "as_grid",
    "attention_grid",
    "color_norm",
    "heatmaps",
    "named_colormap",
    "page_colormap",
]

SCALES = ("linear", "power", "log")
# The lowest weight the log scale shows: the page's one-byte weights resolve about 1/255.
LOG_FLOOR = 1e-3
# The web page's white-to-blue ramp, so the picture and the page agree.
PAGE_RAMP = ("#ffffff", "#d4e2f7", "#7fa6e0", "#2f5fd0", "#0d2463")


class AttentionFigure(Figure):
    """A matplotlib ``Figure`` that a notebook shows as its picture.

    The drawing functions build figures without pyplot, so no backend displays them:
    without this, Jupyter printed ``<Figure size ...>`` unless pyplot had been imported
    first. A notebook asks ``_repr_png_`` for the picture (when pyplot's inline backend
    is active, its own formatter answers instead: one picture either way).
    """

    def _repr_png_(self) -> bytes:
        """The figure as PNG bytes, at its own size and the default dpi."""
        buffer = io.BytesIO()
        self.savefig(buffer, format="png")
        return buffer.getvalue()


def page_colormap() -> Any:
    """The page's colour ramp as a matplotlib colormap (``"attnkit"``)."""
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list("attnkit", PAGE_RAMP)


def named_colormap(cmap: object) -> Any:
    """The matplotlib colormap called ``cmap`` (``cmap`` itself for a Colormap or None,
    matplotlib's default), else a ValueError naming the argument."""
    from matplotlib.colors import Colormap

    if cmap is None or isinstance(cmap, Colormap):
        return cmap
    try:
        return matplotlib.colormaps[cmap]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ValueError(
            f"cmap: expected a matplotlib colormap name such as 'Reds', 'Blues' or 'viridis', "
            f"got {cmap!r}"
        ) from None


def color_norm(scale: str, vmin: float = 0.0, vmax: float = 1.0) -> Any:
    """A matplotlib norm for a colour scale: "linear", "power" (square root) or "log".

    The log scale starts at ``max(vmin, LOG_FLOOR * vmax)``; smaller weights take its lowest colour.
    """
    from matplotlib.colors import LogNorm, Normalize, PowerNorm

    if scale == "linear":
        return Normalize(vmin=vmin, vmax=vmax, clip=True)
    if scale == "power":
        return PowerNorm(gamma=0.5, vmin=vmin, vmax=vmax, clip=True)
    if scale == "log":
        return LogNorm(vmin=max(vmin, LOG_FLOOR * vmax), vmax=vmax, clip=True)
    raise ValueError(f"scale: expected one of {', '.join(SCALES)}, got {scale!r}")


def _check_labels(name: str, labels: Sequence[str] | None, n: int, dim: str) -> list[str] | None:
    if labels is None:
        return None
    if isinstance(labels, str):
        raise TypeError(f"{name}: expected a list of {n} labels ({dim} = {n}), got a single str")
    out = [str(t) for t in labels]
    if len(out) != n:
        raise ValueError(f"{name}: expected {n} labels ({dim} = {n}), got {len(out)}")
    return out


def heatmaps(
    matrices: Any,
    xlabel: str = "Keys",
    ylabel: str = "Queries",
    titles: Sequence[str] | None = None,
    figsize: tuple[float, float] | None = None,
    cmap: str = "Reds",
    *,
    xticklabels: Sequence[str] | None = None,
    yticklabels: Sequence[str] | None = None,
    row_labels: Sequence[str] | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
    colorbar: bool = True,
    fontsize: float = 8.0,
) -> Figure:
    """Draw a grid of matrices (attention weights) as heatmaps.

    Args:
        matrices: (rows, cols, Q, K) tensor or array: ``matrices[i, j]`` is drawn
            in row i, column j, queries down and keys across. (Q, K) and
            (cols, Q, K) are accepted as one matrix and one row.
        xlabel: label under the bottom row (the keys).
        ylabel: label left of the first column (the queries).
        titles: one title per column (e.g. head names), or None.
        figsize: size of the whole figure in inches; None = 2.4 inches per panel
            plus room for labels (labels are laid out so none is clipped).
        cmap: a matplotlib colormap name.
        xticklabels: K key labels (tokens) shown under the bottom row, drawn as their
            text (a ``$`` is a dollar sign, not matplotlib's math).
        yticklabels: Q query labels (tokens) shown left of the first column, as text.
        row_labels: one label per row (e.g. layer names), put before ``ylabel``.
        vmin, vmax: color range shared by every panel; None = the smallest
            (largest) value of all panels, so that the one colorbar is true of each.
        colorbar: add one colorbar for the figure.
        fontsize: size of the tick labels in points.

    Returns:
        a ``matplotlib.figure.Figure`` (an :class:`AttentionFigure`, not registered
        with pyplot): a notebook shows it as a picture; save it with ``fig.savefig(path)``.

    Raises:
        ValueError: ``matrices`` of no grid's shape, or holding NaN or infinity; labels
            whose number does not fit.
    """
    grid = check_finite(as_grid(matrices, name="matrices"), "matrices")  # (rows, cols, Q, K)
    cmap = named_colormap(cmap)
    rows, cols, Q, K = grid.shape
    col_titles = _check_labels("titles", titles, cols, "cols")
    xt = _check_labels("xticklabels", xticklabels, K, "K")
    yt = _check_labels("yticklabels", yticklabels, Q, "Q")
    rl = _check_labels("row_labels", row_labels, rows, "rows")

    # One color scale for every panel: the figure has a single colorbar.
    lo = float(np.nanmin(grid)) if vmin is None else vmin
    hi = float(np.nanmax(grid)) if vmax is None else vmax
    if figsize is None:
        figsize = (2.4 * cols + 1.4, 2.4 * rows + 0.8)
    fig = AttentionFigure(figsize=figsize, layout="constrained")
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
    image = None
    for i in range(rows):
        for j in range(cols):
            ax = axes[i, j]
            image = ax.imshow(
                grid[i, j], cmap=cmap, vmin=lo, vmax=hi, interpolation="nearest", aspect="auto"
            )
            if i == rows - 1:
                ax.set_xlabel(xlabel)
            if j == 0:
                ax.set_ylabel(ylabel if rl is None else f"{rl[i]}\n{ylabel}")
            if col_titles is not None and i == 0:
                ax.set_title(col_titles[j], fontsize=fontsize + 1)
            ax.tick_params(labelsize=fontsize, length=2)
    ax0 = axes[0, 0]
    if xt is not None:
        ax0.set_xticks(range(K))
        for ax in axes[-1]:
            ax.set_xticklabels(xt, rotation=90, fontsize=fontsize, parse_math=False)
    if yt is not None:
        ax0.set_yticks(range(Q))
        for ax in axes[:, 0]:
            ax.set_yticklabels(yt, fontsize=fontsize, parse_math=False)
    if colorbar and image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6)
    return fig


def _thin(labels: list[str], step: int) -> list[str]:
    return [t if i % step == 0 else "" for i, t in enumerate(labels)]


def attention_grid(
    matrices: Any,
    tokens: Sequence[str] | None = None,
    *,
    key_tokens: Sequence[str] | None = None,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    title: str | None = None,
    cmap: str | None = None,
    max_width: float = 30.0,
    scale: str = "linear",
    colorbar: bool = True,
) -> Figure:
    """A (rows, cols) grid of attention matrices drawn as one image: fast for many panels.

    Panels are tiled into one array (one ``imshow``), separated by thin white
    gaps, with token labels left of every row and under the bottom row, column
    labels on top and row labels on the right. Colors span 0 to 1 in every
    panel, so panels compare directly. This is what ``attnkit show`` saves. Every
    label and the title are drawn as their text: a token's ``$`` is a dollar sign,
    not the start of matplotlib's math.

    Args:
        matrices: (rows, cols, Q, K) weights, e.g. (layers, heads, L, L), or a
            list of per-row weights (see :func:`attnkit.viz.grid.as_grid`). A NaN is
            drawn white, as no cell (how panels of fewer heads or tokens are padded),
            where :func:`heatmaps` refuses it.
        tokens: Q query labels (also the key labels when ``key_tokens`` is None).
        key_tokens: K key labels when keys differ from queries.
        row_labels: one label per row (e.g. ``"layer 0"``).
        col_labels: one label per column (e.g. ``"head 0"``).
        title: a line of text above the grid, or None.
        cmap: a matplotlib colormap name; None = the web page's white-to-blue ramp.
        max_width: the figure's largest width in inches; panels shrink (and
            token labels thin out) to fit. Below a pixel per token at dpi 100,
            blocks of tokens are max-pooled into one cell.
        scale: the colour scale from 0 to 1: "linear", "power" (square root:
            small weights show) or "log" (from 1e-3).
        colorbar: add a colorbar right of the grid.

    Returns:
        a ``matplotlib.figure.Figure`` (an :class:`AttentionFigure`: a notebook shows
        it as a picture) whose size in pixels is ``fig.get_size_inches() * dpi`` when
        saved (no tight bounding box).
    """
    norm = color_norm(scale)
    base = page_colormap() if cmap is None else named_colormap(cmap)
    grid = as_grid(matrices, name="matrices")  # (rows, cols, Q, K); NaN: no cell (white)
    rows, cols, Q, K = grid.shape
    yt = _check_labels("tokens", tokens, Q, "Q")
    xt = _check_labels("key_tokens", key_tokens, K, "K") if key_tokens is not None else None
    if xt is None and yt is not None and Q == K:
        xt = yt
    rl = _check_labels("row_labels", row_labels, rows, "rows")
    cl = _check_labels("col_labels", col_labels, cols, "cols")

    longest = max((len(t) for t in [*(yt or []), *(xt or [])]), default=0)
    label_in = 0.07 * min(longest, 16) + 0.2 if (xt or yt) else 0.3
    bar_in = 0.9 if colorbar else 0.0
    # Inches per token: 0.16 when it fits, less for long inputs or many panels.
    gap_tokens = max(1, round(0.15 * max(Q, K)))
    room = max_width - label_in - 1.0 - bar_in  # inches left for the panels
    if not room > 0:
        raise ValueError(
            f"max_width: {max_width} inches leaves no room for the panels next to the labels; "
            f"expected more than {label_in + 1.0 + bar_in:.2f}"
        )
    unit = min(0.16, room / (cols * K + (cols - 1) * gap_tokens))
    # Below one pixel (at dpi 100) per token, max-pool f x f tokens into one cell:
    # the picture keeps its sharp patterns and drawing stays fast.
    f = max(1, int(np.ceil(0.01 / unit)))
    grid = max_pool(grid, f)  # (rows, cols, Qc, Kc)
    Qc, Kc = grid.shape[2], grid.shape[3]
    gap = max(1, round(0.15 * max(Qc, Kc)))  # cells of white between panels
    image = tile(grid, gap)  # (rows * Qc + gaps, cols * Kc + gaps)
    H, W = image.shape
    cell = unit * f  # inches per cell
    step = max(1, int(np.ceil(0.11 / unit)))  # thin token labels closer than 0.11 in
    fontsize = max(4.0, min(8.0, unit * step * 50))

    def at(t: int) -> float:
        """Cell coordinate of token t's center."""
        return (t + 0.5) / f - 0.5

    left, bottom = label_in + 0.15, label_in + 0.35
    right = (0.9 if rl else 0.2) + bar_in
    # Whole hundredths of an inch: a whole number of pixels at dpi 100.
    fig_w = round(left + W * cell + right, 2)
    # The title wrapped to the figure's width (about 0.075 in per character at 10 pt),
    # one more line of 0.17 in each, so no word of it is cut at the right edge.
    title_lines = textwrap.wrap(title, max(12, int((fig_w - 0.24) / 0.075))) if title else []
    top = (0.45 if cl else 0.2) + (0.35 + 0.17 * (len(title_lines) - 1) if title else 0.0)
    fig_h = round(bottom + H * cell + top, 2)
    fig = AttentionFigure(figsize=(fig_w, fig_h))
    ax = fig.add_axes((left / fig_w, bottom / fig_h, W * cell / fig_w, H * cell / fig_h))
    colormap = base.with_extremes(bad="white")
    shown = ax.imshow(image, cmap=colormap, norm=norm, interpolation="nearest", aspect="auto")
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_xticks([])
    ax.set_yticks([])
    # Labels as plain texts: far cheaper to draw than hundreds of ticks.
    pad = 0.04 / cell  # 0.04 in, in cells
    if xt is not None:
        for j in range(cols):
            for k, label in enumerate(_thin(xt, step)):
                if label:
                    ax.text(
                        j * (Kc + gap) + at(k),
                        H - 0.5 + pad,
                        label,
                        rotation=90,
                        ha="center",
                        va="top",
                        fontsize=fontsize,
                        clip_on=False,
                        parse_math=False,
                    )
    if yt is not None:
        for i in range(rows):
            for q, label in enumerate(_thin(yt, step)):
                if label:
                    ax.text(
                        -0.5 - pad,
                        i * (Qc + gap) + at(q),
                        label,
                        ha="right",
                        va="center",
                        fontsize=fontsize,
                        clip_on=False,
                        parse_math=False,
                    )
    if cl is not None:
        for j, label in enumerate(cl):
            ax.text(
                j * (Kc + gap) + (Kc - 1) / 2,
                -0.5 - pad,
                label,
                ha="center",
                va="bottom",
                fontsize=fontsize + 1,
                parse_math=False,
            )
    if rl is not None:
        for i, label in enumerate(rl):
            ax.text(
                W - 0.5 + 0.1 / cell,
                i * (Qc + gap) + (Qc - 1) / 2,
                label,
                ha="left",
                va="center",
                fontsize=fontsize + 1,
                parse_math=False,
            )
    if colorbar:
        bar_h = min(H * cell, 3.0)
        bar_x = fig_w - bar_in + 0.1
        bar_y = bottom + H * cell - bar_h
        cax = fig.add_axes((bar_x / fig_w, bar_y / fig_h, 0.14 / fig_w, bar_h / fig_h))
        bar = fig.colorbar(shown, cax=cax)
        bar.ax.tick_params(labelsize=7, length=2)
        bar.set_label(f"weight ({scale})", fontsize=7)
    if title:
        fig.text(
            0.12 / fig_w, 1 - 0.1 / fig_h, "\n".join(title_lines), ha="left", va="top",
            fontsize=10,
            parse_math=False,
        )  # fmt: skip
    return fig
