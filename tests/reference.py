"""The float64 NumPy oracle every backend is held to, written from the formulas.

Nothing here imports attnkit: masks and scores are rebuilt from their
definitions so a bug in attnkit's own mask or score code cannot hide.

Score specs (tuples):
    ("dot",)                      q·k
    ("scaled_dot",)               q·k (scale defaults to 1/sqrt(E))
    ("bilinear", W)               q W kᵀ, W (Eq, Ek)
    ("additive", Wq, Wk, wv)      wvᵀ tanh(Wq q + Wk k), Wq (H, Eq), Wk (H, Ek), wv (H,)
    ("gaussian", sigma)           -‖q - k‖² / (2σ²)

Mask specs (tuples), dense result broadcastable to batch + (L, S):
    ("keep", t) / ("block", t) / ("tf", t) / ("bias", t)
    ("valid_lens", lens, queries)   lens (B,) or (B, L)
    ("key_padding", pad)            pad (B, S), True = padding
    ("causal", align) / ("window", left, right, align)
    ("document", q_ids, k_ids) / ("prefix_lm", prefix, align)
    ("and", spec, spec, ...) / ("or", spec, spec, ...) / ("not", spec)

Modifier specs (a list, applied in order to the scaled logits, before the mask):
    ("alibi", slopes, causal, q0, k0)      -slope_h |p_i - p_j| (causal: -slope_h (p_i - p_j))
    ("relpos", table, buckets, max_distance, bidirectional, q0, k0)   table[bucket(p_j - p_i), h]
    ("softcap", cap)                       cap tanh(s / cap)
    ("sinks", logits)                      a logit per head joining the softmax, no value
                                           (several sinks: each joins it)
with query row i at position p_i = q0 + i and key column j at p_j = k0 + j. A
per-head scale is ``scale`` given as an array (H,).
"""

from __future__ import annotations

from typing import Any

import numpy as np

Spec = tuple[Any, ...]


def oracle_logits(q: np.ndarray, k: np.ndarray, score: Spec) -> np.ndarray:
    """Unscaled scores (..., L, S) in float64."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    kind = score[0]
    if kind in ("dot", "scaled_dot"):
        return np.einsum("...le,...se->...ls", q, k)
    if kind == "bilinear":
        W = np.asarray(score[1], dtype=np.float64)
        return np.einsum("...le,ef,...sf->...ls", q, W, k)
    if kind == "additive":
        Wq, Wk, wv = (np.asarray(a, dtype=np.float64) for a in score[1:4])
        qh = np.einsum("...le,he->...lh", q, Wq)[..., :, None, :]  # (..., L, 1, H)
        kh = np.einsum("...se,he->...sh", k, Wk)[..., None, :, :]  # (..., 1, S, H)
        return np.tanh(qh + kh) @ wv
    if kind == "gaussian":
        sigma = float(score[1])
        diff = q[..., :, None, :] - k[..., None, :, :]  # (..., L, S, E)
        return -(diff**2).sum(-1) / (2 * sigma**2)
    raise ValueError(f"unknown score spec {kind!r}")


def oracle_mask(
    spec: Spec | None, L: int, S: int, batch_ndim: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Dense (keep, bias) for a mask spec; keep True = may attend."""
    if spec is None:
        return None, None
    kind = spec[0]
    if kind == "keep":
        return np.asarray(spec[1], dtype=bool), None
    if kind == "block":
        return ~np.asarray(spec[1], dtype=bool), None
    if kind == "tf":
        return np.asarray(spec[1]) == 0, None
    if kind == "bias":
        return None, np.asarray(spec[1], dtype=np.float64)
    if kind == "valid_lens":
        lens, queries = np.asarray(spec[1]), bool(spec[2])
        B = lens.shape[0]
        keep = np.zeros((B, L, S), dtype=bool)
        for b in range(B):
            for i in range(L):
                n = lens[b, i] if lens.ndim == 2 else lens[b]
                if queries and i >= n:
                    continue
                keep[b, i, :n] = True
        return keep.reshape(B, *([1] * (batch_ndim - 1)), L, S), None
    if kind == "key_padding":
        pad = np.asarray(spec[1], dtype=bool)
        B = pad.shape[0]
        return (~pad).reshape(B, *([1] * batch_ndim), S), None
    if kind in ("causal", "window"):
        if kind == "causal":
            left, right, align = None, 0, spec[1]
        else:
            left, right, align = spec[1], spec[2], spec[3]
        offset = S - L if align == "bottom_right" else 0
        keep = np.zeros((L, S), dtype=bool)
        for i in range(L):
            for j in range(S):
                ok = True
                if left is not None and j < i + offset - left:
                    ok = False
                if right is not None and j > i + offset + right:
                    ok = False
                keep[i, j] = ok
        return keep, None
    if kind == "document":
        q_ids, k_ids = np.asarray(spec[1]), np.asarray(spec[2])
        keep = (q_ids[..., :, None] == k_ids[..., None, :]) & (q_ids[..., :, None] >= 0)
        if keep.ndim == 3:  # (B, L, S): per batch element, broadcast over heads
            keep = keep.reshape(keep.shape[0], *([1] * (batch_ndim - 1)), L, S)
        return keep, None
    if kind == "prefix_lm":
        prefix, align = np.asarray(spec[1]), spec[2]
        causal, _ = oracle_mask(("causal", align), L, S, batch_ndim)
        assert causal is not None
        seen = np.arange(S)[None, None, :] < prefix.reshape(-1, 1, 1)  # (B, 1, S)
        keep = causal[None] | seen  # (B, L, S)
        return keep.reshape(keep.shape[0], *([1] * (batch_ndim - 1)), L, S), None
    if kind == "or":
        keep_any: np.ndarray | None = None
        for part in spec[1:]:
            kp, bp = oracle_mask(part, L, S, batch_ndim)
            assert bp is None, "or of a bias"
            kp = np.ones((L, S), dtype=bool) if kp is None else kp
            keep_any = kp if keep_any is None else keep_any | kp
        return keep_any, None
    if kind == "not":
        kp, bp = oracle_mask(spec[1], L, S, batch_ndim)
        assert bp is None, "not of a bias"
        return (np.zeros((L, S), dtype=bool) if kp is None else ~kp), None
    if kind == "and":
        keep_all: np.ndarray | None = None
        bias_all: np.ndarray | None = None
        for part in spec[1:]:
            kp, bp = oracle_mask(part, L, S, batch_ndim)
            if kp is not None:
                keep_all = kp if keep_all is None else keep_all & kp
            if bp is not None:
                bias_all = bp if bias_all is None else bias_all + bp
        return keep_all, bias_all
    raise ValueError(f"unknown mask spec {kind!r}")


