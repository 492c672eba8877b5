"""The triton backend registered under Triton's interpreter for one test module.

``TRITON_INTERPRET=1`` must be set before triton is first imported: a test module
imports this one before anything that imports triton, and is skipped when triton is
missing, was imported earlier without the interpreter, or the installed torch is below
the triton backend's floor (``attnkit._torch_features``). :func:`interpreted_triton`
registers the backend for a module; the environment, the registry and dispatch's
rankings are put back afterwards through the public registry functions.
"""

from __future__ import annotations

import os

ENV_BEFORE = os.environ.get("TRITON_INTERPRET")
"""The variable as the first importing module found it."""
os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: its own library too

from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import pytest  # noqa: E402

from attnkit import _torch_features  # noqa: E402 - imports no triton

_below_floor = _torch_features.missing("triton")
if _below_floor is not None:
    pytest.skip(_below_floor, allow_module_level=True)

_language = pytest.importorskip("triton.language")
if type(_language.zeros).__name__ != "InterpretedFunction":
    pytest.skip(
        "triton was imported in this process before TRITON_INTERPRET=1 was set; run with "
        "TRITON_INTERPRET=1 in the environment (or this file on its own)",
        allow_module_level=True,
    )

import attnkit  # noqa: E402
from attnkit.backends import dispatch  # noqa: E402
from attnkit.backends.triton import TritonBackend  # noqa: E402

__all__ = ["ENV_BEFORE", "interpreted_triton"]


@contextmanager
def interpreted_triton() -> Iterator[None]:
    """Register a fresh :class:`TritonBackend` (interpreted) for the block; the backend
    registered as "triton" before, if any, comes back after it, and the variable as it
    was before (:data:`ENV_BEFORE`). Kernels built inside stay interpreted for the rest
    of the process."""
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
        if ENV_BEFORE is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = ENV_BEFORE
