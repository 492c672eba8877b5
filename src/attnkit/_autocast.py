"""Attention under ``torch.autocast``: the call as for inputs of autocast's dtype.

torch puts ``scaled_dot_product_attention`` on autocast's lower-precision list: its
float32, float16 and bfloat16 inputs are cast to autocast's dtype and it runs there.
:func:`attnkit.attention` does the same (:func:`autocast_dtype`, :func:`cast`), then runs with
autocast off for that device, so every backend computes as it does for inputs given
in that dtype (the case the oracle tests check): the output, weights and lse have the
dtypes they have then, whichever backend runs, eager or compiled, with gradients or
without, and a backward called after the autocast block (torch's recommended loop)
replays the same computation.

- query, key and value that autocast would cast (float32, float16, bfloat16; float64
  is left alone, as autocast leaves it) are cast differentiably: their gradients come
  back in their own dtypes;
- a learned score's parameters are used in that dtype too, as autocast's matmuls would
  use them (:meth:`attnkit.scores.Score.cast`: a copy for the call whose parameters
  are cast views of the score's own): the gradients reach the score's parameters in
  their dtype, and the score itself is not changed;
- a float bias mask, a per-head scale and the mods keep their dtypes, as in a call
  without autocast (the backends take a bias in another float dtype).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .scores import Score

any_autocast: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
"""Whether autocast may be on for some device: one C call (always True on a torch
without it, where :func:`autocast_dtype` asks the device)."""

_CASTABLE = (torch.float32, torch.float16, torch.bfloat16)
"""The dtypes autocast casts to its lower precision (float64 it leaves alone)."""

ScoreT = TypeVar("ScoreT")


def autocast_dtype(query: object) -> torch.dtype | None:
    """Autocast's dtype on ``query``'s device when autocast is on there, else None
    (also for anything but a tensor, and a device type autocast has no mode for, such
    as ``meta``). When autocast is off everywhere: one C call."""
    if not any_autocast() or not isinstance(query, torch.Tensor):
        return None
    device_type = query.device.type
    return torch.get_autocast_dtype(device_type) if autocast_on(device_type) else None


def autocast_mixes(device: torch.device, *dtypes: torch.dtype) -> bool:
    """True when autocast is on for ``device`` and every one of ``dtypes`` is one it
    casts: a layer's float32 parameters beside a bfloat16 activation from an earlier
    autocast op are then one computation, as in torch's layers."""
    return all(d in _CASTABLE for d in dtypes) and autocast_on(device.type)


def autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (False for one it has no mode for)."""
    return (
        any_autocast()
        and torch.amp.is_autocast_available(device_type)
        and torch.is_autocast_enabled(device_type)
    )


def cast(t: object, dtype: torch.dtype) -> object:
    """``t`` in ``dtype`` (differentiably) when it is a tensor autocast would cast;
    anything else as it is, for validation to judge."""
    if isinstance(t, torch.Tensor) and t.dtype in _CASTABLE and t.dtype != dtype:
        return t.to(dtype)
    return t


def cast_score(score: ScoreT, dtype: torch.dtype) -> ScoreT:
    """``score`` for one call under autocast: a score name as it is; a score object
    with its parameters in ``dtype`` (:meth:`attnkit.scores.Score.cast`: a shallow copy
    whose parameters are cast views of the score's own, gradients flowing back)."""
    if isinstance(score, Score):
        return score.cast(dtype)  # type: ignore[return-value]
    return score


def operands(
    dtype: torch.dtype, query: object, key: object, value: object, score: ScoreT
) -> tuple[Any, Any, Any, ScoreT]:
    """A call's query, key, value and score as autocast gives them to the call in
    ``dtype`` (:func:`cast` each tensor, :func:`cast_score` the score)."""
    return cast(query, dtype), cast(key, dtype), cast(value, dtype), cast_score(score, dtype)


BackwardT = TypeVar("BackwardT", bound=Callable[..., Any])


def backward_without_autocast(backward: BackwardT) -> BackwardT:
    """A custom autograd Function's ``backward`` run with autocast off on its gradients'
    device. Its forward ran with autocast off (:func:`attnkit.attention` under autocast
    runs so), and a backward called inside the autocast block would otherwise compute its
    float32 sums in autocast's dtype (a tenth of the accuracy in bfloat16)."""

    @functools.wraps(backward)
    def run(ctx: Any, *grads: Any) -> Any:
        if any_autocast():
            t = next((g for g in grads if isinstance(g, torch.Tensor)), None)
            if t is not None and autocast_on(t.device.type):
                with torch.autocast(t.device.type, enabled=False):
                    return backward(ctx, *grads)
        return backward(ctx, *grads)

    return run  # type: ignore[return-value]
