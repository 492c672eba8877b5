"""Dispatch: a priority list of backends, explain(), and use_backend().

The first backend in priority order with no reasons not to run is chosen.
A backend forced by name (``backend=`` or ``use_backend``) runs or raises with
its reasons; it never falls back silently.

Priority: ``sdpa``, ``chunked``, ``reference``.

- ``sdpa`` first: for dot-reducible scores torch's fused kernel is the fastest
  dense path, skips the upper triangle of a top-left causal mask by itself, and
  runs ``valid_lens``/``key_padding`` unpadded. What it would compute densely
  and wastefully (window masks, bottom-right causal with L != S, causal
  combined with other masks) it passes over in automatic dispatch, through
  :meth:`Backend.preference_reasons`, so those fall to ``chunked``; forced by
  name it still runs them. Preference reasons appear in ``explain()`` like the
  others, and only when no backend is forced.
- ``chunked`` second: every dot-reducible score and Additive, every mask kind,
  whole blocks outside a band skipped, O((L + S)·E) memory in training.
- ``reference`` last: any score (including user-defined ones), dropout with
  weights, and the readable definition the others are tested against.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from .._inputs import AttentionInputs
from .base import Backend
from .chunked import ChunkedBackend
from .reference import ReferenceBackend
from .sdpa import SDPABackend

__all__ = [
    "BackendNotSupportedError",
    "Explanation",
    "available_backends",
    "explain_inputs",
    "register_backend",
    "select_backend",
    "use_backend",
]

_REGISTRY: dict[str, Backend] = {}
_PRIORITY: list[str] = []
# The stack of choices made by use_backend(), innermost last. A plain module
# global (process-wide, like torch's own SDPA backend switches) rather than a
# ContextVar: torch.compile traces it and guards on it, so a compiled function
# is recompiled when the choice changes instead of keeping a stale one.
_FORCED: list[tuple[str, ...]] = []


def _forced_backends() -> tuple[str, ...] | None:
    """The names forced by the innermost :func:`use_backend`, or None."""
    return _FORCED[-1] if _FORCED else None


class BackendNotSupportedError(ValueError):
    """A backend chosen by name cannot run this call; the message lists its reasons."""


@dataclass(frozen=True)
class Explanation:
    """Which backend runs a call and why every other one does or does not.

    Attributes:
        chosen: name of the backend that runs, or None when none can.
        candidates: names considered, in priority order.
        reasons: for every registered backend, the reasons it cannot run (empty = can).
        forced: the names a caller forced (``backend=`` or ``use_backend``), if any.
        note: how the chosen backend will compute this call (``Backend.describe``),
            e.g. which kernel runs the Additive score's tiles, or "".
    """

    chosen: str | None
    candidates: tuple[str, ...]
    reasons: dict[str, list[str]] = field(default_factory=dict)
    forced: tuple[str, ...] | None = None
    note: str = ""

    def __str__(self) -> str:
        lines = [f"chosen: {self.chosen or 'none'}" + (" (forced)" if self.forced else "")]
        for name in self.reasons:
            why = self.reasons[name]
            mark = "ok" if not why else "; ".join(why)
            skipped = "" if name in self.candidates else " [not a candidate]"
            lines.append(f"  {name}: {mark}{skipped}")
        if self.note:
            lines.append(f"note ({self.chosen}): {self.note}")
        return "\n".join(lines)


def register_backend(backend: Backend, *, before: str | None = None) -> None:
    """Add a backend to the registry, placed in priority before ``before`` (or last)."""
    if backend.name in _REGISTRY:
        _PRIORITY.remove(backend.name)
    _REGISTRY[backend.name] = backend
    if before is not None and before in _PRIORITY:
        _PRIORITY.insert(_PRIORITY.index(before), backend.name)
    else:
        _PRIORITY.append(backend.name)


def available_backends() -> tuple[str, ...]:
    """Registered backend names in priority order."""
    return tuple(_PRIORITY)


def _check_names(names: Sequence[str], argument: str) -> tuple[str, ...]:
    out = []
    for n in names:
        if not isinstance(n, str) or n not in _REGISTRY:
            raise ValueError(
                f"{argument}: unknown backend {n!r}; expected one of {list(_PRIORITY)}"
            )
        out.append(n)
    if not out:
        raise ValueError(f"{argument}: expected at least one backend name, got none")
    return tuple(out)


def normalize_backend_arg(backend: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """Validate ``backend=``: None, a name, or a sequence of names."""
    if backend is None:
        return None
    if isinstance(backend, str):
        return _check_names([backend], "backend")
    if isinstance(backend, (list, tuple)):
        return _check_names(list(backend), "backend")
    raise TypeError(
        f"backend: expected None, a backend name or a list of names, got {type(backend).__name__}"
    )


def _reasons(name: str, inputs: AttentionInputs, automatic: bool) -> list[str]:
    """One backend's reasons not to run; in automatic dispatch, also its preference reasons."""
    backend = _REGISTRY[name]
    reasons = backend.not_supported_reasons(inputs)
    if automatic:  # pass over backends a faster one beats
        reasons = reasons + backend.preference_reasons(inputs)
    return reasons


def explain_inputs(inputs: AttentionInputs, backend: tuple[str, ...] | None = None) -> Explanation:
    """Every backend's reasons for this call and the one that would run."""
    forced = backend if backend is not None else _forced_backends()
    candidates = forced if forced is not None else tuple(_PRIORITY)
    reasons = {name: _reasons(name, inputs, forced is None) for name in _PRIORITY}
    chosen = next((n for n in candidates if not reasons[n]), None)
    note = _REGISTRY[chosen].describe(inputs) if chosen is not None else ""
    return Explanation(
        chosen=chosen, candidates=candidates, reasons=reasons, forced=forced, note=note
    )


def select_backend(inputs: AttentionInputs, backend: tuple[str, ...] | None = None) -> Backend:
    """The backend that runs this call; raises BackendNotSupportedError when none can.

    Asks the candidates in order and stops at the first that can run; the full
    explanation is built only for the error.
    """
    forced = backend if backend is not None else _forced_backends()
    candidates = forced if forced is not None else tuple(_PRIORITY)
    for name in candidates:
        if not _reasons(name, inputs, forced is None):
            return _REGISTRY[name]
    ex = explain_inputs(inputs, backend)
    detail = "; ".join(f"{n}: {', '.join(ex.reasons[n])}" for n in ex.candidates)
    if ex.forced:
        raise BackendNotSupportedError(
            f"backend: the forced backend(s) {list(ex.forced)} cannot run this call ({detail})"
        )
    raise BackendNotSupportedError(f"backend: no backend can run this call ({detail})")


@contextmanager
def use_backend(*names: str | Sequence[str]) -> Iterator[None]:
    """Force the backend(s) tried, in order, inside a ``with`` block.

    ``use_backend("reference")`` or ``use_backend("chunked", "reference")``. The
    previous choice is restored on exit, even on error. A forced backend that
    cannot run raises with its reasons instead of falling back to another.
    """
    flat: list[str] = []
    for n in names:
        if isinstance(n, (list, tuple)):
            flat.extend(n)
        else:
            flat.append(n)  # type: ignore[arg-type]
    chosen = _check_names(flat, "use_backend")
    _FORCED.append(chosen)
    try:
        yield
    finally:
        _FORCED.pop()


register_backend(SDPABackend())
register_backend(ReferenceBackend())
register_backend(ChunkedBackend(), before="reference")
