"""attnkit.viz.heatmaps and attention_grid: figures of attention matrices."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import torch

from attnkit import viz

from tolerance import FLOAT32_ULPS_REL, assert_close_elementwise


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_heatmaps_grid_like_d2l() -> None:
    torch.manual_seed(0)
    m = torch.softmax(torch.randn(2, 3, 5, 7), dim=-1)  # (rows, cols, Q, K)
    fig = viz.heatmaps(m, titles=["a", "b", "c"], figsize=(6, 4))
    images = [ax for ax in fig.axes if ax.images]
    assert len(images) == 6
    assert len(fig.axes) == 7  # six panels and one colorbar
    assert [ax.get_title() for ax in images[:3]] == ["a", "b", "c"]
    assert images[3].get_xlabel() == "Keys" and images[0].get_ylabel() == "Queries"
    shown = np.asarray(images[4].images[0].get_array())
    assert_close_elementwise(shown, m[1, 1].numpy(), rel=FLOAT32_ULPS_REL)
    # One colorbar, so one color scale: the range of all panels together.
    want = (float(m.min()), float(m.max()))
    assert all(ax.images[0].get_clim() == pytest.approx(want) for ax in images)


def test_heatmaps_token_labels_and_one_matrix() -> None:
    tokens = ["[CLS]", "hello", "world", "[SEP]"]
    fig = viz.heatmaps(
        np.eye(4), xticklabels=tokens, yticklabels=tokens, xlabel="K", ylabel="Q", colorbar=False
    )
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens
    assert [t.get_text() for t in ax.get_yticklabels()] == tokens
    assert ax.get_xlabel() == "K"


def test_heatmaps_rejects_bad_shapes_and_labels() -> None:
    with pytest.raises(ValueError, match="rows, cols, Q, K"):
        viz.heatmaps(np.zeros((1, 1, 1, 2, 2)))
    with pytest.raises(ValueError, match="titles"):
        viz.heatmaps(np.zeros((1, 2, 3, 3)), titles=["only one"])
    with pytest.raises(ValueError, match="xticklabels"):
        viz.heatmaps(np.zeros((3, 3)), xticklabels=["a", "b"])


def test_attention_grid_png_has_the_expected_size() -> None:
    tokens = ["[CLS]", "the", "cat", "sat", "[SEP]"]
    torch.manual_seed(0)
    w = torch.softmax(torch.randn(2, 3, 5, 5), dim=-1)  # (layers, heads, L, L)
    fig = viz.attention_grid(
        w,
        tokens,
        row_labels=["layer 0", "layer 1"],
        col_labels=["head 0", "head 1", "head 2"],
        title="grid",
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    width, height = _png_size(buf.getvalue())
    expected = fig.get_size_inches() * 100
    assert (width, height) == (round(expected[0]), round(expected[1]))
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {"cat", "head 2", "layer 1"} <= texts


def test_attention_grid_stays_within_max_width_for_long_inputs() -> None:
    L = 300
    w = torch.full((1, 12, L, L), 1.0 / L)
    fig = viz.attention_grid(w, [f"t{i}" for i in range(L)], max_width=20.0)
    assert fig.get_size_inches()[0] <= 20.5
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert 0 < len(labels) < 12 * L + L  # thinned


def test_attention_grid_rejects_a_width_with_no_room() -> None:
    with pytest.raises(ValueError, match="max_width"):
        viz.attention_grid(np.eye(3), ["a", "b", "c"], max_width=0.5)


@pytest.mark.parametrize("scale", ["linear", "power", "log"])
def test_attention_grid_colour_scale_and_colorbar(scale: str) -> None:
    from matplotlib.colors import LogNorm, Normalize, PowerNorm

    w = torch.softmax(torch.randn(1, 2, 4, 4, generator=torch.Generator().manual_seed(1)), -1)
    fig = viz.attention_grid(w, ["a", "b", "c", "d"], scale=scale)
    grid_ax, bar_ax = fig.axes  # the panels and one colorbar
    norm = grid_ax.images[0].norm
    assert type(norm) is {"linear": Normalize, "power": PowerNorm, "log": LogNorm}[scale]
    assert norm.vmax == 1.0 and norm.vmin == (1e-3 if scale == "log" else 0.0)
    assert scale in bar_ax.get_ylabel()
    # The colorbar sits right of the panels.
    assert bar_ax.get_position().x0 > grid_ax.get_position().x1
    assert len(viz.attention_grid(w, colorbar=False).axes) == 1
    with pytest.raises(ValueError, match="scale: expected one of linear, power, log"):
        viz.attention_grid(w, scale="cubic")


def test_grid_helper_reads_per_layer_lists_like_hugging_face_attentions() -> None:
    from attnkit.viz.grid import as_grid, max_pool, tile

    layers = tuple(torch.rand(1, 3, 5, 5) for _ in range(2))  # each (1, heads, L, L)
    grid = as_grid(layers)
    assert grid.shape == (2, 3, 5, 5)
    np.testing.assert_array_equal(grid[1, 2], layers[1][0, 2].numpy())
    pooled = max_pool(grid, 2)
    assert pooled.shape == (2, 3, 3, 3) and pooled[0, 0, 0, 0] == grid[0, 0, :2, :2].max()
    image = tile(grid, gap=1)
    assert image.shape == (2 * 5 + 1, 3 * 5 + 2) and np.isnan(image[5]).all()
    with pytest.raises(ValueError, match="one shape"):
        as_grid([torch.rand(3, 5, 5), torch.rand(3, 4, 4)])


def test_a_notebook_shows_the_figures_without_pyplot() -> None:
    m = torch.softmax(torch.randn(1, 2, 4, 4, generator=torch.Generator().manual_seed(0)), -1)
    for fig in (viz.heatmaps(m, figsize=(3, 2)), viz.attention_grid(m, ["a", "b", "c", "d"])):
        png = fig._repr_png_()
        w, h = _png_size(png)
        assert (w, h) == tuple(round(x * fig.dpi) for x in fig.get_size_inches())
    formatters = pytest.importorskip("IPython.core.formatters")
    assert _png_size(formatters.PNGFormatter()(fig))[0] > 0  # what Jupyter calls


TOKENS_WITH_DOLLARS = ["a", "$$", "$\\alpha$", "b"]


def test_tokens_with_dollar_signs_are_drawn_as_their_text() -> None:
    # matplotlib reads "$...$" as math: "$$" failed at savefig, "$\alpha$" drew an alpha.
    w = torch.softmax(torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(0)), -1)
    grid = viz.attention_grid(w, TOKENS_WITH_DOLLARS, row_labels=["$$"], title="m $x^2$")
    maps = viz.heatmaps(w[0, 0], xticklabels=TOKENS_WITH_DOLLARS, yticklabels=TOKENS_WITH_DOLLARS)
    for fig in (grid, maps):
        fig.savefig(io.BytesIO(), format="png")
    drawn = [t for t in grid.findobj(lambda o: hasattr(o, "get_parse_math")) if t.get_text()]
    shown = {t.get_text() for t in drawn}
    assert set(TOKENS_WITH_DOLLARS) | {"$$", "m $x^2$"} <= shown
    assert not any(t.get_parse_math() for t in drawn if "$" in t.get_text())
    ticks = [*maps.axes[0].get_xticklabels(), *maps.axes[0].get_yticklabels()]
    assert [t.get_text() for t in ticks] == TOKENS_WITH_DOLLARS * 2
    assert not any(t.get_parse_math() for t in ticks)


def test_a_long_title_is_wrapped_inside_a_narrow_picture() -> None:
    # one layer and one head: the title was wider than the picture and cut at its edge
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    w = torch.softmax(torch.randn(1, 1, 6, 6, generator=torch.Generator().manual_seed(0)), -1)
    title = "a model: self-attention of each layer (rows) and head (columns); queries down"
    fig = viz.attention_grid(w, list("abcdef"), title=title)
    renderer = FigureCanvasAgg(fig).get_renderer()
    (shown,) = [t for t in fig.texts if t.get_text().replace("\n", " ") == title]
    box = shown.get_window_extent(renderer)
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width
    assert 0 <= box.y0 and box.y1 <= fig.bbox.height
    assert "\n" in shown.get_text()
