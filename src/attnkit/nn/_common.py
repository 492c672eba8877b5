"""Small argument checks shared by the layers of :mod:`attnkit.nn`.

Every check raises before any compute, naming the argument, what was received
and what was expected. :class:`MhaLayer` is what the helper modules of
:class:`~attnkit.nn.MultiheadAttention` read of the layer, so that they need not
import it (the layer's module imports them).
"""

from __future__ import annotations

import contextvars
import numbers
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Literal, Protocol

import torch
from torch import nn

from .. import masks
from .._args import MAX_POSITION
from .._args import as_factory_device as check_factory_device
from .._args import as_factory_dtype as check_factory_dtype
from .._args import shape_text as shape_str
from .._autocast import autocast_mixes
from .._host import readable
from ..functional import attention

__all__ = [
    "InputShapeError",
    "MhaLayer",
    "ParamOwner",
    "attend",
    "attention_override",
    "check_dropout",
    "check_factory_device",
    "check_factory_dtype",
    "check_key_value",
    "check_not_nested",
    "check_param_dtype",
    "check_positive_int",
    "check_tensor",
    "keep_of_zero_one",
    "override_active",
    "shape_str",
]


class InputShapeError(ValueError, AssertionError):
    """An input of the wrong shape or number of dims.

    A ``ValueError`` like every other bad argument in attnkit, and an
    ``AssertionError`` as well, because ``torch.nn.MultiheadAttention`` reports
    these cases with ``assert``: code (and tests) written against torch's layer
    that catch ``AssertionError`` keep working with the drop-in. The message
    names the argument, the shape received and the shape expected.
    """


def check_positive_int(owner: str, name: str, value: object) -> int:
    """``value`` as a Python int when it is an int > 0 (a NumPy int too, as torch's layers
    take it) up to 2**60, else raise naming ``owner`` and ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: {name} must be a positive int, got {value!r}")
    n = operator.index(value)
    if n <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int, got {n}")
    if n > MAX_POSITION:  # (torch's "Overflow when unpacking long long" past int64)
        raise ValueError(f"{owner}: {name} must be a positive int up to 2**60, got {n}")
    return n


def check_dropout(owner: str, value: object) -> float:
    """Return ``value`` as a float if it is a probability in [0, 1), else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # (NumPy's too)
        raise TypeError(f"{owner}: dropout must be a float in [0, 1), got {value!r}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{owner}: dropout must be a float in [0, 1), got {value}")
    return float(value)


def keep_of_zero_one(owner: str, name: str, mask: torch.Tensor, hint: str) -> torch.Tensor:
    """The keep tensor (True = may attend) of a bool or 0/1 ``mask`` (nonzero = attend),
    of ``mask``'s shape. A float mask holding anything but 0 and 1 (-inf, NaN, 0.5: an
    additive bias, or a mistake) is refused where its values can be read without a sync
    (:func:`attnkit._host.readable`); ``hint`` says what to pass instead."""
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise TypeError(f"{owner}: {name} must be bool or 0/1 numbers, got {mask.dtype}")
    if mask.is_floating_point() and readable(mask):
        bad = (mask != 0) & (mask != 1)  # (NaN too)
        if bool(bad.any()):
            raise ValueError(
                f"{owner}: a float {name} must hold 0 (masked) and 1 (attend) only, got "
                f"{float(mask[bad].flatten()[0])}; {hint}"
            )
    return mask != 0


def check_not_nested(owner: str, name: str, value: object, hint: str) -> None:
    """Raise TypeError if ``value`` is a nested tensor; ``hint`` says what to pass instead."""
    if isinstance(value, torch.Tensor) and value.is_nested:
        raise TypeError(
            f"{owner}: {name} is a nested tensor, which this layer does not take; {hint}"
        )


