"""Plans of plain calls: what validation and dispatch decided, reused by the next call.

Inside a model the same call repeats with new tensors of the same shapes. For a
*plain* call (output only, a named score, no mask or a tensor-free causal/window
mask, ``backend`` None or a name) everything :func:`attnkit._inputs.validate_inputs`
checks and everything dispatch decides depends only on what :func:`plan_key` puts
in the key: shapes, dtypes, devices, grad flags, the score's name, the mask's
parameters, scale, dropout_p, the backend argument, the ``use_backend`` choice of
this thread and :func:`attnkit._host.strict`. So the first such call is validated
and dispatched in full, and later ones skip both: :func:`lookup` returns the plan,
whose ``runner`` (a backend's shortcut, :meth:`Backend.plain_runner`) takes the
tensors, or else :meth:`CallPlan.inputs` builds the call record for the backend's
``forward``.

Anything else (tensor masks, score objects with parameters, the Gaussian score, whose
dot form or differences are chosen from the inputs' values, weights or lse, a
recording in progress, code being traced by torch.compile) takes the full path
every time. The cache is cleared when a backend is registered.

Traced calls: :func:`traced_call`. Inside ``torch.compile`` a plain call's arguments
give the same key, built in the trace, and the choice is made from the key alone at
trace time, outside the trace (:func:`_traced_route`): dynamo then guards on the key's
parts (which the tensors' own guards mostly hold already) and not on every registry,
dict and function that validation and dispatch read on the way, about 500 guard lines
that the compiled call checked on every call (5 µs of a compiled call of 30 µs at
(1, 8, 16, 64) on one thread).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import masks as _masks
from ._host import in_transform, strict
from ._inputs import SCALE_READ_ABOVE, AttentionInputs, validate_inputs
from ._per_thread import THREAD as _CALL_SETTINGS
from ._torch_features import INSTALLED, TRACED_ONE_OP_FLOOR, constant_under_compile
from .backends import dispatch
from .backends.base import Backend, PlainRunner, TracedCall
from .backends.dispatch import forced_backends
from .masks import Mask

__all__ = ["CallPlan", "lookup", "plan_key", "remember", "traced_call"]

_PLANS: dict[tuple[object, ...], CallPlan] = {}
_PLANS_MAX = 256


_PLANNED = (
    "score",
    "scale",
    "dropout_p",
    "batch_shape",
    "L",
    "S",
    "E",
    "Ev",
    "groups",
    "check_finite",
)
"""The fields of :class:`AttentionInputs` a plan fixes (besides the flags, all off)."""


@dataclass(frozen=True, slots=True)
class CallPlan:
    """The validated, dispatched parts of a plain call (no tensors are held): the
    :data:`_PLANNED` fields of its record, the backend and the backend's shortcut."""

    fields: dict[str, Any]
    backend: Backend
    runner: PlainRunner | None

    def inputs(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: _masks.Mask | None,
    ) -> AttentionInputs:
        """The call record for new tensors of the planned shapes."""
        return AttentionInputs(
            query=query,
            key=key,
            value=value,
            mask=mask,
            return_weights=False,
            return_lse=False,
            weights_mean=False,
            **self.fields,
        )


def plan_key(
    query: object,
    key: object,
    value: object,
    score: object,
    mask: object,
    scale: object,
    dropout_p: object,
    backend: object,
    check_finite: object = True,
) -> tuple[object, ...] | None:
    """The plan key of a plain call's arguments, or None when the call is not plain.

    ``return_weights``/``return_lse`` are checked by the caller (both must be False).
    Traced calls have no plan (no dict guards): see :func:`traced_call`.
    """
    if (
        torch.compiler.is_compiling()
        or in_transform()  # (torch.func's wrapped tensors: the full path, on reference)
        or not _plain(score, scale, dropout_p, backend, check_finite)
        or not (mask is None or isinstance(mask, _masks.Mask))
        or not (
            type(query) is torch.Tensor
            and type(key) is torch.Tensor
            and type(value) is torch.Tensor
        )
        # dense strided only: a sparse or MKL-DNN tensor has the shape of a dense one;
        # it takes the full path, whose validation refuses it (a nested tensor of the
        # strided layout has no shape: reading it raises, below)
        or query.layout is not torch.strided
        or key.layout is not torch.strided
        or value.layout is not torch.strided
    ):
        return None
    mask_key: tuple[object, ...] | None = None
    if mask is not None:
        mask_key = mask.static_key()  # a Mask, checked above
        if mask_key is None:
            return None  # the mask holds data, read by each call
    try:
        shapes = (query.shape, key.shape, value.shape)
    except RuntimeError:  # a nested tensor (strided layout): the full path names it
        return None
    return (
        *shapes,
        query.dtype,
        key.dtype,
        value.dtype,
        query.device,
        key.device,
        value.device,
        torch.is_grad_enabled(),
        query.requires_grad,
        key.requires_grad,
        value.requires_grad,
        score,
        mask_key,
        scale,
        dropout_p,
        backend,
        forced_backends(),
        strict(),
        check_finite,
        _GENERATION,  # a plan made while the registry changed: never read
    )


