"""Reading tensor values on the host: only where it costs no device synchronization.

attnkit reads a tensor's values on the host (``.tolist()``, ``int(t)``) only to
check lengths or to skip padding, and only when :func:`readable` says so: a CPU
tensor, outside ``torch.compile``. A tensor on an accelerator is never read on
the call path (that would wait for the device); such calls take sync-free paths
(dense masks, bounds) instead. :func:`device_semantics` makes every tensor count
as unreadable in this thread, so tests run the accelerator paths on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from ._per_thread import THREAD

__all__ = ["batched_by_autograd", "device_semantics", "in_transform", "readable", "strict"]

# This thread's host-read setting is THREAD.strict, :func:`strict`'s answer (see
# attnkit._per_thread); only :func:`device_semantics` sets it.


def readable(t: torch.Tensor) -> bool:
    """True when ``t``'s values may be read on the host without a device sync: a CPU
    tensor, outside ``torch.compile`` and outside torch.func's transforms (whose
    wrapped tensors cannot be read either), and not a fake tensor (shapes only: a
    ``FakeTensorMode`` propagating shapes has no values to read) or one batched by
    ``is_grads_batched`` gradients."""
    return (
        t.device.type == "cpu"
        and not THREAD.strict
        and not torch.compiler.is_compiling()
        and not _transforming()
        and not isinstance(t, _FakeTensor)
        and not batched_by_autograd(t)
    )


def batched_by_autograd(t: torch.Tensor) -> bool:
    """True for a gradient batched by ``torch.autograd.grad(..., is_grads_batched=True)``
    (autograd's own vmap, which no transform stack shows)."""
    return _legacy_batched is not None and _legacy_batched(t)


def in_transform() -> bool:
    """True inside a torch.func transform (``vmap``, ``grad``, ``jvp``, ...) or a
    forward-mode AD level (``torch.autograd.forward_ad.dual_level``), outside
    ``torch.compile`` (which traces its own)."""
    return not torch.compiler.is_compiling() and _transforming()


def _transforming() -> bool:
    if _forward_ad._current_level >= 0:
        return True
    return _peek is not None and _peek() is not None


_forward_ad = torch.autograd.forward_ad
_FakeTensor: type | tuple[type, ...]
try:  # (torch's shape-only tensor; absent: none is seen)
    from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
except ImportError:  # pragma: no cover
    _FakeTensor = ()
_legacy_batched: Callable[[torch.Tensor], bool] | None = getattr(
    torch._C._functorch, "is_legacy_batchedtensor", None
)
"""Whether a tensor is batched by autograd's own vmap (``torch.autograd.grad(...,
is_grads_batched=True)``), which no transform stack shows: its values cannot be read."""

_peek: Callable[[], object] | None
try:  # (torch's own probe of its transforms' stack; absent: no transform is seen)
    from torch._C._functorch import peek_interpreter_stack as _peek
except ImportError:  # pragma: no cover
    _peek = None


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
