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
when large: 6 layers x 12 heads at 512 tokens make a page of about 5 MB. Past
:attr:`~attnkit.viz.reduce.Budget.dense_cells` weights the page holds, for every
head, an exact block-pooled overview (max and mean) and the exact top-k keys
of every query row instead (see :mod:`attnkit.viz.reduce` and :mod:`.payload`).
The page is filled in one pass over its template, so no text given to it (a
title holding ``__SCRIPT__``) can put one part of the page into another.
"""

from __future__ import annotations

import functools
import html
import importlib.resources
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from .attention_set import AttentionSet, as_sets, page_payload, reduce_set, shown_layers
from .attribution_records import Attribution, GenerationAttribution
from .compare import Comparison, compare_payload
from .explain_page import explain_payload
from .image import ImageLayout, image_payload
from .options import PageOptions
from .reduce import Budget, ReducedSet

__all__ = ["Page", "render_html", "show", "to_html"]

SCALES = ("linear", "power", "log")
# The page's script, in order: each file is one part of the viewer.
SCRIPTS = (
    "core.js",
    "state.js",
    "matrix.js",
    "head.js",
    "views.js",
    "image.js",
    "search.js",
    "explain.js",
    "export.js",
    "page.js",
)
# show() takes every page field but the budget (its model run has its own).
_PAGE_FIELDS = frozenset(f.name for f in fields(PageOptions)) - {"budget"}
_MARKER = re.compile(r"__(TITLE|STYLE|SCRIPT|DATA)__")


class Page:
    """A rendered page: ``.html`` (str), :meth:`save`, and inline display in Jupyter."""

    def __init__(self, page: str) -> None:
        self.html = page

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (UTF-8) and return it."""
        out = Path(path)
        out.write_bytes(_encoded(self.html))
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


def _fill(template: str, parts: Mapping[str, str]) -> str:
    """Replace every ``__NAME__`` marker of the template in one pass: inserted text is not
    searched again, so a title holding ``__SCRIPT__`` stays a title."""
    return _MARKER.sub(lambda m: parts[m.group(1)], template)


def render_html(
    attentions: Any,
    tokens: Sequence[str] | None = None,
    *,
    options: PageOptions | None = None,
    **page: Any,
) -> str:
    """The page of :func:`to_html` as a string (its arguments but ``path``, and but
    ``include_layers``: :func:`show` takes it, and cuts the weights before the page).

    Args:
        attentions: the weights: (layers, heads, Q, K) (tensor or array), a list of
            per-layer (heads, Q, K) or (1, heads, Q, K) weights, an
            :class:`AttentionSet` or a list of them, or a
            :class:`~attnkit.viz.compare.Comparison` (see :func:`to_html`).
        tokens: the Q query tokens (None with AttentionSet objects or a Comparison).
        options: the page's keywords as one :class:`~attnkit.viz.options.PageOptions`
            (default: every default); ``page`` overrides its fields.
        **page: any field of :class:`~attnkit.viz.options.PageOptions` by name:
            ``key_tokens``, ``layer_labels``, ``head_labels``, ``title``, ``subtitle``,
            ``meta``, ``notes``, ``pair_start``, ``scale``, ``layer``, ``heads``,
            ``top_k``, ``budget``, ``image`` and ``explain`` (each documented there).

    Returns:
        The self-contained HTML page, a str.

    Raises:
        ValueError: an unknown ``scale``; weights with NaN or infinity; tokens,
            labels, ``pair_start``, ``layer`` or ``heads`` that do not fit the weights;
            tokens given with AttentionSet objects or a Comparison.
        TypeError: a keyword that is no page field; a single str for ``tokens``, labels
            or ``notes``, or an ``image`` that is not an ImageLayout (or given with a
            Comparison).
    """
    o = PageOptions.of("render_html", options, **page)
    key_tokens, pair_start, scale, notes = o.key_tokens, o.pair_start, o.scale, o.notes
    image, explain, title = o.image, o.explain, o.title
    labels = (o.layer_labels, o.head_labels)
    if scale not in SCALES:
        raise ValueError(f"scale: expected one of {', '.join(SCALES)}, got {scale!r}")
    if isinstance(notes, str):
        raise TypeError("notes: expected a list of strings, got a single str")
    budget = o.budget or Budget(top_k=o.top_k)
    comparison = None
    if isinstance(attentions, Comparison):  # two sides: A's kinds, then B's, and A - B
        if tokens is not None or key_tokens is not None or pair_start is not None:
            raise ValueError("tokens: a Comparison carries its own tokens; pass tokens=None")
        comparison = attentions
        sets = [*comparison.a, *comparison.b]
    else:
        sets = [
            s if isinstance(s, ReducedSet) else reduce_set(s, budget)
            for s in as_sets(attentions, tokens, key_tokens, *labels, pair_start)
        ]
    payload = {
        "title": title,
        "subtitle": o.subtitle,
        "meta": {str(k): str(v) for k, v in (o.meta or {}).items()},
        "notes": _notes(notes, sets),
        "scale": scale,
        "initial": _initial(o.layer, o.heads, sets[0]),
        "sets": [page_payload(s) for s in sets],
    }
    if comparison is not None:
        payload["compare"] = compare_payload(comparison)
    if image is not None:  # an image source: the first set's tokens lie on its picture
        if not isinstance(image, ImageLayout) or comparison is not None:
            raise TypeError(
                "image: expected an attnkit.viz.ImageLayout for one set of attention, got "
                + ("a Comparison" if comparison is not None else type(image).__name__)
            )
        payload["image"] = image_payload(image, sets[0])
    if explain is not None:
        if not isinstance(explain, (Attribution, GenerationAttribution)):
            raise TypeError(
                "explain: expected an attnkit.viz.Attribution or GenerationAttribution, got "
                + type(explain).__name__
            )
        first = sets[0]
        layers = _numbered(first.layer_labels, "layer")
        heads = _numbered(first.head_labels, "head")
        _check_explain(explain, first, layers, heads)
        payload["explain"] = explain_payload(explain, layers=layers, heads=heads)
    # Inside <script type="application/json">: escape "<" so no token can end the element.
    data = json.dumps(payload, ensure_ascii=False).replace("<", "\\u003c")
    script = "\n".join(_static(name) for name in SCRIPTS)
    parts = {"TITLE": html.escape(title), "STYLE": _static("page.css"), "SCRIPT": script,
             "DATA": data}  # fmt: skip
    return _fill(_static("page.html"), parts)


