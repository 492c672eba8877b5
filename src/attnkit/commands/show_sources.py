"""The checkpoints ``attnkit show`` reads: attnkit's own BERT encoder, or transformers.

A source is opened (config checked against the weights) before anything is
built, then loaded, then run on the text with streaming capture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..models.config_json import ConfigError, is_bert_family
from .show_args import UsageError

__all__ = ["BertSource", "TransformersSource", "open_source"]


class BertSource:
    """A BERT-family checkpoint on attnkit's own encoder."""

    kind = "encoder"

    def __init__(self, path: str | None) -> None:
        from ..models import bert

        _, _, cfg = bert.inspect(path)
        self.path = path
        self.config = cfg
        self.name = Path(path).name if path is not None else "all-MiniLM-L6-v2"
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.max_tokens = cfg.max_tokens
        self.special_tokens = 2
        self.model: Any = None

    def load(self, generate: bool = False, head: bool = False) -> None:
        from ..models import bert

        self.model = bert.load(self.path)
        self.name = self.model.name

    def explain_model(self, directory: Path) -> tuple[Any, Any]:
        """What ``--explain`` attributes: the folder, which :func:`attnkit.viz.explain` loads
        through transformers (attnkit's own encoder is not a transformers model)."""
        return str(directory), None

    def vocabulary(self) -> dict[str, int]:
        """The tokenizer's tokens and their ids (a comparison needs the same on both sides)."""
        return dict(self.model.tokenizer.get_vocab(with_added_tokens=True))

    def content_tokens(self, text: str) -> int:
        (enc,) = self.model.encode_tokens([text], warn=False)
        return sum(1 for kind in enc.special_tokens_mask if kind == 0)

    def attend(self, text: str, pair: str | None, **options: Any) -> Any:
        from ..models.bert.run import attend

        if options.pop("generate_tokens", 0):
            raise UsageError(
                f"--generate: {self.name} is an encoder; generation needs a decoder "
                "(a causal language model such as GPT-2)"
            )
        options.pop("seed", None)
        return attend(self.model, text, pair, **options)


class TransformersSource:
    """Any other local Hugging Face checkpoint, through :class:`attnkit.models.hf.Checkpoint`."""

    special_tokens = 0

    def __init__(self, path: str) -> None:
        from ..models import hf

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
        return self.checkpoint.content_tokens(text)

    def attend(self, text: str, pair: str | None, **options: Any) -> Any:
        return self.checkpoint.attend(text, pair, **options)


def _is_bert_family(directory: Path) -> bool:
    """BERT family by config.json's model_type, or a sentence-transformers layout without one."""
    try:
        return is_bert_family(directory)
    except ConfigError as exc:
        raise UsageError(f"--model: {exc}") from None


def open_source(path: str | None) -> Any:
    """The checkpoint, checked (config against weights) but not built."""
    from ..models import bert, hf

    where = "--model: " if path is not None else ""
    try:
        if path is None or _is_bert_family(Path(path)):
            return BertSource(path)
        return TransformersSource(path)
    except (bert.CheckpointError, hf.CheckpointError) as exc:
        raise UsageError(f"{where}{exc}") from None
