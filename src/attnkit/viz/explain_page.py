"""An :class:`~attnkit.viz.Attribution` on the page and in a file: the Explain view's data.

:func:`explain_payload` makes the JSON-ready part of a page that the Explain view
draws (``payload["explain"]``):

- ``method``, ``target`` (the target in words), ``targetKind``, ``targetPosition``,
  ``targetIndex``, ``targetLabel``, ``targetValue`` and ``baselineValue``;
- ``tokens``: the tokens as :func:`~attnkit.viz.explain` wrote them;
- ``scores``: (n_tokens,) float32, exact, as little-endian bytes in a blob
  (:func:`attnkit.viz.payload.blob`);
- ``heads``: (layers, heads) head importance, float32 the same way, with ``shape``;
  None for rollout. ``pageLayer`` and ``pageHead`` map the model's layers and heads to
  the page's (-1 where the page leaves one out), so a click on a cell selects that head
  in the other views;
- ``relevance``: the (n_tokens, n_tokens) matrix of attention × gradient and rollout:
  its ``diagonal`` exact (float32), the rest one signed byte a value against each row's
  largest |value| off the diagonal (``scales``: one a row, value = byte × scale); else
  None.

:func:`attribution_arrays` names the same arrays for ``--save-weights``
(``explain.scores``, ``explain.head_importance``, ``explain.relevance``,
``explain.target``, ``explain.target_value``) and :func:`attribution_record` the facts
kept in the file's metadata.

A :class:`~attnkit.viz.GenerationAttribution` (each generated token
in turn the target) travels as ``generation: true``, ``promptLength``, ``tokens`` (all
of them), ``targets`` and ``values`` (one a step), ``matrix`` (steps, sources) float32
with NaN where a source came later, and ``heads`` (steps, layers, heads); in a file as
``explain.steps.scores``, ``explain.steps.head_importance``, ``explain.steps.target``
((steps, 2): position and token id) and ``explain.steps.target_value``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .attribution_records import Attribution, GenerationAttribution
from .payload import blob

__all__ = ["attribution_arrays", "attribution_record", "explain_payload"]


def _floats(values: Any) -> dict[str, str]:
    """float32 little-endian bytes of any tensor or array, as a blob."""
    arr = np.ascontiguousarray(_numpy(values), dtype="<f4")
    return blob(arr.tobytes())


def _numpy(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().to("cpu").double().numpy()
    return np.asarray(values, dtype=np.float64)


def _rows_signed(matrix: np.ndarray) -> dict[str, Any]:
    """(n, n) values: the diagonal exact (float32, ``diagonal``), the rest one signed byte each
    against its row's largest |value| off the diagonal (``scales``, one a row), so the
    identity Chefer's R starts from does not drown the rest."""
    m = matrix.astype(np.float64)  # (n, n)
    n = m.shape[0]
    diagonal = np.diagonal(m).copy()  # (n,)
    off = m.copy()
    off[np.arange(n), np.arange(n)] = 0.0
    peak = np.abs(off).max(axis=1) if n else np.zeros(0)  # (n,)
    scales = np.where(peak > 0, peak / 127.0, 1.0)  # (n,)
    codes = np.clip(np.rint(off / scales[:, None]), -127, 127).astype(np.int8)  # (n, n)
    return {**blob(codes.tobytes()), "shape": list(m.shape), "scales": [float(s) for s in scales],
            "diagonal": _floats(diagonal)}  # fmt: skip


def _positions(chosen: Sequence[int] | None, n: int) -> list[int]:
    """For each of n model items, its index among the page's (-1 when left out)."""
    if chosen is None:
        return list(range(n))
    where = {int(c): i for i, c in enumerate(chosen)}
    return [where.get(i, -1) for i in range(n)]


def _generation_payload(g: GenerationAttribution) -> dict[str, Any]:
    L, n = g.prompt_length, len(g.tokens)
    out: dict[str, Any] = {
        "method": g.method,
        "generation": True,
        "promptLength": L,
        "tokens": [str(x) for x in g.tokens],
        "targets": [
            f"logit of generated token {g.tokens[L + t]!r} (id {i}) at position {L + t - 1}"
            for t, i in enumerate(g.target_ids)
        ],
        "values": [float(v) for v in g.target_values],
        "matrix": {**_floats(g.scores), "shape": [len(g.target_ids), n - 1]},
        "heads": None,
        "relevance": None,
        "baselineValue": None,
    }
    if g.head_importance is not None:
        out["heads"] = {**_floats(g.head_importance), "shape": list(g.head_importance.shape)}
    return out