def _check_explain(
    explain: Attribution | GenerationAttribution,
    first: ReducedSet,
    layers: Sequence[int] | None,
    heads: Sequence[int] | None,
) -> None:
    """Refuse an attribution of another input or model than the page's: its head grid
    must hold every layer and head the page shows, and an attribution of one text (the
    page's tokens as the model read them) as many tokens as the page."""
    grid = explain.head_importance
    if grid is not None:
        n_layers, n_heads = int(grid.shape[-2]), int(grid.shape[-1])
        for what, shown, n in (("layer", layers, n_layers), ("head", heads, n_heads)):
            if shown is not None and shown and max(shown) >= n:
                raise ValueError(
                    f"explain: its head importance holds {n_layers} layers × {n_heads} heads, "
                    f"and the page shows {what} {max(shown)}: an attribution of another model "
                    "than the weights'"
                )
    plain = first.view_kind == "tokens" and not first.renormalised and first.key_tokens is None
    if isinstance(explain, Attribution) and plain and len(explain.tokens) != first.shape[2]:
        raise ValueError(
            f"explain: an attribution of {len(explain.tokens)} tokens, and the page shows "
            f"{first.shape[2]}: an attribution of another text than the weights'"
        )


def _numbered(labels: Sequence[str], word: str) -> list[int] | None:
    """The model's numbers of labels like ``"layer 3"`` (None when any label is another)."""
    out = []
    for label in labels:
        head, _, number = str(label).partition(" ")
        if head != word or not number.isdigit():
            return None
        out.append(int(number))
    return out


def _notes(notes: Sequence[str], sets: Sequence[ReducedSet]) -> list[str]:
    """The page's notes: the caller's, then each set's (the word view, what was left out),
    each once."""
    out = [str(n) for n in notes]
    for s in sets:
        out.extend(n for n in s.notes if n not in out)
    return out


