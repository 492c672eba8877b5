"""What a run shows: tokens or words, with or without special tokens, the neuron window.

:class:`ViewOptions` is what the user asks for (``attnkit show --words
--no-special --neuron-window 10:40``, or ``viz.show(..., words=True)``);
:class:`PageView` is those options applied to one input's tokens: the maps of
:mod:`.positions` the reducers apply, the neuron view's window, and the page's
tokens and notes once the run is reduced. The CLI and the Python path share it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from .neuron import DEFAULT_WINDOW, WindowError, window_capacity
from .positions import map_labels, map_position, position_map
from .reduce import Budget, ReducedSet, SetReducer
from .tokens import TokenText

if TYPE_CHECKING:
    from .attribution_records import Attribution, GenerationAttribution
    from .image import ImageLayout

__all__ = [
    "ExplainOptions",
    "GenerationOptions",
    "ImageRunOptions",
    "NeuronWindow",
    "PageOptions",
    "PageView",
    "RunOptions",
    "ViewOptions",
    "WindowError",
]

_RANGE = re.compile(r"^\s*(-?\d+)?\s*:\s*(-?\d+)?\s*$")


@dataclass(frozen=True)
class NeuronWindow:
    """The query tokens whose q the neuron view keeps when not every query fits.

    Either a range of page positions (``start``:``stop``, stop excluded, negative
    numbers from the end, like a Python slice) or ``near``: the
    :data:`~attnkit.viz.neuron.DEFAULT_WINDOW` positions around the first token
    whose text is ``near`` (or holds it), case-insensitive.
    """

    start: int | None = None
    stop: int | None = None
    near: str | None = None

    @classmethod
    def parse(cls, spec: str) -> NeuronWindow:
        """``"START:END"`` (either end may be left out)."""
        m = _RANGE.match(spec)
        if m is None or (m.group(1) is None and m.group(2) is None):
            raise WindowError(
                f"--neuron-window: expected START:END token positions like 100:140, got {spec!r}"
            )
        return cls(
            int(m.group(1)) if m.group(1) is not None else None,
            int(m.group(2)) if m.group(2) is not None else None,
        )

    def resolve(self, tokens: list[str], width: int) -> tuple[int, int]:
        """(start, stop) page positions among ``tokens``; WindowError when outside them
        or empty. ``width``: the most positions a window around a found token takes."""
        n = len(tokens)
        if self.near is not None:
            target = self.near.strip().lower()
            texts = [t.strip().lower() for t in tokens]
            hits = [i for i, t in enumerate(texts) if t == target] or [
                i for i, t in enumerate(texts) if target and target in t
            ]
            if not hits:
                raise WindowError(f"--neuron-token: no token of the text is or holds {self.near!r}")
            size = min(DEFAULT_WINDOW, width, n)
            start = max(0, min(n - size, hits[0] - size // 2))
            return start, start + size
        start = 0 if self.start is None else self.start
        stop = n if self.stop is None else self.stop
        given = (
            f"{'' if self.start is None else self.start}:{'' if self.stop is None else self.stop}"
        )
        if start < 0:
            start += n
        if stop < 0:
            stop += n
        if not 0 <= start < stop <= n:
            raise WindowError(
                f"--neuron-window: {given} is outside the text's {n:,} tokens "
                f"(positions 0 to {n - 1:,}; the end is excluded)"
                if start < stop or start < 0 or stop > n
                else f"--neuron-window: {given} holds no token; expected START < END"
            )
        return start, stop


@dataclass(frozen=True)
class ViewOptions:
    """What to show of a run (the same for the CLI and :func:`attnkit.viz.show`).

    Attributes:
        words: merge subword pieces into words (attention to a word: the sum over its
            pieces; from a word: the mean).
        drop_special: leave the tokenizer's special tokens out and renormalise each row.
        neuron_window: which queries the neuron view keeps past its budget (None: the
            tokens up to the last one).
    """

    words: bool = False
    drop_special: bool = False
    neuron_window: NeuronWindow | None = None


@dataclass(frozen=True)
class RunOptions:
    """One model run of the viewer: the same record for ``attnkit show`` and
    :func:`attnkit.viz.show` (:func:`attnkit.viz.notebook.attend` runs it).

    Attributes:
        text: the input.
        pair: a second sentence (an encoder-decoder's decoder text), or None.
        max_length: truncate the input to this many tokens (None: the model's positions).
        layers: the layer numbers to capture, in the order they run (None: all).
        heads: the head numbers to keep (None: all).
        generate: a decoder generates this many tokens after the text (0: none).
        seed: with ``generate``, sample with this seed (None: greedy).
        top_k: keys kept per query row on a long page.
        view: tokens or words, special tokens, the neuron window (:class:`ViewOptions`).
        progress: progress on stderr (:mod:`attnkit.viz.progress`).
    """

    text: str
    pair: str | None = None
    max_length: int | None = None
    layers: Sequence[int] | None = None
    heads: Sequence[int] | None = None
    generate: int = 0
    seed: int | None = None
    top_k: int = 16
    view: ViewOptions = field(default_factory=ViewOptions)
    progress: bool = True

    @classmethod
    def of(
        cls,
        text: str,
        *,
        words: bool = False,
        special: bool = True,
        neuron_window: tuple[int | None, int | None] | str | None = None,
        **options: Any,
    ) -> RunOptions:
        """The record from :func:`attnkit.viz.show`'s arguments: ``words``, ``special``
        (False: leave the special tokens out) and ``neuron_window`` (``(start, stop)``
        positions or a token's text) make the :class:`ViewOptions`; ``options`` are the
        other fields."""
        window = None
        if isinstance(neuron_window, str):
            window = NeuronWindow(near=neuron_window)
        elif neuron_window is not None:
            window = NeuronWindow(*neuron_window)
        view = ViewOptions(words=words, drop_special=not special, neuron_window=window)
        return cls(text, view=view, **options)

    def budget(self) -> Budget:
        """What a long page keeps (:class:`~attnkit.viz.reduce.Budget` with ``top_k``)."""
        return Budget(top_k=self.top_k)


@dataclass(frozen=True)
class ImageRunOptions:
    """One picture run of the viewer: the same record for ``attnkit show --image`` and
    :func:`attnkit.viz.show_image` (:func:`attnkit.viz.image_show.attend_image` runs it).

    Attributes:
        layers: the layer numbers to capture, increasing (None: all).
        heads: the head numbers to keep (None: all).
        top_k: keys kept per query row on a long page.
        progress: progress on stderr (:mod:`attnkit.viz.progress`).
    """

    layers: Sequence[int] | None = None
    heads: Sequence[int] | None = None
    top_k: int = 16
    progress: bool = True

    def budget(self) -> Budget:
        """What a long page keeps (:class:`~attnkit.viz.reduce.Budget` with ``top_k``)."""
        return Budget(top_k=self.top_k)


@dataclass(frozen=True)
class ExplainOptions:
    """One attribution of a text: the same record for ``attnkit show --explain`` and
    :func:`attnkit.viz.explain` (:func:`attnkit.viz.attribution.explain_with` runs it).

    Attributes:
        text: the input.
        target: what to explain (None: the model's default; see :func:`attnkit.viz.explain`).
        method: one of :data:`attnkit.viz.attribution.METHODS`.
        steps: integrated gradients' number of points on the path.
        compare: an encoder's second text (the target is the cosine similarity), or None.
        integration: where integrated gradients samples the path (captum's ``method=``).
        max_length: truncate the input to this many tokens (None: the model's positions).
    """

    text: str
    target: Any = None
    method: str = "attention_x_gradient"
    steps: int = 32
    compare: str | None = None
    integration: str = "gausslegendre"
    max_length: int | None = None


@dataclass(frozen=True)
class GenerationOptions:
    """One attribution of a generation, each generated token in turn: the same record for
    ``attnkit show --generate N --explain`` and :func:`attnkit.viz.explain_generation`
    (:func:`attnkit.viz.attribution_steps.explain_generation_with` runs it).

    Attributes:
        ids: (n,) the prompt's token ids, then the N generated ones.
        prompt_length: L, in 1 .. n - 1.
        tokens: the n tokens as shown, or None (the tokenizer's pieces).
        method: one of :data:`attnkit.viz.attribution.METHODS`.
        steps: integrated gradients' number of points on the path.
    """

    ids: tuple[int, ...]
    prompt_length: int
    tokens: tuple[str, ...] | None = None
    method: str = "attention_x_gradient"
    steps: int = 32


@dataclass(frozen=True)
class PageOptions:
    """How a page is drawn: the page keywords of :func:`attnkit.viz.render_html`,
    :func:`attnkit.viz.to_html` and :func:`attnkit.viz.show`, declared once.

    Attributes:
        key_tokens: the K key tokens; None when the keys are the Q queries.
        layer_labels: the layers' names (default ``"layer i"``).
        head_labels: the heads' names (default ``"head i"``).
        title: the page's title (default ``"Attention"``).
        subtitle: a line under the title (default none); elided on the page when long.
        meta: a few ``name: value`` facts shown on the page (default none).
        notes: sentences in a box under the title (default none).
        pair_start: the index of the second sentence's first token, in 1..Q-1 (a
            divider and an A->A / A->B / B->A / B->B filter), or None (default).
        scale: the colour scale, ``"linear"`` (default), ``"power"`` or ``"log"``.
        layer: the layer the page opens on (negative counts from the end), or None.
        heads: the head numbers the page opens on (an int or a list), or None (all).
        top_k: keys kept per query row on a long page (default 16); ignored when
            ``budget`` is given.
        budget: what the page keeps (:class:`~attnkit.viz.reduce.Budget`); None
            (default): the default budget with ``top_k``.
        image: an :class:`~attnkit.viz.ImageLayout` when the tokens are a vision
            transformer's patches, or None (default).
        explain: an :class:`~attnkit.viz.Attribution` from :func:`attnkit.viz.explain`
            on the same model and text: an Explain view (the tokens coloured by
            relevance, the head-importance grid, the relevance matrix), or None
            (default). Its layers and heads are matched to the page's by their labels
            (``"layer i"``, ``"head h"``, as a model run names them). A
            :class:`~attnkit.viz.GenerationAttribution` (each generated token the
            target) gives a steps × sources matrix that follows the generation slider.
    """

    key_tokens: Sequence[str] | None = None
    layer_labels: Sequence[str] | None = None
    head_labels: Sequence[str] | None = None
    title: str = "Attention"
    subtitle: str = ""
    meta: Mapping[str, str] | None = None
    notes: Sequence[str] = ()
    pair_start: int | None = None
    scale: str = "linear"
    layer: int | None = None
    heads: Sequence[int] | int | None = None
    top_k: int = 16
    budget: Budget | None = None
    image: ImageLayout | None = None
    explain: Attribution | GenerationAttribution | None = None

    @classmethod
    def of(cls, where: str, base: PageOptions | None = None, **page: Any) -> PageOptions:
        """``base`` (default: every default) with the keywords ``page`` (field names);
        TypeError naming the function ``where`` for any other name, as Python does."""
        names = {f.name for f in fields(cls)}
        for name in page:
            if name not in names:
                raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")
        return cls(**{**(vars(base) if base is not None else {}), **page})


class PageView:
    """:class:`ViewOptions` applied to the tokens of one input.

    Args:
        options: what to show.
        queries: the query tokens (what the page numbers as rows).
        keys: the key tokens when they differ (cross-attention); None = the queries.
    """

    def __init__(
        self, options: ViewOptions | None, queries: TokenText, keys: TokenText | None = None
    ) -> None:
        self.options = options or ViewOptions()
        opt = self.options
        self.queries, self.keys = queries, keys
        self.rows = position_map(queries, words=opt.words, drop_special=opt.drop_special)
        self.cols = (
            self.rows
            if keys is None
            else position_map(keys, words=opt.words, drop_special=opt.drop_special)
        )
        self.tokens, self.raw = map_labels(queries.shown, queries.raw, self.rows, queries.partial)
        self.window: tuple[int, int] | None = None

    def set_window(self) -> None:
        """Resolve the neuron window against the page's tokens (WindowError when outside)."""
        if self.options.neuron_window is not None:
            self.window = self.options.neuron_window.resolve(self.tokens, len(self.tokens))

    def check_window(self, reducer: SetReducer, head_dim: int) -> None:
        """WindowError when the window is wider than the neuron view of ``reducer`` holds
        (q and k of ``head_dim`` values per head)."""
        if self.window is None or reducer.neuron is None:
            return
        cap = window_capacity(reducer.neuron.budget, len(reducer.layers), len(reducer.heads),
                              head_dim)  # fmt: skip
        width = self.window[1] - self.window[0]
        if width > cap:
            raise WindowError(
                f"--neuron-window: {width:,} query tokens are more than the page holds for "
                f"the neuron view at this model's size (at most {cap:,})"
            )

    def reducer_args(self, keys: bool = False) -> dict[str, Any]:
        """The maps (and the window) for a :class:`~attnkit.viz.reduce.SetReducer`; ``keys``:
        the keys are the other input's tokens (cross-attention)."""
        if keys:
            return {"rows": self.rows, "cols": self.cols, "neuron_window": self.window}
        return {"rows": self.rows, "cols": self.rows, "neuron_window": self.window}

    def finish(
        self,
        s: ReducedSet,
        queries: TokenText | None = None,
        keys: TokenText | None = None,
        *,
        pair_start: int | None = None,
        generated_start: int | None = None,
        cross: bool = False,
    ) -> ReducedSet:
        """Put the page's tokens, positions and view flags on a reduced set."""
        rows = self.rows
        cols = self.cols if cross else rows
        q = queries or self.queries
        s.tokens, raw = map_labels(q.shown, q.raw, rows, q.partial)
        s.raw_tokens = raw if raw != s.tokens else None
        if keys is not None:
            s.key_tokens, key_raw = map_labels(keys.shown, keys.raw, cols, keys.partial)
            s.key_raw_tokens = key_raw if key_raw != s.key_tokens else None
        s.pair_start = s.key_pair_start = map_position(rows, pair_start)
        s.generated_start = map_position(rows, generated_start)
        s.view_kind = "words" if self.options.words else "tokens"
        s.renormalised = any(m is not None and m.drops for m in (rows, cols))
        merged = any(m is not None and m.merges for m in (rows, cols))
        if s.view_kind == "words" and merged:
            source = self.queries.word_source
            how = (
                "the tokenizer's words"
                if source == "tokenizer"
                else "runs of tokens between spaces (the tokenizer marks no words)"
            )
            s.notes.append(
                f"Word view ({how}): attention to a word is the sum over its pieces, attention "
                "from a word the mean over its pieces; each row still sums to 1."
            )
        elif self.options.words:
            s.notes.append("Word view: every word here is a single token, so words are tokens.")
        if s.renormalised:
            s.notes.append(
                "Special tokens are left out and each row is renormalised to sum to 1 over the "
                "tokens shown (rollout too)."
            )
        return s
