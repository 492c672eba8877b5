"""Any local Hugging Face checkpoint's attention, through transformers, offline.

Encoders (DistilBERT, ...), decoders (GPT-2, ...: causal) and encoder-decoders
(T5, BART, ...: encoder self-attention, decoder self-attention and
cross-attention) are loaded with ``attn_implementation="eager"`` and run with
``output_attentions=True``; nothing is downloaded (``local_files_only``).
BERT-family checkpoints are better served by :mod:`attnkit.models.bert`, which
runs on attnkit's own attention.

The checkpoint's ``config.json`` is checked against its safetensors headers
before anything is built, so a config that disagrees with its weights is
refused in a fraction of a second.

    >>> from attnkit.models import hf
    >>> ckpt = hf.Checkpoint("path/to/gpt2-like")          # doctest: +SKIP
    >>> run = ckpt.attend("The cat sat.", max_length=64)    # doctest: +SKIP
    >>> run.sets[0].weights.shape                           # doctest: +SKIP
    torch.Size([12, 12, 4, 4])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..viz.html import AttentionSet
from .weights import HeaderError, layer_counts, read_shapes, safetensors_files

__all__ = ["KINDS", "AttentionRun", "Checkpoint", "CheckpointError"]

KINDS = ("encoder", "decoder", "encoder-decoder")
# Families whose base model is a causal decoder even when config.json names no architecture.
_DECODER_TYPES = frozenset(
    ("gpt2", "gpt_neo", "gpt_neox", "gptj", "llama", "mistral", "opt", "bloom", "falcon", "qwen2")
)
# Largest position count read from a tokenizer when the model has no position table (T5).
_DEFAULT_MAX_TOKENS = 512


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be used; the message says why in one line."""


@dataclass(frozen=True)
class AttentionRun:
    """The attention of one input, ready for :func:`attnkit.viz.to_html`.

    Attributes:
        sets: one :class:`~attnkit.viz.AttentionSet` per kind of attention
            (one for encoders and decoders; encoder, decoder and cross for
            encoder-decoders), with weights (layers, heads, Q, K).
        tokens: the input's tokens (the first set's queries).
        total_tokens: how many tokens the input makes before truncation.
    """

    sets: list[AttentionSet]
    tokens: list[str]
    total_tokens: int


