"""Modifiers of the logits' values and of the softmax: softcapping, sinks, head scales."""

from __future__ import annotations

import math

import torch

from .._layout import HeadLayout
from .base import Mod

__all__ = ["Sinks", "Softcap"]


class Softcap(Mod):
    """Logit softcapping (Gemma 2): ``s -> cap * tanh(s / cap)``, after the scale and
    before the mask, with its derivative ``1 - tanh²(s / cap)`` in the backward. Not a
    dot product, so it runs on tiled kernels (chunked, triton) and the reference."""

    kind = "softcap"

    def __init__(self, cap: float) -> None:
        super().__init__()
        if isinstance(cap, bool) or not isinstance(cap, (int, float)):
            raise TypeError(f"mods.softcap: cap must be a positive float, got {cap!r}")
        if not math.isfinite(cap) or cap <= 0:
            raise ValueError(f"mods.softcap: cap must be a positive finite float, got {cap!r}")
        self.cap = float(cap)

    def logits(self, s: torch.Tensor, L: int, S: int) -> torch.Tensor:
        return torch.tanh(s / self.cap) * self.cap

    def signature(self) -> tuple[object, ...]:
        return (type(self), self.cap)


class Sinks(Mod):
    """Learnable attention sinks (gpt-oss): one logit per head that joins every row's
    softmax with no value (several sinks: each joins it). Exact from any (out, lse): ``out * sigmoid(lse - sink)`` and
    ``lse' = logaddexp(lse, sink)``; gradients reach the sink logits, q, k and v. A row
    with every key masked still gives output 0 (its lse is the sink's logit)."""

    kind = "sinks"

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        if (
            not isinstance(logits, torch.Tensor)
            or logits.ndim != 1
            or not logits.is_floating_point()
        ):
            raise ValueError(
                "mods.sinks: logits must be a 1-D float tensor (H,), one sink per query head, "
                f"got {getattr(logits, 'shape', type(logits).__name__)}"
            )
        self.sink = logits

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.sink,)

    def check(self, heads: int, where: str = "mods") -> None:
        if self.sink.shape[0] not in (1, heads):
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
        keep = torch.sigmoid(lse - sink)  # (*batch, L): exp(lse) / (exp(lse) + exp(sink))
        keep = torch.where(torch.isneginf(lse), torch.zeros_like(keep), keep)
        return out * keep.unsqueeze(-1).to(out.dtype), torch.logaddexp(lse, sink.expand_as(lse))

    def weights(self, w: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        """Weights (*batch, L, S) of the keys once the sink takes its share."""
        keep = torch.sigmoid(lse - self.per_row(lse))
        keep = torch.where(torch.isneginf(lse), torch.zeros_like(keep), keep)
        return w * keep.unsqueeze(-1).to(w.dtype)

    def logits(self, s: torch.Tensor, L: int, S: int) -> torch.Tensor:
        return s  # the sink changes the softmax, not the logits (see join)
