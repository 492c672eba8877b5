"""Dispatch: a priority list per device type, declarative preference rules,
explain(), and use_backend().

Ranking lives here and only here; no backend imports or instantiates another.

- **Priority per device type** (:data:`PRIORITY`): on the CPU ``sdpa``, ``chunked``,
  ``reference``; on CUDA ``sdpa``, ``triton`` (when triton is installed), ``chunked``,
  ``reference``. A backend registers for the device types it declares
  (``Backend.device_types``); a device type without a list of its own uses the
  registration order.
- **Availability**: a backend whose ``is_available()`` gives a reason (a missing
  package, no compiler) cannot run; the reason is shown by ``explain()``.
- **Preference rules** (:data:`RULES`), automatic dispatch only: a backend that can
  run a call is still passed over when a rule gives a reason and a later candidate
  can run the call without that reason. The rule today: a backend that would build
  part of the mask densely as an (L, S) tensor (``Backend.materialized_masks``)
  yields to a later one that keeps it symbolic; on an accelerator only to a fused
  backend, never to a Python-tiled one (``Backend.fused``), since a fused kernel
  with a dense mask beats Python loops over tiles there. And a backend that would run
  half-precision inputs in float32 (``Backend.float32_upcasts``: SDPA with a Gaussian or
  Bilinear score on an accelerator) yields to a later fused one that keeps half tiles.

The first candidate with no reasons runs. A backend forced by name (``backend=`` or
``use_backend``) runs or raises with its reasons; it never falls back silently, and
preference rules do not apply to it. ``use_backend`` is per thread (a field of
:mod:`attnkit._per_thread`'s ``threading.local`` record), which torch.compile traces and
guards on, so a compiled function is recompiled when the choice changes instead of
keeping a stale one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .. import _host
from .._far_rows import far_rows_at_risk
from .._inputs import AttentionInputs
from .._per_thread import THREAD
from ..blockplan.atoms import MaskTooComplex
from .base import Backend
from .chunked import ChunkedBackend
from .operands import alibi_forms, gaussian_form
from .reference import ReferenceBackend
from .sdpa import SDPABackend
from .triton import TritonBackend

__all__ = [
    "PRIORITY",
    "RULES",
    "BackendNotSupportedError",
    "Explanation",
    "PreferenceRule",
    "available_backends",
    "backends_for",
    "explain_inputs",
    "forced_backends",
    "get_backend",
    "on_registry_change",
    "register_backend",
    "select_backend",
    "unregister_backend",
    "use_backend",
]

_REGISTRY: dict[str, Backend] = {}
_ORDER: list[str] = []  # registration order, the fallback ranking

PRIORITY: dict[str, list[str]] = {
    "cpu": ["sdpa", "chunked", "reference"],
    "cuda": ["sdpa", "triton", "chunked", "reference"],
}
"""Ranking per device type; names not registered are skipped.