def _initial(
    layer: int | None, heads: Sequence[int] | int | None, first: ReducedSet
) -> dict[str, Any]:
    """The view the page opens on (bertviz's ``layer=`` and ``heads=``)."""
    n_layers, n_heads = first.shape[0], first.shape[1]
    out: dict[str, Any] = {}
    if layer is not None:
        if (
            isinstance(layer, bool)
            or not isinstance(layer, int)
            or not -n_layers <= layer < n_layers
        ):
            raise ValueError(f"layer: expected a layer number in 0..{n_layers - 1}, got {layer!r}")
        out["layer"] = layer % n_layers
    if heads is not None:
        picked = [heads] if isinstance(heads, int) else list(heads)
        if not picked or any(
            isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < n_heads for h in picked
        ):
            raise ValueError(f"heads: expected head numbers in 0..{n_heads - 1}, got {heads!r}")
        out["heads"] = picked
    return out


def to_html(
    attentions: Any,
    tokens: Sequence[str] | None,
    path: str | Path,
    **options: Any,
) -> Path:
    """Write one self-contained HTML page that shows attention weights.

    Args:
        attentions: (layers, heads, Q, K) weights (tensor or array); or a list
            with one (heads, Q, K) or (1, heads, Q, K) tensor per layer (what
            :func:`attnkit.viz.capture` records for a batch of one, and what a
            Hugging Face model returns as ``outputs.attentions`` with
            ``output_attentions=True``); or a list of :class:`AttentionSet`
            (several kinds of attention, with a selector; then ``tokens=None``);
            or a :class:`~attnkit.viz.compare.Comparison` from
            :func:`attnkit.viz.compare` (two sides in sync and A − B; ``tokens=None``).
        tokens: Q query tokens, shown as they are (escaped, never run as HTML).
        path: the file to write (UTF-8).
        **options: as for :func:`show`: ``key_tokens``, ``layer_labels``,
            ``head_labels``, ``title``, ``subtitle`` (a line under the title, e.g.
            the sentence; elided on the page when long), ``meta`` (a few
            ``name: value`` facts), ``notes`` (sentences in a box under the title),
            ``pair_start`` (bertviz: ``sentence_b_start``; the second sentence's
            first token: a divider and an A->A / A->B / B->A / B->B filter),
            ``scale`` ("linear", "power" or "log"), ``layer`` and ``heads`` (the
            view the page opens on), ``include_layers`` (bertviz: keep only these
            layers), ``top_k`` (keys kept per row on a long page), ``image`` (an
            :class:`~attnkit.viz.ImageLayout`: the tokens are a vision transformer's
            patches, drawn on its picture in an image view; see :func:`show_image`),
            ``explain`` (an :class:`~attnkit.viz.Attribution`: an Explain view).

    Returns:
        the path written.

    Raises:
        ValueError/TypeError: shapes and labels disagree; OSError: the file
        cannot be written.
    """
    out = Path(path)
    if not out.parent.is_dir():
        raise FileNotFoundError(
            f"path: the folder {str(out.parent)!r} does not exist; create it first "
            f"(the page would be {str(out)!r})"
        )
    page = show(attentions, tokens, **options)
    out.write_bytes(_encoded(page.html))  # (encoded first: no empty file on an error)
    return out


def _encoded(page: str) -> bytes:
    """The page in UTF-8, or a ValueError (before any file is opened) naming what holds
    text UTF-8 cannot write."""
    try:
        return page.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"the page holds U+{ord(page[exc.start]):04X}, half of a character (a lone "
            "surrogate), which UTF-8 cannot write; check the title, subtitle, meta, notes "
            "and labels"
        ) from None


