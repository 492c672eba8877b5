"""One checker for the arguments of the constructors (masks, modifiers, scores, layers).

Every constructor of :mod:`attnkit.masks` and :mod:`attnkit.mods` takes its plain
arguments through these functions, so one class of mistake gets one answer
everywhere, at construction, naming the constructor and the argument:

- an int where an int is meant: not a bool, a float or a string (a NumPy integer is
  an int); positions, offsets, lengths and window sizes within ±:data:`MAX_POSITION`,
  so sums of a few of them stay inside int64;
- a bool where a bool is meant (not ``1`` or ``"yes"``);
- a real number where one is meant (not a bool or a string), finite and positive
  where that is required;
- integer tensors (or lists of ints): an integer dtype (not bool or float), values
  that fit in int64, the expected number of dims;
- float tensors (or lists of floats): a floating dtype, the expected number of dims,
  not empty, finite where that is required (read only where reading is free: CPU
  tensors outside ``torch.compile``);
- the ``device`` and ``dtype`` of a module's parameters: a device this torch has, a
  floating-point dtype.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence

import torch

from ._host import readable

__all__ = [
    "MAX_POSITION",
    "as_bool",
    "as_factory_device",
    "as_factory_dtype",
    "as_float_tensor",
    "as_int",
    "as_int_tensor",
    "as_real",
    "shape_text",
]

MAX_POSITION = 2**60
"""The largest magnitude of a position, offset, length or window size given as an int
(a few of them added together stay inside int64, the dtype positions are computed in)."""


def shape_text(shape: Sequence[int] | torch.Tensor) -> str:
    """``(2, 3, 4)`` for a shape or a tensor: the one spelling of shapes in attnkit's
    errors. (An f-string, not ``str()``: dynamo formats a dynamic size that way only, so
    an error raised while compiling with dynamic shapes keeps its message.)"""
    dims = shape.shape if isinstance(shape, torch.Tensor) else shape
    return "(" + ", ".join(f"{int(d)}" for d in dims) + ")"


def as_int(
    where: str,
    name: str,
    val: object,
    *,
    low: int = -MAX_POSITION,
    high: int = MAX_POSITION,
    what: str = "an int",
) -> int:
    """``val`` as a Python int in [low, high], or a TypeError / ValueError naming it."""
    if isinstance(val, bool) or not isinstance(val, numbers.Integral):
        raise TypeError(f"{where}: {name} must be {what}, got {val!r}")
    n = operator.index(val)
    if not low <= n <= high:
        raise ValueError(
            f"{where}: {name} must be {what}; got {n}, expected a value in "
            f"[{_num(low)}, {_num(high)}]"
        )
    return n


def _num(n: int) -> str:
    """``n`` for a message: a large power of two as ``2**k``."""
    m = abs(n)
    if m >= 2**20 and m & (m - 1) == 0:
        return f"{'-' if n < 0 else ''}2**{m.bit_length() - 1}"
    return str(n)


def as_bool(where: str, name: str, val: object) -> bool:
    """``val`` when it is True or False, else a TypeError naming it."""
    if not isinstance(val, bool):
        raise TypeError(f"{where}: {name} must be True or False, got {val!r}")
    return val


def as_real(
    where: str, name: str, val: object, *, positive: bool = False, allow_inf: bool = False
) -> float:
    """``val`` as a float: a real number, not a bool or a string; finite (or +inf when
    ``allow_inf``) and > 0 when ``positive``."""
    what = "a positive float" if positive else "a float"
    if isinstance(val, bool) or not isinstance(val, numbers.Real):
        raise TypeError(f"{where}: {name} must be {what}, got {val!r}")
    try:
        x = float(val)
    except OverflowError as exc:
        raise ValueError(
            f"{where}: {name} must be {what} in the float64 range, got {val!r}"
        ) from exc
    if math.isnan(x) or (math.isinf(x) and not (allow_inf and x > 0)):
        raise ValueError(f"{where}: {name} must be a finite {what[2:]}, got {val!r}")
    if positive and not x > 0:
        raise ValueError(f"{where}: {name} must be {what}, got {val!r}")
    return x


def _tensor_of(where: str, name: str, val: object, what: str) -> torch.Tensor:
    """``val`` as a tensor (a tensor as it is; a list, tuple or NumPy array converted),
    or a TypeError / ValueError naming it."""
    if isinstance(val, torch.Tensor):
        return val
    if isinstance(val, (str, bytes)):
        raise TypeError(f"{where}: {name} must be {what}, got {type(val).__name__}")
    try:
        t = torch.as_tensor(val)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "overflow" in detail.lower():
            raise ValueError(
                f"{where}: {name} must hold values that fit in int64, got {val!r:.80}"
            ) from exc
        raise TypeError(f"{where}: {name} must be {what}, got {val!r:.80} ({detail})") from exc
    if t.numel() == 0 and t.is_floating_point() and not isinstance(val, torch.Tensor):
        t = t.to(torch.long)  # [] holds no float: an empty list of ints
    return t


def as_int_tensor(
    where: str, name: str, val: object, *, ndims: tuple[int, ...], layout: str
) -> torch.Tensor:
    """``val`` as an int64 tensor with one of ``ndims`` dims (``layout`` names them), or
    an error naming it: not bool, float or complex; a list converts (its values must
    fit in int64)."""
    what = f"an integer tensor or a list of ints of shape {layout}"
    t = _tensor_of(where, name, val, what)
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"{where}: {name} must have an integer dtype, got {t.dtype}")
    if t.ndim not in ndims:
        raise ValueError(f"{where}: {name} must have shape {layout}, got {shape_text(t.shape)}")
    return t.to(torch.long)


def as_float_tensor(
    where: str,
    name: str,
    val: object,
    *,
    ndim: int,
    layout: str,
    finite: bool = True,
    convert: bool = True,
) -> torch.Tensor:
    """``val`` as a float tensor of ``ndim`` dims (``layout`` names them), not empty,
    and with finite values where they can be read for free (``finite``). A list
    converts (to float32) when ``convert``; a tensor keeps its dtype (and identity: a
    parameter stays a parameter)."""
    what = f"a float tensor of shape {layout}"
    if not convert and not isinstance(val, torch.Tensor):
        raise TypeError(f"{where}: {name} must be {what}, got {type(val).__name__}")
    t = _tensor_of(where, name, val, what)
    if not isinstance(val, torch.Tensor) and not t.is_floating_point() and t.dtype != torch.bool:
        t = t.to(torch.float32)  # a list of ints: [1, 2] means slopes 1.0 and 2.0
    if not t.is_floating_point():
        raise TypeError(f"{where}: {name} must have a floating dtype, got {t.dtype}")
    if t.ndim != ndim:
        raise ValueError(f"{where}: {name} must have shape {layout}, got {shape_text(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{where}: {name} must not be empty, got shape {shape_text(t.shape)}")
    if finite and readable(t) and not bool(torch.isfinite(t.detach()).all()):
        raise ValueError(f"{where}: {name} must hold finite values, got {t.detach().flatten()[:4]}")
    return t


def as_factory_dtype(owner: str, dtype: object) -> torch.dtype | None:
    """``dtype`` if it is None or a floating-point ``torch.dtype``, else a TypeError
    naming ``owner``: at construction, not inside a weight initializer."""
    if dtype is None:
        return None
    if not isinstance(dtype, torch.dtype):
        raise TypeError(
            f"{owner}: dtype must be a floating-point torch.dtype or None, got "
            f"{type(dtype).__name__} {dtype!r}"
        )
    if not dtype.is_floating_point:
        raise TypeError(
            f"{owner}: dtype must be a floating-point torch.dtype (float16, bfloat16, float32, "
            f"float64) or None, got {dtype}"
        )
    return dtype


def as_factory_device(owner: str, device: object) -> torch.device | None:
    """``device`` as a ``torch.device`` (None stays None) if this torch has it, else a
    ValueError naming ``owner``: a misspelt name (``"gpu"``), or a device type this
    build or machine lacks (``"cuda"`` on a CPU-only torch)."""
    if device is None:
        return None
    try:
        dev = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"{owner}: device must be a torch.device or a name such as 'cpu' or 'cuda:0', "
            f"got {device!r}"
        ) from None
    if dev.type not in ("cpu", "meta"):
        try:
            torch.empty(0, device=dev)
        except (AssertionError, RuntimeError) as exc:
            raise ValueError(f"{owner}: device {dev} is not available here ({exc})") from None
    return dev
