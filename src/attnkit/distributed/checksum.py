"""Checksums of tensor values, so ranks can check they hold the same tensors cheaply.

A context-parallel call needs every rank to pass the same mask tensors and score
parameters, but shipping them would cost as much as the call. Each rank instead
condenses every tensor to two int64 words, computed as tensor ops on the tensor's
own device (nothing is read on the host, so nothing waits for an accelerator):

- ``s0 = Σ bits(x_i)`` and ``s1 = Σ bits(x_i) · (i + 1)``, over the tensor's
  elements in logical (row-major) order, where ``bits`` is the element's bit
  pattern as an integer (``-0.0`` counted as ``0.0``). Integer sums wrap modulo
  2**64, so they are exact and do not depend on the order of summation, the
  device, or how the tensor is laid out in memory (a broadcast view and its
  materialized copy give the same words; a broadcast dim is summed in closed form,
  never expanded).
- Any single changed element changes ``s0``; two elements swapped change ``s1``.
  Equal words on two ranks do not prove equal tensors, but a careless difference
  (another seed, a tensor edited on one rank) is caught.

Large tensors are processed in pieces of at most :data:`PIECE` elements, so the
temporaries stay small whatever the tensor's size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["PIECE", "combine", "tensor_checksum"]

PIECE = 1 << 22
"""Elements converted at once (the int64 temporaries are at most this long)."""

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MIX = 0x9E3779B97F4A7C15  # an odd 64-bit constant: tensor t's words are weighted by (2t+1)·_MIX


def _wrap(n: int) -> int:
    """``n`` modulo 2**64 as a signed int64 value."""
    return (n + 2**63) % 2**64 - 2**63


def _bits(x: torch.Tensor) -> torch.Tensor:
    """x's elements as int64 bit patterns (same shape); -0.0 becomes 0.0."""
    if x.dtype == torch.bool:
        return x.to(torch.int64)
    if x.is_floating_point():
        x = x + 0.0  # IEEE: -0.0 + 0.0 == +0.0, so both zeros agree
        return x.view(_INT_OF_SIZE[x.element_size()]).to(torch.int64)
    if x.is_complex():
        raise TypeError(f"checksum: complex tensors are not supported, got {x.dtype}")
    return x.to(torch.int64)


def _weighted(x: torch.Tensor, coef: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ bits, Σ bits · (1 + Σ_d idx_d · coef_d)) of ``x`` with its own index origin."""
    if x.numel() <= PIECE or x.ndim == 0:
        bits = _bits(x)  # x's shape, int64
        weight = torch.ones((), dtype=torch.int64, device=x.device)
        for d, (n, c) in enumerate(zip(x.shape, coef, strict=True)):
            index = torch.arange(n, dtype=torch.int64, device=x.device) * _wrap(c)  # (n,)
            weight = weight + index.view(n, *([1] * (x.ndim - d - 1)))  # broadcasts up to x's shape
        return bits.sum(), (bits * weight).sum()
    d = next(i for i, n in enumerate(x.shape) if n > 1)
    per_index = x.numel() // x.shape[d]
    step = max(1, PIECE // per_index)
    s0 = torch.zeros((), dtype=torch.int64, device=x.device)
    s1 = torch.zeros((), dtype=torch.int64, device=x.device)
    for a in range(0, x.shape[d], step):
        part0, part1 = _weighted(x.narrow(d, a, min(step, x.shape[d] - a)), coef)
        s0 = s0 + part0
        s1 = s1 + part1 + part0 * _wrap(a * coef[d])  # the slab starts at index a of dim d
    return s0, s1


def tensor_checksum(t: torch.Tensor) -> torch.Tensor:
    """(2,) int64 on ``t``'s device: ``(s0, s1)`` of ``t``'s values (see the module docstring).

    Broadcast (stride-0) dims are summed in closed form: the words equal those of
    ``t.contiguous()`` without building it.
    """
    t = t.detach()
    shape = list(t.shape)
    coef = [1] * len(shape)  # logical row-major strides of the full shape
    for d in range(len(shape) - 2, -1, -1):
        coef[d] = coef[d + 1] * shape[d + 1]
    repeats, offset = 1, 0  # a broadcast dim repeats every element n times at index j·coef
    for d, n in enumerate(shape):
        if n > 1 and t.stride(d) == 0:
            t = t.narrow(d, 0, 1)
            others = repeats
            # Σ_j (w + j·coef_d) over j < n = n·w + coef_d·n(n-1)/2, for every earlier repeat
            offset = offset * n + others * coef[d] * (n * (n - 1) // 2)
            repeats *= n
    if t.numel() == 0:
        return torch.zeros(2, dtype=torch.int64, device=t.device)
    s0, s1 = _weighted(t, coef)
    s1 = s1 * _wrap(repeats) + s0 * _wrap(offset)
    return torch.stack([s0 * _wrap(repeats), s1])  # (2,)


def combine(words: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """(2,) int64 on ``device``: the checksums of several tensors folded into one, each
    weighted by its position (so tensors that trade places do not cancel)."""
    total = torch.zeros(2, dtype=torch.int64, device=device)
    for i, w in enumerate(words):
        total = total + w.to(device) * _wrap((2 * i + 1) * _MIX)
    return total