def _int_field(config: Any, names: Sequence[str]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if value is not None:
            raise CheckpointError(f"config.json: {name} must be a positive integer, got {value!r}")
    return None


class Checkpoint:
    """A local Hugging Face checkpoint directory, checked on construction, loaded on first use.

    Attributes:
        directory: the checkpoint directory.
        name: a short name for messages (the directory's name).
        kind: "encoder", "decoder" or "encoder-decoder".
        num_layers: layers of the encoder (of the decoder for decoders).
        num_decoder_layers: layers of the decoder of an encoder-decoder, else None.
        num_heads: attention heads per layer.
        max_tokens: the longest input the model's positions allow.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.name = self.directory.name
        if not self.directory.is_dir():
            raise CheckpointError(f"{self.directory}: not a directory")
        config_path = self.directory / "config.json"
        if not config_path.is_file():
            raise CheckpointError(f"{self.directory}: missing config.json")
        files = self._weight_files()
        try:
            from transformers import AutoConfig
        except ImportError:
            raise CheckpointError(
                f"{self.directory}: a {self._model_type(config_path)!r} checkpoint needs the "
                "package transformers (pip install transformers)"
            ) from None
        try:
            self.config = AutoConfig.from_pretrained(str(self.directory), local_files_only=True)
        except Exception as exc:  # transformers raises many types for a bad config
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(
                f"{config_path}: transformers cannot read it ({detail})"
            ) from None
        cfg = self.config
        if getattr(cfg, "is_encoder_decoder", False):
            self.kind = "encoder-decoder"
        elif cfg.model_type in _DECODER_TYPES or any(
            a.endswith(("ForCausalLM", "LMHeadModel")) for a in (cfg.architectures or [])
        ):
            self.kind = "decoder"
        else:
            self.kind = "encoder"
        layers = _int_field(cfg, ("num_hidden_layers",))
        heads = _int_field(cfg, ("num_attention_heads",))
        if layers is None or heads is None or layers < 1 or heads < 1:
            raise CheckpointError(
                f"{config_path}: expected positive layer and head counts, got "
                f"num_hidden_layers {layers!r}, num_attention_heads {heads!r}"
            )
        self.num_layers = layers
        self.num_heads = heads
        self.num_decoder_layers = (
            _int_field(cfg, ("num_decoder_layers", "decoder_layers")) or layers
            if self.kind == "encoder-decoder"
            else None
        )
        self._check_weights(files, config_path)
        positions = _int_field(cfg, ("max_position_embeddings",))
        self.max_tokens = positions if positions else _DEFAULT_MAX_TOKENS
        self._model: Any = None
        self._tokenizer: Any = None

    # ----------------------------------------------------------------------- checks

    @staticmethod
    def _model_type(config_path: Path) -> str:
        try:
            data = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            raise CheckpointError(f"{config_path}: not a readable JSON file") from None
        return str(data.get("model_type", "unknown")) if isinstance(data, dict) else "unknown"

    def _weight_files(self) -> list[Path]:
        try:
            files = safetensors_files(self.directory)
        except HeaderError as exc:
            raise CheckpointError(str(exc)) from None
        if not files:
            raise CheckpointError(
                f"{self.directory}: missing model.safetensors (or a sharded "
                "model.safetensors.index.json); other weight formats are not read"
            )
        return files

    def _check_weights(self, files: list[Path], config_path: Path) -> None:
        """The config's layer counts, vocabulary and positions against the stored tensors."""
        shapes: dict[str, tuple[int, ...]] = {}
        try:
            for f in files:
                shapes.update(read_shapes(f))
        except HeaderError as exc:
            raise CheckpointError(str(exc)) from None
        stacks = layer_counts(list(shapes))
        held = sorted(set(stacks.values()))
        declared = [("num_hidden_layers", self.num_layers)]
        if self.num_decoder_layers is not None:
            declared.append(("num_decoder_layers", self.num_decoder_layers))
        for field, n in declared:
            if n not in held:
                said = ", ".join(map(str, held)) or "no numbered layers"
                raise CheckpointError(
                    f"{config_path}: {field} is {n} but the weights hold stacks of {said}"
                )
        cfg = self.config
        limits = {
            "vocab_size": (
                "word_embeddings.weight",
                "wte.weight",
                "shared.weight",
                "embed_tokens.weight",
            ),
            "max_position_embeddings": (
                "position_embeddings.weight",
                "wpe.weight",
                "embed_positions.weight",
            ),
        }
        for field, suffixes in limits.items():
            value = getattr(cfg, field, None)
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            rows = {
                shape[0]
                for name, shape in shapes.items()
                if name.endswith(suffixes) and len(shape) == 2
            }
            # Some families pad their position table by a fixed offset (BART: 2).
            if rows and not any(0 <= r - value <= 2 for r in rows):
                raise CheckpointError(
                    f"{config_path}: {field} is {value} but the weights' tables have "
                    f"{', '.join(map(str, sorted(rows)))} rows"
                )
        if self.num_heads > 4096:
            raise CheckpointError(
                f"{config_path}: num_attention_heads {self.num_heads} is implausible"
            )

    # ----------------------------------------------------------------------- loading

    def load(self) -> None:
        """Build the model (eager attention, eval mode) and the tokenizer; idempotent."""
        if self._model is not None:
            return
        import transformers
        from transformers import AutoModel, AutoTokenizer

        transformers.logging.set_verbosity_error()
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(
                str(self.directory), local_files_only=True
            )
        except Exception as exc:  # transformers raises many types for a missing tokenizer
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(f"{self.directory}: no usable tokenizer ({detail})") from None
        try:
            self._model = AutoModel.from_pretrained(
                str(self.directory), local_files_only=True, attn_implementation="eager"
            ).eval()
        except Exception as exc:  # shapes, missing keys, unsupported architectures
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(
                f"{self.directory}: transformers cannot load it ({detail})"
            ) from None
        limit = getattr(self._tokenizer, "model_max_length", None)
        if not getattr(self.config, "max_position_embeddings", None) and isinstance(limit, int):
            self.max_tokens = min(limit, self.max_tokens) if limit < 10**6 else self.max_tokens

    def _encode(self, text: str, pair: str | None, max_length: int | None) -> Any:
        tok = self._tokenizer
        if max_length is None:
            return tok(text, pair, add_special_tokens=True)
        return tok(
            text, pair, add_special_tokens=True, truncation="longest_first", max_length=max_length
        )

    def count_tokens(self, text: str, pair: str | None = None) -> int:
        """How many tokens the input makes, special tokens included, untruncated."""
        self.load()
        if self.kind == "encoder-decoder":
            pair = None
        return len(self._encode(text, pair, None)["input_ids"])

    def content_tokens(self, text: str) -> int:
        """How many tokens the text makes without special tokens (0 for only invisible characters)."""
        self.load()
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def attend(
        self,
        text: str,
        pair: str | None = None,
        *,
        max_length: int | None = None,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
    ) -> AttentionRun:
        """Run the model on one input and return its attention weights.

        Args:
            text: the input (the encoder's, for an encoder-decoder).
            pair: a second sentence (encoders and decoders); for an
                encoder-decoder, the decoder's text (default: ``text``).
            max_length: truncate each text to this many tokens; None = ``max_tokens``.
            layers: layer numbers to keep (default all), in increasing order.
            heads: head numbers to keep (default all).

        Returns:
            an :class:`AttentionRun`.
        """
        self.load()
        limit = self.max_tokens if max_length is None else max_length
        tok = self._tokenizer
        if self.kind == "encoder-decoder":
            return self._attend_seq2seq(
                text, pair if pair is not None else text, limit, layers, heads
            )
        total = self.count_tokens(text, pair)
        enc = self._encode(text, pair, limit)
        ids = torch.tensor([enc["input_ids"]], dtype=torch.long)  # (1, L)
        tokens = [str(t) for t in tok.convert_ids_to_tokens(enc["input_ids"])]
        with torch.no_grad():
            out = self._model(
                input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True
            )
        weights = _select(out.attentions, layers, heads)  # (layers, heads, L, L)
        pair_start = None
        if pair is not None:
            seq = enc.sequence_ids() if hasattr(enc, "sequence_ids") else None
            second = [i for i, s in enumerate(seq or []) if s == 1]
            pair_start = second[0] if second and 0 < second[0] < len(tokens) else None
        name = "self-attention" + (" (causal)" if self.kind == "decoder" else "")
        return AttentionRun(
            sets=[self._set(name, weights, tokens, None, layers, heads, pair_start)],
            tokens=tokens,
            total_tokens=total,
        )

    def _attend_seq2seq(
        self,
        text: str,
        target: str,
        limit: int,
        layers: Sequence[int] | None,
        heads: Sequence[int] | None,
    ) -> AttentionRun:
        tok, cfg = self._tokenizer, self.config
        total = max(self.count_tokens(text), self.count_tokens(target))
        enc = self._encode(text, None, limit)
        dec = self._encode(target, None, limit)
        start = getattr(cfg, "decoder_start_token_id", None)
        if start is None:
            start = getattr(cfg, "pad_token_id", 0) or 0
        dec_ids = [int(start), *dec["input_ids"][:-1]]  # shifted right, as in training
        src = torch.tensor([enc["input_ids"]], dtype=torch.long)  # (1, L)
        tgt = torch.tensor([dec_ids], dtype=torch.long)  # (1, T)
        with torch.no_grad():
            out = self._model(
                input_ids=src,
                attention_mask=torch.ones_like(src),
                decoder_input_ids=tgt,
                output_attentions=True,
            )
        src_tokens = [str(t) for t in tok.convert_ids_to_tokens(enc["input_ids"])]
        tgt_tokens = [str(t) for t in tok.convert_ids_to_tokens(dec_ids)]
        sets = [
            self._set(
                "encoder self-attention",
                _select(out.encoder_attentions, layers, heads),  # (layers, heads, L, L)
                src_tokens, None, layers, heads, None,
            ),
            self._set(
                "decoder self-attention (causal)",
                _select(out.decoder_attentions, layers, heads),  # (layers, heads, T, T)
                tgt_tokens, None, layers, heads, None,
            ),
            self._set(
                "cross-attention (decoder → encoder)",
                _select(out.cross_attentions, layers, heads),  # (layers, heads, T, L)
                tgt_tokens, src_tokens, layers, heads, None,
            ),
        ]  # fmt: skip
        return AttentionRun(sets=sets, tokens=src_tokens, total_tokens=total)

    @staticmethod
    def _set(
        name: str,
        weights: torch.Tensor,
        tokens: list[str],
        key_tokens: list[str] | None,
        layers: Sequence[int] | None,
        heads: Sequence[int] | None,
        pair_start: int | None,
    ) -> AttentionSet:
        n_layers, n_heads = weights.shape[0], weights.shape[1]
        return AttentionSet(
            name=name,
            weights=weights,
            tokens=tokens,
            key_tokens=key_tokens,
            layer_labels=[
                f"layer {i}" for i in (layers if layers is not None else range(n_layers))
            ],
            head_labels=[f"head {h}" for h in (heads if heads is not None else range(n_heads))],
            pair_start=pair_start,
        )


def _select(
    attentions: Sequence[torch.Tensor], layers: Sequence[int] | None, heads: Sequence[int] | None
) -> torch.Tensor:
    """Per-layer (1, H, Q, K) weights -> (layers, heads, Q, K) float32 of the chosen ones."""
    if not attentions:
        raise CheckpointError("the model returned no attention weights (is its attention eager?)")
    picked = [attentions[i] for i in layers] if layers is not None else list(attentions)
    w = torch.stack([a[0] for a in picked]).detach().float()  # (layers, H, Q, K)
    if heads is not None:
        w = w[:, list(heads)]  # (layers, heads, Q, K)
    return w
