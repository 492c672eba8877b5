"""A transformers model already in memory, with its tokenizer, as a source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from .base import SourceError

__all__ = ["ModelSource", "hf_kind"]


def hf_kind(model: nn.Module) -> str:
    """``"encoder"``, ``"decoder"`` or ``"encoder-decoder"``: a transformers model's kind,
    from its config and its class name."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "is_encoder_decoder", False):
        return "encoder-decoder"
    name = type(model).__name__
    if name.endswith(("ForCausalLM", "LMHeadModel")) or getattr(cfg, "is_decoder", False):
        return "decoder"
    from ...models.hf import _DECODER_TYPES

    return "decoder" if getattr(cfg, "model_type", "") in _DECODER_TYPES else "encoder"


class ModelSource:
    """A transformers model the caller built, run as it is (its own head), in eval mode for
    each run: every module's ``training`` flag is as it was after.

    Args:
        model: a transformers model (``model.config`` names its layers and heads).
        tokenizer: its tokenizer.

    Raises:
        TypeError: ``tokenizer`` is None (a transformers model needs its tokenizer).
    """

    special_tokens = 0

    def __init__(self, model: nn.Module, tokenizer: Any) -> None:
        if tokenizer is None:
            raise TypeError("tokenizer: a transformers model needs its tokenizer")
        cfg: Any = model.config
        self.model = model
        self.tokenizer = tokenizer
        self.kind = hf_kind(model)
        self.name = type(model).__name__
        self.num_layers = int(getattr(cfg, "num_hidden_layers", 0) or getattr(cfg, "num_layers", 0))
        self.num_heads = int(cfg.num_attention_heads)
        self.num_decoder_layers = getattr(cfg, "num_decoder_layers", None) or getattr(
            cfg, "decoder_layers", None
        )
        self.max_tokens = int(getattr(cfg, "max_position_embeddings", None) or 512)

    def load(self, generate: bool = False, head: bool = False) -> None:
        """Nothing to build: the model is built already (each run sets eval mode itself)."""

    def explain_model(self, directory: Path) -> tuple[Any, Any]:
        """The model and its tokenizer, as given."""
        return self.model, self.tokenizer

    def vocabulary(self) -> dict[str, int]:
        """The tokenizer's tokens and their ids."""
        return dict(self.tokenizer.get_vocab())

    def content_tokens(self, text: str) -> int:
        """How many tokens ``text`` makes without special tokens."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def attend(self, text: str, pair: str | None, **options: Any) -> Any:
        """Run the model (:func:`attnkit.viz.sources.text_run.run_text`: generation with
        ``generate_tokens``, else one forward); options as
        :meth:`~.base.Source.attend`.

        Raises:
            SourceError: ``generate_tokens`` > 0 and the model is not a decoder.
        """
        from .text_run import run_text

        limit = options.pop("max_length", None)
        limit = self.max_tokens if limit is None else limit
        return run_text(self.model, self.tokenizer, self.kind, text, pair, max_length=limit,
                        n_layers=self.num_layers, n_heads=self.num_heads,
                        n_decoder_layers=self.num_decoder_layers, refuse=_not_a_decoder,
                        **options)  # fmt: skip


def _not_a_decoder(kind: str) -> SourceError:
    return SourceError(f"generate: needs a decoder (a causal language model), got an {kind}")
