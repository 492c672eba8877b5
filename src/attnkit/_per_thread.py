"""This thread's call settings, in one record that every call may read.

Two context managers set them, each for its own thread: :func:`attnkit.use_backend`
(``forced``, the backends it names) and :func:`attnkit._host.device_semantics`
(``strict``, no host reads). They share one record so that a compiled call, which
guards on every object it reads, reads one per-thread object for both: each
``threading.local`` read costs a compiled call a guard of its own.
"""

from __future__ import annotations

import threading

__all__ = ["THREAD", "CallSettings"]


class CallSettings(threading.local):
    """One thread's settings (every thread starts with the defaults).

    ``forced``: the names of the innermost ``use_backend()`` (None: automatic dispatch),
    one value rather than a stack, so that a compiled call guards on one attribute.
    ``strict``: True inside ``device_semantics()``, where no tensor is read on the host.
    """

    def __init__(self) -> None:
        self.forced: tuple[str, ...] | None = None
        self.strict = False


THREAD = CallSettings()
"""This thread's settings. Read the fields directly only where a function call costs (a
compiled call's guards: dynamo guards each function it inlines); only ``use_backend()``
sets ``forced`` and only ``device_semantics()`` sets ``strict``."""
