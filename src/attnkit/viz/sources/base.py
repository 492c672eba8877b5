"""The :class:`Source` protocol: what the viewer reads from a model, whatever the model is.

A source is opened (its config checked against its weights, nothing built),
then loaded, then run on a text with streaming capture. :func:`open_source`
(:mod:`.resolve`) picks the source for a checkpoint folder or a model in memory;
``attnkit show`` and :func:`attnkit.viz.show` both go through it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ...models.hf_run import AttentionRun

__all__ = ["Source", "SourceError"]


class SourceError(ValueError):
    """A source asked for something its model cannot do (generation from an encoder).

    The message names the argument as :func:`attnkit.viz.show` spells it; the
    command line checks the same before a model is built and words it with its flag.
    """


@runtime_checkable
class Source(Protocol):
    """A model the viewer runs: its sizes before it is built, then its attention on a text.

    Attributes:
        name: a short name for messages and the page's title (the folder's name, or
            the checkpoint's own name once loaded).
        kind: ``"encoder"``, ``"decoder"`` or ``"encoder-decoder"``.
        num_layers: layers whose attention is captured (the decoder's, for an
            encoder-decoder when it has fewer).
        num_heads: attention heads per layer.
        max_tokens: the longest input the model's positions allow (may shrink on
            :meth:`load`, when only the tokenizer knows it).
        special_tokens: special tokens the tokenizer adds to one text ([CLS] and
            [SEP]: 2; 0 when the source does not count them before a run).
    """

    name: str
    kind: str
    num_layers: int
    num_heads: int
    max_tokens: int
    special_tokens: int

    def load(self, generate: bool = False, head: bool = False) -> None:
        """Build the model and its tokenizer; idempotent.

        Args:
            generate: build what generation needs (a causal language model's head).
            head: build the head the config names, which :func:`attnkit.viz.explain`
                attributes, so one model serves the page and the attribution.
        """
        ...

    def attend(self, text: str, pair: str | None, **options: Any) -> AttentionRun:
        """Run the model on ``text`` with streaming capture: every layer reduced as it runs.

        Args:
            text: the input (a decoder's prompt; an encoder-decoder's encoder text).
            pair: a second sentence, or an encoder-decoder's decoder text, or None.
            **options: ``max_length`` (int, tokens), ``layers`` and ``heads`` (sequences
                of ints, increasing), ``generate_tokens`` (int, a decoder's new tokens),
                ``seed`` (int or None: greedy), ``budget``
                (:class:`~attnkit.viz.reduce.Budget`), ``view``
                (:class:`~attnkit.viz.options.ViewOptions`).

        Returns:
            An :class:`~attnkit.models.hf_run.AttentionRun`: the tokens shown (Q of
            them), the reduced sets (per layer × head, (Q, K) or a long input's block
            overview and top-k), the untruncated token count and the run's notes.

        Raises:
            SourceError: generation asked of a model that is not a decoder.
        """
        ...

    def content_tokens(self, text: str) -> int:
        """How many tokens ``text`` makes without special tokens (0: only invisible characters)."""
        ...

    def vocabulary(self) -> dict[str, int]:
        """The tokenizer's tokens and their ids (a comparison needs the same on both sides)."""
        ...

    def explain_model(self, directory: Path) -> tuple[Any, Any]:
        """What :func:`attnkit.viz.explain` attributes for this source: ``(model, tokenizer)``.

        The model :meth:`load` built with ``head=True`` and its tokenizer, or a folder
        (str) and None when explain must load the checkpoint through transformers
        itself (attnkit's own encoder is not a transformers model). ``directory`` is
        the checkpoint's folder.
        """
        ...