On CUDA, torch's SDPA (FlashAttention-2 / memory-efficient kernels) comes first for
what it runs without a dense mask; the preference rule hands calls it would have to
give a dense (L, S) mask (windows, shifted causal, padding it cannot unpad) to the
fused ``triton`` kernels, which skip those blocks; Additive scores, exact weights and
other calls SDPA cannot run go to ``triton`` as the next candidate."""


@dataclass(frozen=True)
class PreferenceRule:
    """In automatic dispatch, pass over ``backend`` when ``reasons(backend, inputs)`` is
    not empty and a later candidate that ``accepts(later, inputs)`` can run the call
    with no reasons of this rule."""

    name: str
    reasons: Callable[[Backend, AttentionInputs], list[str]]
    accepts: Callable[[Backend, AttentionInputs], bool]
    instead: str = "{other} keeps it symbolic"
    """What the later candidate does instead, shown after each reason."""


def _materialized(backend: Backend, inputs: AttentionInputs) -> list[str]:
    return [f"{why} would be a dense (L, S) mask" for why in backend.materialized_masks(inputs)]


def _keeps_masks_symbolic(later: Backend, inputs: AttentionInputs) -> bool:
    # A backend that builds every mask densely keeps none symbolic (the reference backend
    # was taken for one: a window with a learnt bias went there, 3x slower than sdpa);
    # on an accelerator a Python-tiled backend never beats a fused kernel.
    return not later.dense_masks and (later.fused or inputs.device.type == "cpu")


def _upcasts(backend: Backend, inputs: AttentionInputs) -> list[str]:
    return backend.float32_upcasts(inputs)


def _fused(later: Backend, inputs: AttentionInputs) -> bool:
    return later.fused


RULES: list[PreferenceRule] = [
    PreferenceRule("symbolic masks", _materialized, _keeps_masks_symbolic),
    PreferenceRule("half precision", _upcasts, _fused, "{other} keeps half-precision tiles"),
]
"""Preference rules, applied in order in automatic dispatch."""


# This thread's backend choice is THREAD.forced, :func:`forced_backends`' answer (see
# attnkit._per_thread); only :func:`use_backend` sets it.


def forced_backends() -> tuple[str, ...] | None:
    """The names forced by the innermost :func:`use_backend` of this thread, or None."""
    return THREAD.forced


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


def register_backend(
    backend: Backend, *, before: str | None = None, device_types: Sequence[str] | None = None
) -> None:
    """Add (or replace) a backend.

    It joins the ranking of each device type it declares (``backend.device_types``,
    or ``device_types``, a list of names such as ``["cpu"]``): placed before ``before``
    (a backend name) when given, else where :data:`PRIORITY` names it, else last.

    Args:
        backend: an :class:`attnkit.backends.base.Backend` instance; its ``name`` is
            its key (a registered backend of that name is replaced).
        before: a registered backend's name to place it before, or None.
        device_types: the device types ("cpu", "cuda", ...) whose ranking it joins;
            None: ``backend.device_types``.

    Raises:
        TypeError: ``backend`` is not a Backend; ``device_types`` is not a list of names.
        ValueError: ``before`` names no backend.
    """
    if not isinstance(backend, Backend):
        raise TypeError(f"backend: expected an attnkit Backend, got {type(backend).__name__}")
    if device_types is not None and not isinstance(device_types, str):
        device_types = tuple(device_types)  # (read twice below: a generator once)
    if device_types is not None and (
        isinstance(device_types, str) or not all(isinstance(d, str) for d in device_types)
    ):
        raise TypeError(
            f"device_types: expected a list of device type names such as ['cpu'], got "
            f"{device_types!r}"
        )
    known = set(_REGISTRY) | {n for ranking in PRIORITY.values() for n in ranking}
    if before is not None and (not isinstance(before, str) or before not in known):
        raise ValueError(
            f"before: unknown backend {before!r}; expected one of {sorted(known)} or None"
        )
    if before == backend.name:
        raise ValueError(
            f"before: {before!r} is the backend being registered; name another backend, or "
            "leave before=None to keep its place"
        )
    if backend.name not in _REGISTRY:
        _ORDER.append(backend.name)
    _REGISTRY[backend.name] = backend
    for dev in device_types if device_types is not None else sorted(backend.device_types):
        ranking = PRIORITY.setdefault(dev, [])
        if before is not None:
            if backend.name in ranking:
                ranking.remove(backend.name)
            at = ranking.index(before) if before in ranking else len(ranking)
            ranking.insert(at, backend.name)
        elif backend.name not in ranking:
            ranking.append(backend.name)
    _registry_changed()


_ON_CHANGE: list[Callable[[], None]] = []


_GENERATION = 0
"""How many times the registry changed. Part of the key of a cached choice: a choice made
while another thread changed the registry is stored under the old count, where no later
call looks (call plans keep a count of their own, :mod:`attnkit._plans`)."""


def _registry_changed() -> None:
    """Forget every choice made for the old registry: names, choices, and the listeners'."""
    global _GENERATION
    _GENERATION += 1
    _NAME_CACHE.clear()
    _CHOICES.clear()
    for clear in list(_ON_CHANGE):
        clear()


def on_registry_change(clear: Callable[[], None]) -> Callable[[], None]:
    """Call ``clear`` whenever a backend is registered or unregistered (caches of earlier
    choices). Returns a function that stops the calls (each listener is removed once)."""
    _ON_CHANGE.append(clear)

    def stop() -> None:
        if clear in _ON_CHANGE:
            _ON_CHANGE.remove(clear)

    return stop


def get_backend(name: str) -> Backend:
    """The registered backend called ``name``.

    Args:
        name: a backend's name (``"sdpa"``, ``"chunked"``, ``"reference"``, ...).

    Returns:
        The :class:`attnkit.backends.base.Backend` registered under it.

    Raises:
        ValueError: no backend is registered under ``name`` (the message lists them).
    """
    be = _REGISTRY.get(name) if isinstance(name, str) else None
    if be is None:
        raise ValueError(f"get_backend: unknown backend {name!r}; expected one of {list(_ORDER)}")
    return be


