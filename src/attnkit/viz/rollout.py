"""Attention rollout and attention flow (Abnar & Zuidema, 2020) across a stack of layers.

Both answer: which input tokens does each position draw from, through every
layer? Each layer's head-averaged weights ``A`` are mixed with the residual
connection, ``Ã = (A + I) / 2`` (rows renormalized), then

- **rollout** multiplies them: ``R = Ã_n ··· Ã_1`` (row i: how much of input j
  reaches position i after the last layer);
- **flow** treats each ``Ã`` as edge capacities of a layered graph and takes,
  for every (position i, input j), the maximum flow from input j at the bottom
  to position i at the top.

Rollout costs n matrix products of L×L; flow solves L² max-flow problems, so
it is meant for short inputs (:data:`FLOW_MAX_TOKENS` by default). Flow uses
SciPy's max-flow solver (Dinic's algorithm, capacities in steps of 1e-7).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "FLOW_MAX_TOKENS",
    "attention_flow",
    "attention_rollout",
    "mix_residual",
    "rollout_of_means",
]

FLOW_MAX_TOKENS = 64
_UNIT = 1e7  # SciPy needs int32 capacities: weights in steps of 1e-7


def _layer_means(weights: Any) -> torch.Tensor:
    """(layers, L, L) float64 head means from (layers, heads, L, L) or a list of layers."""
    from .grid import as_grid, check_finite

    grid = as_grid(weights, name="weights", dims="layers, heads")  # (layers, heads, Q, K)
    check_finite(grid, "weights")
    if (grid < 0).any():
        raise ValueError(
            f"weights: attention weights are >= 0 (rows of a softmax), got a minimum of "
            f"{float(grid.min()):.3g}"
        )
    if grid.shape[2] != grid.shape[3]:
        raise ValueError(
            f"weights: rollout and flow need self-attention (Q == K), got Q={grid.shape[2]}, "
            f"K={grid.shape[3]}"
        )
    return torch.from_numpy(grid).double().mean(1)  # (layers, L, L)


def mix_residual(a: torch.Tensor) -> torch.Tensor:
    """``(A + I) / 2`` with rows renormalized: (..., L, L) -> (..., L, L)."""
    L = a.shape[-1]
    mixed = 0.5 * a + 0.5 * torch.eye(L, dtype=a.dtype, device=a.device)
    return mixed / mixed.sum(-1, keepdim=True).clamp_min(1e-30)


def attention_rollout(weights: Any, *, residual: bool = True) -> np.ndarray:
    """Attention rollout: how much each input token reaches each position after the last layer.

    Args:
        weights: (layers, heads, L, L) self-attention weights (tensor or array),
            or a list of per-layer (heads, L, L) / (1, heads, L, L) weights such as
            a Hugging Face model's ``outputs.attentions``; layers in order.
        residual: mix in the residual connection, ``(A + I) / 2`` (the paper's choice).

    Returns:
        (L, L) float32 array: row i is a distribution over input tokens j.

    Raises:
        ValueError: weights that are not a stack of self-attention, or hold NaN,
            infinity or a negative value.
    """
    means = _layer_means(weights)  # (layers, L, L)
    mats = mix_residual(means) if residual else means
    out = mats[0]
    for m in mats[1:]:
        out = m @ out  # (L, L)
    return out.float().numpy()


def _lower_product(a: torch.Tensor, b: torch.Tensor, base: int = 256) -> torch.Tensor:
    """``a @ b`` for lower-triangular (n, n) a and b, skipping the zero blocks: the
    diagonal blocks recursively, the block below them as two products (about 3/8 of a
    full product at two levels)."""
    n = a.shape[0]
    if n <= base:
        return a @ b
    h = n // 2
    out = torch.zeros_like(a)  # (n, n); the block above the diagonal stays 0
    out[:h, :h] = _lower_product(a[:h, :h], b[:h, :h], base)
    out[h:, h:] = _lower_product(a[h:, h:], b[h:, h:], base)
    torch.addmm(a[h:, :h] @ b[:h, :h], a[h:, h:], b[h:, :h], out=out[h:, :h])
    return out


def rollout_of_means(means: torch.Tensor) -> np.ndarray:
    """Attention rollout from each layer's head mean, (layers, L, L) float32 (overwritten).

    The same as :func:`attention_rollout` with ``residual=True``, in float32 and in
    place; when every layer is lower triangular (a causal model), the products skip
    the zeros above the diagonal. Returns (L, L) float32.
    """
    lower = all(not bool(torch.triu(m, 1).any()) for m in means)
    out: torch.Tensor | None = None
    for m in means:  # (L, L) each, in order
        m.mul_(0.5).diagonal().add_(0.5)  # (A + I) / 2
        m.div_(m.sum(-1, keepdim=True).clamp_min_(1e-30))
        if out is None:
            out = m
        else:
            out = _lower_product(m, out) if lower else m @ out  # (L, L)
    assert out is not None
    return out.numpy()


def _solver(cap: np.ndarray) -> Any:
    """A function (source, sink) -> max flow over the capacity matrix (N, N)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    graph = csr_matrix(np.rint(cap * _UNIT).astype(np.int32))
    return lambda s, t: maximum_flow(graph, s, t, method="dinic").flow_value / _UNIT


def attention_flow(weights: Any, *, max_tokens: int = FLOW_MAX_TOKENS) -> np.ndarray:
    """Attention flow: the max flow from each input token to each position through the stack.

    Args:
        weights: as for :func:`attention_rollout`.
        max_tokens: refuse longer inputs (L² max-flow problems of (layers + 1)·L nodes each).

    Returns:
        (L, L) float32 array: entry (i, j) is the flow from input j to position i,
        each row normalized to sum to 1.

    Raises:
        ValueError: more than ``max_tokens`` tokens; weights that are not a stack of
            self-attention, or hold NaN, infinity or a negative value.
    """
    mats = mix_residual(_layer_means(weights)).numpy()  # (layers, L, L)
    n_layers, L, _ = mats.shape
    if L > max_tokens:
        raise ValueError(
            f"weights: attention flow solves L² max-flow problems; {L} tokens is more than "
            f"max_tokens={max_tokens} (use attention_rollout for long inputs)"
        )
    N = (n_layers + 1) * L
    cap = np.zeros((N, N))
    for li in range(n_layers):
        lo, hi = li * L, (li + 1) * L  # level li (inputs) -> level li + 1 (outputs)
        cap[lo : lo + L, hi : hi + L] = mats[li].T  # edge j -> i carries Ã[i, j]
    top = n_layers * L
    out = np.zeros((L, L))
    solve = _solver(cap)
    for i in range(L):
        for j in range(L):
            out[i, j] = solve(j, top + i)
        s = out[i].sum()
        if s > 0:
            out[i] /= s
    return out.astype(np.float32)