def show(
    attentions: Any,
    tokens: Any = None,
    text: str | None = None,
    *,
    tokenizer: Any = None,
    pair: str | None = None,
    include_layers: Sequence[int] | None = None,
    sentence_b_start: int | None = None,
    max_length: int | None = None,
    generate: int = 0,
    seed: int | None = None,
    words: bool = False,
    special: bool = True,
    neuron_window: tuple[int | None, int | None] | str | None = None,
    progress: bool = True,
    **options: Any,
) -> Page:
    """A page of attention as a :class:`Page`: displayed inline in Jupyter, ``.save(path)``.

    Two ways in:

    - weights you hold: ``show(attentions, tokens)``, arguments as for :func:`to_html`;
    - a model: ``show(model, tokenizer, "some text")``, where ``model`` is a
      transformers model, an attnkit BERT model or a checkpoint folder (then the
      tokenizer may be None). It runs the same streaming capture as ``attnkit
      show``: every layer reduced while it runs, readable tokens, ``pair`` for a
      second sentence (an encoder-decoder's decoder text), ``generate=N`` tokens
      for a decoder (greedy, or sampled with ``seed``), ``words=True`` for the word
      view (pieces merged: attention to a word is the sum over its pieces, from a
      word the mean), ``special=False`` to leave the special tokens out (each row
      renormalised), ``neuron_window=(start, stop)`` or a token's text for the
      queries the neuron view keeps past its budget, ``progress=False`` for no
      progress on stderr. Tokens are shown as written
      (:func:`attnkit.viz.tokens.display_tokens`, as in ``attnkit show``).

    bertviz's names are accepted where they mean the same: ``sentence_b_start``
    (``pair_start``), ``layer``, ``heads``, ``include_layers``, and
    ``encoder_attention``/``decoder_attention``/``cross_attention`` with
    ``encoder_tokens``/``decoder_tokens`` (an encoder-decoder on one page).

    Args:
        attentions: the weights, in any form :func:`to_html` takes ((layers, heads, Q,
            K), a list of per-layer weights, AttentionSet objects, a Comparison); or a
            model: a transformers model, an attnkit BERT model, or a checkpoint folder
            (str or Path). None with bertviz's ``encoder_attention=`` and friends.
        tokens: with weights, the Q query tokens; with a model, its tokenizer may be
            passed here (``show(model, tokenizer, text)``).
        text: with a model, the text to run it on; refused with weights.
        tokenizer: keyword-only, the model's tokenizer (None for an attnkit BERT model
            or a folder); refused with weights.
        pair: with a model, a second sentence (an encoder-decoder's decoder text).
        include_layers: keep only these layers (bertviz's name; negative numbers count
            from the end, as ``attnkit show --layers``); with a model, only these layers
            are captured, in the order they run. Layers are labelled by their numbers,
            and ``layer=`` names one of them by its number (bertviz's rule).
        sentence_b_start: bertviz's name for ``pair_start``; give one of the two.
        max_length: with a model, truncate the input to this many tokens, 1 to the
            model's positions (default: the model's positions).
        generate: with a decoder model, generate this many tokens (0 to 4096, fewer
            than ``max_length``; default 0) and add a step slider.
        seed: with ``generate``, sample the tokens with this seed; None (default):
            greedy.
        words: with a model, True: the word view (subword pieces merged); default False.
        special: with a model, False: leave the special tokens out and renormalise
            each row; default True.
        neuron_window: with a model, the queries the neuron view keeps past its
            budget: ``(start, stop)`` positions (either may be None) or a token's text
            to centre the window on; None (default): the neuron view's own choice.
        progress: with a model, False: no progress on stderr; default True.
        **options: the page's keywords, each a field of
            :class:`~attnkit.viz.options.PageOptions` (documented there): ``key_tokens``
            (with weights), ``layer_labels``, ``head_labels``, ``title``, ``subtitle``
            (default: the ``text`` with a model), ``meta``, ``notes`` (a model run adds
            its own), ``pair_start``, ``scale``, ``layer`` and ``heads`` (bertviz's
            names: the view the page opens on), ``top_k`` (with a model, also the
            run's), ``image`` and ``explain``; and bertviz's ``encoder_attention``,
            ``decoder_attention``, ``cross_attention``, ``encoder_tokens`` and
            ``decoder_tokens`` (then ``attentions`` is None); any other name is refused.

    Returns:
        A :class:`Page`: ``.html`` (str), ``.save(path)``, shown inline in Jupyter.

    Raises:
        TypeError: ``text``/``tokenizer``, ``pair``, ``max_length``, ``generate``,
            ``seed``, or ``words``/``special``/``neuron_window``, given with weights
            instead of a model; ``key_tokens`` with a model; an unknown keyword; a
            transformers model without its tokenizer.
        ValueError: ``sentence_b_start`` with ``pair_start``; weights and bertviz's
            arguments together; weights, tokens or labels that do not fit (as for
            :func:`render_html`); ``generate`` with a model that is not a decoder;
            ``include_layers`` out of range; with a model, before it is built or run
            (as ``attnkit show`` checks its flags): ``max_length`` below 1, below the
            special tokens or above the model's positions, ``generate`` below 0, above
            4096 or leaving no room for the prompt, ``seed`` without ``generate``, and
            ``generate`` with ``pair``.

    Examples:
        >>> import torch
        >>> from attnkit import viz
        >>> w = torch.softmax(torch.randn(2, 4, 3, 3), dim=-1)  # (layers, heads, Q, K)
        >>> page = viz.show(w, ["the", "cat", "sat"], title="Two layers")
        >>> page.html.startswith("<!DOCTYPE html>")
        True
    """
    from .notebook import check_text, from_bertviz, is_model, run_options
    from .options import RunOptions

    page_names = _PAGE_FIELDS & set(options)
    bertviz = {k: v for k, v in options.items() if k not in page_names}
    o = PageOptions.of("show", **{k: options[k] for k in page_names})
    if sentence_b_start is not None:
        if o.pair_start is not None:
            raise ValueError("sentence_b_start, pair_start: give one of them (the same thing)")
        o = replace(o, pair_start=sentence_b_start)
    if bertviz:
        attentions, tokens = from_bertviz(attentions, tokens, bertviz)
    if is_model(attentions):
        if o.key_tokens is not None:
            raise TypeError(
                "key_tokens: only with weights; a model's run gives its own tokens, the "
                "queries' and the keys'"
            )
        run_opts = RunOptions.of(
            check_text(text), pair=pair, max_length=max_length, generate=generate, seed=seed,
            layers=include_layers, top_k=o.top_k, words=words, special=special,
            neuron_window=neuron_window, progress=progress,
        )  # fmt: skip
        run = run_options(attentions, tokenizer if tokenizer is not None else tokens, run_opts)
        attentions, tokens = run.sets, None
        if include_layers is not None:
            o = replace(o, layer=_opening_layer(o.layer, run.layers))
        o = replace(o, subtitle=o.subtitle or (text or ""), notes=[*o.notes, *run.notes])
    elif text is not None or tokenizer is not None:
        raise TypeError("text, tokenizer: only with a model (show(model, tokenizer, text))")
    elif words or not special or neuron_window is not None:
        raise TypeError(
            "words, special, neuron_window: only with a model (show(model, tokenizer, text)): "
            "the tokenizer says where words and special tokens are"
        )
    elif pair is not None or max_length is not None or generate or seed is not None:
        given = [name for name, value in (("pair", pair), ("max_length", max_length),
                 ("generate", generate or None), ("seed", seed)) if value is not None]  # fmt: skip
        raise TypeError(
            f"{', '.join(given)}: only with a model (show(model, tokenizer, text)): they "
            "change the run, and weights are given already run"
        )
    elif include_layers is not None:
        sets = as_sets(attentions, tokens, o.key_tokens, o.layer_labels, o.head_labels,
                       o.pair_start)  # fmt: skip
        attentions, kept = _with_layers(sets, include_layers)
        tokens = None
        o = replace(o, key_tokens=None, layer_labels=None, head_labels=None, pair_start=None)
        o = replace(o, layer=_opening_layer(o.layer, kept))
    return Page(render_html(attentions, tokens, options=o))


