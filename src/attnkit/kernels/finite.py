"""One read of a kernel's output: is every value finite, and does every row hold a nonzero?

:func:`rows_settled` answers from the compiled library (:mod:`attnkit.kernels._native`),
about as fast as memory reads the tensor. The sdpa backend asks it after torch's kernel
ran, to learn without reading the inputs that the kernel already gave the non-finite
policy's answer (:func:`attnkit.backends.sdpa.run.kernel_followed_policy` says why
that follows). Where the library does not run (no C compiler, another device or dtype,
rows not laid out one after another) it answers False, "not shown", and the caller
takes its full check.
"""

from __future__ import annotations

import torch

from . import _native

__all__ = ["rows_settled"]

_FORMATS: dict[torch.dtype, tuple[int, int]] = {
    torch.float32: (4, 0x7F800000),
    torch.float16: (2, 0x7C00),
    torch.bfloat16: (2, 0x7F80),
}
"""Per dtype the library reads: its width in bytes and its exponent field."""


def rows_settled(t: torch.Tensor) -> bool:
    """True when every value of ``t`` is finite and every row of it (its last dim) holds a
    value other than ±0, read in one pass on the host.

    Args:
        t: (..., C) float32, float16 or bfloat16 on the CPU, C >= 1, laid out so that its
            rows follow one another in memory (row-major, or row-major with its dims -3
            and -2 swapped, as torch's CPU SDPA kernel returns). No gradient is taken.

    Returns:
        True when shown. False when a value is inf or NaN, when a row is all zeros, and
        when it cannot be told here (no compiled library, another dtype, device or
        layout, an empty tensor): the caller then checks in full.
    """
    fmt = _FORMATS.get(t.dtype)
    n = t.numel()
    if fmt is None or not t.is_cpu or n == 0 or t.ndim == 0:
        return False
    if not (t.is_contiguous() or (t.ndim >= 3 and t.transpose(-3, -2).is_contiguous())):
        return False
    lib = _native.library()
    if lib is None:
        return False
    C = t.shape[-1]
    return bool(lib.ak_rows_settled(t.data_ptr(), n // C, C, fmt[0], fmt[1]))