def _plain(
    score: object, scale: object, dropout_p: object, backend: object, check_finite: object
) -> bool:
    """Whether these arguments of a call leave it plain (see the module docstring)."""
    return not (
        type(score) is not str
        or score == "gaussian"  # its form is chosen from the inputs' values (operands.py)
        or not (scale is None or type(scale) is float)  # (1 and True would share a key)
        or (scale is not None and scale > SCALE_READ_ABOVE)  # checked against each call's values
        or type(dropout_p) is not float
        or not (backend is None or type(backend) is str)
        or type(check_finite) is not bool
    )


def lookup(key: tuple[object, ...]) -> CallPlan | None:
    """The plan stored under ``key``, or None."""
    return _PLANS.get(key)


def remember(key: tuple[object, ...], inputs: AttentionInputs, backend: Backend) -> None:
    """Store the plan of a call that was just validated and dispatched in full."""
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = CallPlan(
        fields={name: getattr(inputs, name) for name in _PLANNED},
        backend=backend,
        runner=backend.plain_runner(inputs),
    )


_GENERATION = 0
"""How many times the backend registry changed: part of a plan's key (a plan made while
another thread changed the registry is stored where no later call looks) and of a traced
call's (a compiled graph whose op was chosen from another registry is traced again). A
global of this module: a compiled call guards on it alone."""


def _next_generation() -> None:
    global _GENERATION
    _GENERATION += 1


dispatch.on_registry_change(_PLANS.clear)
dispatch.on_registry_change(_next_generation)


def _traced_call(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    score: object,
    mask: object,
    scale: object,
    dropout_p: object,
    backend: object,
    check_finite: object,
) -> torch.Tensor | None:
    """A call of :func:`attnkit.attention` (output only, no mods) inside
    ``torch.compile``, as the one op its backend traces to
    (:meth:`Backend.traced_call`): out (..., L, Ev); None where the call takes the full
    path (not plain, dynamic shapes, no single op, or a torch older than
    :data:`attnkit._torch_features.TRACED_ONE_OP_FLOOR`).

    The call's key is gathered in the trace, as little as it can be: the tensors' types,
    layouts, shapes, dtypes, devices and grad flags (which the tensors' own guards hold
    already), the other arguments (constants of the caller's code, or one guard each),
    the mask's static key, the ``use_backend`` choice, :func:`attnkit._host.strict` (both
    read as fields of the one per-thread record, :mod:`attnkit._per_thread`: a function
    called, or a second record, costs guards more) and the registry's generation. The op
    is chosen from the key by :func:`_traced_route`, at trace time and outside the trace:
    what it reads gets no guard.
    """
    mask_key = None
    if mask is not None:
        if not isinstance(mask, Mask):
            return None  # a tensor: the full path
        mask_key = mask.static_key()
        if mask_key is None:
            return None  # the mask holds data: the full path
        for field in mask_key:
            # A mask made in the compiled code from an int argument holds a symbol
            # there, once dynamo has seen two values of it (see below).
            if isinstance(field, int) and max(field, field) is not field:
                return None
    # Only a score named by a string, a float scale (or None) and a float dropout_p are
    # plain (a score object, or a (H,) tensor of scales, is no constant of the route; the
    # full path checks the rest). A constant float is its own max(); a dynamic one (an
    # argument that took two values) is a symbol, whose max() is a new symbol (neither
    # type() nor isinstance() tells a symbol from a number while traced). Those take the
    # full path too, which traces them as they are.
    if not isinstance(score, str):
        return None
    if not (scale is None or isinstance(scale, float)) or not isinstance(dropout_p, float):
        return None
    if scale is not None and max(scale, scale) is not scale:
        return None
    if max(dropout_p, dropout_p) is not dropout_p:
        return None
    shapes = (query.shape, key.shape, value.shape)
    for shape in shapes:
        for size in shape:
            if max(size, 0) is not size:  # a dynamic size, as above
                return None
    route = _traced_route(
        (query.__class__, key.__class__, value.__class__),
        (query.layout, key.layout, value.layout),
        shapes,
        (query.dtype, key.dtype, value.dtype),
        (query.device, key.device, value.device),
        (query.requires_grad, key.requires_grad, value.requires_grad),
        (score, mask_key, scale, dropout_p, backend, check_finite),
        (_CALL_SETTINGS.forced, _CALL_SETTINGS.strict, _GENERATION),
    )
    if route is None:
        return None
    return _run_route(query, key, value, route)


