"""The one error context parallelism raises on every rank: :class:`ContextParallelError`."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ContextParallelError"]


class ContextParallelError(ValueError):
    """Raised on every rank when a rank's arguments are bad, the ranks disagree, or a
    rank is lost during the call.

    A ``ValueError``: code that catches ValueError for bad arguments catches it too.
    It pickles with its attributes (a launcher can send it from a worker).

    Args:
        message: the error's text, the same on every rank.
        ranks: keyword-only, the ranks it is about (default none).
        collective: keyword-only, the exchange that failed, or None (default).

    Attributes:
        ranks: the ranks the error is about: those whose arguments are bad or differ
            from rank 0's, or the peers that were lost or did not answer (empty when
            the fault is not one rank's).
        collective: for a communication failure, the exchange that failed (for
            example ``"ring forward, step 1: receive K/V from rank 0"``); else None.
    """

    def __init__(
        self, message: str, *, ranks: Sequence[int] = (), collective: str | None = None
    ) -> None:
        super().__init__(message)
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.collective = collective

    def __reduce__(self) -> tuple[object, ...]:  # picklable with its attributes
        return (_rebuild, (str(self), self.ranks, self.collective))


def _rebuild(message: str, ranks: tuple[int, ...], collective: str | None) -> ContextParallelError:
    return ContextParallelError(message, ranks=ranks, collective=collective)
