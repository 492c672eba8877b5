"""mkdocs hook: pictures of masks, drawn by attnkit itself when the site is built.

Each entry of ``PICTURES`` is a mask expression over ``torch`` and ``attnkit.masks``
(as ``masks``); the hook evaluates it, materializes it with ``mask.to_dense`` and
draws it with matplotlib into ``images/masks/NAME.png`` of the site. A guide shows
one with ``![...](../images/masks/NAME.png)``; a change in how a mask lowers shows
up in its picture.
"""

from __future__ import annotations

import io
from typing import Any

# name -> (expression, L, S, batch shape)
PICTURES: dict[str, tuple[str, int, int, tuple[int, ...]]] = {
    "keep": (
        "masks.keep(torch.rand(6, 8, generator=torch.Generator().manual_seed(0)) > 0.3)",
        6,
        8,
        (),
    ),
    "block": ("masks.block(torch.eye(6, 8, dtype=torch.bool))", 6, 8, ()),
    "bias": ("masks.bias(torch.tensor([[0.0, -1.0, -2.0, float('-inf')] * 2] * 6))", 6, 8, ()),
    "tf": ("masks.tf(torch.triu(torch.ones(6, 8), diagonal=1))", 6, 8, ()),
    "valid_lens": ("masks.valid_lens(torch.tensor([3, 6]))", 6, 8, (2,)),
    "valid_lens_queries": ("masks.valid_lens(torch.tensor([3, 6]), queries=True)", 6, 8, (2,)),
    "valid_lens_2d": ("masks.valid_lens(torch.tensor([[1, 2, 3, 4, 5, 6]]))", 6, 8, (1,)),
    "key_padding": ("masks.key_padding(torch.arange(8) >= torch.tensor([[5], [8]]))", 6, 8, (2,)),
    "causal_top_left": ("masks.causal()", 6, 8, ()),
    "causal_bottom_right": ("masks.causal('bottom_right')", 6, 8, ()),
    "causal_offset": ("masks.causal(q_offset=4)", 4, 8, ()),
    "window": ("masks.window(2, 1)", 8, 8, ()),
    "document": ("masks.document(torch.tensor([0, 0, 0, 1, 1, 2, 2, 2]))", 8, 8, ()),
    "document_causal": (
        "masks.document(torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])) & masks.causal()",
        8,
        8,
        (),
    ),
    "prefix_lm": ("masks.prefix_lm(3)", 8, 8, ()),
    "causal_and_valid_lens": ("masks.causal() & masks.valid_lens(torch.tensor([5]))", 8, 8, (1,)),
    "window_or_prefix": ("masks.window(1, 1) | masks.prefix_lm(2)", 8, 8, ()),
    "not_causal": ("~masks.causal()", 8, 8, ()),
}


def draw(expression: str, L: int, S: int, batch_shape: tuple[int, ...]) -> bytes:
    """The PNG of ``expression``'s dense form: kept pairs dark, blocked ones white."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from attnkit import masks

    mask = eval(expression, {"torch": torch, "masks": masks})
    dense = mask.to_dense(L, S, batch_shape).reshape(-1, L, S)  # (B, L, S)
    panels = dense.shape[0]
    fig, axes = plt.subplots(1, panels, figsize=(0.32 * S * panels + 0.6, 0.32 * L + 0.7))
    axes = [axes] if panels == 1 else list(axes)
    for b, ax in enumerate(axes):
        grid = dense[b]
        if grid.dtype == torch.bool:
            image = grid.float().numpy()
            ax.imshow(image, cmap="Blues", vmin=-0.25, vmax=1.0)
        else:  # an additive bias: -inf white, finite values shaded
            image = grid.masked_fill(grid.isneginf(), float("nan")).numpy()
            cmap = matplotlib.colormaps["Blues_r"].copy()
            cmap.set_bad("white")
            ax.imshow(image, cmap=cmap, vmin=-3.0, vmax=0.5)
        ax.set_xticks(range(S))
        ax.set_yticks(range(L))
        ax.set_xticks([x - 0.5 for x in range(1, S)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, L)], minor=True)
        ax.grid(which="minor", color="#bbbbbb", linewidth=0.5)
        ax.tick_params(labelsize=7, length=0, which="both")
        ax.set_xlabel("key j", fontsize=8)
        if b == 0:
            ax.set_ylabel("query i", fontsize=8)
        if panels > 1:
            ax.set_title(f"batch {b}", fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    return buffer.getvalue()


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    from mkdocs.structure.files import File

    for name, (expression, L, S, batch_shape) in PICTURES.items():
        content = draw(expression, L, S, batch_shape)
        files.append(File.generated(config, f"images/masks/{name}.png", content=content))
    return files