def _with_layers(
    sets: list[AttentionSet | ReducedSet], include: Sequence[int]
) -> tuple[list[AttentionSet], list[int]]:
    """bertviz's ``include_layers`` for weights: each set shows only those layers (in
    increasing order, as from a model), every layer still feeding its rollout; and the
    numbers of the layers shown."""
    out: list[AttentionSet] = []
    kept: list[int] = []
    for s in sets:
        if not isinstance(s, AttentionSet):
            raise TypeError(
                "include_layers: only with weights or AttentionSet objects (a reduced set "
                "holds the layers it was reduced with)"
            )
        kept = shown_layers(include, _layer_count(s.weights))
        out.append(replace(s, layers=kept))
    return out, kept


def _layer_count(weights: Any) -> int:
    """How many layers weights of any form :func:`.grid.as_grid` takes hold, read off
    their shape (no copy): a list holds one per item, a 4-D or 5-D array one per row of
    dim 0, a 3-D or 2-D array one."""
    if isinstance(weights, (list, tuple)):
        return len(weights)
    ndim = len(getattr(weights, "shape", ()))
    return int(weights.shape[0]) if ndim >= 4 else 1


def _opening_layer(layer: int | None, kept: Sequence[int]) -> int | None:
    """bertviz's ``layer=`` beside ``include_layers``: the number of a layer the page
    shows (one of ``kept``, the layers' own numbers), as its position on the page."""
    if layer is None or isinstance(layer, bool) or not isinstance(layer, int):
        return layer  # (refused by the page's own check, naming it)
    if layer not in kept:
        raise ValueError(
            f"layer: {layer} is not one of the layers shown (include_layers gives "
            f"{list(kept)}); give the number of the layer to open on, as bertviz does"
        )
    return list(kept).index(layer)
