"""The architecture of a BERT-family checkpoint, read from its ``config.json``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = ["ACTIVATIONS", "ROBERTA_FAMILY", "BertConfig", "CheckpointError"]

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")
# Encoders whose position ids count real tokens from pad_token_id + 1 (RoBERTa's scheme).
ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message says why in one line."""


@dataclass(frozen=True)
class BertConfig:
    """The architecture fields of a BERT ``config.json`` that the encoder uses."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int = 0
    model_type: str = "bert"

    @property
    def head_dim(self) -> int:
        """Features per attention head: hidden_size / num_attention_heads."""
        return self.hidden_size // self.num_attention_heads

    @property
    def position_offset(self) -> int:
        """Position id of the first token: ``pad_token_id + 1`` for RoBERTa-family models, else 0."""
        return self.pad_token_id + 1 if self.model_type in ROBERTA_FAMILY else 0

    @property
    def max_tokens(self) -> int:
        """The longest input the position embeddings cover."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config.json") -> BertConfig:
        """Build from a parsed ``config.json``; raise CheckpointError naming a bad field."""
        if not isinstance(data, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(data).__name__}")
        model_type = data.get("model_type", "bert")
        if model_type not in ("bert", *ROBERTA_FAMILY):
            raise CheckpointError(
                f"{source}: model_type {model_type!r} is not a BERT-family encoder"
            )
        pos_type = data.get("position_embedding_type", "absolute")
        if pos_type != "absolute":
            raise CheckpointError(
                f"{source}: position_embedding_type {pos_type!r} is not supported (only 'absolute')"
            )
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in data:
                values[f.name] = data[f.name]
        missing = [
            f.name
            for f in fields(cls)
            if f.name not in values
            and f.name
            in (
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
            )
        ]
        if missing:
            raise CheckpointError(f"{source}: missing field(s) {', '.join(missing)}")
        cfg = cls(**values)
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            val = getattr(cfg, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise CheckpointError(f"{source}: {name} must be a positive integer, got {val!r}")
        if cfg.hidden_size % cfg.num_attention_heads:
            raise CheckpointError(
                f"{source}: hidden_size {cfg.hidden_size} is not a multiple of "
                f"num_attention_heads {cfg.num_attention_heads}"
            )
        if cfg.max_tokens < 1:
            raise CheckpointError(
                f"{source}: max_position_embeddings {cfg.max_position_embeddings} leaves no "
                f"position after pad_token_id {cfg.pad_token_id}"
            )
        if cfg.hidden_act not in ACTIVATIONS:
            raise CheckpointError(
                f"{source}: hidden_act {cfg.hidden_act!r} is not supported; expected one of "
                f"{', '.join(ACTIVATIONS)}"
            )
        return cfg
