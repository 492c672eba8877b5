"""One self-contained web page to explore attention weights: to_html(), show(), render_html().

The page needs nothing but a browser: styles, script and data are inline, and
it loads no font, script or image from anywhere. Its HTML, CSS and JavaScript
are package files in ``attnkit/viz/static/``; this module fills in the data.

Views: a *head view* (queries on the left, keys on the right, one colored line
per head whose opacity is the weight; hover a token to see only its lines), a
*matrix view* (the weights of the chosen heads as a zoomable, scrollable grid
with a colour scale, a colorbar and the hovered cell highlighted) and a *model
view* (every layer x head as a thumbnail; click one to open it). Sentence
pairs get a divider at the separator and an A->A / A->B / B->A / B->B filter;
several kinds of attention (an encoder-decoder's self- and cross-attention)
get a selector. The state can be set in the address:
``attention.html#view=matrix&layer=2&heads=0,3&token=4&scale=log&filter=AB&zoom=8``.

Weights are stored with one byte each, quantized per (layer, head) against
that head's largest weight (error at most 1/510 of it), and deflate-compressed
when large: 6 layers x 12 heads at 512 tokens make a page of about 5 MB.
"""

from __future__ import annotations

import base64
import functools
import html
import importlib.resources
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .grid import as_grid

__all__ = ["AttentionSet", "Page", "render_html", "show", "to_html"]

SCALES = ("linear", "power", "log")
# Weights of a set above this many bytes are deflate-compressed (the page inflates them
# with the browser's DecompressionStream); smaller pages stay readable by any browser.
COMPRESS_ABOVE = 1 << 16


@dataclass(frozen=True)
class AttentionSet:
    """One kind of attention shown on a page, e.g. an encoder-decoder's cross-attention.

    Attributes:
        name: what the page's selector calls it (``"cross-attention"``).
        weights: (layers, heads, Q, K) weights (tensor or array), or a list of
            per-layer (heads, Q, K) / (1, heads, Q, K) weights.
        tokens: Q query tokens.
        key_tokens: K key tokens; None when the keys are the queries.
        layer_labels: names of the layers (default ``"layer i"``).
        head_labels: names of the heads (default ``"head i"``).
        pair_start: index of the first query token of the second sentence of a
            pair (a divider is drawn there and the A/B filter appears), or None.
        key_pair_start: the same among the keys; None = ``pair_start`` when the
            keys are the queries.
    """

    name: str
    weights: Any
    tokens: Sequence[str]
    key_tokens: Sequence[str] | None = None
    layer_labels: Sequence[str] | None = None
    head_labels: Sequence[str] | None = None
    pair_start: int | None = None
    key_pair_start: int | None = None


class Page:
    """A rendered page: ``.html`` (str), :meth:`save`, and inline display in Jupyter."""

    def __init__(self, page: str) -> None:
        self.html = page

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (UTF-8) and return it."""
        out = Path(path)
        out.write_text(self.html, encoding="utf-8")
        return out

    def _repr_html_(self) -> str:
        """The page in an iframe, so its styles and script stay apart from the notebook's."""
        return (
            '<iframe style="width: 100%; height: 760px; border: 1px solid #d9dde5" '
            f'srcdoc="{html.escape(self.html, quote=True)}"></iframe>'
        )

    def __repr__(self) -> str:
        return f"<attnkit.viz.Page: {len(self.html.encode('utf-8')):,} bytes>"


@functools.cache
def _static(name: str) -> str:
    """A file of the page's template, read from the installed package."""
    return importlib.resources.files("attnkit.viz").joinpath("static", name).read_text("utf-8")


def _labels(name: str, labels: Sequence[Any] | None, n: int, default: str) -> list[str]:
    if labels is None:
        return [f"{default} {i}" for i in range(n)]
    if isinstance(labels, str):
        raise TypeError(f"{name}: expected a list of {n} strings, got a single str")
    out = [str(t) for t in labels]
    if len(out) != n:
        raise ValueError(f"{name}: expected {n} labels, got {len(out)}")
    return out


def _tokens(name: str, tokens: Sequence[Any] | None, n: int, what: str) -> list[str]:
    if tokens is None:
        raise ValueError(f"{name}: expected {n} {what} tokens, got None")
    if isinstance(tokens, str):
        raise TypeError(f"{name}: expected a list of strings, got a single str")
    out = [str(t) for t in tokens]
    if len(out) != n:
        raise ValueError(
            f"{name}: expected {n} {what} tokens (the weights have {n}), got {len(out)}"
        )
    return out


