"""What the installed torch offers: one record, read at import, and each feature's floor.

attnkit installs on every torch from :data:`PACKAGE_FLOOR` on (transformers' own floor).
A few features need a newer torch; each declares its floor here and only here:

- ``compile``: ``torch.compile`` of :func:`attnkit.attention` and of the layers (and so
  of transformers models on ``attn_implementation="attnkit"``). Older dynamo cannot
  trace attnkit's call path without graph breaks (on torch 2.6: ``bool()`` of a list,
  ``next()`` with a default over a generator in the layers' checks, ``&`` of two masks;
  on 2.8: ``all()`` over a generator in mask validation).
- ``triton``: the triton backend. The Triton releases older torch pins (3.0 to 3.4
  with torch 2.4 to 2.8) cannot run its kernels (loop bounds read from the mask).

Below its floor a feature refuses with one line naming the feature, the floor and the
installed version (:func:`missing`, :func:`require`); the tests skip through the same
record. Everything else (eager ``attention()`` on every CPU backend, the layers, masks
and modifiers, the transformers integration, the viewer, context parallelism) runs
from the package floor on.

>>> from attnkit import _torch_features as tf
>>> tf.missing("compile") is None or tf.missing("compile").startswith("torch.compile")
True
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

__all__ = [
    "FEATURES",
    "GLOO_RELEASES_GIL_FLOOR",
    "INSTALLED",
    "PACKAGE_FLOOR",
    "SDPA_GROUPED_HEADS_FLOOR",
    "TRACED_ONE_OP_FLOOR",
    "Feature",
    "FeatureUnavailableError",
    "TorchRecord",
    "available",
    "check_compiling",
    "constant_under_compile",
    "missing",
    "require",
]

PACKAGE_FLOOR: tuple[int, int] = (2, 6)
"""The oldest torch attnkit installs on (pyproject's ``torch>=2.6``)."""


@dataclass(frozen=True)
class TorchRecord:
    """The installed torch: its version string and its (major, minor) release."""

    version: str
    """``torch.__version__`` without the local build tag (``2.6.0``, not ``2.6.0+cu124``)."""
    release: tuple[int, int]
    """(major, minor), e.g. (2, 6)."""


def _record(version: str) -> TorchRecord:
    """Parse a torch version string ("2.6.0+cu124", "2.13.0.dev20260101") into a record."""
    public = version.split("+", 1)[0]
    found = re.match(r"(\d+)\.(\d+)", public)
    release = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    return TorchRecord(version=public, release=release)


INSTALLED: TorchRecord = _record(str(torch.__version__))
"""The installed torch, read once at import."""


@dataclass(frozen=True)
class Feature:
    """A feature that needs a newer torch than the package floor.

    Attributes:
        name: what a user calls it, as the refusal names it.
        floor: the oldest (major, minor) torch it runs on.
        why: what breaks below the floor (for the documentation and ``explain``).
    """

    name: str
    floor: tuple[int, int]
    why: str


FEATURES: dict[str, Feature] = {
    "compile": Feature(
        name="torch.compile or torch.export of attnkit.attention()",
        floor=(2, 12),
        why="older dynamo cannot trace attention() without graph breaks (export traces "
        "with dynamo too)",
    ),
    "triton": Feature(
        name="the triton backend",
        floor=(2, 12),
        why="the Triton releases older torch pins cannot run its kernels",
    ),
}
"""Every version-gated feature by key, with its floor: the one list of them."""

SDPA_GROUPED_HEADS_FLOOR: tuple[int, int] = (2, 12)
"""The oldest torch whose SDPA runs grouped-query heads (``enable_gqa=True``) on the same
fused CPU kernel as heads expanded by hand. On torch 2.6 the CPU call with
``enable_gqa`` runs plain math instead, slower and different in the last bits from the
fused kernel that the lse op (used when weights or the lse are asked for) runs, so asking
for the weights would change the output. Below this floor the sdpa backend expands the
key and value heads itself (measured equal on 2.12 and later). Not a refusal: a choice of
path, declared here beside the features' floors."""


TRACED_ONE_OP_FLOOR: tuple[int, int] = (2, 13)
"""The oldest torch on which a plain ``attention()`` call under ``torch.compile`` is traced
as one op chosen at trace time (:func:`attnkit._plans.traced_call`): from 2.13 on,
``torch.compiler.is_compiling()`` stays True while dynamo runs a function whose result
it keeps as a constant, so that function validates and dispatches as a traced call
would (2.12.1 says False there). Below it the call is traced in full, with the same
numbers and more guards. Not a refusal: a choice of path, declared here beside the
features' floors."""


GLOO_RELEASES_GIL_FLOOR: tuple[int, int] = (2, 8)
"""The oldest torch whose gloo process group lets go of the GIL while its destructor
waits for the group's worker threads. Below it (measured on torch 2.6.0 and 2.7.1; 2.8.0
does not), ``destroy_process_group()`` can hang for ever: the destructor holds the GIL
and joins a worker thread that is dropping the last reference to a collective's tensor
whose Python object has already gone, and that drop waits for the GIL. Below this floor
attnkit's collectives on gloo keep their tensors until gloo has let go of them
(:func:`attnkit.distributed.comm.handed`). Not a refusal: a choice of path, declared here
beside the features' floors."""


class FeatureUnavailableError(RuntimeError):
    """A feature was used on a torch older than its floor; the message says which."""


def _floor_text(floor: tuple[int, int]) -> str:
    return f"{floor[0]}.{floor[1]}"


def missing(key: str, installed: TorchRecord = INSTALLED) -> str | None:
    """Why feature ``key`` cannot run on the installed torch, as one line, or None when
    it can: ``"the triton backend needs torch >= 2.12 (installed 2.6.0)"``.

    Raises:
        KeyError: ``key`` is not in :data:`FEATURES`.
    """
    feature = FEATURES[key]
    if installed.release >= feature.floor:
        return None
    return f"{feature.name} needs torch >= {_floor_text(feature.floor)} (installed {installed.version})"


def available(key: str) -> bool:
    """True when feature ``key`` runs on the installed torch."""
    return missing(key) is None


def require(key: str) -> None:
    """Raise :class:`FeatureUnavailableError` with :func:`missing`'s line when feature
    ``key`` cannot run on the installed torch; return None otherwise."""
    why = missing(key)
    if why is not None:
        raise FeatureUnavailableError(why)


_COMPILES = available("compile")


def _refuse_compiling() -> None:
    """Under ``torch.compile`` (on a torch below the compile floor), raise
    :class:`FeatureUnavailableError`; otherwise return."""
    if torch.compiler.is_compiling():
        require("compile")


def _compiles() -> None:
    """Return: this torch is at or above the compile floor."""


check_compiling: Callable[[], None] = _compiles if _COMPILES else _refuse_compiling
"""Under ``torch.compile`` on a torch below the compile floor, raise
:class:`FeatureUnavailableError` (dynamo reports it with the line); otherwise return.

Called by :func:`attnkit.attention` before any tensor work (a traced plain call, which
only a torch above the floor makes, skips it), by every layer's ``forward`` and by the
transformers integration's mask function, so a compiled model refuses at the first
attnkit call it traces. Chosen once, at import: on a torch at or above the floor it is
a function that does nothing, so a compiled call guards on nothing of this module."""


_F = TypeVar("_F", bound=Callable[..., Any])


def constant_under_compile(fn: _F) -> _F:
    """Mark ``fn`` as :func:`torch.compiler.assume_constant_result` does: dynamo, tracing
    a call of it, runs it as it stands and keeps its result as a constant of the graph.

    That decorator imports ``torch._dynamo`` (a second or more at import, and once a
    process group exists it keeps the group alive past ``destroy_process_group``; see
    :mod:`attnkit.kernels._ops`), so attnkit sets the mark it sets, an attribute that
    every torch from the package floor to the newest tested reads the same way
    (``tests/unit/test_torch_features.py`` compares it with the decorator's). Returns
    ``fn`` itself."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn
