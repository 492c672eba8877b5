"""The BERT-family encoder: embeddings, self-attention on :func:`attnkit.attention`, layers.

Attribute names follow the checkpoint's keys so its state dict loads as is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ... import masks
from ...functional import attention
from . import text as tokenization
from .config import BertConfig

__all__ = [
    "Bert",
    "BertAttention",
    "BertEmbeddings",
    "BertEncoder",
    "BertIntermediate",
    "BertLayer",
    "BertOutput",
    "BertOutputBlock",
    "BertPooler",
    "BertSelfAttention",
    "BertSelfOutput",
]


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
        return tokenization.count_tokens(self._require_tokenizer(), text, pair)

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
        return tokenization.pad_batch(encodings, self.config.pad_token_id)

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
        limit = self.config.max_tokens
        return tokenization.encode_tokens(
            self._require_tokenizer(),
            texts,
            pairs,
            max_length=limit if max_length is None else max_length,
            limit=limit,
            warn=warn,
        )

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
