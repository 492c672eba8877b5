"""The page's data: a :class:`~attnkit.viz.reduce.ReducedSet` as JSON-ready dicts.

Numbers travel as base64 of little-endian bytes, deflate-compressed when large
(the page inflates them with the browser's ``DecompressionStream``):

- weights: one byte each, quantized per (layer, head) against that head's
  largest value (error at most 1/510 of it), with the scales beside them;
- top-k key indices: sorted per row and stored as gaps (uint16, or uint32 for
  more than 65,535 keys), which compress well;
- q and k of the neuron view: one signed byte each, quantized per (layer, head,
  dimension) against that dimension's largest |value| (error at most 1/254 of it),
  with the scales beside them: half the bytes of float16.

A set's JSON (:func:`set_payload`, with the tokens added by :mod:`.html`) holds
``name``, ``layers``, ``heads``, ``shape`` (layers, heads, Q, K), ``stats``, the
weights (``mode`` "dense": every weight; "long": ``block``, ``pooledShape``,
``pooledMax``, ``pooledMean``, ``topk``), ``rollout`` and ``flow`` when computed,
``tokens``, ``keyTokens``, ``rawTokens``, ``rawKeyTokens``, ``pairStart``,
``pairKeyStart``, ``genStart``, and:

- ``viewKind``: ``"tokens"``, or ``"words"`` for the word view (subword pieces
  merged: attention to a word summed over its pieces, from a word averaged);
- ``renormalised``: true when special tokens were left out and each row
  renormalised to sum to 1 over the rest;
- ``neuron``: ``layers`` (indices of the page's layers it covers: all of them),
  ``dim``, ``forms`` (per layer: how q and k make the logit), ``q`` (layers, heads,
  queryStop - queryStart, dim) for the page queries ``queryStart`` ..
  ``queryStop - 1``, and ``k`` (layers, heads, K'', dim) for the page keys listed in
  ``keyIndex`` (increasing), or for every key when ``keyIndex`` is null; each signed
  bytes with ``scales`` (layers × heads × dim, value = byte × scale).
"""

from __future__ import annotations

import base64
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from .reduce import ReducedSet

__all__ = [
    "COMPRESS_ABOVE",
    "blob",
    "blobs",
    "grid_payload",
    "quantize",
    "quantize_signed",
    "set_payload",
]

# Arrays above this many bytes are deflate-compressed; smaller pages stay readable by any browser.
COMPRESS_ABOVE = 1 << 16


def blob(raw: bytes) -> dict[str, str]:
    """Bytes as ``{"encoding": "raw" | "deflate", "data": base64}``.

    Deflate at level 1: about 4 times faster than the default level 6 on the long
    page's top-k arrays, for about 4% more bytes."""
    if len(raw) > COMPRESS_ABOVE:
        return {"encoding": "deflate", "data": base64.b64encode(zlib.compress(raw, 1)).decode()}
    return {"encoding": "raw", "data": base64.b64encode(raw).decode()}


def blobs(*raws: bytes) -> list[dict[str, str]]:
    """:func:`blob` of each, the large ones compressed side by side on two threads
    (deflate releases the interpreter's lock: the long page's top-k gaps and weights
    took 0.65 s this way instead of 0.9 s one after the other)."""
    if sum(len(raw) > COMPRESS_ABOVE for raw in raws) < 2:
        return [blob(raw) for raw in raws]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(blob, raws))


def quantize(arr: np.ndarray) -> tuple[bytes, list[float]]:
    """(layers, heads, ...) values >= 0 -> one byte each, and each (layer, head)'s scale."""
    lead = arr.shape[:2]
    flat = np.clip(arr.reshape(*lead, -1).astype(np.float32), 0.0, None)  # (layers, heads, n)
    scales = flat.max(axis=2) if flat.shape[2] else np.zeros(lead, np.float32)  # (layers, heads)
    scales = np.where(scales > 0, scales, 1.0).astype(np.float32)
    codes = np.rint(flat / scales[:, :, None] * 255.0).astype(np.uint8)  # (layers, heads, n)
    return codes.tobytes(), [float(s) for s in scales.reshape(-1)]


def quantize_signed(arr: np.ndarray) -> tuple[bytes, list[float]]:
    """(layers, heads, n, d) values -> one signed byte each (-127 .. 127) against each
    (layer, head, d)'s largest |value|, and those scales (layers × heads × d, value =
    byte × scale): the neuron view's q and k, whose dimensions have ranges of their own."""
    x = arr.astype(np.float32)  # (layers, heads, n, d)
    peak = np.abs(x).max(axis=2) if x.shape[2] else np.zeros((*x.shape[:2], x.shape[3]))
    scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)  # (layers, heads, d)
    codes = np.clip(np.rint(x / scales[:, :, None, :]), -127, 127).astype(np.int8)
    return codes.tobytes(), [float(s) for s in scales.reshape(-1)]


def _signed_part(arr: np.ndarray) -> dict[str, Any]:
    raw, scales = quantize_signed(arr)
    return {**blob(raw), "scales": scales}


