"""Any local Hugging Face checkpoint's attention, through transformers, offline.

Encoders (DistilBERT, ...), decoders (GPT-2, ...: causal) and encoder-decoders
(T5, BART, ...: encoder self-attention, decoder self-attention and
cross-attention) are loaded with ``attn_implementation="eager"``; the viewer runs
them on ``attn_implementation="attnkit"`` with streaming capture
(:class:`attnkit.viz.sources.TransformersSource`). Nothing is downloaded
(``local_files_only``) and no code from the folder ever runs
(``trust_remote_code=False``; a config with ``auto_map`` is refused).
BERT-family checkpoints are better served by :mod:`attnkit.models.bert`, which
runs on attnkit's own attention.

The checkpoint's ``config.json`` is checked against its safetensors headers
before anything is built, so a config that disagrees with its weights is
refused in a fraction of a second.

    >>> from attnkit.models import hf
    >>> ckpt = hf.Checkpoint("path/to/gpt2-like")          # doctest: +SKIP
    >>> ckpt.load()                                         # doctest: +SKIP
    >>> ckpt.count_tokens("The cat sat.")                   # doctest: +SKIP
    4
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config_json import ConfigError, read_checked_config
from .weights import HeaderError, layer_counts, read_shapes, safetensors_files

__all__ = ["KINDS", "Checkpoint", "CheckpointError", "first_line"]

KINDS = ("encoder", "decoder", "encoder-decoder")
# Families whose base model is a causal decoder even when config.json names no architecture.
_DECODER_TYPES = frozenset(
    ("gpt2", "gpt_neo", "gpt_neox", "gptj", "llama", "mistral", "opt", "bloom", "falcon", "qwen2")
)
# Largest position count read from a tokenizer when the model has no position table (T5).
_DEFAULT_MAX_TOKENS = 512


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be used; the message says why in one line."""


def _int_field(config: Any, names: Sequence[str]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if value is not None:
            raise CheckpointError(f"config.json: {name} must be a positive integer, got {value!r}")
    return None


def read_checkpoint_config(directory: Path) -> dict[str, Any]:
    """The checked ``config.json`` of checkpoint ``directory`` (no remote code, sane numbers).

    Raises:
        CheckpointError: not a directory, no config.json, or a config refused.
    """
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{directory}: missing config.json")
    try:
        return read_checked_config(config_path)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None


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
        data = read_checkpoint_config(self.directory)
        config_path = self.directory / "config.json"
        model_type = str(data.get("model_type", "unknown"))
        if _is_image_model(data):
            raise CheckpointError(
                f"{self.directory}: a {model_type!r} checkpoint is an image model; "
                "give it a picture with --image PATH (attnkit.viz.show_image in Python)"
            )
        files = self._weight_files()
        try:
            from transformers import AutoConfig
        except ImportError:
            raise CheckpointError(
                f"{self.directory}: a {model_type!r} checkpoint needs the "
                "package transformers (pip install 'transformers>=5', attnkit's `transformers` extra)"
            ) from None
        try:
            self.config = AutoConfig.from_pretrained(
                str(self.directory), local_files_only=True, trust_remote_code=False
            )
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
        self._head = "none"  # the head of the built model

    # ----------------------------------------------------------------------- checks

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

    @property
    def head(self) -> str:
        """The head the checkpoint's config names, from the config alone: ``"classifier"``
        (its ``architectures`` name a ``...ForSequenceClassification``), ``"lm"`` (a
        decoder: its language-model head) or ``"none"``."""
        archs = list(getattr(self.config, "architectures", None) or [])
        if any(a.endswith("ForSequenceClassification") for a in archs):
            return "classifier"
        return "lm" if self.kind == "decoder" else "none"

    def load(self, *, causal_lm: bool = False, head: bool = False) -> None:
        """Build the model (eager attention, eval mode) and the tokenizer; idempotent.

        A model with a head serves every later call that asks for less: the page's
        forward runs its backbone, whose attention is the base model's.

        Args:
            causal_lm: build the language-model head too (for generation).
            head: build the head the config names (:attr:`head`; what
                :func:`attnkit.viz.explain` attributes), so one model serves both the
                page and the attribution.
        """
        wanted = "lm" if causal_lm else self.head if head else "none"
        if self._model is not None and wanted in ("none", self._head):
            return
        from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

        self._load_tokenizer()
        autos: dict[str, Any] = {"lm": AutoModelForCausalLM,
                                 "classifier": AutoModelForSequenceClassification}  # fmt: skip
        auto = autos.get(wanted, AutoModel)
        try:
            self._model = auto.from_pretrained(
                str(self.directory), local_files_only=True, attn_implementation="eager",
                trust_remote_code=False,
            ).eval()  # fmt: skip
        except Exception as exc:  # shapes, missing keys, unsupported architectures
            raise CheckpointError(
                f"{self.directory}: transformers cannot load it ({first_line(exc)})"
            ) from None
        self._head = wanted

    def _load_tokenizer(self) -> None:
        """Build the tokenizer (no model); idempotent."""
        if self._tokenizer is not None:
            return
        import transformers
        from transformers import AutoTokenizer

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        missing = not any((self.directory / f).is_file() for f in _TOKENIZER_FILES)
        if missing:
            raise CheckpointError(
                f"{self.directory}: no tokenizer files (expected one of "
                f"{', '.join(_TOKENIZER_FILES)})"
            )
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(
                str(self.directory), local_files_only=True, trust_remote_code=False
            )
        except Exception as exc:  # transformers raises many types for a bad tokenizer
            raise CheckpointError(
                f"{self.directory}: no usable tokenizer ({first_line(exc)})"
            ) from None
        limit = getattr(self._tokenizer, "model_max_length", None)
        if not getattr(self.config, "max_position_embeddings", None) and isinstance(limit, int):
            self.max_tokens = min(limit, self.max_tokens) if limit < 10**6 else self.max_tokens

    @property
    def model(self) -> Any:
        """The built model (built by :meth:`load` if it is not yet: the base model)."""
        self.load()
        return self._model

    @property
    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer (built on first use; no model is built for it)."""
        self._load_tokenizer()
        return self._tokenizer

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

    def not_a_decoder(self, kind: str) -> CheckpointError:
        """The error for generation asked of this checkpoint, which is a ``kind``."""
        return CheckpointError(f"{self.name}: generation needs a decoder, not an {kind}")


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt",
                    "spiece.model", "tokenizer.model", "sentencepiece.bpe.model")  # fmt: skip


def first_line(exc: Exception) -> str:
    """The first line of an exception's message, or its type's name (transformers'
    errors run to many lines)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _is_image_model(data: Any) -> bool:
    """A vision config: image sizes and channels, and no text vocabulary."""
    return (
        isinstance(data, dict)
        and "vocab_size" not in data
        and ("image_size" in data or "num_channels" in data or "patch_size" in data)
    )