def explain_payload(
    a: Attribution | GenerationAttribution,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The Explain view's data for one attribution.

    Args:
        a: what :func:`attnkit.viz.explain` returned: ``scores`` (n_tokens,),
            ``head_importance`` (layers, heads) or None, ``relevance`` (n_tokens,
            n_tokens) or None; or what
            :func:`~attnkit.viz.explain_generation` returned: ``scores``
            (steps, sources), ``head_importance`` (steps, layers, heads) or None.
        layers: the model's layers the page shows, in the page's order (None: all);
            a head-importance cell of another layer selects nothing on the page.
        heads: the model's heads the page shows, likewise.

    Returns:
        a JSON-ready dict (see the module's description), put under ``"explain"`` in
        the page's data.
    """
    if isinstance(a, GenerationAttribution):
        out = _generation_payload(a)
        if a.head_importance is not None:
            _, nL, nH = (int(n) for n in a.head_importance.shape)
            out["pageLayer"] = _positions(layers, nL)
            out["pageHead"] = _positions(heads, nH)
        return out
    t = a.target
    out = {
        "method": a.method,
        "target": str(t),
        "targetKind": t.kind,
        "targetPosition": t.position,
        "targetIndex": t.index,
        "targetLabel": t.label,
        "targetValue": float(a.target_value),
        "baselineValue": None if a.baseline_value is None else float(a.baseline_value),
        "tokens": [str(x) for x in a.tokens],
        "scores": _floats(a.scores),
        "heads": None,
        "relevance": None,
    }
    if a.head_importance is not None:
        nL, nH = (int(n) for n in a.head_importance.shape)
        out["heads"] = {**_floats(a.head_importance), "shape": [nL, nH]}
        out["pageLayer"] = _positions(layers, nL)
        out["pageHead"] = _positions(heads, nH)
    if a.relevance is not None:
        out["relevance"] = _rows_signed(_numpy(a.relevance))
    return out


def attribution_arrays(a: Attribution | GenerationAttribution) -> dict[str, np.ndarray]:
    """The attribution's arrays under the names ``--save-weights`` gives them.

    Args:
        a: an :class:`~attnkit.viz.Attribution`, or a
            :class:`~attnkit.viz.GenerationAttribution`: then
            ``explain.steps.scores`` (steps, sources) float32 (NaN where a source came
            later), ``explain.steps.head_importance`` (steps, layers, heads) float32 unless
            None, ``explain.steps.target`` (steps, 2) int64 (position, token id) and
            ``explain.steps.target_value`` (steps,) float64.

    Returns:
        ``explain.scores`` (n_tokens,) float32; ``explain.head_importance`` (layers,
        heads) float32 unless None; ``explain.relevance`` (n_tokens, n_tokens) float32
        unless None; ``explain.target`` (2,) int64, the target's (position, index), -1
        where the target has none (a similarity has neither); ``explain.target_value``
        (1,) float64, y at the input.
    """
    if isinstance(a, GenerationAttribution):
        L = a.prompt_length
        steps: dict[str, np.ndarray] = {"explain.steps.scores": _numpy(a.scores).astype(np.float32)}
        if a.head_importance is not None:
            steps["explain.steps.head_importance"] = _numpy(a.head_importance).astype(np.float32)
        pairs = [[L + t - 1, i] for t, i in enumerate(a.target_ids)]
        steps["explain.steps.target"] = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        steps["explain.steps.target_value"] = _numpy(a.target_values)
        return steps
    t = a.target
    out: dict[str, np.ndarray] = {"explain.scores": _numpy(a.scores).astype(np.float32)}
    if a.head_importance is not None:
        out["explain.head_importance"] = _numpy(a.head_importance).astype(np.float32)
    if a.relevance is not None:
        out["explain.relevance"] = _numpy(a.relevance).astype(np.float32)
    where = [-1 if t.position is None else t.position, -1 if t.index is None else t.index]
    out["explain.target"] = np.array(where, dtype=np.int64)
    out["explain.target_value"] = np.array([a.target_value], dtype=np.float64)
    return out


def attribution_record(a: Attribution | GenerationAttribution) -> dict[str, Any]:
    """The facts of an attribution that a weights file keeps in its metadata (``"explain"``):
    the method, the target (kind, position, index, label, in words), its value, the baseline's
    value (integrated gradients) and the tokens; for a generation, the prompt's length and
    each step's target in words instead of one target."""
    if isinstance(a, GenerationAttribution):
        page = _generation_payload(a)
        return {
            "method": a.method,
            "prompt_length": a.prompt_length,
            "targets": page["targets"],
            "tokens": page["tokens"],
            "arrays": sorted(attribution_arrays(a)),
        }
    t = a.target
    return {
        "method": a.method,
        "target": {
            "kind": t.kind,
            "position": t.position,
            "index": t.index,
            "label": t.label,
            "text": str(t),
        },
        "target_value": float(a.target_value),
        "baseline_value": None if a.baseline_value is None else float(a.baseline_value),
        "tokens": [str(x) for x in a.tokens],
        "arrays": sorted(attribution_arrays(a)),
    }
