"""Whether Triton can run here, the GPU architecture of a call, and the tiles per target.

Nothing in this module imports Triton at import time: ``attnkit`` stays importable
without it, and the backend reports the missing package as its reason not to run.

The tile table is explicit, per architecture, from compile reports: every entry is
compiled for its target by :mod:`.targets` (in the test suite), which checks that it
fits the target's shared memory and that no half-precision kernel spills registers
on sm_80 or newer. It was not autotuned: that needs timings on each GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from contextvars import ContextVar
from dataclasses import dataclass

import torch

__all__ = [
    "SHARED_MEMORY",
    "Tiles",
    "arch_of",
    "interpreting",
    "missing_reason",
    "next_pow2",
    "tiles_for",
]

SHARED_MEMORY = {75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
"""Shared memory one block may use, in bytes, per target (sm_XY as XY)."""

TARGET_ARCH: ContextVar[int | None] = ContextVar("attnkit_triton_target_arch", default=None)
"""Set by the compile-only check (:mod:`.targets`): the architecture tiles are chosen
for, instead of the device's."""


def interpreting() -> bool:
    """True when ``TRITON_INTERPRET=1``: kernels run on CPU tensors, through NumPy."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
"""Looked up once, at import: a compiled call asks :func:`missing_reason`, and torch's
compiler before 2.13 cannot trace ``find_spec`` (a graph break)."""


def missing_reason() -> str | None:
    """Why Triton kernels cannot run on this install, or None when they can."""
    if not _TRITON_INSTALLED:
        return "triton is not installed (pip install 'triton>=3.0')"
    return None


def next_pow2(n: int, minimum: int = 16) -> int:
    """The smallest power of two >= n and >= ``minimum`` (tl.dot needs 16 on the GPU)."""
    p = minimum
    while p < n:
        p *= 2
    return p


@functools.lru_cache(maxsize=16)
def _device_arch(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


def arch_of(device: torch.device) -> int:
    """The CUDA architecture tiles are chosen for (e.g. 80 for sm_80); 0 for the CPU
    (Triton's interpreter) and wherever torch has no CUDA to ask."""
    target = TARGET_ARCH.get()
    if target is not None:
        return target
    if device.type != "cuda" or not torch.cuda.is_available():
        return 0
    return _device_arch(device.index if device.index is not None else torch.cuda.current_device())


def family(arch: int) -> int:
    """The tile table's row for an architecture: 75, 80, 86 (sm_86/sm_89 and consumer
    Blackwell: 99 KiB a block) or 90 (sm_90 and newer data-centre parts)."""
    if arch < 80:
        return 75
    if arch in (86, 87, 89) or arch >= 120:
        return 86
    if arch >= 90:
        return 90
    return 80


@dataclass(frozen=True)
class Tiles:
    """Tile sizes and launch options of one kernel.

    block_m: query rows per tile; block_n: keys per tile; block_h: hidden features
    per step of the Additive score; num_warps / num_stages: CUDA launch options.
    """

    block_m: int
    block_n: int
    block_h: int
    num_warps: int
    num_stages: int


# kernel -> family -> head-dim bucket -> (block_m, block_n, num_warps, num_stages).
# Buckets: 64 (E <= 64), 128 (E <= 128), 256 (E <= 256). Chosen from compile reports
# of the heaviest specializations (every mask field, the weights' gradient): the largest
# tiles that fit the target's shared memory without spilling registers. sm_75: Triton
# 3.9 emits no tensor-core instruction below sm_80 (products on FMA), so small tiles
# with the fewest spills (none at E <= 64).
_HALF: dict[str, dict[int, dict[int, tuple[int, int, int, int]]]] = {
    "forward": {
        90: {64: (128, 64, 8, 2), 128: (128, 64, 8, 2), 256: (64, 64, 8, 2)},
        80: {64: (128, 64, 8, 2), 128: (128, 32, 8, 2), 256: (64, 64, 8, 2)},
        86: {64: (128, 64, 8, 2), 128: (128, 32, 8, 2), 256: (64, 32, 8, 1)},
        75: {64: (32, 16, 4, 1), 128: (16, 16, 4, 1), 256: (16, 16, 4, 1)},
    },
    "weights": {
        90: {64: (64, 64, 4, 2), 128: (64, 64, 4, 2), 256: (64, 32, 8, 1)},
        80: {64: (64, 64, 4, 2), 128: (64, 64, 4, 2), 256: (64, 32, 8, 1)},
        86: {64: (64, 64, 4, 2), 128: (64, 64, 4, 1), 256: (64, 32, 8, 1)},
        75: {64: (32, 16, 4, 1), 128: (16, 16, 4, 1), 256: (16, 16, 4, 1)},
    },
    "dkdv": {
        90: {64: (64, 64, 8, 1), 128: (32, 32, 4, 1), 256: (32, 32, 8, 1)},
        80: {64: (32, 32, 8, 1), 128: (32, 32, 4, 1), 256: (32, 32, 8, 1)},
        86: {64: (32, 32, 8, 1), 128: (32, 32, 4, 1), 256: (32, 32, 8, 1)},
        75: {64: (32, 16, 4, 1), 128: (16, 16, 4, 1), 256: (16, 16, 4, 1)},
    },
    "dq": {
        90: {64: (64, 64, 8, 1), 128: (64, 64, 8, 1), 256: (32, 32, 8, 1)},
        80: {64: (64, 32, 4, 1), 128: (32, 32, 4, 1), 256: (32, 32, 8, 1)},
        86: {64: (32, 32, 4, 1), 128: (64, 64, 8, 1), 256: (32, 32, 8, 1)},
        75: {64: (32, 16, 4, 1), 128: (16, 16, 4, 1), 256: (16, 32, 4, 1)},
    },
}
_WIDE: dict[str, dict[int, dict[int, tuple[int, int, int, int]]]] = {
    # float32 operands: twice the bytes and registers per element (spills allowed);
    # sm_75 and the 99 KiB parts get smaller tiles where shared memory runs out
    "forward": {
        90: {64: (64, 32, 4, 2), 128: (64, 32, 8, 1), 256: (32, 32, 8, 1)},
        86: {64: (64, 32, 4, 2), 128: (64, 32, 8, 1), 256: (32, 32, 8, 1)},
        75: {64: (32, 32, 4, 1), 128: (32, 16, 4, 1), 256: (16, 16, 4, 1)},
    },
    "weights": {
        90: {64: (64, 32, 4, 1), 128: (32, 32, 8, 1), 256: (32, 32, 8, 1)},
        86: {64: (64, 32, 4, 1), 128: (32, 32, 8, 1), 256: (32, 32, 8, 1)},
        75: {64: (32, 32, 4, 1), 128: (32, 16, 4, 1), 256: (16, 16, 4, 1)},
    },
    "dkdv": {
        90: {64: (32, 32, 4, 1), 128: (32, 32, 8, 1), 256: (16, 16, 8, 1)},
        86: {64: (32, 32, 4, 1), 128: (32, 32, 8, 1), 256: (16, 16, 8, 1)},
        75: {64: (32, 16, 4, 1), 128: (16, 16, 4, 1), 256: (16, 16, 4, 1)},
    },
    "dq": {
        90: {64: (32, 32, 4, 1), 128: (32, 32, 8, 1), 256: (16, 32, 8, 1)},
        86: {64: (32, 32, 4, 1), 128: (32, 32, 8, 1), 256: (16, 32, 8, 1)},
        75: {64: (32, 16, 4, 1), 128: (16, 16, 4, 1), 256: (16, 16, 4, 1)},
    },
}
_ADDITIVE = {  # (block_m, block_n, block_h, num_warps, num_stages): a (rows, keys, hidden
    # step) tanh block lives in registers
    "forward": (32, 32, 8, 4, 1),
    "weights": (32, 32, 8, 4, 1),
    "dkdv": (32, 32, 8, 4, 1),
    "dq": (32, 32, 8, 4, 1),
}


def tiles_for(
    kernel: str, head_dim: int, *, arch: int, additive: bool, hidden: int = 0, wide: bool = False
) -> Tiles:
    """Tile sizes for ``kernel`` ("forward", "weights", "dkdv" or "dq") on ``arch``.

    The interpreter (arch 0) gets 16 x 16 tiles, so small test shapes still span several
    blocks. ``wide``: float32 operands. ``head_dim``: the larger of the query/key and
    value feature sizes of the kernel's dot form; ``hidden``: the Additive score's.
    """
    if arch == 0:
        return Tiles(16, 16, min(next_pow2(hidden), 32) if additive else 16, 4, 1)
    if additive:
        m, n, h, w, s = _ADDITIVE[kernel]
        return Tiles(m, n, min(h, next_pow2(hidden, minimum=1)), w, s)
    bucket = 64 if head_dim <= 64 else 128 if head_dim <= 128 else 256
    fam = family(arch)
    table = _WIDE[kernel][90 if fam == 80 else fam] if wide else _HALF[kernel][fam]
    m, n, w, s = table[bucket]
    return Tiles(m, n, 16, w, s)
