"""Pictures of attention: capture weights from a model, draw heatmaps, write a web page.

- :func:`capture` records the exact weights of a module's attention layers.
- :func:`heatmaps` draws a (rows, cols, Q, K) grid of matrices (matplotlib).
- :func:`attention_grid` draws a (layers, heads, L, L) grid fast, as one image.
- :func:`to_html` writes a self-contained page (head, matrix, model, statistics,
  rollout and neuron views; long inputs as an exact overview and top-k rows);
  :func:`show` returns it as a :class:`Page`, which Jupyter displays inline, and
  also runs a model on a text itself (``show(model, tokenizer, text)``) with
  streaming capture. Hugging Face ``outputs.attentions`` are accepted as they
  are; :func:`from_generate` reads ``generate(..., output_attentions=True)``.
- :func:`show_image` draws a vision transformer's attention (ViT, DeiT, DINOv2, ...)
  as heatmaps over the picture it saw: patches are its tokens (:class:`ImageLayout`).
- :func:`compare` puts two sides (two texts, or two models on one text) on
  one page in sync, with A − B where their tokens are equal.
- :func:`explain` attributes a model's output on a text to its input tokens
  (input × gradient, integrated gradients, attention × gradient, rollout) and to
  its heads (head importance), as an :class:`Attribution`; :func:`explain_generation`
  explains each token a causal LM generated from the tokens before it, and
  :func:`explain_image` an image classifier's top class from its picture's patches.
- :func:`attention_rollout` and :func:`attention_flow` trace which input tokens
  each position draws from through the stack; :func:`head_statistics` gives
  every head's entropy, distance and pattern class.

matplotlib is imported only when a drawing function is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .attention_set import AttentionSet
from .attribution import Attribution, Target, explain
from .attribution_image import explain_image
from .attribution_steps import GenerationAttribution, explain_generation
from .capture import AttentionRecord, Capture, capture
from .compare import Comparison, compare
from .html import Page, render_html, show, to_html
from .image import ImageLayout
from .image_show import show_image
from .notebook import from_generate
from .rollout import attention_flow, attention_rollout
from .stats import head_statistics

if TYPE_CHECKING:
    from .heatmap import attention_grid, heatmaps

__all__ = [
    "AttentionRecord",
    "AttentionSet",
    "Attribution",
    "Capture",
    "Comparison",
    "GenerationAttribution",
    "ImageLayout",
    "Page",
    "Target",
    "attention_flow",
    "attention_grid",
    "attention_rollout",
    "capture",
    "compare",
    "explain",
    "explain_generation",
    "explain_image",
    "from_generate",
    "head_statistics",
    "heatmaps",
    "render_html",
    "show",
    "show_image",
    "to_html",
]


def __getattr__(name: str) -> Any:
    if name in ("heatmaps", "attention_grid"):
        from . import heatmap

        return getattr(heatmap, name)
    if name == "export":  # (viz.export.load_weights, as the viewer guide writes it)
        import importlib

        return importlib.import_module(f"{__name__}.export")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


from .._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__all__)