def check_tensor(owner: str, name: str, value: object, layout: str) -> torch.Tensor:
    """Return ``value`` if it is a floating-point tensor, else raise naming the layout."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"{owner}: {name} must be a torch.Tensor of shape {layout}, got {type(value).__name__}"
        )
    if not value.is_floating_point():
        raise TypeError(
            f"{owner}: {name} must be a floating-point tensor of shape {layout}, got dtype "
            f"{value.dtype}"
        )
    return value


def check_key_value(owner: str, key: torch.Tensor, value: torch.Tensor) -> None:
    """Raise unless ``key`` and ``value`` agree on every dim but the last (features)."""
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(
            f"{owner}: key and value must agree on every dim but the last, got key "
            f"{shape_str(key)} and value {shape_str(value)}"
        )


MergeMasksFn = Callable[
    [torch.Tensor | None, torch.Tensor | None, torch.Tensor], tuple[torch.Tensor | None, int | None]
]
"""(attn_mask, key_padding_mask, query (N, L, E)) -> (merged mask, its type), as
``torch.nn.MultiheadAttention.merge_masks``."""

LayerAttendFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, masks.Mask | None, bool, bool, bool],
    tuple[torch.Tensor, torch.Tensor | None],
]
"""(query (N, L, E), key (N, S, kdim), value (N, S, vdim), mask, self_attn, need_weights,
average_attn_weights) -> (output (N, L, E), weights or None): a layer's projections
around :func:`attnkit.attention`."""


class ParamOwner(Protocol):
    """What :func:`check_param_dtype` reads of a layer: its parameters, its submodules
    and their names (every ``torch.nn.Module`` has them)."""

    _parameters: dict[str, nn.Parameter | None]
    _modules: dict[str, nn.Module | None]

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]: ...


class MhaLayer(ParamOwner, Protocol):
    """What the helpers of :class:`~attnkit.nn.MultiheadAttention` (its input checks,
    torch's fused op, the nested path) read of the layer; the layer is one.

    Sizes: ``embed_dim`` E, ``kdim``, ``vdim``, ``num_heads`` H; ``in_proj_bias``
    (3E,) or None, ``bias_k`` (1, 1, E) or None, ``out_proj`` (E -> E); ``merge_masks``
    (:data:`MergeMasksFn`) and ``_attend`` (:data:`LayerAttendFn`).
    """

    training: bool
    embed_dim: int
    kdim: int
    vdim: int
    num_heads: int
    batch_first: bool
    add_zero_attn: bool
    in_proj_bias: nn.Parameter | None
    bias_k: nn.Parameter | None

    @property
    def merge_masks(self) -> MergeMasksFn: ...

    @property
    def _attend(self) -> LayerAttendFn: ...

    @property
    def out_proj(self) -> nn.Linear: ...


def _parameter_tensors(module: ParamOwner) -> list[torch.Tensor]:
    """Every parameter of ``module`` and its submodules (cheaper than ``named_parameters``)."""
    found: list[torch.Tensor] = []
    pending: list[ParamOwner] = [module]
    while pending:
        m = pending.pop()
        found.extend(p for p in m._parameters.values() if p is not None)
        pending.extend(c for c in m._modules.values() if c is not None)
    return found


def check_param_dtype(
    owner: str,
    module: ParamOwner,
    *,
    cast: Sequence[torch.Tensor | None] = (),
    **inputs: torch.Tensor,
) -> None:
    """Raise TypeError unless every parameter and every input share one dtype and device.

    Every parameter is read, not only the first: a layer converted piecewise
    (say a float16 ``in_proj_bias`` in a float64 layer) is named here, before
    any compute, instead of failing inside ``F.linear`` or ``torch.einsum``.
    The parameters in ``cast`` (by identity) may have another floating-point
    dtype, because the layer casts them to the computation's dtype; they must
    still be on the same device. Under ``torch.autocast`` an input may have another
    dtype autocast casts (a bfloat16 activation beside float32 parameters), as
    torch's layers take it.
    """
    params = _parameter_tensors(module)
    if not params:
        return
    loose = {id(t) for t in cast if t is not None}
    ref = next((p for p in params if id(p) not in loose), params[0]) if loose else params[0]
    dtype, device = ref.dtype, ref.device
    if any(p.dtype != dtype or p.device != device for p in params):  # rare: find which

        def bad(p: torch.Tensor) -> bool:
            if p.device != device:
                return True
            return p.dtype != dtype and not (id(p) in loose and p.dtype.is_floating_point)

        named = list(module.named_parameters())
        first_name = next(name for name, p in named if p is ref)
        for name, param in named:
            if bad(param):
                raise TypeError(
                    f"{owner}: parameter {name} is {param.dtype} on {param.device}, but "
                    f"parameter {first_name} is {dtype} on {device}; every parameter "
                    f"of the layer must share one dtype and device (layer.to(dtype=..., device=...))"
                )
    for name, t in inputs.items():
        if t.device != device or (t.dtype != dtype and not autocast_mixes(device, t.dtype, dtype)):
            raise TypeError(
                f"{owner}: {name} is {t.dtype} on {t.device}, but the layer's parameters are "
                f"{dtype} on {device}; convert the input or the layer "
                f"(layer.to(dtype=..., device=...))"
            )


AttendFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
"""(q, k, v, *, mask, dropout_p, need_weights, scale) -> (output, weights or None)."""

_OVERRIDE: contextvars.ContextVar[AttendFn | None] = contextvars.ContextVar(
    "attnkit_nn_attention_override", default=None
)


@contextmanager
def attention_override(fn: AttendFn) -> Iterator[None]:
    """Inside the block (this thread or task), the multi-head layers' attention calls go
    to ``fn``: those of :class:`~attnkit.nn.MultiheadAttention`,
    :class:`~attnkit.nn.EinsumMultiHeadAttention` (and the Keras-style
    :class:`~attnkit.nn.MultiHeadAttention`) and :class:`~attnkit.nn.SelfAttention`. The
    d2l-style layers and :class:`~attnkit.nn.NadarayaWatson`, which have one head and
    no projections around the attention, call :func:`attnkit.attention` directly.

    ``fn(q, k, v, *, mask, dropout_p, need_weights, scale)`` takes the heads, q
    (..., H, L, E), k (..., Hkv, S, E) and v (..., Hkv, S, Ev) with H a multiple of Hkv,
    an :mod:`attnkit.masks` mask or None, the dropout probability, ``need_weights``
    (False, True or ``"mean"``) and the scale (None: 1/sqrt(E)), and returns
    ``(output (..., H, L, Ev), weights or None)``: weights (..., H, L, S) for True,
    averaged over the heads to (..., L, S) for ``"mean"``. This is how a wrapper changes
    how a layer attends without touching the layer (for example
    :class:`attnkit.distributed.ContextParallel`, which runs it across ranks). Not seen
    by code being traced by torch.compile.
    """
    token = _OVERRIDE.set(fn)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def override_active() -> bool:
    """True inside :func:`attention_override` (outside code being traced)."""
    return _OVERRIDE.get() is not None


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: masks.Mask | None,
    dropout_p: float,
    need_weights: bool | Literal["mean"],
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`attnkit.attention` of (..., H, L, E), (..., Hkv, S, E), (..., Hkv, S, Ev) heads.

    ``H`` may be a multiple of ``Hkv`` (grouped-query attention). Returns
    ``(output (..., H, L, Ev), weights or None)``: weights (..., H, L, S) when
    ``need_weights`` is True, averaged over the heads to (..., L, S) when it
    is ``"mean"``, None when it is False.
    """
    override = None if torch.compiler.is_compiling() else _OVERRIDE.get()
    if override is not None:
        return override(
            q, k, v, mask=mask, dropout_p=dropout_p, need_weights=need_weights, scale=scale
        )
    if need_weights is False:
        return attention(q, k, v, mask=mask, scale=scale, dropout_p=dropout_p), None
    out, weights = attention(
        q, k, v, mask=mask, scale=scale, dropout_p=dropout_p, return_weights=need_weights
    )
    return out, weights