def _full_path_only(*_: object) -> None:
    """None, for :func:`_traced_call`'s arguments: below
    :data:`attnkit._torch_features.TRACED_ONE_OP_FLOOR`, every traced call takes the full
    path."""
    return None


traced_call: Callable[..., torch.Tensor | None] = (
    _traced_call if INSTALLED.release >= TRACED_ONE_OP_FLOOR else _full_path_only
)
"""A call of :func:`attnkit.attention` (output only, no mods) inside ``torch.compile``,
as the one op its backend traces to, or None for the full path (see
:func:`_traced_call`). Chosen once, at import, for this torch: a flag read in the trace
would cost every compiled call a guard."""


def _run_route(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, route: TracedCall
) -> torch.Tensor:
    """Run the op ``route`` names (namespace, name, args, keyword items) on q, k and v.

    Marked for dynamo as :func:`torch.compiler.allow_in_graph` (by :func:`_traced_route`,
    which runs first): dynamo puts this call into the graph as it is, with the route as
    a constant, and the op is found when the graph is traced further. Found by dynamo
    itself, each attribute of ``torch.ops.<namespace>.<name>`` would cost the compiled
    call a guard."""
    namespace, name, args, keywords = route
    op = getattr(getattr(torch.ops, namespace), name).default
    return op(query, key, value, *args, **dict(keywords))


@constant_under_compile
def _traced_route(
    types: tuple[type, ...],
    layouts: tuple[torch.layout, ...],
    shapes: tuple[torch.Size, ...],
    dtypes: tuple[torch.dtype, ...],
    devices: tuple[torch.device, ...],
    grads: tuple[bool, ...],
    arguments: tuple[object, ...],
    state: tuple[object, ...],
) -> TracedCall | None:
    """The op of a traced call, chosen from its key at trace time: dynamo runs this
    function as it stands and keeps its answer as a constant of the graph, with no guard
    on what it read. So it reads nothing the key does not fix: it checks that the call is
    plain (as :func:`plan_key`), validates and dispatches empty CPU tensors of the key's
    shapes, dtypes and grad flags (grad mode has dynamo's own guard) with the mask the
    key names, and asks the chosen backend (:meth:`Backend.traced_call`). Anything else,
    an error included, is None: the full path then traces the call (and raises the error
    there). ``state`` (the ``use_backend`` choice, :func:`attnkit._host.strict`, the
    registry's generation) is in the key to be guarded; dispatch reads it itself. Before
    it answers a route, it marks :func:`_run_route` for dynamo, which then traces it."""
    del state
    score, mask_key, scale, dropout_p, backend, check_finite = arguments
    if (
        not torch.compiler.is_compiling()  # (a torch that does not say so here: full path)
        or any(t is not torch.Tensor for t in types)
        or any(layout is not torch.strided for layout in layouts)
        or any(d.type != "cpu" for d in devices)
        or not _plain(score, scale, dropout_p, backend, check_finite)
        or not (mask_key is None or type(mask_key) is tuple)
    ):
        return None
    try:
        q, k, v = (
            torch.empty(shape, dtype=dtype, requires_grad=grad)
            for shape, dtype, grad in zip(shapes, dtypes, grads, strict=True)
        )
        mask = None
        if mask_key is not None:
            mask = mask_key[0].from_static_key(mask_key)
        inputs = validate_inputs(q, k, v, score=score, mask=mask, scale=scale,
                                 dropout_p=dropout_p, return_weights=False, return_lse=False,
                                 mods=None, check_finite=check_finite)  # fmt: skip
        if inputs.L == 0 or inputs.S == 0 or 0 in inputs.batch_shape:
            return None
        chosen = dispatch.select_backend(
            inputs,
            dispatch.normalize_backend_arg(backend),  # type: ignore[arg-type]
        )
        route = chosen.traced_call(inputs)
    except Exception:  # the full path raises it, from the trace
        return None
    if route is not None and not _RUN_ROUTE_IN_GRAPH:
        # (dynamo is loaded by now; marked here, the import of attnkit does not load it)
        torch.compiler.allow_in_graph(_run_route)
        _RUN_ROUTE_IN_GRAPH.append(True)
    return route


_RUN_ROUTE_IN_GRAPH: list[bool] = []
"""Holds one entry once :func:`_run_route` is marked for dynamo (once per process)."""