def unregister_backend(name: str) -> Backend:
    """Remove the backend called ``name`` and return it.

    Its place in :data:`PRIORITY` is kept (names not registered are skipped), so
    ``register_backend(unregister_backend(name))`` puts a backend back where it was.
    Cached choices and call plans are forgotten; a call choosing its backend meanwhile
    (in another thread) does not store its choice.

    Args:
        name: the registered backend's name.

    Returns:
        The :class:`attnkit.backends.base.Backend` removed.

    Raises:
        ValueError: no backend is registered under ``name``.
    """
    be = _REGISTRY.get(name) if isinstance(name, str) else None
    if be is None:
        raise ValueError(
            f"unregister_backend: unknown backend {name!r}; expected one of {list(_ORDER)}"
        )
    del _REGISTRY[name]
    _ORDER.remove(name)
    _registry_changed()
    return be


def available_backends() -> tuple[str, ...]:
    """Registered backend names, in registration order."""
    return tuple(_ORDER)


def backends_for(device_type: str) -> tuple[str, ...]:
    """Registered backends that run on ``device_type`` ("cpu", "cuda", ...), by priority.

    Includes backends that are registered but unavailable on this install (their
    ``is_available()`` reason shows in ``explain()``).
    """
    ranking = PRIORITY.get(device_type)
    names = ranking if ranking is not None else _ORDER
    return tuple(n for n in names if n in _REGISTRY and device_type in _REGISTRY[n].device_types)


def _check_names(names: Sequence[str], argument: str) -> tuple[str, ...]:
    out = []
    for n in names:
        if not isinstance(n, str) or n not in _REGISTRY:
            raise ValueError(f"{argument}: unknown backend {n!r}; expected one of {list(_ORDER)}")
        out.append(n)
    if not out:
        raise ValueError(f"{argument}: expected at least one backend name, got none")
    return tuple(out)


_NAME_CACHE: dict[object, tuple[str, ...]] = {}

_CHOICES: dict[tuple[object, ...], Backend] = {}
"""The backend chosen per (forced names, ``AttentionInputs.signature()``): a call with
the same shapes, dtypes, device, score type, mask structure and flags as an earlier
one skips the reason checks. Cleared when a backend is registered."""
_CHOICES_MAX = 1024


