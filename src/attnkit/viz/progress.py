"""Where a run is, on stderr, in every context.

On a terminal, a live bar (tqdm): layers done, tokens, elapsed time and an
estimate of what is left. Anywhere else (a notebook, a pipe, ``nohup``, a job
scheduler's log), one plain line per layer with the elapsed time, so a long run
is never silent. Before a run starts, one line says what it is: tokens, layers
× heads and the kind of page (dense or long).

``attnkit show --quiet`` and ``viz.show(..., progress=False)`` turn it off for
the run (:func:`quiet`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TextIO

__all__ = ["ENABLED", "Progress", "quiet"]

ENABLED: ContextVar[bool] = ContextVar("attnkit_progress", default=True)
_LINES_AT_MOST = 64  # past this many steps, plain lines come at most once a second


@contextmanager
def quiet(off: bool = True) -> Iterator[None]:
    """Within the block, no progress is printed (when ``off``)."""
    token = ENABLED.set(not off and ENABLED.get())
    try:
        yield
    finally:
        ENABLED.reset(token)


class Progress:
    """Progress of ``total`` steps (a layer's attention, or a generation step's).

    Args:
        total: steps in the run.
        unit: what a step is (``"layer"``).
        header: the line printed before the run starts (None: none).
        tokens: tokens of the run, shown beside the count.
        stream: where to write (default: stderr at construction).
    """

    def __init__(
        self,
        total: int,
        unit: str = "layer",
        *,
        header: str | None = None,
        tokens: int = 0,
        stream: TextIO | None = None,
    ) -> None:
        self.total, self.unit, self.tokens = max(1, total), unit, tokens
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = ENABLED.get()
        self.start = time.perf_counter()
        self.last = self.start
        self.done = 0
        self.bar: Any = None
        if not self.enabled:
            return
        if header:
            self.stream.write(f"attnkit: {header}\n")
            self.stream.flush()
        if bool(getattr(self.stream, "isatty", lambda: False)()):
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit=unit, file=self.stream, leave=False,
                            dynamic_ncols=True, desc=f"attnkit: {tokens:,} tokens")  # fmt: skip

    def step(self, n: int = 1) -> None:
        """``n`` more steps are done."""
        self.done += n
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.perf_counter()
        last = self.done >= self.total
        if self.total > _LINES_AT_MOST and not last and now - self.last < 1.0:
            return
        self.last = now
        shown = min(self.done, self.total)
        what = f" ({self.tokens:,} tokens)" if self.tokens else ""
        self.stream.write(
            f"attnkit: {self.unit} {shown}/{self.total}{what}, {now - self.start:.1f} s\n"
        )
        self.stream.flush()

    def close(self) -> None:
        """The run ended (or failed): the bar is cleared."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
