"""Reading tensor values on the host: only where it costs no device synchronization.

attnkit reads a tensor's values on the host (``.tolist()``, ``int(t)``) only to
check lengths or to skip padding, and only when :func:`readable` says so: a CPU
tensor, outside ``torch.compile``. A tensor on an accelerator is never read on
the call path (that would wait for the device); such calls take sync-free paths
(dense masks, bounds) instead. :func:`device_semantics` makes every tensor count
as unreadable in this thread, so tests run the accelerator paths on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ._per_thread import THREAD

__all__ = ["device_semantics", "readable", "strict"]

# This thread's host-read setting is THREAD.strict, :func:`strict`'s answer (see
# attnkit._per_thread); only :func:`device_semantics` sets it.


def readable(t: torch.Tensor) -> bool:
    """True when ``t``'s values may be read on the host without a device sync."""
    return t.device.type == "cpu" and not THREAD.strict and not torch.compiler.is_compiling()


def strict() -> bool:
    """True inside :func:`device_semantics` (in this thread)."""
    return THREAD.strict


@contextmanager
def device_semantics() -> Iterator[None]:
    """Inside the block (this thread), treat every tensor as an accelerator's: no host reads."""
    old = THREAD.strict
    THREAD.strict = True
    try:
        yield
    finally:
        THREAD.strict = old
