"""Dense masks: boolean keep tensors (``keep``, ``block``, ``tf``) and additive biases."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .._host import readable
from ..blockplan.atoms import DNF, DenseBias, DenseKeep
from .base import DenseMask, Mask, check_broadcast_to, slice_last2

__all__ = ["BiasMask", "KeepMask"]


class KeepMask(Mask):
    """Boolean mask, True = may attend, broadcastable to ``(..., L, S)``."""

    kind = "keep"

    def __init__(self, tensor: torch.Tensor, *, source: str = "keep") -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"masks.{source}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.ndim < 1:
            raise ValueError(
                f"masks.{source}: expected a tensor of shape (..., L, S) or (S,), got a 0-d tensor"
            )
        self.tensor = tensor
        self.source = source

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        check_broadcast_to(f"masks.{self.source}(...)", self.tensor.shape, (*batch_shape, L, S))

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        return DenseMask(keep=self.tensor.to(device), bias=None)

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        return [[DenseKeep(self.tensor.to(device))]]

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        return KeepMask(slice_last2(self.tensor, q0, k0, L, S), source=self.source)

    def map_tensors(self, fn: Callable[[torch.Tensor, str], torch.Tensor]) -> Mask:
        return KeepMask(fn(self.tensor, "dense"), source=self.source)

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.tensor,)

    def dense_tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.tensor,)


class BiasMask(Mask):
    """Additive float mask broadcastable to ``(..., L, S)``; ``-inf`` blocks a key."""

    kind = "bias"
    additive = True

    def __init__(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"masks.bias: expected a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.is_floating_point():
            raise TypeError(
                f"masks.bias: expected a floating-point tensor, got dtype {tensor.dtype}; "
                "for a boolean mask use masks.keep (True = attend) or masks.block (True = masked)"
            )
        if tensor.ndim < 1:
            raise ValueError("masks.bias: expected a tensor of shape (..., L, S), got a 0-d tensor")
        if readable(tensor) and (torch.isnan(tensor).any() or torch.isposinf(tensor).any()):
            raise ValueError(
                "masks.bias: the bias contains NaN or +inf; expected finite values or -inf "
                "(which blocks a key)"
            )  # (on an accelerator the values are not read: that would sync)
        self.tensor = tensor

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        check_broadcast_to("masks.bias(...)", self.tensor.shape, (*batch_shape, L, S))

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        return DenseMask(keep=None, bias=self.tensor.to(device))

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        return [[DenseBias(self.tensor.to(device))]]

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        return self.map_tensors(lambda t, role: slice_last2(t, q0, k0, L, S))

    def map_tensors(self, fn: Callable[[torch.Tensor, str], torch.Tensor]) -> Mask:
        out = BiasMask.__new__(BiasMask)  # the values were checked once, by this mask
        out.tensor = fn(self.tensor, "dense")
        return out

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.tensor,)

    def dense_tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.tensor,)
