"""The hook :func:`attnkit.attention` calls when a recorder is active.

:func:`attnkit.viz.capture` installs a recorder for the duration of a ``with``
block; outside one, :data:`ACTIVE` holds None and ``attention()`` pays one
ContextVar lookup. Kept free of heavy imports so ``functional`` can import it.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ._inputs import AttentionInputs
    from .backends.base import Backend
    from .backends.records import AttentionResult

__all__ = ["ACTIVE", "Recorder"]


class Recorder(Protocol):
    """Receives every ``attention()`` call made while it is active."""

    def record(self, inputs: AttentionInputs, result: AttentionResult, backend: Backend) -> None:
        """Called after the backend ran, with the validated inputs and its result."""


ACTIVE: ContextVar[Recorder | None] = ContextVar("attnkit_active_recorder", default=None)
