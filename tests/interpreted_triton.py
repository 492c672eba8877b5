"""The triton backend registered under Triton's interpreter for one test module.

``TRITON_INTERPRET=1`` must be set before triton is first imported, so each module
sets it at its top and passes the value it found (``env_before``) here; the
environment, the registry and dispatch's rankings are put back afterwards through
the public registry functions.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import attnkit
from attnkit.backends import dispatch
from attnkit.backends.triton import TritonBackend

__all__ = ["interpreted_triton"]


@contextmanager
def interpreted_triton(env_before: str | None) -> Iterator[None]:
    """Register a fresh :class:`TritonBackend` (interpreted) for the block; the backend
    registered as "triton" before, if any, comes back after it. Kernels built inside
    stay interpreted for the rest of the process."""
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        previous = attnkit.get_backend("triton")
    except ValueError:
        previous = None
    rankings = {device: list(names) for device, names in dispatch.PRIORITY.items()}
    attnkit.register_backend(TritonBackend())
    try:
        yield
    finally:
        attnkit.unregister_backend("triton")
        dispatch.PRIORITY.clear()
        dispatch.PRIORITY.update(rankings)
        if previous is not None:
            attnkit.register_backend(previous)
        if env_before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = env_before
