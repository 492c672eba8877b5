"""Modifiers of the logits' values and of the softmax: softcapping, sinks, head scales."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from .._args import as_float_tensor, as_real
from .._host import in_transform
from .._layout import HeadLayout
from .base import Mod

__all__ = ["Sinks", "Softcap"]


CAP_RANGE = (torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max)
"""The finite caps :class:`Softcap` takes: float32's normal range, the dtype logits of
float32 and half inputs are computed in (a larger cap is inf there, a smaller one 0,
and either turns ``cap * tanh(s / cap)`` into NaN)."""


class Softcap(Mod):
    """Logit softcapping (Gemma 2): ``s -> cap * tanh(s / cap)``, after the scale and
    before the mask, with its derivative ``1 - tanh²(s / cap)`` in the backward. Not a
    dot product, so it runs on the tiled ``chunked`` backend and the reference.

    ``cap``: a float in :data:`CAP_RANGE` (about 1.2e-38 to 3.4e38), or ``inf``, the
    limit of ``cap * tanh(s / cap)`` as the cap grows: no cap at all (the call runs as
    without this modifier).

    Args:
        cap: the cap, as above.

    Attributes:
        cap: the cap, a float.

    Raises:
        TypeError, ValueError: ``cap`` is not a positive number in :data:`CAP_RANGE`
            or inf.
    """

    kind = "softcap"

    def __init__(self, cap: float) -> None:
        super().__init__()
        cap = as_real("mods.softcap", "cap", cap, positive=True, allow_inf=True)
        lo, hi = CAP_RANGE
        if not math.isinf(cap) and not lo <= cap <= hi:
            raise ValueError(
                f"mods.softcap: cap must lie in [{lo:.3g}, {hi:.4g}] (float32's range, in which "
                f"the logits of float32 and half inputs are capped) or be inf (no cap), got {cap!r}"
            )
        self.cap = cap

    @property
    def identity(self) -> bool:
        """True for ``cap=inf``: no cap, the logits as they are."""
        return math.isinf(self.cap)

    def logits(self, s: torch.Tensor, L: int, S: int) -> torch.Tensor:
        return (_SoftcapForward if in_transform() else _SoftcapFunction).apply(s, self.cap)

    def signature(self) -> tuple[object, ...]:
        return (type(self), self.cap)


class _SoftcapFunction(torch.autograd.Function):
    """``cap * tanh(s / cap)`` whose backward is ``1 - tanh²(s / cap)`` as it is: the
    chain rule through ``tanh(...) * cap`` would multiply the gradient by the cap first,
    which overflows for a cap near the dtype's largest value. The backward is made of
    differentiable operations, so a second derivative works too; its context is set apart
    and its vmap rule generated, so it runs inside torch.func's transforms as well."""

    generate_vmap_rule = True

    @staticmethod
    def forward(s: torch.Tensor, cap: float) -> torch.Tensor:
        return torch.tanh(s / cap) * cap

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])
        ctx.cap = inputs[1]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (s,) = ctx.saved_tensors
        t = torch.tanh(s / ctx.cap)
        return grad * (1 - t * t), None


class _SoftcapForward(_SoftcapFunction):
    """:class:`_SoftcapFunction` with forward mode, for torch.func's transforms and
    forward-mode AD (dynamo traces no Function that defines ``jvp``)."""

    @staticmethod
    def jvp(ctx: Any, s_dot: torch.Tensor, _cap_dot: Any) -> torch.Tensor:
        (s,) = ctx.saved_tensors
        t = torch.tanh(s / ctx.cap)
        return s_dot * (1 - t * t)


class Sinks(Mod):
    """Learnable attention sinks (gpt-oss): one logit per head that joins every row's
    softmax with no value (several sinks: each joins it). Exact from any (out, lse): ``out * sigmoid(lse - sink)`` and
    ``lse' = logaddexp(lse, sink)``; gradients reach the sink logits, q, k and v. A row
    with every key masked still gives output 0 (its lse is the sink's logit).

    Built by :func:`attnkit.mods.sinks`. Joined after the backend, so every backend
    runs a call with sinks (asked for the lse).

    Args:
        logits: float tensor (H,), one sink logit per query head, or (1,) for all;
            kept as it is (a parameter learns).

    Attributes:
        sink: the (H,) logits.

    Raises:
        TypeError, ValueError: ``logits`` is not a 1-D float tensor.
    """

    kind = "sinks"
    in_backends = False  # joined outside the backends, from their lse

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.sink = as_float_tensor("mods.sinks", "logits", logits, ndim=1,
                                    layout="(H,), one sink per query head", convert=False)  # fmt: skip

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.sink,)

    def check(self, heads: int, where: str = "mods") -> None:
        n = self.sink.shape[0]
        if n != 1 and n != heads:  # (not `in`: dynamo's `in` misses a dynamic size equal to it)
            raise ValueError(
                f"{where}: mods.sinks has {self.sink.shape[0]} logits, but the call has {heads} "
                "query heads (dim -3)"
            )

    def per_row(self, lse: torch.Tensor) -> torch.Tensor:
        """The sink logit of each row, broadcastable to ``lse`` (*batch, L)."""
        sink = self.sink.to(device=lse.device, dtype=lse.dtype)  # (H,) or (1,)
        return HeadLayout(tuple(lse.shape[:-1])).per_head(sink, 1)  # (H, 1), or (1,)

    def join(self, out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(out (*batch, L, Ev), lse (*batch, L)) with the sink joined to the softmax."""
        sink = self.per_row(lse)
        empty = torch.isneginf(lse)  # (*batch, L): rows with no key
        keep = self._keys_share(lse, sink, empty)  # (*batch, L), in the lse's dtype
        # (in the lse's float32 for half inputs: one rounding to out's dtype, not three)
        joined = (out.to(keep.dtype) * keep.unsqueeze(-1)).to(out.dtype)  # (*batch, L, Ev)
        sink = sink.expand_as(lse)  # (*batch, L)
        # a row with no key: its lse is the sink's (logaddexp's derivatives at -inf hold
        # inf · 0, NaN in a second derivative)
        both = torch.logaddexp(torch.where(empty, sink, lse), sink)  # (*batch, L)
        return joined, torch.where(empty, sink, both)

    def weights(self, w: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        """Weights (*batch, L, S) of the keys once the sink takes its share."""
        keep = self._keys_share(lse, self.per_row(lse), torch.isneginf(lse))  # (*batch, L)
        return w * keep.unsqueeze(-1).to(w.dtype)

    @staticmethod
    def _keys_share(lse: torch.Tensor, sink: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
        """``exp(lse) / (exp(lse) + exp(sink))`` (*batch, L), 0 for a row with no key,
        as ``exp(-softplus(sink - lse))``: its gradient ``share · sigmoid(sink - lse)``
        keeps a sink far below the lse (``sigmoid``'s own ``s · (1 - s)`` rounded
        ``1 - s`` to 0 there: the sink's gradient through the output was 0). ``empty``
        (*batch, L): the rows with no key (lse -inf)."""
        safe = torch.where(empty, sink, lse)  # (no inf in either branch's derivatives)
        keep = torch.exp(-F.softplus(sink - safe))  # (*batch, L)
        return torch.where(empty, torch.zeros_like(keep), keep)

    def logits(self, s: torch.Tensor, L: int, S: int) -> torch.Tensor:
        return s  # the sink changes the softmax, not the logits (see join)
