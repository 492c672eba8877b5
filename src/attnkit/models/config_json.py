"""Reading a checkpoint's ``config.json`` safely: bounded, parsed without recursion errors,
numeric fields checked before any model is built.

A config is data from someone else's folder: it may nest brackets until the
parser overflows, hold NaN or a negative epsilon, or ask transformers to run
the folder's own code (``auto_map``). Each is refused here with one line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = [
    "BERT_TYPES",
    "ConfigError",
    "check_numbers",
    "is_bert_family",
    "read_checked_config",
    "read_json",
    "refuse_remote_code",
]

BERT_TYPES = ("bert", "roberta", "xlm-roberta", "camembert")
"""config.json ``model_type`` values that attnkit's own BERT encoder loads."""

# A config.json is a few kilobytes; anything near this is not one.
MAX_CONFIG_BYTES = 16 * 1024 * 1024


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the field."""


def read_json(path: Path) -> Any:
    """The parsed JSON of ``path``; ConfigError "not a readable JSON file" otherwise.

    Deeply nested input (200,000 brackets) raises RecursionError inside the
    parser; it is reported like any other unreadable file.
    """
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: not a readable JSON file (larger than 16 MB)")
        return json.loads(raw.decode("utf-8"))
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"{path}: not a readable JSON file (nested too deeply)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable JSON file ({exc})") from None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_numbers(data: Any, source: str) -> None:
    """Refuse non-finite numbers anywhere at the top two levels, non-positive epsilons and
    dropout probabilities outside [0, 1].

    Raises:
        ConfigError: naming the field and its value.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
    items: list[tuple[str, Any]] = []
    for key, value in data.items():
        items.append((str(key), value))
        if isinstance(value, dict):  # text_config, vision_config, ...
            items.extend((f"{key}.{k}", v) for k, v in value.items())
    for name, value in items:
        if not _is_number(value):
            continue
        leaf = name.rsplit(".", 1)[-1].lower()
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{source}: {name} must be a finite number, got {value!r}")
        if ("eps" in leaf or "epsilon" in leaf) and not value > 0:
            raise ConfigError(f"{source}: {name} must be a positive number, got {value!r}")
        if ("dropout" in leaf or "pdrop" in leaf or leaf.endswith("_prob")) and not (
            0 <= value <= 1
        ):
            raise ConfigError(f"{source}: {name} must be a probability in [0, 1], got {value!r}")


def refuse_remote_code(data: Any, source: str) -> None:
    """A config that names its own code (``auto_map``) is refused: attnkit never runs it."""
    if isinstance(data, dict) and "auto_map" in data:
        raise ConfigError(
            f"{source}: the checkpoint brings its own model code (auto_map); attnkit never "
            "runs code from a model folder"
        )


def read_checked_config(path: Path) -> dict[str, Any]:
    """A checkpoint's config file, read and checked: readable JSON, no code of its own
    (``auto_map``), sane numbers (:func:`check_numbers`).

    Raises:
        ConfigError: naming the file and what is wrong.
    """
    data = read_json(path)
    refuse_remote_code(data, str(path))
    check_numbers(data, str(path))  # also refuses anything but a JSON object
    return data


def is_bert_family(directory: Path) -> bool:
    """Whether the checkpoint folder ``directory`` is for attnkit's BERT encoder.

    True for a ``model_type`` in :data:`BERT_TYPES`, and for a folder without
    ``config.json`` (a sentence-transformers layout: the loader follows its
    ``modules.json``, or names what is missing). ConfigError for an unreadable config.
    """
    config = directory / "config.json"
    if not config.is_file():
        return True
    data = read_json(config)
    return not isinstance(data, dict) or data.get("model_type", "bert") in BERT_TYPES