def _split(name: str, start: int | None, n: int) -> int | None:
    if start is None:
        return None
    if isinstance(start, bool) or not isinstance(start, int) or not 0 < start < n:
        raise ValueError(
            f"{name}: expected the index of the second sentence's first token, in 1..{n - 1}, "
            f"got {start!r}"
        )
    return start


def _quantize(arr: np.ndarray) -> tuple[bytes, list[float]]:
    """(layers, heads, Q, K) weights in [0, 1] -> one byte each, and each head's scale."""
    clipped = np.clip(arr, 0.0, None)  # (layers, heads, Q, K)
    scales = clipped.max(axis=(2, 3))  # (layers, heads)
    scales = np.where(scales > 0, scales, 1.0).astype(np.float32)
    codes = np.rint(clipped / scales[:, :, None, None] * 255.0).astype(np.uint8)
    return codes.tobytes(), [float(s) for s in scales.reshape(-1)]


def _set_payload(s: AttentionSet) -> dict[str, Any]:
    arr = as_grid(
        s.weights, name="attentions", dims="layers, heads", batch_of_one=True
    )  # (layers, heads, Q, K)
    n_layers, n_heads, Q, K = arr.shape
    q_tokens = _tokens("tokens", s.tokens, Q, "query")
    if s.key_tokens is None:
        if K != Q:
            raise ValueError(
                f"key_tokens: the weights have {K} keys and {Q} queries; pass key_tokens"
            )
        k_tokens = q_tokens
    else:
        k_tokens = _tokens("key_tokens", s.key_tokens, K, "key")
    if not np.isfinite(arr).all():
        raise ValueError("attentions: contains NaN or infinity")
    pair_start = _split("pair_start", s.pair_start, Q)
    key_pair = s.key_pair_start
    if key_pair is None and s.key_tokens is None:
        key_pair = pair_start
    key_pair = _split("key_pair_start", key_pair, K)
    if (pair_start is None) != (key_pair is None):
        raise ValueError(
            "pair_start, key_pair_start: give both (queries and keys differ) or neither; got "
            f"{pair_start!r} and {key_pair!r}"
        )
    raw, scales = _quantize(arr)
    compress = len(raw) > COMPRESS_ABOVE
    data = zlib.compress(raw, 6) if compress else raw
    return {
        "name": str(s.name),
        "tokens": q_tokens,
        "keyTokens": k_tokens,
        "layers": _labels("layer_labels", s.layer_labels, n_layers, "layer"),
        "heads": _labels("head_labels", s.head_labels, n_heads, "head"),
        "shape": [n_layers, n_heads, Q, K],
        "scales": scales,
        "encoding": "deflate" if compress else "raw",
        "data": base64.b64encode(data).decode("ascii"),
        "pairStart": pair_start,
        "pairKeyStart": key_pair,
    }


def _as_sets(
    attentions: Any,
    tokens: Sequence[str] | None,
    key_tokens: Sequence[str] | None,
    layer_labels: Sequence[str] | None,
    head_labels: Sequence[str] | None,
    pair_start: int | None,
) -> list[AttentionSet]:
    if isinstance(attentions, AttentionSet):
        return [attentions]
    if (
        isinstance(attentions, (list, tuple))
        and attentions
        and all(isinstance(a, AttentionSet) for a in attentions)
    ):
        if tokens is not None or key_tokens is not None or pair_start is not None:
            raise ValueError(
                "tokens: AttentionSet objects carry their own tokens; pass tokens=None"
            )
        return list(attentions)
    if isinstance(tokens, str):
        raise TypeError("tokens: expected a list of strings, got a single str")
    return [
        AttentionSet(
            name="attention",
            weights=attentions,
            tokens=tokens if tokens is not None else [],
            key_tokens=key_tokens,
            layer_labels=layer_labels,
            head_labels=head_labels,
            pair_start=pair_start,
        )
    ]