def normalize_backend_arg(backend: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """Validate ``backend=``: None, a name, or a sequence of names."""
    if backend is None:
        return None
    if isinstance(backend, str):
        hit = _NAME_CACHE.get(backend)
        if hit is None:
            hit = _NAME_CACHE[backend] = _check_names([backend], "backend")
        return hit
    if isinstance(backend, (list, tuple)):
        return _check_names(list(backend), "backend")
    raise TypeError(
        f"backend: expected None, a backend name or a list of names, got {type(backend).__name__}"
    )


def _candidates(inputs: AttentionInputs, forced: tuple[str, ...] | None) -> tuple[str, ...]:
    if forced is None:
        return backends_for(inputs.device.type)
    gone = [n for n in forced if n not in _REGISTRY]
    if gone:
        raise ValueError(
            f"backend: {', '.join(map(repr, gone))} is no longer registered (unregistered "
            f"while use_backend or backend= named it); registered: {list(_ORDER)}"
        )
    return forced


def _reasons(backend: Backend, inputs: AttentionInputs) -> list[str]:
    """``backend.not_supported_reasons(inputs)``, and a mask too complex to lower (see
    :class:`attnkit.blockplan.atoms.MaskTooComplex`) as its one reason: the backends that
    read a lowered mask decline it, and the reference backend, whose masks are dense,
    runs it."""
    if inputs.mask is not None and not backend.dense_masks:
        try:
            inputs.block_plan()
        except MaskTooComplex as exc:
            return [str(exc).removeprefix("mask: ")]
    return backend.not_supported_reasons(inputs)


def _preferred(backend: Backend, later: Sequence[str], inputs: AttentionInputs) -> list[str]:
    """Preference reasons to pass over ``backend`` (which can run) for a later candidate."""
    out: list[str] = []
    for rule in RULES:
        why = rule.reasons(backend, inputs)
        if not why:
            continue
        for other in later:
            cand = _REGISTRY.get(other)  # (None: unregistered by another thread meanwhile)
            if (
                cand is not None
                and rule.accepts(cand, inputs)
                and not _reasons(cand, inputs)
                and not rule.reasons(cand, inputs)
            ):
                instead = rule.instead.format(other=other)
                out.extend(f"{w} ({instead})" for w in why)
                break
    return out


def explain_inputs(inputs: AttentionInputs, backend: tuple[str, ...] | None = None) -> Explanation:
    """Every backend's reasons for this call and the one that would run."""
    forced = backend if backend is not None else forced_backends()
    candidates = _candidates(inputs, forced)
    registry = dict(_REGISTRY)  # (this call's view: another thread may change it)
    reasons: dict[str, list[str]] = {name: _reasons(be, inputs) for name, be in registry.items()}
    chosen: str | None = None
    for pos, name in enumerate(candidates):
        if name not in reasons:
            reasons[name] = ["unregistered while this call chose a backend"]
        if reasons[name]:
            continue
        if forced is None:
            pref = _preferred(registry[name], candidates[pos + 1 :], inputs)
            if pref:
                reasons[name] = pref
                continue
        chosen = name
        break
    note = registry[chosen].describe(inputs) if chosen is not None else ""
    return Explanation(
        chosen=chosen, candidates=candidates, reasons=reasons, forced=forced, note=note
    )


def _value_forms(inputs: AttentionInputs) -> tuple[object, ...]:
    """What the backends' reasons read from tensor values, which the inputs' signature
    leaves out: a Gaussian's form (:func:`.operands.gaussian_form`), whether each
    symmetric ALiBi folds, the lowered plan of a mask at a tensor offset (which band
    it keeps decides, say, whether sdpa would build it densely), and whether a call
    with a gradient or head-mean weights has a far bias row
    (:func:`attnkit._far_rows.far_rows_at_risk`)."""
    mask = inputs.mask
    plan: tuple[object, ...] = ()
    if mask is not None and mask.has_tensor_offsets():
        try:
            plan = inputs.block_plan().signature()
        except MaskTooComplex:
            plan = ("too complex to lower",)
    alibi = alibi_forms(inputs) if inputs.mods else ()
    return (gaussian_form(inputs), alibi, plan, far_rows_at_risk(inputs))


def select_backend(inputs: AttentionInputs, backend: tuple[str, ...] | None = None) -> Backend:
    """The backend that runs this call; raises BackendNotSupportedError when none can.

    Asks the candidates in order and stops at the first that can run (and, in
    automatic dispatch, that no preference rule passes over); the full explanation
    is built only for the error.
    """
    forced = backend if backend is not None else forced_backends()
    key: tuple[object, ...] | None = None
    if not torch.compiler.is_compiling():  # (a traced dict lookup would guard on the dict)
        key = (forced, _host.strict(), _host.in_transform(), inputs.signature(),
               _value_forms(inputs), _GENERATION)  # fmt: skip
        hit = _CHOICES.get(key)
        if hit is not None:
            return hit
    candidates = _candidates(inputs, forced)
    for pos, name in enumerate(candidates):
        be = _REGISTRY.get(name)
        if be is None:  # unregistered by another thread since the candidates were listed
            continue
        if _reasons(be, inputs):
            continue
        if forced is None and _preferred(be, candidates[pos + 1 :], inputs):
            continue
        if key is not None:
            if len(_CHOICES) >= _CHOICES_MAX:
                _CHOICES.clear()
            _CHOICES[key] = be
        return be
    ex = explain_inputs(inputs, backend)
    detail = "; ".join(f"{n}: {', '.join(ex.reasons[n])}" for n in ex.candidates)
    if not ex.candidates:
        detail = f"no backend is registered for device type {inputs.device.type!r}"
    if ex.forced:
        raise BackendNotSupportedError(
            f"backend: the forced backend(s) {list(ex.forced)} cannot run this call ({detail})"
        )
    raise BackendNotSupportedError(f"backend: no backend can run this call ({detail})")


@contextmanager
def use_backend(*names: str | Sequence[str]) -> Iterator[None]:
    """Force the backend(s) tried, in order, inside a ``with`` block, in this thread.

    ``use_backend("reference")`` or ``use_backend("chunked", "reference")``. The
    previous choice is restored on exit, even on error; other threads are not
    affected. A forced backend that cannot run raises with its reasons instead of
    falling back to another. The choice belongs to the thread (a compiled function
    guards on it, and it works inside one): asyncio tasks of one thread whose blocks
    interleave share it, so give such calls ``backend=`` instead.
    """
    flat: list[str] = []
    for n in names:
        if isinstance(n, (list, tuple)):
            flat.extend(n)
        else:
            flat.append(n)  # type: ignore[arg-type]
    chosen = _check_names(flat, "use_backend")
    outer = THREAD.forced
    THREAD.forced = chosen
    try:
        yield
    finally:
        THREAD.forced = outer


_CHUNKED = ChunkedBackend()
register_backend(SDPABackend(tiles=_CHUNKED))  # chunked's tiles: see SDPABackend's tiles
register_backend(_CHUNKED)
register_backend(ReferenceBackend())
register_backend(TritonBackend())  # CUDA (and the CPU under TRITON_INTERPRET=1, for tests)
