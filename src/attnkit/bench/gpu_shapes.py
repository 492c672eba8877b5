"""Shapes and FLOP counts of the GPU suite's cases (see :mod:`attnkit.bench.gpu_cases`).

FLOP counts (the work a call needs, not what a kernel spends on skipped tiles):

- dot-product attention, forward: ``4 · B · H · E · pairs`` (Q·Kᵀ and P·V, two
  FLOPs per multiply-add), ``pairs`` the kept (query, key) pairs: L·S dense,
  N(N+1)/2 causal, Σ len_b² for ragged ``valid_lens(lens, queries=True)``,
  Σ_i (min(i, W) + 1) for ``window(W, 0)``;
- forward+backward: 3.5 × the forward (the backward's five products against the
  forward's two, FlashAttention's convention);
- Bilinear adds the projection q·W: ``2 · B · H · L · E²``; Gaussian counts as dot;
- Additive: ``B · L · S · (4 · hidden + 2 · Ev)`` (add, tanh, multiply-add with
  w_v over the hidden dim, then P·V) plus the projections ``2 · B · (L + S) · E · hidden``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from .cases import Sides

__all__ = [
    "BWD_FACTOR",
    "GpuCase",
    "GpuShape",
    "additive_flops",
    "attention_flops",
    "bilinear_flops",
    "causal_pairs",
    "dense_pairs",
    "ragged_lengths",
    "ragged_pairs",
    "window_pairs",
]

BWD_FACTOR = 3.5
"""FLOPs of forward+backward over the forward's."""


@dataclass(frozen=True)
class GpuShape:
    """Sizes of one GPU case: batch B, heads H, L queries, S keys, feature dim E, dtype.

    ``hidden``: the Additive score's hidden size; ``window``: W of ``window(W, 0)``.
    """

    B: int = 4
    H: int = 16
    L: int = 4096
    S: int = 4096
    E: int = 128
    dtype: torch.dtype = torch.bfloat16
    hidden: int = 0
    window: int = 0

    def small(self) -> GpuShape:
        """The same case at tiny sizes in float32 (to check the builders anywhere)."""
        return replace(
            self,
            B=min(self.B, 2),
            H=min(self.H, 2),
            L=min(self.L, 64),
            S=min(self.S, 64),
            E=16,
            dtype=torch.float32,
            hidden=min(self.hidden, 8),
            window=min(self.window, 8),
        )


@dataclass(frozen=True)
class GpuCase:
    """One GPU benchmark: attnkit against one peer.

    ``build(shape, device)`` returns the sides on that device; ``flops(shape)`` the
    useful FLOPs of one call; ``goal`` the minimum speedup (peer time / attnkit
    time) of the target; ``mem_goal`` the largest attnkit/peer peak-memory ratio.
    ``weights_floor``: the target is total time ≤ 1.3 × (the peer's time + the time
    to write the weights at the device's copy bandwidth).
    """

    name: str
    suite: str
    peer: str
    target: str
    goal: float | None
    shape: GpuShape
    flops: Callable[[GpuShape], float]
    build: Callable[[GpuShape, str], Sides]
    mem_goal: float | None = None
    needs_flex: bool = False
    weights_floor: bool = False


# ------------------------------------------------------------------ FLOP counts


def attention_flops(shape: GpuShape, pairs: float, *, backward: bool = False) -> float:
    """4 · B · H · E · pairs, times 3.5 with the backward."""
    fwd = 4.0 * shape.B * shape.H * shape.E * pairs
    return fwd * BWD_FACTOR if backward else fwd


def ragged_lengths(B: int, N: int, seed: int = 3) -> torch.Tensor:
    """(B,) lengths uniform in [N/10, N], stratified (one per B-quantile) in a fixed
    shuffled order, so the batch carries the distribution's mean work."""
    strata = (torch.arange(B, dtype=torch.float64) + 0.5) / B  # (B,)
    lens = (N / 10 + (N - N / 10) * strata).round().long()  # (B,)
    return lens[torch.randperm(B, generator=torch.Generator().manual_seed(seed))]  # (B,)


def window_pairs(N: int, W: int) -> int:
    """Kept pairs of ``window(W, 0)`` on N positions: Σ_i (min(i, W) + 1)."""
    full = max(N - W, 0)  # rows that see W + 1 keys
    ramp = min(N, W)  # rows 0 .. ramp-1 see i + 1 keys
    return full * (W + 1) + ramp * (ramp + 1) // 2


def dense_pairs(s: GpuShape) -> float:
    return float(s.L * s.S)


def causal_pairs(s: GpuShape) -> float:
    return float(s.L * (s.L + 1) // 2)


def ragged_pairs(s: GpuShape) -> float:
    lens = ragged_lengths(s.B, s.L)  # (B,)
    # mean pairs per batch element: attention_flops multiplies by B
    return float((lens.double() ** 2).sum()) / s.B


def bilinear_flops(s: GpuShape) -> float:
    return attention_flops(s, dense_pairs(s)) + 2.0 * s.B * s.H * s.L * s.E * s.E


def additive_flops(s: GpuShape, backward: bool = False) -> float:
    fwd = s.B * s.L * s.S * (4.0 * s.hidden + 2.0 * s.E) + 2.0 * s.B * (s.L + s.S) * s.E * s.hidden
    return fwd * BWD_FACTOR if backward else fwd


# ------------------------------------------------------------------ inputs and peers