def render_html(
    attentions: Any,
    tokens: Sequence[str] | None = None,
    *,
    key_tokens: Sequence[str] | None = None,
    layer_labels: Sequence[str] | None = None,
    head_labels: Sequence[str] | None = None,
    title: str = "Attention",
    subtitle: str = "",
    meta: Mapping[str, str] | None = None,
    notes: Sequence[str] = (),
    pair_start: int | None = None,
    scale: str = "linear",
) -> str:
    """The page of :func:`to_html` as a string (same arguments, no path)."""
    if scale not in SCALES:
        raise ValueError(f"scale: expected one of {', '.join(SCALES)}, got {scale!r}")
    if isinstance(notes, str):
        raise TypeError("notes: expected a list of strings, got a single str")
    sets = _as_sets(attentions, tokens, key_tokens, layer_labels, head_labels, pair_start)
    payload = {
        "title": title,
        "subtitle": subtitle,
        "meta": {str(k): str(v) for k, v in (meta or {}).items()},
        "notes": [str(n) for n in notes],
        "scale": scale,
        "sets": [_set_payload(s) for s in sets],
    }
    # Inside <script type="application/json">: escape "<" so no token can end the element.
    data = json.dumps(payload, ensure_ascii=False).replace("<", "\\u003c")
    return (
        _static("page.html")
        .replace("__TITLE__", html.escape(title))
        .replace("__STYLE__", _static("page.css"))
        .replace("__SCRIPT__", _static("page.js"))
        .replace("__DATA__", data)
    )


def show(
    attentions: Any,
    tokens: Sequence[str] | None = None,
    *,
    key_tokens: Sequence[str] | None = None,
    layer_labels: Sequence[str] | None = None,
    head_labels: Sequence[str] | None = None,
    title: str = "Attention",
    subtitle: str = "",
    meta: Mapping[str, str] | None = None,
    notes: Sequence[str] = (),
    pair_start: int | None = None,
    scale: str = "linear",
) -> Page:
    """The page of :func:`to_html` as a :class:`Page`: displayed inline in Jupyter.

    Same arguments as :func:`to_html`, without the path; ``page.save(path)`` writes it.
    """
    return Page(
        render_html(
            attentions,
            tokens,
            key_tokens=key_tokens,
            layer_labels=layer_labels,
            head_labels=head_labels,
            title=title,
            subtitle=subtitle,
            meta=meta,
            notes=notes,
            pair_start=pair_start,
            scale=scale,
        )
    )


def to_html(
    attentions: Any,
    tokens: Sequence[str] | None,
    path: str | Path,
    *,
    key_tokens: Sequence[str] | None = None,
    layer_labels: Sequence[str] | None = None,
    head_labels: Sequence[str] | None = None,
    title: str = "Attention",
    subtitle: str = "",
    meta: Mapping[str, str] | None = None,
    notes: Sequence[str] = (),
    pair_start: int | None = None,
    scale: str = "linear",
) -> Path:
    """Write one self-contained HTML page that shows attention weights.

    Args:
        attentions: (layers, heads, Q, K) weights (tensor or array); or a list
            with one (heads, Q, K) or (1, heads, Q, K) tensor per layer (what
            :func:`attnkit.viz.capture` records for a batch of one, and what a
            Hugging Face model returns as ``outputs.attentions`` with
            ``output_attentions=True``); or a list of :class:`AttentionSet`
            (several kinds of attention, with a selector; then ``tokens=None``).
        tokens: Q query tokens, shown as they are (escaped, never run as HTML).
        path: the file to write (UTF-8).
        key_tokens: K key tokens when the keys are not the queries.
        layer_labels: names of the layers (default ``"layer i"``).
        head_labels: names of the heads (default ``"head i"``).
        title: the page title; subtitle: a line under it (e.g. the sentence).
        meta: a few ``name: value`` facts shown under the title.
        notes: sentences shown in a box under the title (e.g. that the input
            was truncated).
        pair_start: for a sentence pair, the index of the second sentence's
            first token: the page draws a divider there and offers an
            A->A / A->B / B->A / B->B filter.
        scale: the matrix view's first colour scale: "linear", "power" or "log".

    Returns:
        the path written.

    Raises:
        ValueError/TypeError: shapes and labels disagree; OSError: the file
        cannot be written.
    """
    page = render_html(
        attentions,
        tokens,
        key_tokens=key_tokens,
        layer_labels=layer_labels,
        head_labels=head_labels,
        title=title,
        subtitle=subtitle,
        meta=meta,
        notes=notes,
        pair_start=pair_start,
        scale=scale,
    )
    out = Path(path)
    out.write_text(page, encoding="utf-8")
    return out
