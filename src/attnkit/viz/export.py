"""Data out: what a run captured, with its tokens, as a .safetensors or .npz file.

:func:`save_weights` writes the arrays of every reduced set
(:meth:`ReducedSet.arrays() <attnkit.viz.reduce.ReducedSet.arrays>`) under
``"<set>.<array>"`` names, where ``<set>`` is ``self`` (an encoder's or a
decoder's self-attention), or ``encoder``, ``decoder`` and ``cross`` (an
encoder-decoder):

- a **dense** set (every weight fits the page) holds ``weights`` (layers, heads,
  Q, K) float32, every captured weight;
- a **long** set holds ``pooled_max`` and ``pooled_mean`` (layers, heads, Qb, Kb),
  the exact max and mean over ``block``×``block`` blocks, and ``topk_index``
  (int32) and ``topk_weight`` (float32) (layers, heads, Q, k), the exact top-k
  keys of every query row, best first; the other weights were never kept;
- either may hold ``rollout`` (Q, K) and the neuron view's ``neuron_q`` and
  ``neuron_k`` (float16).

The metadata, one JSON document (safetensors: ``__metadata__["attnkit"]``; npz:
the array ``attnkit_meta``), says which kind each set holds (``"holds"``:
``"dense"`` or ``"long"``, and the file's own ``"holds"``), with the tokens as
the page shows them, the layer and head labels, the view (tokens or words,
renormalised or not), the block size, k, the neuron window and the statistics.
:func:`load_weights` reads both formats back, whatever the case of the suffix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .reduce import ReducedSet

__all__ = ["FORMAT", "SUFFIXES", "load_weights", "save_weights", "set_key"]

FORMAT = "attnkit.attention/1"
SUFFIXES = (".safetensors", ".npz")


def set_key(name: str, taken: Sequence[str] = ()) -> str:
    """The short name of a set in a file: ``self``, ``encoder``, ``decoder``, ``cross``."""
    low = name.lower()
    key = (
        "cross"
        if low.startswith("cross")
        else "encoder"
        if low.startswith("encoder")
        else "decoder"
        if low.startswith("decoder")
        else "self"
    )
    n, out = 1, key
    while out in taken:
        n += 1
        out = f"{key}{n}"
    return out


def _describe(s: ReducedSet, key: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "key": key,
        "name": s.name,
        "holds": "long" if s.long else "dense",
        "shape": list(s.shape),
        "layers": list(s.layer_labels),
        "heads": list(s.head_labels),
        "tokens": list(s.tokens),
        "raw_tokens": s.raw_tokens,
        "key_tokens": s.key_tokens,
        "pair_start": s.pair_start,
        "generated_start": s.generated_start,
        "view": s.view_kind,
        "renormalised": s.renormalised,
        "stats": s.stats,
    }
    if s.long:
        out["block"] = s.block
        out["top_k"] = int(s.topk_index.shape[-1]) if s.topk_index is not None else 0
    if s.neuron is not None:
        n = s.neuron
        out["neuron"] = {name: n[name] for name in ("layers", "forms", "query_start",
                                                    "query_stop", "key_index")}  # fmt: skip
    return out


def save_weights(
    sets: Sequence[ReducedSet] | ReducedSet,
    path: str | Path,
    *,
    meta: Mapping[str, str] | None = None,
) -> Path:
    """Write what was captured, with the tokens, to ``path`` (.safetensors or .npz).

    Args:
        sets: the reduced sets (an :class:`~attnkit.models.hf_run.AttentionRun`'s
            ``.sets``), or one set.
        path: a file name ending in ``.safetensors`` or ``.npz`` (any case: ``.NPZ``
            is an npz file, written under exactly this name).
        meta: a few ``name: value`` facts kept in the metadata (the model, the text).

    Returns:
        the path written: ``path`` itself.

    Raises:
        ValueError: another suffix, or no set.
    """
    out = Path(path)
    suffix = out.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(
            f"path: expected a file name ending in .safetensors or .npz, got {str(out)!r}"
        )
    items = [sets] if isinstance(sets, ReducedSet) else list(sets)
    if not items:
        raise ValueError("sets: expected at least one reduced set, got none")
    arrays: dict[str, np.ndarray] = {}
    described = []
    keys: list[str] = []
    for s in items:
        key = set_key(s.name, keys)
        keys.append(key)
        described.append(_describe(s, key))
        arrays |= {f"{key}.{name}": a for name, a in s.arrays().items()}
    holds = {d["holds"] for d in described}
    document = {
        "format": FORMAT,
        "holds": holds.pop() if len(holds) == 1 else "mixed",
        "sets": described,
        "meta": {str(k): str(v) for k, v in (meta or {}).items()},
    }
    text = json.dumps(document, ensure_ascii=False)
    if suffix == ".safetensors":
        from safetensors.numpy import save_file

        save_file(arrays, str(out), metadata={"attnkit": text})
    else:
        named: dict[str, Any] = {"attnkit_meta": np.array(text), **arrays}
        # A file object: given a name, numpy appends ".npz" to any other ending (".NPZ").
        with out.open("wb") as f:
            np.savez_compressed(f, **named)
    return out


def load_weights(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and the metadata of a file :func:`save_weights` wrote.

    Returns:
        (``{"self.weights": array, ...}``, the metadata document: ``holds``, ``sets``, ``meta``).

    Raises:
        ValueError: not such a file.
    """
    p = Path(path)
    if p.suffix.lower() == ".safetensors":
        from safetensors import safe_open
        from safetensors.numpy import load_file

        with safe_open(str(p), framework="numpy") as f:
            text = (f.metadata() or {}).get("attnkit")
        arrays = load_file(str(p))
    else:
        with np.load(p, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        meta = arrays.pop("attnkit_meta", None)
        text = str(meta) if meta is not None else None
    if text is None:
        raise ValueError(f"path: {p} holds no attnkit metadata (not written by save_weights)")
    document = json.loads(text)
    if document.get("format") != FORMAT:
        raise ValueError(f"path: {p} is of format {document.get('format')!r}, expected {FORMAT!r}")
    return arrays, document
