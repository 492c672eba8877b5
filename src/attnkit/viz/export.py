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
  ``neuron_k`` (float16, or float32 when a value is beyond float16's range).

A comparison (``attnkit show --compare`` or ``--compare-model``) writes both
sides in one file: ``sets`` is then a mapping of side keys (``"a"``, ``"b"``) to
each side's sets, and every array name starts with its side,
``"<side>/<set>.<array>"`` (``a/self.weights``, ``b/self.weights``); a run
without sides keeps the plain names above.

The metadata, one JSON document (safetensors: ``__metadata__["attnkit"]``; npz:
the array ``attnkit_meta``), says which kind each set holds (``"holds"``:
``"dense"`` or ``"long"``, and the file's own ``"holds"``), with the tokens as
the page shows them, the layer and head labels, the view (tokens or words,
renormalised or not), the block size, k, the neuron window and the statistics.
A file with sides also lists them (``"sides"``: each side's key and what it is,
e.g. its name, model and text), and each set's record names its ``"side"``.

With an attribution (``attnkit show --explain``, ``explain=``), the file also holds
``explain.scores`` (n_tokens,), ``explain.head_importance`` (layers, heads),
``explain.relevance`` (n_tokens, n_tokens) when the method makes one,
``explain.target`` (position, index; -1 for none) and ``explain.target_value``, and
the metadata's ``"explain"`` says what was explained: the method, the target, the
tokens (:func:`attnkit.viz.explain_page.attribution_record`).
:func:`load_weights` reads both formats back, whatever the case of the suffix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .attribution_records import Attribution, GenerationAttribution
from .explain_page import attribution_arrays, attribution_record
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


_Sets = Sequence[ReducedSet] | ReducedSet


def _items(sets: Any) -> list[Any]:
    """One side's sets as a list: a list or tuple as it is, anything else one item (a
    set, or something else, refused by name afterwards)."""
    return list(sets) if isinstance(sets, (list, tuple)) else [sets]


def _side_items(
    sets: _Sets | Mapping[str, _Sets], side_meta: Mapping[str, Mapping[str, str]] | None
) -> list[tuple[str | None, list[ReducedSet]]]:
    """(side key or None, its sets) for each side; one side without a key for a plain run."""
    if not isinstance(sets, Mapping):
        if side_meta is not None:
            raise ValueError("side_meta: only with sides (sets given as {side: sets})")
        return [(None, _items(sets))]
    if not sets:
        raise ValueError("sets: expected at least one side, got an empty mapping")
    out: list[tuple[str | None, list[ReducedSet]]] = []
    for side, value in sets.items():
        if not isinstance(side, str) or not side or "/" in side or "." in side:
            raise ValueError(
                f"sets: a side's key must be a short name without '/' or '.', got {side!r}"
            )
        out.append((side, _items(value)))
    unknown = sorted(set(side_meta or {}) - set(sets))
    if unknown:
        raise ValueError(f"side_meta: {', '.join(map(repr, unknown))} is not a side of sets")
    return out


def save_weights(
    sets: _Sets | Mapping[str, _Sets],
    path: str | Path,
    *,
    meta: Mapping[str, str] | None = None,
    side_meta: Mapping[str, Mapping[str, str]] | None = None,
    explain: Attribution | GenerationAttribution | None = None,
) -> Path:
    """Write what was captured, with the tokens, to ``path`` (.safetensors or .npz).

    Args:
        sets: the reduced sets (an :class:`~attnkit.viz.sources.text_run.AttentionRun`'s
            ``.sets``), or one set; or, for a comparison, ``{side: sets}`` (e.g.
            ``{"a": run_a.sets, "b": run_b.sets}``): each side's arrays are named
            ``"<side>/<set>.<array>"``.
        path: a file name ending in ``.safetensors`` or ``.npz`` (any case: ``.NPZ``
            is an npz file, written under exactly this name).
        meta: a few ``name: value`` facts kept in the metadata (the model, the text).
        side_meta: with sides, a few facts about each side (its name, model, text),
            kept in the metadata's ``"sides"``.
        explain: an :class:`~attnkit.viz.Attribution` written beside the weights, its
            arrays named ``explain.<array>`` (scores (n_tokens,), head_importance (layers,
            heads), relevance (n_tokens, n_tokens), target (2,), target_value (1,)); a
            :class:`~attnkit.viz.GenerationAttribution` as
            ``explain.steps.<array>``; or None (default).

    Returns:
        the path written: ``path`` itself.

    Raises:
        ValueError: another suffix, no set, a side key holding '/' or '.', or
            ``side_meta`` without sides.
        TypeError: ``sets`` holds something other than reduced sets (weights).
    """
    out = Path(path)
    suffix = out.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(
            f"path: expected a file name ending in .safetensors or .npz, got {str(out)!r}"
        )
    sides = _side_items(sets, side_meta)
    if not all(items for _, items in sides):
        raise ValueError("sets: expected at least one reduced set, got none")
    for _, items in sides:
        for s in items:
            if not isinstance(s, ReducedSet):
                raise TypeError(
                    "sets: expected reduced sets (an AttentionRun's .sets, what a page "
                    f"shows), got {type(s).__name__}; for weights, reduce them first "
                    "(attnkit.viz.attention_set.reduce_set) or save them with numpy"
                )
    arrays: dict[str, np.ndarray] = {}
    described = []
    for side, items in sides:
        keys: list[str] = []
        prefix = "" if side is None else f"{side}/"
        for s in items:
            key = set_key(s.name, keys)
            keys.append(key)
            record = _describe(s, prefix + key)
            if side is not None:
                record["side"] = side
            described.append(record)
            arrays |= {f"{prefix}{key}.{name}": a for name, a in s.arrays().items()}
    if explain is not None:
        arrays |= attribution_arrays(explain)
    holds = {d["holds"] for d in described}
    document: dict[str, Any] = {
        "format": FORMAT,
        "holds": holds.pop() if len(holds) == 1 else "mixed",
        "sets": described,
        "meta": {str(k): str(v) for k, v in (meta or {}).items()},
    }
    if explain is not None:
        document["explain"] = attribution_record(explain)
    if sides[0][0] is not None:
        document["sides"] = [
            {
                "key": side,
                **{str(k): str(v) for k, v in (side_meta or {}).get(str(side), {}).items()},
            }
            for side, _ in sides
        ]
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
        (``{"self.weights": array, ...}``, or ``{"a/self.weights": ..., "b/self.weights": ...}``
        for a comparison; the metadata document: ``holds``, ``sets``, ``meta``, and ``sides``
        for a comparison).

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
