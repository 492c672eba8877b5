"""Declaring the native kernels as ``torch.library`` custom ops.

Each entry point is an op in the ``attnkit`` namespace with a fake (meta)
implementation, so ``torch.compile`` traces it as one node and meta or fake tensors
get correct shapes without running it. ``torch.library.custom_op`` exists from
torch 2.4; where it is missing the functions stay plain Python functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["custom_op", "register_fake"]

_HAS_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")


def custom_op(name: str, *, mutates_args: Iterable[str] = ()) -> Callable[[Any], Any]:
    """``torch.library.custom_op(name, mutates_args=...)``, or the function unchanged."""

    def wrap(fn: Any) -> Any:
        if not _HAS_CUSTOM_OP:  # pragma: no cover - torch < 2.4
            return fn
        return torch.library.custom_op(name, mutates_args=tuple(mutates_args))(fn)

    return wrap


def register_fake(op: Any) -> Callable[[Any], Any]:
    """``torch.library.register_fake(op)``, or a no-op."""

    def wrap(fn: Any) -> Any:
        if _HAS_CUSTOM_OP and hasattr(op, "register_fake"):
            op.register_fake(fn)
        return fn

    return wrap
