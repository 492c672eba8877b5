"""The :class:`Source` protocol: what the viewer reads from a model, whatever the model is.

A source is opened (its config checked against its weights, nothing built),
then loaded, then run on a text with streaming capture. :func:`open_source`
(:mod:`.resolve`) picks the source for a checkpoint folder or a model in memory;
``attnkit show`` and :func:`attnkit.viz.show` both go through it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["Source", "SourceError", "TextSource"]


class SourceError(ValueError):
    """A source asked for something its model cannot do (generation from an encoder).

    The message names the argument as :func:`attnkit.viz.show` spells it; the
    command line checks the same before a model is built and words it with its flag.
    """


@runtime_checkable
class Source(Protocol):
    """A model the viewer runs: its sizes before it is built, then its attention on an input.

    Every source has these; a text source (:class:`TextSource`) has its tokenizer's
    too. An image source's input is a picture, its tokens the picture's patches
    (:class:`~.image.ImageSource`).

    Attributes:
        name: a short name for messages and the page's title (the folder's name, or
            the checkpoint's own name once loaded).
        kind: ``"encoder"``, ``"decoder"``, ``"encoder-decoder"`` or ``"vision encoder"``.
        num_layers: layers whose attention is captured (the decoder's, for an
            encoder-decoder when it has fewer).
        num_heads: attention heads per layer.
    """

    name: str
    kind: str
    num_layers: int
    num_heads: int

    def load(self, generate: bool = False, head: bool = False) -> None:
        """Build the model and its tokenizer; idempotent.

        Args:
            generate: build what generation needs (a causal language model's head).
            head: build the head the config names, which :func:`attnkit.viz.explain`
                attributes, so one model serves the page and the attribution.
        """
        ...

    def attend(self, text: Any, pair: str | None, **options: Any) -> Any:
        """Run the model on one input with streaming capture: every layer reduced as it runs.

        Args:
            text: the input: a text (a decoder's prompt; an encoder-decoder's encoder
                text), or an RGB ``PIL.Image`` for an image source.
            pair: a second sentence, or an encoder-decoder's decoder text, or None.
            **options: ``layers`` and ``heads`` (sequences of ints, increasing),
                ``budget`` (:class:`~attnkit.viz.reduce.Budget`); a text source also
                takes ``max_length`` (int, tokens), ``generate_tokens`` (int, a
                decoder's new tokens), ``seed`` (int or None: greedy) and ``view``
                (:class:`~attnkit.viz.options.ViewOptions`).

        Returns:
            An :class:`~attnkit.viz.sources.text_run.AttentionRun` (an image source's
            :class:`~attnkit.viz.sources.image_run.ImageRun`): the tokens shown (Q of them),
            the reduced sets (per layer × head, (Q, K) weights or a long input's block
            overview and exact top-k), and the run's notes.

        Raises:
            SourceError: generation asked of a model that is not a decoder.
        """
        ...

    def explain_model(self, directory: Path) -> tuple[Any, Any]:
        """What attribution runs backward through for this source: ``(model, tokenizer)``.

        The target is the output of the head :meth:`load` built with ``head=True``
        (a classifier's top class, a language model's next token), the way backward
        is the model's own autograd. Returns that model and its tokenizer; or a
        folder (str) and None when :func:`attnkit.viz.explain` must load the
        checkpoint through transformers itself (attnkit's own encoder is not a
        transformers model); or an image checkpoint and None
        (:func:`attnkit.viz.explain_image`). ``directory`` is the checkpoint's folder.
        """
        ...


@runtime_checkable
class TextSource(Source, Protocol):
    """A source whose input is text: :class:`Source` and its tokenizer's facts.

    Attributes:
        max_tokens: the longest input the model's positions allow (may shrink on
            :meth:`~Source.load`, when only the tokenizer knows it).
        special_tokens: special tokens the tokenizer adds to one text ([CLS] and
            [SEP]: 2; 0 when the source does not count them before a run).
    """

    max_tokens: int
    special_tokens: int

    def content_tokens(self, text: str) -> int:
        """How many tokens ``text`` makes without special tokens (0: only invisible characters)."""
        ...

    def vocabulary(self) -> dict[str, int]:
        """The tokenizer's tokens and their ids (a comparison needs the same on both sides)."""
        ...
