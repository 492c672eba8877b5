"""The hook :func:`attnkit.attention` calls when a recorder is active.

:func:`attnkit.viz.capture` installs a recorder for the duration of a ``with``
block; outside one, :data:`ACTIVE` holds None and ``attention()`` pays one
ContextVar lookup. Kept free of heavy imports so ``functional`` can import it.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from ._inputs import AttentionInputs
    from .backends.base import Backend
    from .backends.records import AttentionResult

__all__ = ["ACTIVE", "Recorder", "reaches"]


class Recorder(Protocol):
    """Receives every ``attention()`` call made while it is active."""

    def record(self, inputs: AttentionInputs, result: AttentionResult, backend: Backend) -> None:
        """Called after the backend ran, with the validated inputs and its result."""


ACTIVE: ContextVar[Recorder | None] = ContextVar("attnkit_active_recorder", default=None)


def reaches(recorder: object) -> bool:
    """Whether this context's ``attention()`` calls reach ``recorder``: it is the active
    recorder, or one the active recorder passes its calls on to (its ``parent``, and
    its ``also`` where it passes them to two). Module hooks of a recording ask it, so
    the same model run in another thread (whose context has no recorder) leaves the
    recording alone. False in code being traced by torch.compile (which cannot trace
    a context variable, and whose calls record nothing)."""
    if torch.compiler.is_compiling():
        return False
    todo = [ACTIVE.get()]
    while todo:
        active = todo.pop()
        if active is recorder:
            return True
        if active is not None:
            todo += [getattr(active, "parent", None), getattr(active, "also", None)]
    return False