def _bytes_part(arr: np.ndarray) -> dict[str, Any]:
    raw, scales = quantize(arr)
    return {**blob(raw), "scales": scales}


def _topk_part(index: np.ndarray, weight: np.ndarray, K: int) -> dict[str, Any]:
    """Top-k entries (layers, heads, Q, k), sorted by key, as gaps and one-byte weights.

    The sort runs in torch (its threads): on a long page's tens of millions of entries,
    numpy's sort, gathers and difference took about five times as long."""
    keys = torch.from_numpy(np.ascontiguousarray(index, np.int32))  # (layers, heads, Q, k)
    idx, order = torch.sort(keys, dim=-1, stable=True)  # (layers, heads, Q, k) twice
    w = torch.gather(torch.from_numpy(np.ascontiguousarray(weight, np.float32)), -1, order)
    first = torch.zeros_like(idx[..., :1])  # (layers, heads, Q, 1)
    gaps = torch.diff(idx, dim=-1, prepend=first)  # first: the key itself, then gaps >= 0
    width = 2 if K <= 0xFFFF else 4
    gaps_raw = gaps.numpy().astype("<u2" if width == 2 else "<u4").tobytes()
    w_raw, scales = quantize(w.numpy())
    index_part, weight_part = blobs(gaps_raw, w_raw)
    return {
        "k": int(index.shape[-1]),
        "indexBytes": width,
        "index": index_part,
        "weight": {**weight_part, "scales": scales},
    }


def grid_payload(
    dense: np.ndarray | None,
    *,
    block: int = 1,
    pooled_max: np.ndarray | None = None,
    pooled_mean: np.ndarray | None = None,
    topk_index: np.ndarray | None = None,
    topk_weight: np.ndarray | None = None,
    K: int = 0,
) -> dict[str, Any]:
    """One (layers, heads, Q, K) grid: every weight, or the overview and top-k of a long one."""
    if dense is not None:
        return {"mode": "dense", **_bytes_part(dense)}
    assert pooled_max is not None and pooled_mean is not None
    assert topk_index is not None and topk_weight is not None
    return {
        "mode": "long",
        "block": block,
        "pooledShape": list(pooled_max.shape),
        "pooledMax": _bytes_part(pooled_max),
        "pooledMean": _bytes_part(pooled_mean),
        "topk": _topk_part(topk_index, topk_weight, K),
    }


def _matrix_payload(m: np.ndarray, long: bool, block: int, k: int) -> dict[str, Any]:
    """A (Q, K) matrix (rollout, flow) encoded like one head of the page."""
    grid = m[None, None].astype(np.float32)  # (1, 1, Q, K)
    if not long:
        return grid_payload(grid)
    Q, K = m.shape
    Qb, Kb = -(-Q // block), -(-K // block)
    padded = np.zeros((Qb * block, Kb * block), np.float32)
    padded[:Q, :K] = m
    blocks = padded.reshape(Qb, block, Kb, block)  # (Qb, b, Kb, b)
    rows = np.minimum(block, Q - block * np.arange(Qb))
    cols = np.minimum(block, K - block * np.arange(Kb))
    mean = blocks.sum(axis=(1, 3)) / (rows[:, None] * cols[None, :])
    k = min(k, K)
    idx = np.argpartition(-m, k - 1, axis=-1)[:, :k]  # (Q, k)
    w = np.take_along_axis(m, idx, -1)
    return grid_payload(
        None,
        block=block,
        pooled_max=blocks.max(axis=(1, 3))[None, None],
        pooled_mean=mean[None, None],
        topk_index=idx[None, None].astype(np.int32),
        topk_weight=w[None, None],
        K=K,
    )


def set_payload(s: ReducedSet) -> dict[str, Any]:
    """The JSON-ready part of a page for one reduced set (tokens are added by the caller)."""
    nL, nH, Q, K = s.shape
    out: dict[str, Any] = {
        "name": s.name,
        "layers": list(s.layer_labels),
        "heads": list(s.head_labels),
        "shape": [nL, nH, Q, K],
        "stats": s.stats,
    }
    k = int(s.topk_index.shape[-1]) if s.topk_index is not None else 16
    out |= grid_payload(
        s.dense,
        block=s.block,
        pooled_max=s.pooled_max,
        pooled_mean=s.pooled_mean,
        topk_index=s.topk_index,
        topk_weight=s.topk_weight,
        K=K,
    )
    for name in ("rollout", "flow"):
        m = getattr(s, name)
        if m is not None:
            out[name] = _matrix_payload(m, s.long, s.block, k)
    if s.neuron is not None:
        n = s.neuron
        out["neuron"] = {
            "layers": n["layers"],
            "dim": int(n["q"].shape[-1]),
            "q": _signed_part(n["q"]),
            "k": _signed_part(n["k"]),
            "forms": n["forms"],
            "queryStart": int(n["query_start"]),
            "queryStop": int(n["query_stop"]),
            "keyIndex": n["key_index"],
        }
    return out
