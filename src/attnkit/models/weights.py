"""What a checkpoint's safetensors files hold, read from their headers alone.

A safetensors file starts with an 8-byte little-endian length and a JSON header
naming every tensor with its dtype and shape. Reading it costs a few kilobytes,
so a ``config.json`` can be checked against the weights before any model is
built (a config that claims 10⁹ layers is refused, not allocated).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["HeaderError", "layer_counts", "read_shapes", "safetensors_files"]

# A header larger than this is not a checkpoint we should parse.
_MAX_HEADER_BYTES = 100 * 1024 * 1024
_LAYER = re.compile(r"^(.*?)\.(\d+)\.")


class HeaderError(ValueError):
    """A weights file whose header cannot be read; the message says why in one line."""


def safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's safetensors files: ``model.safetensors``, or the shards its index names."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted({str(v) for v in weight_map.values()})
        except (
            OSError,
            UnicodeDecodeError,
            json.JSONDecodeError,
            KeyError,
            TypeError,
            AttributeError,
        ):
            raise HeaderError(f"{index}: not a readable safetensors index") from None
        return [directory / n for n in names]
    return []


def read_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from the header of one safetensors file.

    Raises:
        HeaderError: the file is missing, too short, or its header is not valid.
    """
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            head = f.read(8)
            if len(head) < 8:
                raise HeaderError(f"{path}: not a valid safetensors file (too short)")
            n = int.from_bytes(head, "little")
            if not 2 <= n <= min(_MAX_HEADER_BYTES, size - 8):
                raise HeaderError(f"{path}: not a valid safetensors file (header length {n})")
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as exc:
        raise HeaderError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise HeaderError(f"{path}: not a valid safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{path}: not a valid safetensors file (header is not an object)")
    shapes: dict[str, tuple[int, ...]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise HeaderError(f"{path}: not a valid safetensors file (bad shape for {name!r})")
        shapes[name] = tuple(shape)
    return shapes


def layer_counts(names: Mapping[str, object] | list[str]) -> dict[str, int]:
    """Stacks of numbered layers in tensor names: prefix -> how many layers.

    ``encoder.layer.3.attention.self.query.weight`` counts layer 3 of the stack
    ``encoder.layer``; a stack of n layers numbers them 0 .. n-1.
    """
    found: dict[str, set[int]] = {}
    for name in names:
        m = _LAYER.match(name)
        if m:
            found.setdefault(m.group(1), set()).add(int(m.group(2)))
    return {prefix: max(ids) + 1 for prefix, ids in found.items()}