def oracle(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    score: Spec = ("scaled_dot",),
    mask: Spec | None = None,
    scale: float | np.ndarray | None = None,
    mods: list[Spec] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Attention in float64: returns output (*B, L, Ev), weights (*B, L, S), lse (*B, L).

    Grouped-query attention when dim -3 of q is a multiple of k's. Rows where
    every key is blocked give output 0, weights 0, lse -inf.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if q.ndim >= 3 and k.ndim >= 3 and q.shape[-3] != k.shape[-3] and k.shape[-3] != 1:
        g = q.shape[-3] // k.shape[-3]
        k = np.repeat(k, g, axis=-3)
        v = np.repeat(v, g, axis=-3)
    L, S = q.shape[-2], k.shape[-2]
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1]) if score[0] == "scaled_dot" else 1.0
    logits = oracle_logits(q, k, score)  # (..., L, S)
    if np.ndim(scale) == 1:
        scale = _per_head(np.asarray(scale, dtype=np.float64)[:, None, None], logits.ndim)
    logits = logits * scale
    sinks: list[np.ndarray] = []
    for mod in mods or []:
        if mod[0] == "sinks":
            sinks.append(np.asarray(mod[1], dtype=np.float64))
        else:
            logits = _modified(logits, mod, L, S)
    batch_ndim = max(q.ndim, k.ndim) - 2
    keep, bias = oracle_mask(mask, L, S, batch_ndim)
    if bias is not None:
        logits = logits + bias
    if keep is not None:
        logits = np.where(keep, logits, -np.inf)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], logits.shape[:-2])
    logits = np.broadcast_to(logits, (*batch, L, S))
    m = logits.max(axis=-1, keepdims=True)
    dead = ~np.isfinite(m)
    m = np.where(dead, 0.0, m)
    e = np.exp(logits - m)
    denom = e.sum(-1, keepdims=True)
    weights = np.where(denom > 0, e / np.where(denom > 0, denom, 1.0), 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(denom[..., 0] > 0, m[..., 0] + np.log(denom[..., 0]), -np.inf)
    if sinks:  # sum_j exp(s_j) + sum exp(sink): each sink takes its share, no value
        total = lse
        for logits_h in sinks:  # (H,): one logit per head (dim -3); (1,) without heads
            per_row = logits_h[:, None] if lse.ndim >= 2 else logits_h.reshape(())
            total = np.logaddexp(total, np.broadcast_to(per_row, lse.shape))  # (..., H, L)
        weights = weights * np.exp(np.where(np.isinf(lse), -np.inf, lse - total))[..., None]
        lse = total
    out = weights @ v
    return out, weights, lse


def t5_bucket(
    rel: np.ndarray, num_buckets: int, max_distance: int, bidirectional: bool
) -> np.ndarray:
    """T5's bucket of a relative position (key position - query position)."""
    n = num_buckets
    out = np.zeros_like(rel)
    if bidirectional:
        n //= 2
        out = out + (rel > 0) * n
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    exact = n // 2
    with np.errstate(divide="ignore"):
        log_ratio = np.log(np.maximum(rel, 1) / exact) / np.log(max_distance / exact)
    large = np.minimum(exact + (log_ratio * (n - exact)).astype(np.int64), n - 1)
    return out + np.where(rel < exact, rel, large)


def _per_head(a: np.ndarray, ndim: int) -> np.ndarray:
    """A per-head array (H, L or 1, S or 1) against logits of ``ndim`` dims: as it is
    with leading dims (dim -3 is the head dim), its one head (L, S) without them."""
    return a if ndim >= 3 else a[0]


def _modified(logits: np.ndarray, mod: Spec, L: int, S: int) -> np.ndarray:
    """One modifier applied to the scaled logits (..., H, L, S)."""
    if mod[0] == "softcap":
        return mod[1] * np.tanh(logits / mod[1])
    q0, k0 = mod[-2], mod[-1]
    rel = (k0 + np.arange(S))[None, :] - (q0 + np.arange(L))[:, None]  # (L, S): p_j - p_i
    if mod[0] == "alibi":
        slopes, causal = np.asarray(mod[1], dtype=np.float64), mod[2]
        dist = -rel if causal else np.abs(rel)  # p_i - p_j, or |p_i - p_j|
        return logits - _per_head(slopes[:, None, None] * dist, logits.ndim)
    if mod[0] == "relpos":
        table, buckets, max_distance, bidirectional = mod[1:5]
        b = t5_bucket(rel, buckets, max_distance, bidirectional)  # (L, S)
        return logits + _per_head(np.asarray(table, dtype=np.float64).T[:, b], logits.ndim)
    raise ValueError(f"unknown modifier spec {mod[0]!r}")
